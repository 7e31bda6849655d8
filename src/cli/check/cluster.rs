//! `check-config --probe`: the cluster's version, the kubeconfig's permissions, and a read of
//! every mapped node's power source, as one table.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::Say;
use crate::cli::fail;
use crate::cluster::{ApiError, NodeView};
use crate::config::Config;
use crate::config::checks;
use crate::daemon;
use crate::power::{MappedSource, PowerSources};
use crate::report::short_state;

/// Lists the cluster's nodes and reads every mapped one's power source once (the table); the
/// exit code: 1 when the kubeconfig lacks a permission or a node could not be read or tied to
/// its machine.
pub(super) async fn read_cluster(
    say: &mut Say,
    cfg: Config,
    path: &Path,
) -> Result<ExitCode, ExitCode> {
    let client = daemon::client_for(&cfg).await.map_err(fail)?;
    kubernetes_version(say, &client, &cfg).await;
    let lacking = permissions(say, &client, &cfg).await;
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
        say.finding(path, &f);
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
            let mappings = cfg.mappings_for(&name);
            if mappings.is_empty() {
                return vec![Row {
                    node: name,
                    backend: "-".into(),
                    address: "-".into(),
                    state: "not mapped".into(),
                    identity: "-".into(),
                    ok: true,
                    actions: None,
                    level: None,
                }];
            }
            // A node of several sources, or of a level above 1, shows each row's level.
            let shown_levels = mappings.len() > 1 || mappings.iter().any(|m| m.level() > 1);
            let mut rows = Vec::new();
            for m in mappings {
                let node = name.clone();
                let Some(MappedSource { source, deadline }) =
                    sources.for_mapping(m, &name, provider_id)
                else {
                    continue;
                };
                rows.push({
                    let r = daemon::read_once(&source, deadline).await;
                    let mut node_identity = crate::cluster::node_identity(&NodeView::from(&n));
                    node_identity.uuid_shared_with =
                        shared_uuids.get(&name).cloned().unwrap_or_default();
                    let verdict = crate::identity::verify(&node_identity, &r.identity);
                    let checked = m.identity() != crate::identity::IdentityCheck::Unchecked;
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
                    let acts = cfg.actuation.is_some() && m.actuation_refused().is_none();
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
                        node,
                        level: shown_levels.then_some(m.level()),
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
                });
            }
            rows
        }
    }))
    .buffered(cfg.max_concurrent_reads)
    .collect::<Vec<Vec<Row>>>()
    .await
    .into_iter()
    .flatten()
    .collect();
    sources.close_sessions().await;
    let w = |f: fn(&Row) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let (w0, w1, w2, w3) = (
        w(|r| shown(r).len(), 4),
        w(|r| r.backend.len(), 7),
        w(|r| r.address.len(), 7),
        w(|r| r.state.len(), 5),
    );
    say.out(format!(
        "{:w0$}  {:w1$}  {:w2$}  {:w3$}  IDENTITY",
        "NODE", "BACKEND", "ADDRESS", "STATE"
    ));
    for r in &rows {
        say.push(
            "nodes",
            serde_json::json!({
                "node": r.node, "level": r.level, "backend": r.backend, "address": r.address,
                "state": r.state, "identity": r.identity, "ok": r.ok, "actuation": r.actions,
            }),
        );
        say.out(format!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
            shown(r),
            r.backend,
            r.address,
            r.state,
            r.identity
        ));
    }
    for r in rows.iter().filter(|r| r.actions.is_some()) {
        say.out(format!(
            "actuation: {}: {}",
            r.node,
            r.actions.as_deref().unwrap_or_default()
        ));
    }
    let failed = rows.iter().filter(|r| !r.ok).count();
    if lacking {
        return Ok(ExitCode::from(1));
    }
    if failed > 0 {
        say.err(format!(
            "oobfence: {failed} of {} nodes could not be read or not tied to their machine (see STATE and IDENTITY)",
            rows.len()
        ));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `check-config --probe`: whether the cluster acts on the out-of-service taint (1.26 or
/// later). A warning, not a failure: a 1.24 or 1.25 cluster may have the gate on by hand, and
/// `delete-node` does not need it.
async fn kubernetes_version(say: &mut Say, client: &kube::Client, cfg: &crate::config::Config) {
    use crate::cluster::version;
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(e) => {
            let text = format!("cannot read the version: {}", ApiError(&e));
            say.set("kubernetes", serde_json::json!({ "error": text }));
            say.err(format!("kubernetes: {text}"));
            return;
        }
    };
    let Some(v) = version::parse(&info.major, &info.minor) else {
        let text = format!(
            "version {:?}.{:?} is not numbers: cannot tell whether the out-of-service taint \
             is acted on (it is from 1.26)",
            info.major, info.minor
        );
        say.set(
            "kubernetes",
            serde_json::json!({ "version": info.git_version, "warning": text }),
        );
        say.warnings += 1;
        say.err(format!("kubernetes: warning: {text}"));
        return;
    };
    let (acted_on, text) = match (
        version::out_of_service_words(&info.git_version, v),
        cfg.policy.action,
    ) {
        (Ok(words), _) => (true, words),
        (Err(words), crate::decision::FenceAction::Taint) => (false, words),
        (Err(_), crate::decision::FenceAction::DeleteNode) => (
            false,
            format!(
                "{}: action delete-node needs no out-of-service support",
                info.git_version
            ),
        ),
    };
    let warn = !acted_on && cfg.policy.action == crate::decision::FenceAction::Taint;
    say.set(
        "kubernetes",
        serde_json::json!({
            "version": info.git_version,
            "out_of_service_acted_on": acted_on,
            "warning": warn,
            "text": text,
        }),
    );
    if warn {
        say.warnings += 1;
        say.err(format!("kubernetes: warning: {text}"));
    } else {
        say.out(format!("kubernetes: {text}"));
    }
}

/// `check-config --probe`: whether the kubeconfig's identity may do everything the daemon
/// does with this config, as the API server's authorizer says (SelfSubjectAccessReview).
/// Prints the answer; `true` when something is lacking.
async fn permissions(say: &mut Say, client: &kube::Client, cfg: &crate::config::Config) -> bool {
    let needed = crate::kubeconfig::needed_by(cfg);
    let answer = crate::kubeconfig::lacking(client, &needed).await;
    say.set(
        "permissions",
        match &answer {
            Ok(missing) => serde_json::json!({
                "needed": needed.len(),
                "missing": missing.iter().map(ToString::to_string).collect::<Vec<_>>(),
            }),
            Err(e) => serde_json::json!({ "needed": needed.len(), "error": e }),
        },
    );
    match answer {
        Ok(missing) if missing.is_empty() => {
            say.out(format!(
                "permissions: the kubeconfig may do all {} things the daemon does with this config",
                needed.len()
            ));
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
                say.err(format!("permissions: MISSING: {p}{why}"));
            }
            say.err(format!(
                "oobfence: the kubeconfig lacks {} of the {} permissions the daemon uses: apply the shipped RBAC again (kubectl apply -f /usr/share/doc/oobfence/examples/rbac.yaml, or deploy/rbac.yaml from the source)",
                missing.len(),
                needed.len()
            ));
            true
        }
        Err(e) => {
            say.err(format!("permissions: cannot be checked: {e}"));
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
/// How the table names a row's node: with its level, where the node has several or one
/// above 1.
fn shown(r: &Row) -> String {
    match r.level {
        Some(l) => format!("{} (level {l})", r.node),
        None => r.node.clone(),
    }
}

struct Row {
    node: String,
    backend: String,
    address: String,
    state: String,
    identity: String,
    ok: bool,
    /// With opt-in actuation, whether its source says it can power the machine off and on.
    actions: Option<String>,
    /// The source's fencing level, where the node has several or one above 1.
    level: Option<u32>,
}
