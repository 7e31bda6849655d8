//! The daemon: watch Nodes and Leases, read power when the core asks, carry out its decisions.
//!
//! One loop owns all per-node state. Power reads and cluster writes run as tasks that report
//! back over channels, so one node's slow BMC or failing write never holds up another node:
//! reads are bounded in number (a semaphore) and in time (a deadline per read).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{Semaphore, mpsc};

use crate::cluster::{self, Cluster, EventType, reasons};
use crate::config::Config;
use crate::decision::{self, Decision, FenceAction, NodeState, Rule, Step};
use crate::metrics::{BackendLabels, BlockedLabels, Metrics, ReadLabels, WouldActLabels};
use crate::power::{self, PowerReading, PowerSource, PowerState, ReadErrorKind};
use crate::report::{NodeReport, PowerSourceReport, ReportInputs};

/// How often every node is re-evaluated even when nothing changed (time passing matters).
const TICK: Duration = Duration::from_secs(1);
/// Power reads kept per node: enough for any confirmation plus what `why` shows.
const READS_KEPT: usize = 16;
/// After a failed write, wait this long before trying again.
const ACTION_RETRY: Duration = Duration::from_secs(10);
/// `/healthz` fails when the decision loop has not completed a pass for this long.
pub const LOOP_STALL: Duration = Duration::from_secs(30);

/// State shared with the HTTP server.
pub struct Shared {
    pub datacenter: String,
    pub metrics: Metrics,
    pub reports: RwLock<BTreeMap<String, NodeReport>>,
    /// Both caches (Nodes, Leases) completed their initial list.
    pub synced: AtomicBool,
    /// The last watch call succeeded.
    pub api_ok: AtomicBool,
    pub last_pass: Mutex<Option<Instant>>,
}

