//! `drill`: a fire drill for one real node. It goes through everything a fence of that node
//! needs, short of the write itself, and says what oobfence would do if the node lost power
//! now: the Node and whether it may be fenced at all, the config's mapping, a power read and
//! the machine's identity, the exact write as a server-side dry run (RBAC, admission and the
//! resourceVersion precondition, nothing stored), the pods permissions the release needs, the
//! pause switch, the dry run, `[ha]` leadership, the cluster's support for the taint, and the
//! running daemon. Exit 0 when nothing stands in the way, 1 when something does.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde::Serialize;

use super::{fail, load};
use crate::cluster::{self, ApiError, Cluster, NodeView};
use crate::config::Config;
use crate::daemon;
use crate::decision::{DEFAULT_LEASE_DURATION, FenceAction, PowerState};
use crate::identity::{IdentityCheck, Verdict};
use crate::power::{MappedSource, PowerSources};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Pass,
    /// Worth knowing; does not stop a fence.
    Warn,
    /// Stops a fence of this node if it died now.
    Fail,
}

#[derive(Debug, Serialize)]
struct Check {
    check: &'static str,
    outcome: Outcome,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Drill {
    node: String,
    datacenter: String,
    checks: Vec<Check>,
    /// Whether oobfence would fence the node if it lost power now.
    would_fence: bool,
    verdict: String,
}

struct Checks(Vec<Check>);

impl Checks {
    fn add(&mut self, check: &'static str, outcome: Outcome, detail: impl Into<String>) {
        self.0.push(Check {
            check,
            outcome,
            detail: detail.into(),
        });
    }
}

pub(super) async fn drill(path: &Path, node: &str, json: bool) -> Result<ExitCode, ExitCode> {
    let cfg = Arc::new(load(path)?);
    let mut c = Checks(Vec::new());
    let client = daemon::client_for(&cfg).await.map_err(fail)?;
    let n = match Api::<Node>::all(client.clone()).get(node).await {
        Ok(n) => n,
        Err(e) => return Err(fail(format!("cannot read node {node}: {}", ApiError(&e)))),
    };
    let view = NodeView::from(&n);
    node_checks(&mut c, &view);

    // The mapping, a power read, and whose machine answered.
    let sources = PowerSources::new(cfg.clone(), Default::default()).await;
    let provider_id = n.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let mut read_latency = Duration::ZERO;
    match sources.for_node(node, provider_id) {
        None => c.add(
            "mapping",
            Outcome::Fail,
            format!(
                "no [[bmc]] entry or [aws] nodes pattern in {} matches {node}: its power \
                 cannot be read, so it is never fenced",
                path.display()
            ),
        ),
        Some(MappedSource { source, deadline }) => {
            c.add(
                "mapping",
                Outcome::Pass,
                format!("{} {}", source.backend(), source.address()),
            );
            let r = daemon::read_once(&source, deadline).await;
            read_latency = r.latency;
            let ready = view.ready.as_ref().is_some_and(|r| r.ready);
            let state = format!("{} in {:.3}s", r.state, r.latency.as_secs_f64());
            match (&r.state, ready) {
                (PowerState::Error { .. }, _) => c.add(
                    "power read",
                    Outcome::Fail,
                    format!("{state}: a dead node's power could not be proven off"),
                ),
                (PowerState::On, true) => c.add("power read", Outcome::Pass, state),
                (PowerState::Off, true) => c.add(
                    "power read",
                    Outcome::Fail,
                    format!(
                        "{state} while the node is Ready: the entry reads another machine, or \
                         the BMC lies; such an Off is never trusted"
                    ),
                ),
                _ => c.add("power read", Outcome::Warn, state),
            }
            let checked =
                cfg.mapping_for(node).map(|m| m.identity()) != Some(IdentityCheck::Unchecked);
            let verdict = crate::identity::verify(&cluster::node_identity(&view), &r.identity);
            match (&verdict, checked) {
                (Verdict::Match(_), _) => c.add("identity", Outcome::Pass, verdict.to_string()),
                (Verdict::Mismatch(_), _) => c.add(
                    "identity",
                    Outcome::Fail,
                    format!("{verdict}: the entry reads another machine"),
                ),
                (Verdict::Unverifiable(_), true) => c.add(
                    "identity",
                    Outcome::Fail,
                    format!(
                        "{verdict}: an Off read that cannot be tied to the node's machine is \
                         never acted on"
                    ),
                ),
                (Verdict::Unverifiable(_), false) => c.add(
                    "identity",
                    Outcome::Warn,
                    format!("{verdict} (identity = \"unchecked\": the mapping is trusted as is)"),
                ),
            }
            sources.close_sessions().await;
        }
    }

    // The exact write, rehearsed by the API server.
    let writer = Cluster::new(client.clone(), &cfg.datacenter);
    let action = cfg.policy.action;
    let what = match action {
        FenceAction::Taint => {
            "the out-of-service taint patch with its resourceVersion precondition"
        }
        FenceAction::DeleteNode => "the Node's delete with its uid precondition",
    };
    match writer.rehearse_fence(node, action).await {
        Ok(()) => c.add(
            "write",
            Outcome::Pass,
            format!("the API server accepts {what} (a server-side dry run: nothing stored)"),
        ),
        Err(e) => c.add("write", Outcome::Fail, format!("{what} refused: {e}")),
    }
    if cfg.policy.release_at_attestation {
        release_permissions(&mut c, &client).await;
    }

    holds(&mut c, &cfg, &client).await;
    leadership(&mut c, &cfg, &client).await;
    kubernetes_version(&mut c, &cfg, &client).await;
    running_daemon(&mut c, &cfg, node).await;

    let lease_duration = Api::<Lease>::namespaced(client, cluster::NODE_LEASE_NAMESPACE)
        .get_opt(node)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_LEASE_DURATION, Duration::from_secs);
    let blocking: Vec<&str> =
        c.0.iter()
            .filter(|k| k.outcome == Outcome::Fail)
            .map(|k| k.check)
            .collect();
    let would_fence = blocking.is_empty();
    let verdict = if would_fence {
        format!(
            "if {node} lost power now, oobfence would {}",
            timeline(&cfg, lease_duration, read_latency)
        )
    } else {
        format!(
            "if {node} lost power now, oobfence would NOT fence it: {} (see FAIL above)",
            blocking.join(", ")
        )
    };
    let drill = Drill {
        node: node.to_string(),
        datacenter: cfg.datacenter.clone(),
        checks: c.0,
        would_fence,
        verdict,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&drill).map_err(fail)?);
    } else {
        let width = drill
            .checks
            .iter()
            .map(|k| k.check.len())
            .max()
            .unwrap_or(0);
        for k in &drill.checks {
            let mark = match k.outcome {
                Outcome::Pass => "ok  ",
                Outcome::Warn => "WARN",
                Outcome::Fail => "FAIL",
            };
            println!("{mark}  {:width$}  {}", k.check, k.detail);
        }
        println!("{}", drill.verdict);
    }
    Ok(if would_fence {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Whether the Node is one oobfence may fence at all.
fn node_checks(c: &mut Checks, view: &NodeView) {
    let ready = match &view.ready {
        Some(r) if r.ready => "True",
        Some(_) => "False/Unknown",
        None => "no Ready condition",
    };
    let boot = cluster::boot_id(view);
    if let Some(why) = cluster::opted_out(view) {
        c.add(
            "node",
            Outcome::Fail,
            format!("opted out ({why}): oobfence leaves it alone"),
        );
    } else if let Some(who) = cluster::other_remediator(view) {
        c.add(
            "node",
            Outcome::Fail,
            format!("another remediator acts on it ({who}): oobfence stands back"),
        );
    } else if cluster::foreign_out_of_service(view, None) {
        c.add(
            "node",
            Outcome::Fail,
            "it already carries an out-of-service taint that is not oobfence's",
        );
    } else {
        c.add(
            "node",
            Outcome::Pass,
            format!("Ready={ready}, bootID {boot}"),
        );
    }
}

/// The pods list and delete that `release_at_attestation` needs.
async fn release_permissions(c: &mut Checks, client: &kube::Client) {
    let needed: Vec<_> = crate::kubeconfig::NEEDED
        .iter()
        .filter(|p| p.resource == "pods")
        .copied()
        .collect();
    match crate::kubeconfig::lacking(client, &needed).await {
        Ok(missing) if missing.is_empty() => c.add(
            "release",
            Outcome::Pass,
            "may list and force-delete the node's pods (release_at_attestation)",
        ),
        Ok(missing) => c.add(
            "release",
            Outcome::Warn,
            format!(
                "MISSING {}: the fence lands, its pods wait for the pod garbage collector \
                 (apply deploy/rbac.yaml)",
                missing
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => c.add("release", Outcome::Warn, format!("cannot be checked: {e}")),
    }
}

/// The pause switch (file and ConfigMap) and the dry run: each holds every write.
async fn holds(c: &mut Checks, cfg: &Config, client: &kube::Client) {
    let mut paused = Vec::new();
    if let Some(file) = &cfg.pause.file
        && let Some(why) = crate::pause::read_file(file)
    {
        paused.push(format!("pause file {}: {why}", file.display()));
    }
    if let Some(cm) = &cfg.pause.configmap {
        match crate::pause::read_configmap(client, cm, &cfg.datacenter).await {
            Ok(Some(why)) => paused.push(why),
            Ok(None) => {}
            Err(e) => c.add(
                "pause",
                Outcome::Warn,
                format!("the pause ConfigMap {cm} cannot be read: {}", ApiError(&e)),
            ),
        }
    }
    if paused.is_empty() {
        c.add("pause", Outcome::Pass, "not paused");
    } else {
        c.add(
            "pause",
            Outcome::Fail,
            format!("paused, every write held: {}", paused.join("; ")),
        );
    }
    if cfg.policy.dry_run {
        c.add(
            "dry run",
            Outcome::Fail,
            "policy.dry_run = true: it would decide and write nothing",
        );
    }
}

/// `[ha]`: which instance holds the group's Lease, if any does.
async fn leadership(c: &mut Checks, cfg: &Config, client: &kube::Client) {
    let Some(ha) = &cfg.ha else {
        c.add("leadership", Outcome::Pass, "one instance (no [ha])");
        return;
    };
    let name = ha.lease_name(&cfg.datacenter);
    let lease = Api::<Lease>::namespaced(client.clone(), &ha.namespace)
        .get_opt(&name)
        .await;
    let spec = match lease {
        Err(e) => {
            c.add(
                "leadership",
                Outcome::Fail,
                format!(
                    "Lease {}/{name} cannot be read: {}",
                    ha.namespace,
                    ApiError(&e)
                ),
            );
            return;
        }
        Ok(l) => l.and_then(|l| l.spec),
    };
    let holder = spec.as_ref().and_then(|s| s.holder_identity.clone());
    let renewed = spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    let age = renewed
        .map(|t| Duration::try_from(jiff::Timestamp::now().duration_since(t)).unwrap_or_default());
    match (holder, age) {
        (Some(h), Some(age)) if !h.is_empty() && age < ha.lease_duration => {
            let me = if h == ha.identity { " (this host)" } else { "" };
            c.add(
                "leadership",
                Outcome::Pass,
                format!(
                    "{h}{me} leads (Lease {}/{name} renewed {}s ago)",
                    ha.namespace,
                    age.as_secs()
                ),
            );
        }
        _ => c.add(
            "leadership",
            Outcome::Fail,
            format!(
                "no instance holds Lease {}/{name}: none writes until one takes it (is any \
                 oobfence@{} running?)",
                ha.namespace, cfg.datacenter
            ),
        ),
    }
}

async fn kubernetes_version(c: &mut Checks, cfg: &Config, client: &kube::Client) {
    use crate::cluster::version;
    match client.apiserver_version().await {
        Err(e) => c.add("kubernetes", Outcome::Warn, ApiError(&e).to_string()),
        Ok(info) => match version::parse(&info.major, &info.minor) {
            None => c.add(
                "kubernetes",
                Outcome::Warn,
                format!("version {}.{} is not numbers", info.major, info.minor),
            ),
            Some(v) => match (
                version::out_of_service_words(&info.git_version, v),
                cfg.policy.action,
            ) {
                (Ok(words), _) => c.add("kubernetes", Outcome::Pass, words),
                (Err(words), FenceAction::Taint) => c.add("kubernetes", Outcome::Warn, words),
                (Err(_), FenceAction::DeleteNode) => c.add(
                    "kubernetes",
                    Outcome::Pass,
                    format!(
                        "{}: delete-node needs no out-of-service support",
                        info.git_version
                    ),
                ),
            },
        },
    }
}

/// The daemon of this config, and what it decides of the node now.
async fn running_daemon(c: &mut Checks, cfg: &Config, node: &str) {
    let base = super::daemon_commands::daemon_url(cfg);
    // What another daemon says is about another datacenter (or another file's pause).
    let who = super::right_daemon::answer(cfg).await;
    if let Some(why) = super::right_daemon::not_ours(cfg, &cfg.source, &who) {
        c.add("daemon", Outcome::Fail, why);
        return;
    }
    let answer = async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .map_err(|e| e.to_string())?;
        let resp = client
            .get(format!("{base}/nodes/{node}"))
            .send()
            .await
            .map_err(|e| super::daemon_commands::root_cause(&e))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, body))
    }
    .await;
    // Under [ha] another host's instance may be the one that acts.
    let absent = if cfg.ha.is_some() {
        Outcome::Warn
    } else {
        Outcome::Fail
    };
    match answer {
        Err(e) => c.add(
            "daemon",
            absent,
            format!(
                "no daemon answers at {base} ({e}): nothing here would fence it (systemctl \
                 status oobfence@{})",
                cfg.datacenter
            ),
        ),
        Ok((status, body)) if status.is_success() => {
            let report: Option<crate::report::NodeReport> = serde_json::from_str(&body).ok();
            match report {
                Some(r) => c.add(
                    "daemon",
                    Outcome::Pass,
                    format!("answers at {base}: {} ({}): {}", r.state, r.rule, r.reason),
                ),
                None => c.add("daemon", Outcome::Warn, format!("answers at {base}")),
            }
        }
        Ok((status, _)) => c.add(
            "daemon",
            absent,
            format!(
                "the daemon at {base} does not know {node} ({status}): check its node_selector"
            ),
        ),
    }
}

/// What a power cut now would bring, with the config's timings.
fn timeline(cfg: &Config, lease_duration: Duration, read_latency: Duration) -> String {
    let p = &cfg.policy;
    let reads = p.confirm_interval * p.confirm_reads.saturating_sub(1) + read_latency;
    let write = match p.action {
        FenceAction::Taint => "taint it out-of-service",
        FenceAction::DeleteNode => "delete its Node",
    };
    let secs = |d: Duration| format!("{:.0}s", d.as_secs_f64());
    match p.pre_attest_after {
        Some(stale) if p.release_at_attestation => format!(
            "{write} and force-delete its pods about {} after the kubelet's last renewal ({} of \
             silence, then {} Off reads {} apart), once the machine reads Off as its own",
            secs(stale.of(lease_duration) + reads),
            secs(stale.of(lease_duration)),
            p.confirm_reads,
            secs(p.confirm_interval)
        ),
        Some(stale) => format!(
            "{write} when the node turns NotReady (the controller-manager's grace, 40s by \
             default), its power read ahead from {} of silence: {} Off reads {} apart",
            secs(stale.of(lease_duration)),
            p.confirm_reads,
            secs(p.confirm_interval)
        ),
        None => format!(
            "{write} {} after the node turns NotReady plus {} Off reads {} apart",
            secs(p.not_ready_grace),
            p.confirm_reads,
            secs(p.confirm_interval)
        ),
    }
}
