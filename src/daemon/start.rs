//! Start-up: everything the loop needs, started in order by named steps — the Kubernetes
//! client and its token, the HTTP server, the token's expiry watch, the Node and Lease
//! watches, the power sources, the journal, the VolumeAttachment watch, the pause watch, the
//! `[ha]` elector, the guards' record — and handed to the loop as one [`Started`].

use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::action::ActionDone;
use super::guard_record;
use super::leases::{self, Leases};
use super::nodes::{self, Nodes};
use super::notify::{log_startup_warnings, notify_systemd};
use super::reads::{ReadDone, ReadSlots};
use super::state::Daemon;
use super::uuids;
use crate::cluster::{self, Cluster, WatchError};
use crate::config::Config;
use crate::decision::holds::{Calm, Hold, HoldKind, Holds};
use crate::journal::{Journal, JournalWriter};
use crate::power::PowerSources;
use crate::status::{ReportRequest, Shared};
use crate::volumes::VolumeWatch;

/// At shutdown, queued journal records get this long to reach the disk.
const JOURNAL_FLUSH: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("cannot listen on {addr} ([server] listen): {source}{holder}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
        /// Who holds the address, when it is taken: "; it is held by ...".
        holder: String,
    },
}

/// What [`start`] hands the loop.
pub(super) struct Started {
    pub(super) daemon: Daemon,
    pub(super) events: Events,
    pub(super) background: Background,
}

/// What the loop waits on besides its clock: reads and writes done, Nodes changed, reports
/// asked for.
pub(super) struct Events {
    pub(super) reads: mpsc::Receiver<ReadDone>,
    pub(super) actions: mpsc::Receiver<ActionDone>,
    pub(super) changed: mpsc::Receiver<String>,
    pub(super) reports: mpsc::Receiver<ReportRequest>,
}

/// What runs beside the loop and is stopped with it.
pub(super) struct Background {
    stop_tx: tokio::sync::watch::Sender<bool>,
    http: tokio::task::JoinHandle<()>,
    journal_writer: JournalWriter,
}

impl Background {
    /// Stops the HTTP server and the token watch, drops the daemon (its tasks end with it),
    /// and gives queued journal records [`JOURNAL_FLUSH`] to reach the disk.
    pub(super) async fn stop(self, daemon: Daemon) {
        let _ = self.stop_tx.send(true);
        let _ = self.http.await;
        // Redfish sessions are logged out (a BMC has few session slots), a few seconds at most.
        daemon.sources.close_sessions().await;
        drop(daemon);
        self.journal_writer.finish(JOURNAL_FLUSH).await;
    }
}

/// Who holds `[server] listen` when it is taken: another oobfence daemon says who it is
/// (two units given one address: the second names the first); anything else is named as
/// not oobfence.
async fn address_holder(cfg: &Config) -> String {
    use crate::whoami::{Answer, Whoami};
    match Answer::of(cfg, Duration::from_secs(3)).await {
        Answer::Ours { who, .. } => format!(
            "; the daemon of this very config already runs there ({}): it needs no second one",
            who.describe()
        ),
        Answer::Other(who) => format!(
            "; it is held by {}: give {} a [server] listen of its own",
            who.describe(),
            Whoami::of(cfg).config.display()
        ),
        Answer::Unknown(why) => format!(
            "; it is held by a program that is not an oobfence daemon ({why}): `ss -ltnp` names it"
        ),
        Answer::Nobody(_) => String::new(),
    }
}