impl Shared {
    pub fn new(datacenter: &str) -> Arc<Shared> {
        Arc::new(Shared {
            datacenter: datacenter.to_string(),
            metrics: Metrics::new(),
            reports: RwLock::new(BTreeMap::new()),
            synced: AtomicBool::new(false),
            api_ok: AtomicBool::new(false),
            last_pass: Mutex::new(None),
        })
    }

    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && self.api_ok.load(Ordering::Relaxed)
    }

    pub fn loop_alive(&self) -> bool {
        self.last_pass
            .lock()
            .map(|t| t.is_some_and(|t| t.elapsed() < LOOP_STALL))
            .unwrap_or(false)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("cannot listen on {addr} ([server] listen): {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A power source for one node, built once from the config.
#[derive(Clone)]
pub struct MappedSource {
    pub source: Arc<dyn PowerSource>,
    /// Hard bound on one read, above the backend's own timeout.
    pub deadline: Duration,
}

/// Builds the power source the config maps `node` to; `Ok(None)` when no entry matches.
pub fn power_source_for(cfg: &Config, node: &str) -> Result<Option<MappedSource>, String> {
    let Some(entry) = cfg.bmc_for(node) else {
        return Ok(None);
    };
    let source = power::source_for(entry, node)
        .map_err(|e| format!("bmc[{}] for node {node}: {e}", entry.index))?;
    Ok(Some(MappedSource {
        source,
        deadline: entry.timeout + Duration::from_secs(2),
    }))
}

#[derive(Default)]
struct Tracker {
    uid: String,
    reads: Vec<PowerReading>,
    read_in_flight: bool,
    action_in_flight: bool,
    /// The cached resourceVersion an action was taken on: no new action until the cache moves
    /// past it, so a write that succeeded is not repeated from a stale cache.
    acted_on: Option<String>,
    retry_after: Option<Instant>,
    last_action_error: Option<String>,
    last_rule: Option<Rule>,
    source: Option<Result<Option<MappedSource>, String>>,
}

struct ReadDone {
    node: String,
    uid: String,
    reading: PowerReading,
    backend: &'static str,
}

struct ActionDone {
    node: String,
    uid: String,
    result: Result<(), String>,
}

pub struct Daemon {
    cfg: Arc<Config>,
    cluster: Cluster,
    shared: Arc<Shared>,
    nodes: Store<Node>,
    leases: Store<Lease>,
    trackers: HashMap<String, Tracker>,
    read_slots: Arc<Semaphore>,
    reads_tx: mpsc::Sender<ReadDone>,
    actions_tx: mpsc::Sender<ActionDone>,
}

/// Runs the daemon until `shutdown` completes.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let cfg = Arc::new(cfg);
    log_startup_warnings(&cfg);
    let client = cluster::connect(&cfg.kubernetes).await?;
    let shared = Shared::new(&cfg.datacenter);

    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: cfg.server.listen,
            source,
        })?;
    tracing::info!(listen = %cfg.server.listen, "serving /metrics, /healthz, /readyz, /nodes");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http = tokio::spawn(crate::http::serve(
        listener,
        shared.clone(),
        stop_rx.clone(),
    ));

    let mut node_watch = watcher::Config::default();
    if let Some(sel) = &cfg.kubernetes.node_selector {
        node_watch = node_watch.labels(sel);
    }
    let nodes = spawn_reflector(
        Api::<Node>::all(client.clone()),
        node_watch,
        shared.clone(),
        "nodes",
    );
    let leases = spawn_reflector(
        Api::<Lease>::namespaced(client.clone(), cluster::NODE_LEASE_NAMESPACE),
        watcher::Config::default(),
        shared.clone(),
        "leases",
    );

    let (reads_tx, mut reads_rx) = mpsc::channel(1024);
    let (actions_tx, mut actions_rx) = mpsc::channel(1024);
    let mut daemon = Daemon {
        read_slots: Arc::new(Semaphore::new(cfg.max_concurrent_reads)),
        cluster: Cluster::new(client, &cfg.datacenter),
        cfg,
        shared: shared.clone(),
        nodes: nodes.clone(),
        leases: leases.clone(),
        trackers: HashMap::new(),
        reads_tx,
        actions_tx,
    };

    tokio::pin!(shutdown);
    let synced = async {
        let _ = nodes.wait_until_ready().await;
        let _ = leases.wait_until_ready().await;
    };
    tokio::select! {
        _ = synced => {}
        _ = &mut shutdown => {
            let _ = stop_tx.send(true);
            let _ = http.await;
            return Ok(());
        }
    }
    shared.synced.store(true, Ordering::Relaxed);
    tracing::info!(nodes = daemon.nodes.len(), "node cache synced");
    notify_systemd(&[sd_notify::NotifyState::Ready]);

    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {
                daemon.evaluate_all();
                if last_status.elapsed() >= Duration::from_secs(10) {
                    last_status = Instant::now();
                    daemon.report_status();
                }
                notify_systemd(&[sd_notify::NotifyState::Watchdog]);
            }
            Some(done) = reads_rx.recv() => daemon.read_done(done),
            Some(done) = actions_rx.recv() => daemon.action_done(done),
        }
    }
    tracing::info!("shutting down");
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    let _ = stop_tx.send(true);
    let _ = http.await;
    Ok(())
}

fn notify_systemd(states: &[sd_notify::NotifyState<'_>]) {
    // Outside systemd there is no NOTIFY_SOCKET and this does nothing.
    let _ = sd_notify::notify(states);
}

fn log_startup_warnings(cfg: &Config) {
    for b in &cfg.bmc {
        if b.tls == crate::config::BmcTls::Insecure {
            tracing::warn!(
                entry = format!("bmc[{}]", b.index),
                address = %b.address,
                "TLS certificate verification is OFF for this [[bmc]] entry (tls_insecure = true): anyone on the management network could answer as this BMC"
            );
        }
    }
    if cfg.policy.dry_run {
        tracing::warn!(
            "dry_run = true: decisions are logged and reported, nothing is written to any Node"
        );
    }
    if cfg.policy.confirm_reads < 2 {
        tracing::warn!("confirm_reads = 1: a single Off read is enough to fence");
    }
}

fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    shared: Arc<Shared>,
    what: &'static str,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => shared.api_ok.store(true, Ordering::Relaxed),
                Err(e) => {
                    shared.api_ok.store(false, Ordering::Relaxed);
                    tracing::warn!(watch = what, error = %e, "watch failed; retrying with backoff");
                }
            }
        }
    });
    reader
}

fn is_blocking(rule: Rule) -> bool {
    matches!(
        rule,
        Rule::PowerOn
            | Rule::PowerUnknown
            | Rule::NoPowerSource
            | Rule::LeaseRenewedRecently
            | Rule::RecoveredSameBootId
    )
}

