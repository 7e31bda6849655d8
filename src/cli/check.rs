//! `check-config` (the file, what it names, and with `--probe` a read of every mapped node's
//! power source) and `probe` (one node's power source, read now).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::{fail, load};
use crate::cluster::{ApiError, NodeView};
use crate::daemon;
use crate::power::{MappedSource, PowerSources};
use crate::report::short_state;

pub(super) async fn check_config(path: &Path, probe: bool) -> Result<ExitCode, ExitCode> {
    use crate::config::checks::{self, Severity};
    let cfg = load(path)?;
    let mut findings = checks::kubeconfig(&cfg.kubernetes, jiff::Timestamp::now());
    findings.extend(checks::warnings(&cfg));
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    for f in &findings {
        match f.severity {
            Severity::Note => println!("{}: {f}", path.display()),
            _ => eprintln!("{}: {f}", path.display()),
        }
    }
    if errors > 0 {
        eprintln!(
            "{}: {errors} error(s): `oobfence run` would not work with this config",
            path.display()
        );
        return Err(ExitCode::from(2));
    }
    let listed: usize = cfg
        .bmc
        .iter()
        .filter_map(|b| b.inventory.as_ref())
        .map(|i| i.len())
        .sum();
    println!(
        "{}: OK (datacenter {}, {} [[bmc]] entries{}, action {}{})",
        path.display(),
        cfg.datacenter,
        cfg.bmc.len(),
        if listed > 0 {
            format!(" ({listed} nodes from inventory files)")
        } else {
            String::new()
        },
        cfg.policy.action,
        if cfg.policy.dry_run { ", dry run" } else { "" }
    );
    if !probe {
        return Ok(ExitCode::SUCCESS);
    }
    let client = daemon::client_for(&cfg).await.map_err(fail)?;
    kubernetes_version(&client, &cfg).await;
    let lacking = permissions(&client, &cfg).await;
    let nodes = Api::<Node>::all(client)
        .list(&match &cfg.kubernetes.node_selector {
            Some(sel) => ListParams::default().labels(sel),
            None => ListParams::default(),
        })
        .await
        .map_err(|e| fail(format!("cannot list nodes: {}", ApiError(&e))))?;
    let names: Vec<&str> = nodes
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    for f in checks::unmatched(&cfg, &names) {
        eprintln!("{}: {f}", path.display());
    }
    let cfg = Arc::new(cfg);
    let sources = Arc::new(PowerSources::new(cfg.clone(), Default::default()).await);
    let conflicts = daemon::mapping_conflicts(
        &cfg,
        nodes.items.iter().map(|n| {
            (
                n.metadata.name.as_deref().unwrap_or(""),
                n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            )
        }),
    );
    let conflicts = &conflicts;
    let shared_uuids = crate::identity::shared_system_uuids(nodes.items.iter().map(|n| {
        (
            n.metadata.name.as_deref().unwrap_or(""),
            n.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map_or("", |i| i.system_uuid.as_str()),
        )
    }));
    let shared_uuids = &shared_uuids;
    let rows: Vec<Row> = futures::stream::iter(nodes.items.into_iter().map(|n| {
        let sources = sources.clone();
        let cfg = cfg.clone();
        async move {
            let name = n.name_any();
            let provider_id = n.spec.as_ref().and_then(|s| s.provider_id.as_deref());
            match sources.for_node(&name, provider_id) {
                None => Row {
                    node: name,
                    backend: "-".into(),
                    address: "-".into(),
                    state: "not mapped".into(),
                    identity: "-".into(),
                    ok: true,
                    actions: None,
                },
                Some(MappedSource { source, deadline }) => {
                    let r = daemon::read_once(&source, deadline).await;
                    let mut node_identity = crate::cluster::node_identity(&NodeView::from(&n));
                    node_identity.uuid_shared_with =
                        shared_uuids.get(&name).cloned().unwrap_or_default();
                    let verdict = crate::identity::verify(&node_identity, &r.identity);
                    let checked = cfg.mapping_for(&name).map(|m| m.identity())
                        != Some(crate::identity::IdentityCheck::Unchecked);
                    let conflict = conflicts.get(&name);
                    let identity_ok = conflict.is_none()
                        && match &verdict {
                            crate::identity::Verdict::Match(_) => true,
                            crate::identity::Verdict::Mismatch(_) => false,
                            // A gone instance reports no identity: that is for the daemon's
                            // binding to judge, not a broken mapping.
                            crate::identity::Verdict::Unverifiable(_) => {
                                !checked || r.state.is_gone()
                            }
                        };
                    let identity = match conflict {
                        Some(c) => format!("UNTRUSTED {c}"),
                        None if !checked => format!("{verdict} (identity unchecked)"),
                        None => verdict.to_string(),
                    };
                    // How the read logged in, where the backend says (IPMI: suite and role;
                    // Redfish: Basic or a session), and the TLS version the BMC picks.
                    let backend = backend_column(source.as_ref(), &r.details).await;
                    // Opt-in actuation: what the source says it can do, where both opt-ins
                    // are given (it costs a read of its own).
                    let acts = cfg.actuation.is_some()
                        && cfg
                            .mapping_for(&name)
                            .is_some_and(|m| m.actuation_refused().is_none());
                    let actions = match acts {
                        true => {
                            let a = source.action_support().await;
                            let say = |r: &Result<String, String>| match r {
                                Ok(how) => format!("yes ({how})"),
                                Err(why) => format!("NO: {why}"),
                            };
                            Some(format!(
                                "power off: {}; power on: {}",
                                say(&a.off),
                                say(&a.on)
                            ))
                        }
                        false => None,
                    };
                    Row {
                        node: name,
                        backend,
                        address: source.address(),
                        state: format!(
                            "{} ({:.3}s)",
                            short_state(&r.state),
                            r.latency.as_secs_f64()
                        ),
                        identity,
                        ok: !matches!(r.state, crate::power::PowerState::Error { .. })
                            && identity_ok,
                        actions,
                    }
                }
            }
        }
    }))
    .buffered(cfg.max_concurrent_reads)
    .collect()
    .await;
    sources.close_sessions().await;
    let w = |f: fn(&Row) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let (w0, w1, w2, w3) = (
        w(|r| r.node.len(), 4),
        w(|r| r.backend.len(), 7),
        w(|r| r.address.len(), 7),
        w(|r| r.state.len(), 5),
    );
    println!(
        "{:w0$}  {:w1$}  {:w2$}  {:w3$}  IDENTITY",
        "NODE", "BACKEND", "ADDRESS", "STATE"
    );
    for r in &rows {
        println!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
            r.node, r.backend, r.address, r.state, r.identity
        );
    }
    for r in rows.iter().filter(|r| r.actions.is_some()) {
        println!(
            "actuation: {}: {}",
            r.node,
            r.actions.as_deref().unwrap_or_default()
        );
    }
    let failed = rows.iter().filter(|r| !r.ok).count();
    if lacking {
        return Ok(ExitCode::from(1));
    }
    if failed > 0 {
        eprintln!(
            "oobfence: {failed} of {} nodes could not be read or not tied to their machine (see STATE and IDENTITY)",
            rows.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `check-config --probe`: whether the cluster acts on the out-of-service taint (1.26 or
/// later). A warning, not a failure: a 1.24 or 1.25 cluster may have the gate on by hand, and
/// `delete-node` does not need it.
async fn kubernetes_version(client: &kube::Client, cfg: &crate::config::Config) {
    use crate::cluster::version;
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(e) => {
            eprintln!("kubernetes: cannot read the version: {}", ApiError(&e));
            return;
        }
    };
    let Some(v) = version::parse(&info.major, &info.minor) else {
        eprintln!(
            "kubernetes: warning: version {:?}.{:?} is not numbers: cannot tell whether the              out-of-service taint is acted on (it is from 1.26)",
            info.major, info.minor
        );
        return;
    };
    match (
        version::out_of_service_words(&info.git_version, v),
        cfg.policy.action,
    ) {
        (Ok(words), _) => println!("kubernetes: {words}"),
        (Err(words), crate::decision::FenceAction::Taint) => {
            eprintln!("kubernetes: warning: {words}")
        }
        (Err(_), crate::decision::FenceAction::DeleteNode) => println!(
            "kubernetes: {}: action delete-node needs no out-of-service support",
            info.git_version
        ),
    }
}

/// `check-config --probe`: whether the kubeconfig's identity may do everything the daemon
/// does with this config, as the API server's authorizer says (SelfSubjectAccessReview).
/// Prints the answer; `true` when something is lacking.
async fn permissions(client: &kube::Client, cfg: &crate::config::Config) -> bool {
    let needed = crate::kubeconfig::needed_by(cfg);
    match crate::kubeconfig::lacking(client, &needed).await {
        Ok(missing) if missing.is_empty() => {
            println!(
                "permissions: the kubeconfig may do all {} things the daemon does with this config",
                needed.len()
            );
            false
        }
        Ok(missing) => {
            for p in &missing {
                let why = match p.resource {
                    "pods" => {
                        " (release_at_attestation lists a fenced node's pods and force-deletes them; without it they wait for the pod garbage collector)"
                    }
                    _ => "",
                };
                eprintln!("permissions: MISSING: {p}{why}");
            }
            eprintln!(
                "oobfence: the kubeconfig lacks {} of the {} permissions the daemon uses: apply the shipped RBAC again (kubectl apply -f /usr/share/doc/oobfence/examples/rbac.yaml, or deploy/rbac.yaml from the source)",
                missing.len(),
                needed.len()
            );
            true
        }
        Err(e) => {
            eprintln!("permissions: cannot be checked: {e}");
            false
        }
    }
}

/// `BACKEND` of `check-config --probe`: the backend, how the read logged in and what its
/// connection negotiated, as far as the backend says.
async fn backend_column(
    source: &dyn crate::power::PowerSource,
    details: &[crate::power::ReadDetail],
) -> String {
    let login = details
        .iter()
        .find(|d| d.name == "session")
        .map(|d| d.value.clone());
    let transport = source.transport().await;
    let said: Vec<String> = login.into_iter().chain(transport).collect();
    if said.is_empty() {
        source.backend().to_string()
    } else {
        format!("{} ({})", source.backend(), said.join("; "))
    }
}

/// One line of `check-config --probe`.
struct Row {
    node: String,
    backend: String,
    address: String,
    state: String,
    identity: String,
    ok: bool,
    /// With opt-in actuation, whether its source says it can power the machine off and on.
    actions: Option<String>,
}

pub(super) async fn probe(path: &Path, node: &str, json: bool) -> Result<ExitCode, ExitCode> {
    let cfg = Arc::new(load(path)?);
    let sources = PowerSources::new(cfg.clone(), Default::default()).await;
    // Only an EC2-mapped node needs the cluster (its providerID); a BMC is in the config.
    let provider_id = if sources.needs_node_data(node) {
        let client = daemon::client_for(&cfg).await.map_err(fail)?;
        let n = Api::<Node>::all(client).get(node).await.map_err(|e| {
            fail(format!(
                "cannot read node {node} for its providerID: {}",
                ApiError(&e)
            ))
        })?;
        n.spec.and_then(|s| s.provider_id)
    } else {
        None
    };
    let Some(MappedSource { source, deadline }) = sources.for_node(node, provider_id.as_deref())
    else {
        return Err(fail(format!(
            "no [[bmc]] entry or [aws] nodes pattern in {} matches node {node:?}",
            path.display()
        )));
    };
    let r = daemon::read_once(&source, deadline).await;
    // A Redfish session is logged out now, not left to the BMC's timeout (its slots are few).
    sources.close_sessions().await;
    let mut out = format!(
        "{node}: {} ({} {}, {:.3}s)",
        r.state,
        source.backend(),
        source.address(),
        r.latency.as_secs_f64()
    );
    out.push_str(&format!("\n  identity: {}", r.identity));
    let transport = source.transport().await;
    if let Some(transport) = &transport {
        out.push_str(&format!("\n  transport: {transport}"));
    }
    for d in &r.details {
        out.push_str(&format!("\n  {d}"));
    }
    let failed = matches!(r.state, crate::power::PowerState::Error { .. });
    if json {
        // The reading as the journal records it (state, latency, identity, details), and
        // where it was read; the exit code is the text form's.
        let doc = serde_json::json!({
            "node": node,
            "backend": source.backend(),
            "address": source.address(),
            "transport": transport,
            "reading": &r,
        });
        println!("{}", serde_json::to_string_pretty(&doc).map_err(fail)?);
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    if failed {
        return Err(fail(out));
    }
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}