/// Starts everything the loop needs; the caches may not have synced yet.
pub(super) async fn start(cfg: Config) -> Result<Started, DaemonError> {
    let cfg = Arc::new(cfg);
    log_startup_warnings(&cfg);
    let (client, credentials) = cluster::connect_with_credentials(&cfg.kubernetes).await?;
    let shared = Shared::new(&cfg.datacenter);
    let reports = shared
        .report_requests
        .lock()
        .ok()
        .and_then(|mut r| r.take())
        .expect("a new Shared holds its report requests' receiver");
    shared.metrics.set_config_info(&cfg);
    shared.set_whoami(&cfg);

    let listener = match tokio::net::TcpListener::bind(cfg.server.listen).await {
        Ok(l) => l,
        Err(source) => {
            let holder = if source.kind() == std::io::ErrorKind::AddrInUse {
                address_holder(&cfg).await
            } else {
                String::new()
            };
            return Err(DaemonError::Listen {
                addr: cfg.server.listen,
                source,
                holder,
            });
        }
    };
    tracing::info!(listen = %cfg.server.listen, "serving /metrics, /healthz, /readyz, /nodes");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    spawn_token_expiry_watch(
        cfg.kubernetes.clone(),
        credentials.clone(),
        shared.clone(),
        stop_rx.clone(),
    );
    let http = tokio::spawn(crate::http::serve(
        listener,
        shared.clone(),
        stop_rx.clone(),
    ));

    let mut node_watch = watcher::Config::default();
    if let Some(sel) = &cfg.kubernetes.node_selector {
        node_watch = node_watch.labels(sel);
    }
    // A Node that changes is decided at once, not at the next tick: a pre-attested node is
    // fenced the moment it turns NotReady.
    let (changed_tx, changed) = mpsc::channel::<String>(4096);
    let changes_missed = Arc::new(AtomicBool::new(true));
    let nodes = spawn_node_cache(
        Api::<Node>::all(client.clone()),
        node_watch,
        shared.clone(),
        changed_tx,
        changes_missed.clone(),
    );
    let leases = spawn_lease_cache(
        Api::<Lease>::namespaced(client.clone(), cluster::NODE_LEASE_NAMESPACE),
        shared.clone(),
    );

    let (reads_tx, reads) = mpsc::channel(1024);
    let (actions_tx, actions) = mpsc::channel(1024);
    notify_systemd(&[sd_notify::NotifyState::Status(
        "listing nodes and leases from the Kubernetes API",
    )]);
    let sources = Arc::new(PowerSources::new(cfg.clone(), shared.metrics.ec2.clone()).await);
    let (journal, journal_writer) = Journal::start(
        cfg.journal.path.clone(),
        &cfg.datacenter,
        &cfg.digest,
        shared.metrics.journal_records.clone(),
    );
    tracing::info!(path = %cfg.journal.path.display(), "decision journal");
    let volumes = VolumeWatch::start(client.clone());
    crate::pause::spawn_watch(
        cfg.pause.clone(),
        cfg.datacenter.clone(),
        client.clone(),
        shared.clone(),
    );
    let leadership = cfg
        .ha
        .as_ref()
        .map(|ha| crate::leader::spawn(client.clone(), ha, &cfg.datacenter));
    if let Ok(mut l) = shared.leadership.write() {
        l.clone_from(&leadership);
    }
    let guard_store = cfg
        .guard_record
        .as_ref()
        .map(|at| cluster::GuardStore::new(client.clone(), at, &cfg.datacenter))
        .map(|s| match &cfg.ha {
            Some(ha) => s.with_write_timeout(ha.write_timeout()),
            None => s,
        });
    let mut cluster_writer = Cluster::new(client, &cfg.datacenter)
        .with_holds(holds_now(&cfg, &shared, leadership.clone()))
        .with_pause_configmap(cfg.pause.configmap.clone());
    if let (Some(l), Some(ha)) = (&leadership, &cfg.ha) {
        cluster_writer = cluster_writer.with_leadership(l.clone(), ha.write_timeout());
    }
    let daemon = Daemon {
        journal,
        volumes,
        sources,
        read_slots: ReadSlots::new(
            cfg.max_concurrent_reads,
            shared.metrics.power_reads_in_flight.clone(),
        ),
        cluster: cluster_writer,
        cfg,
        shared: shared.clone(),
        nodes: nodes.clone(),
        leases: leases.clone(),
        trackers: HashMap::new(),
        reads_tx,
        actions_tx,
        conflicts: HashMap::new(),
        conflicts_of: HashMap::new(),
        outlets: HashMap::new(),
        shared_uuids: uuids::SharedUuids::default(),
        wakeups: BinaryHeap::new(),
        calm: Calm::default(),
        guard_keeper: guard_record::Keeper::new(guard_store),
        leadership,
        guards_epoch: 0,
        told_leader: None,
        census_current: false,
        mapping_check_due: true,
        changes_missed,
        passes_since_mapping_check: 0,
        credentials,
    };
    Ok(Started {
        daemon,
        events: Events {
            reads,
            actions,
            changed,
            reports,
        },
        background: Background {
            stop_tx,
            http,
            journal_writer,
        },
    })
}

/// The holds on a node right before a write: the last pass's, and the pause file read now
/// (a pause placed a moment ago still stops the write).
fn holds_now(
    cfg: &Config,
    shared: &Arc<Shared>,
    leadership: Option<crate::leader::LeadershipHandle>,
) -> cluster::HoldsNow {
    let shared = shared.clone();
    let file = cfg.pause.file.clone();
    Arc::new(move |uid: &str| {
        // A uid no pass holds holds for (a Node just deleted): what holds every write.
        let mut holds = shared
            .holds
            .read()
            .ok()
            .and_then(|h| h.get(uid).cloned())
            .unwrap_or_else(|| Holds {
                write: shared.calm.read().ok().and_then(|c| c.write_hold()),
                ..Default::default()
            });
        if holds.write.is_none()
            && let Some(reason) = file.as_deref().and_then(crate::pause::read_file)
        {
            holds.write = Some(Hold {
                kind: HoldKind::Paused,
                reason: format!("writes are paused by an operator ({reason})"),
            });
        }
        // [ha]: leadership is a deadline, checked at the last moment.
        if holds.write.is_none()
            && let Some(why) = leadership
                .as_ref()
                .and_then(|l| l.read().ok().and_then(|l| l.standby_reason()))
        {
            holds.write = Some(Hold {
                kind: HoldKind::Standby,
                reason: why,
            });
        }
        holds
    })
}