impl Daemon {
    fn evaluate_all(&mut self) {
        let now = Timestamp::now();
        let nodes = self.nodes.state();
        let names: std::collections::HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        // Forget nodes that are gone.
        let gone: Vec<String> = self
            .trackers
            .keys()
            .filter(|k| !names.contains(*k))
            .cloned()
            .collect();
        for name in gone {
            self.trackers.remove(&name);
            self.shared.metrics.forget_node(&name);
            if let Ok(mut r) = self.shared.reports.write() {
                r.remove(&name);
            }
        }
        let mut blocked: BTreeMap<&'static str, i64> = BTreeMap::new();
        for node in &nodes {
            let d = self.evaluate(node, now);
            if d.state == NodeState::Blocked {
                *blocked.entry(d.rule.name()).or_default() += 1;
            }
        }
        for rule in [
            Rule::PowerOn,
            Rule::PowerUnknown,
            Rule::NoPowerSource,
            Rule::LeaseRenewedRecently,
        ] {
            self.shared
                .metrics
                .blocked
                .get_or_create(&BlockedLabels {
                    reason: rule.name(),
                })
                .set(blocked.get(rule.name()).copied().unwrap_or(0));
        }
        self.shared.metrics.nodes_watched.set(nodes.len() as i64);
        self.shared
            .metrics
            .last_sync
            .set(now.as_millisecond() as f64 / 1000.0);
        if let Ok(mut t) = self.shared.last_pass.lock() {
            *t = Some(Instant::now());
        }
    }

    fn report_status(&self) {
        let reports = match self.shared.reports.read() {
            Ok(r) => r,
            Err(_) => return,
        };
        let count = |s: &str| reports.values().filter(|r| r.state == s).count();
        let status = format!(
            "watching {} nodes, {} fenced, {} blocked, {} confirming",
            reports.len(),
            count("fenced"),
            count("blocked"),
            count("confirming")
        );
        notify_systemd(&[sd_notify::NotifyState::Status(&status)]);
    }

    fn source_for(&mut self, name: &str) -> Result<Option<MappedSource>, String> {
        let cfg = self.cfg.clone();
        let tracker = self.trackers.entry(name.to_string()).or_default();
        tracker
            .source
            .get_or_insert_with(|| power_source_for(&cfg, name))
            .clone()
    }

    fn evaluate(&mut self, node: &Arc<Node>, now: Timestamp) -> Decision {
        let name = node.name_any();
        let uid = node.uid().unwrap_or_default();
        {
            let t = self.trackers.entry(name.clone()).or_default();
            if t.uid != uid {
                // A new object under this name: nothing from the old one carries over.
                *t = Tracker {
                    uid: uid.clone(),
                    ..Default::default()
                };
            }
        }
        let source = self.source_for(&name);
        let lease = self
            .leases
            .get(&ObjectRef::new(&name).within(cluster::NODE_LEASE_NAMESPACE));
        let has_source = matches!(source, Ok(Some(_)));
        let facts = cluster::node_facts(node, lease.as_deref(), has_source);
        let policy = self.cfg.policy.clone();
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        let mut decision = decision::decide(&facts, &tracker.reads, &policy, now);
        if let Err(e) = &source
            && facts.readiness != decision::Readiness::Ready
        {
            // The mapping exists but the source cannot be built (bad CA file...): say so.
            decision.reason = format!("{} (power source error: {e})", decision.reason);
        }

        // Power read wanted now?
        if let (Some(at), Ok(Some(src))) = (decision.next_read_at, &source)
            && at <= now
            && !tracker.read_in_flight
        {
            tracker.read_in_flight = true;
            spawn_read(
                name.clone(),
                uid.clone(),
                src.clone(),
                self.read_slots.clone(),
                self.reads_tx.clone(),
            );
        }

        // Transitions: log once, emit Events for refusals that matter.
        let changed = tracker.last_rule != Some(decision.rule);
        if changed {
            tracker.last_rule = Some(decision.rule);
            tracing::info!(
                node = %name,
                state = decision.state.as_str(),
                rule = decision.rule.name(),
                reason = %decision.reason,
                "decision"
            );
            if is_blocking(decision.rule) && facts.readiness != decision::Readiness::Ready
                || decision.rule == Rule::RecoveredSameBootId
            {
                self.spawn_event(node, EventType::Warning, reasons::BLOCKED, &decision);
            }
            match decision.step {
                Step::WouldFence(a) => {
                    self.shared
                        .metrics
                        .would_act
                        .get_or_create(&WouldActLabels {
                            action: action_label(a),
                        })
                        .inc();
                    self.spawn_event(node, EventType::Normal, reasons::WOULD_FENCE, &decision);
                }
                Step::WouldUnfence => {
                    self.shared
                        .metrics
                        .would_act
                        .get_or_create(&WouldActLabels { action: "untaint" })
                        .inc();
                    self.spawn_event(node, EventType::Normal, reasons::WOULD_UNFENCE, &decision);
                }
                _ => {}
            }
        }

        // Writes.
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        let rv = node.resource_version();
        let may_act = !tracker.action_in_flight
            && tracker.retry_after.is_none_or(|t| Instant::now() >= t)
            && (tracker.acted_on.is_none() || tracker.acted_on != rv);
        if may_act
            && matches!(
                decision.step,
                Step::Fence(_) | Step::Unfence | Step::ClearRecord
            )
        {
            tracker.action_in_flight = true;
            tracker.acted_on = rv;
            self.spawn_action(node.clone(), uid.clone(), decision.clone());
        }

        self.shared.metrics.set_node_state(&name, decision.state);
        let tracker = &self.trackers[&name];
        let report = NodeReport::new(ReportInputs {
            node: &name,
            datacenter: &self.cfg.datacenter,
            now,
            facts: &facts,
            decision: &decision,
            reads: &tracker.reads,
            power_source: match &source {
                Ok(Some(s)) => Some(PowerSourceReport {
                    backend: s.source.backend().to_string(),
                    address: s.source.address(),
                }),
                _ => None,
            },
            dry_run: self.cfg.policy.dry_run,
            read_in_flight: tracker.read_in_flight,
            last_action_error: tracker.last_action_error.clone(),
        });
        if let Ok(mut r) = self.shared.reports.write() {
            r.insert(name, report);
        }
        decision
    }