/// Keeps `oobfence_kubeconfig_token_expiry_timestamp_seconds` current with the token the
/// requests carry: an inline token's is the one in `credentials` (a reload replaces it and
/// sets the metric at once); a token file may be replaced under the running daemon (kube
/// re-reads it), so it is read again every 10 minutes.
fn spawn_token_expiry_watch(
    k: crate::config::KubernetesConfig,
    credentials: cluster::Credentials,
    shared: Arc<Shared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut logged = None;
        loop {
            let expiry = if credentials.carries_token() {
                credentials.token_expiry()
            } else {
                let k2 = k.clone();
                tokio::task::spawn_blocking(move || {
                    crate::config::checks::configured_token_expiry(&k2)
                })
                .await
                .ok()
                .flatten()
            };
            shared
                .metrics
                .kubeconfig_token_expiry
                .set(expiry.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0));
            if let Some(t) = expiry
                && logged != Some(t)
            {
                logged = Some(t);
                let left = t.duration_since(crate::clock::now());
                if left < crate::config::checks::TOKEN_EXPIRY_WARNING {
                    tracing::warn!(expires = %t, "the kubeconfig's token expires in less than a week: mint a new one (oobfence make-kubeconfig)");
                } else {
                    tracing::info!(expires = %t, "the kubeconfig's token expires then");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(600)) => {}
                _ = stop.changed() => return,
            }
        }
    });
}

/// Watches `api`, hands every event to `apply`, and keeps the watch's health in `shared`
/// (what the guards' stale-view hold reads).
fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    shared: Arc<Shared>,
    what: &'static str,
    mut apply: impl FnMut(watcher::Event<K>) + Send + 'static,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    shared.watches.register(what);
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        // One line when a watch starts failing and one when it works again, not one per retry.
        let mut failing = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    // The watcher says Init before it asks the API server anything: no proof.
                    if !matches!(ev, watcher::Event::Init) {
                        shared.watches.answered(what, true);
                        if failing {
                            tracing::info!(watch = what, "watch works again");
                            failing = false;
                        }
                    }
                    apply(ev);
                }
                Err(e) => {
                    shared.watches.answered(what, false);
                    if failing {
                        tracing::debug!(watch = what, error = %WatchError(&e), "watch failed again");
                    } else {
                        tracing::warn!(watch = what, error = %WatchError(&e), "watch failed; retrying with backoff (logged again when it works)");
                        failing = true;
                    }
                }
            }
        }
    });
}

/// The Node cache ([`nodes`]); a Node that changes or goes is sent on `changed`, to be
/// decided at once. Where that cannot tell the loop (a full channel, a relist), `missed` says
/// so.
fn spawn_node_cache(
    api: Api<Node>,
    config: watcher::Config,
    shared: Arc<Shared>,
    changed: mpsc::Sender<String>,
    missed: Arc<AtomicBool>,
) -> Nodes {
    let (reader, mut writer) = nodes::nodes();
    spawn_watch(api, config, shared, "nodes", move |ev| {
        // A relist may have changed any node, unannounced.
        let relisted = matches!(ev, watcher::Event::InitDone);
        let told = match writer.apply(ev, nodes::keep) {
            // Full: the next tick decides it anyway, and checks every node's mapping.
            Some(name) => changed.try_send(name).is_ok(),
            None => !relisted,
        };
        if !told {
            missed.store(true, Ordering::Relaxed);
        }
    });
    reader
}

/// The Lease cache: each node's renewTime and duration ([`leases`]).
fn spawn_lease_cache(api: Api<Lease>, shared: Arc<Shared>) -> Leases {
    let (reader, mut writer) = leases::leases();
    spawn_watch(
        api,
        watcher::Config::default(),
        shared,
        "leases",
        move |ev| {
            writer.apply(ev, leases::keep);
        },
    );
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VolumeAttachments of a Node just deleted are written about a uid no pass holds
    /// holds for any more: the writer then asks what holds every write (a pause by the
    /// ConfigMap, a stale view), not nothing.
    #[test]
    fn a_uid_no_pass_holds_holds_for_gets_the_datacenters_write_hold() {
        let text = "datacenter = \"dc1\"\n[pause]\nfile = \"\"\n";
        let cfg = Config::parse(text, std::path::Path::new("dc1.toml")).unwrap();
        let shared = Shared::new("dc1");
        let holds = holds_now(&cfg, &shared, None);
        assert_eq!(holds("gone").write, None);
        shared.calm.write().unwrap().pause.by = vec!["ConfigMap oobfence/oobfence-pause".into()];
        let h = holds("gone").write.expect("held");
        assert_eq!(h.kind, HoldKind::Paused, "{}", h.reason);
        shared.calm.write().unwrap().pause.by.clear();
        shared.calm.write().unwrap().stale = Some("the watch of nodes is broken".into());
        assert_eq!(
            holds("gone").write.map(|h| h.kind),
            Some(HoldKind::StaleView)
        );
        // A node a pass decided keeps the holds that pass gave it.
        shared
            .holds
            .write()
            .unwrap()
            .insert("known".into(), Holds::default());
        assert_eq!(holds("known").write, None);
    }
}