    fn read_done(&mut self, done: ReadDone) {
        let m = &self.shared.metrics;
        let error_kind = match &done.reading.state {
            PowerState::Error { kind, .. } => kind.to_string(),
            _ => String::new(),
        };
        m.power_reads
            .get_or_create(&ReadLabels {
                backend: done.backend,
                result: done.reading.state.label(),
                error_kind,
            })
            .inc();
        m.power_read_duration
            .get_or_create(&BackendLabels {
                backend: done.backend,
            })
            .observe(done.reading.latency.as_secs_f64());
        tracing::debug!(
            node = %done.node,
            backend = done.backend,
            state = %done.reading.state,
            latency_ms = done.reading.latency.as_millis() as u64,
            "power read"
        );
        let Some(t) = self.trackers.get_mut(&done.node) else {
            return;
        };
        if t.uid != done.uid {
            return;
        }
        t.read_in_flight = false;
        t.reads.push(done.reading);
        if t.reads.len() > READS_KEPT {
            t.reads.remove(0);
        }
        // Decide again at once rather than at the next tick.
        if let Some(node) = self.nodes.get(&ObjectRef::new(&done.node)) {
            self.evaluate(&node, Timestamp::now());
        }
    }

    fn action_done(&mut self, done: ActionDone) {
        let Some(t) = self.trackers.get_mut(&done.node) else {
            return;
        };
        if t.uid != done.uid {
            return;
        }
        t.action_in_flight = false;
        match done.result {
            Ok(()) => {
                t.last_action_error = None;
                t.retry_after = None;
            }
            Err(e) => {
                t.last_action_error = Some(e);
                t.acted_on = None;
                t.retry_after = Some(Instant::now() + ACTION_RETRY);
            }
        }
    }

    fn spawn_event(&self, node: &Arc<Node>, kind: EventType, reason: &'static str, d: &Decision) {
        let cluster = self.cluster.clone();
        let node = node.clone();
        let message = format!("{} (rule {})", d.reason, d.rule.name());
        tokio::spawn(async move { cluster.event(&node, kind, reason, &message).await });
    }

    fn spawn_action(&self, node: Arc<Node>, uid: String, decision: Decision) {
        let cluster = self.cluster.clone();
        let shared = self.shared.clone();
        let tx = self.actions_tx.clone();
        let name = node.name_any();
        let reads: Vec<String> = self
            .trackers
            .get(&name)
            .map(|t| {
                t.reads
                    .iter()
                    .rev()
                    .take(4)
                    .map(|r| format!("{} {} in {:.2}s", r.at, r.state, r.latency.as_secs_f64()))
                    .collect()
            })
            .unwrap_or_default();
        tokio::spawn(async move {
            let evidence = format!("{} (rule {})", decision.reason, decision.rule.name());
            let (label, result) = match decision.step {
                Step::Fence(FenceAction::Taint) => (
                    "taint",
                    cluster
                        .apply_fence_taint(&name, &uid, &evidence)
                        .await
                        .map(|w| {
                            format!(
                                "out-of-service taint added: {evidence}; bootID at fence {}; reads (newest first): {}",
                                w.boot_id,
                                reads.join("; ")
                            )
                        }),
                ),
                Step::Fence(FenceAction::DeleteNode) => (
                    "delete_node",
                    cluster.delete_node(&name, &uid).await.map(|w| {
                        format!(
                            "Node deleted: {evidence}; bootID at fence {}; reads (newest first): {}",
                            w.boot_id,
                            reads.join("; ")
                        )
                    }),
                ),
                Step::Unfence => (
                    "untaint",
                    cluster
                        .remove_fence_taint(&name, &uid)
                        .await
                        .map(|()| format!("out-of-service taint removed: {evidence}")),
                ),
                Step::ClearRecord => (
                    "clear_record",
                    cluster
                        .clear_fence_record(&name, &uid)
                        .await
                        .map(|()| format!("fence record removed: {evidence}")),
                ),
                _ => return,
            };
            shared.metrics.action(label, result.is_ok());
            let reason = match decision.step {
                Step::Fence(_) => reasons::FENCED,
                Step::Unfence => reasons::UNFENCED,
                _ => reasons::RECORD_CLEARED,
            };
            let outcome = match result {
                Ok(message) => {
                    tracing::warn!(node = %name, action = label, rule = decision.rule.name(), "{message}");
                    cluster
                        .event(&node, EventType::Normal, reason, &message)
                        .await;
                    Ok(())
                }
                Err(e) => {
                    let message = format!("{label} failed: {e}");
                    tracing::error!(node = %name, action = label, error = %e, "action failed; will retry");
                    cluster
                        .event(&node, EventType::Warning, reasons::FENCE_FAILED, &message)
                        .await;
                    Err(message)
                }
            };
            let _ = tx
                .send(ActionDone {
                    node: name,
                    uid,
                    result: outcome,
                })
                .await;
        });
    }
}

fn action_label(a: FenceAction) -> &'static str {
    match a {
        FenceAction::Taint => "taint",
        FenceAction::DeleteNode => "delete_node",
    }
}

fn spawn_read(
    node: String,
    uid: String,
    src: MappedSource,
    slots: Arc<Semaphore>,
    tx: mpsc::Sender<ReadDone>,
) {
    tokio::spawn(async move {
        let _permit = slots.acquire_owned().await;
        let reading = read_once(&src.source, src.deadline).await;
        let _ = tx
            .send(ReadDone {
                node,
                uid,
                reading,
                backend: src.source.backend(),
            })
            .await;
    });
}

/// One read with a hard deadline; a panic in the backend becomes an error read.
pub async fn read_once(source: &Arc<dyn PowerSource>, deadline: Duration) -> PowerReading {
    let started = Instant::now();
    let s = source.clone();
    let mut task = tokio::spawn(async move { s.read_detailed().await });
    let (state, details) = match tokio::time::timeout(deadline, &mut task).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(join)) => (
            PowerState::error(
                ReadErrorKind::BadReply,
                format!("power source failed internally: {join}"),
            ),
            Vec::new(),
        ),
        Err(_) => {
            task.abort();
            (
                PowerState::error(
                    ReadErrorKind::Timeout,
                    format!("no answer within {deadline:?}"),
                ),
                Vec::new(),
            )
        }
    };
    PowerReading {
        at: Timestamp::now(),
        latency: started.elapsed(),
        state,
        details,
    }
}

/// Used by `check-config --probe`: a client for listing nodes.
pub async fn client_for(cfg: &Config) -> Result<Client, cluster::ClusterError> {
    cluster::connect(&cfg.kubernetes).await
}
