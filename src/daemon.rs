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
use crate::decision::{self, Decision, FenceAction, Rule, Step};
use crate::journal::{self, Journal, RecordKind};
use crate::metrics::{self, BackendLabels, FailingLabels, Metrics, ReadLabels, WouldActLabels};
use crate::power::{
    self, MappedSource, PowerReading, PowerSource, PowerSources, PowerState, ReadErrorKind,
};
use crate::report::{NodeReport, PowerSourceReport, ReportInputs};
use crate::volumes::VolumeWatch;

/// How often every node is re-evaluated even when nothing changed (time passing matters).
const TICK: Duration = Duration::from_secs(1);
/// Power reads kept per node: enough for any confirmation plus what `why` shows.
const READS_KEPT: usize = 16;
/// After a failed write, wait this long before trying again.
const ACTION_RETRY: Duration = Duration::from_secs(10);
/// A failed power read counts towards `power_sources_failing` for this long.
const FAILING_WINDOW: Duration = Duration::from_secs(600);
/// A delete_node fence stays in `fenced_since_timestamp_seconds` this long after the delete.
const DELETED_FENCE_KEPT: Duration = Duration::from_secs(3600);
/// At shutdown, queued journal records get this long to reach the disk.
const JOURNAL_FLUSH: Duration = Duration::from_secs(5);
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
    /// The refusal the node is in (see `journal::refusal`).
    refusal: Option<Rule>,
    /// The node's source, built for the providerID it was built with.
    source: Option<(Option<String>, Option<MappedSource>)>,
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
    step: Step,
    /// When a fence landed.
    fenced_at: Option<Timestamp>,
    /// VolumeAttachments pointing at the node when the fence was written.
    volume_attachments: Option<Vec<String>>,
}

pub struct Daemon {
    cfg: Arc<Config>,
    cluster: Cluster,
    shared: Arc<Shared>,
    nodes: Store<Node>,
    leases: Store<Lease>,
    trackers: HashMap<String, Tracker>,
    sources: Arc<PowerSources>,
    read_slots: Arc<Semaphore>,
    reads_tx: mpsc::Sender<ReadDone>,
    actions_tx: mpsc::Sender<ActionDone>,
    journal: Journal,
    volumes: VolumeWatch,
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
    let mut daemon = Daemon {
        journal,
        volumes,
        sources,
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
            drop(daemon);
            journal_writer.finish(JOURNAL_FLUSH).await;
            return Ok(());
        }
    }
    shared.synced.store(true, Ordering::Relaxed);
    tracing::info!(nodes = daemon.nodes.len(), "node cache synced");
    // READY=1 only now: both caches hold a full list, so the API server answered.
    let synced_status = format!(
        "node cache synced: {} nodes; starting the decision loop",
        daemon.nodes.len()
    );
    notify_systemd(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&synced_status),
    ]);

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
                // The keep-alive comes from this loop only, after a full pass: if a pass
                // hangs, systemd's WatchdogSec= expires and the unit is restarted.
                notify_systemd(&[sd_notify::NotifyState::Watchdog]);
            }
            Some(done) = reads_rx.recv() => daemon.read_done(done),
            Some(done) = actions_rx.recv() => daemon.action_done(done),
        }
    }
    tracing::info!("shutting down");
    notify_systemd(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
    let _ = stop_tx.send(true);
    let _ = http.await;
    drop(daemon);
    journal_writer.finish(JOURNAL_FLUSH).await;
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
        for node in &nodes {
            self.evaluate(node, now);
        }
        self.observe_all(&nodes, now);
        self.shared.metrics.nodes_watched.set(nodes.len() as i64);
        // Only a pass over a synced cache with the API answering counts as a sync.
        if self.shared.ready() {
            self.shared
                .metrics
                .last_sync
                .set(now.as_millisecond() as f64 / 1000.0);
        }
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
        let mut status = format!(
            "watching {} nodes, {} fenced, {} blocked, {} confirming",
            reports.len(),
            count("fenced"),
            count("blocked"),
            count("confirming")
        );
        if !self.shared.api_ok.load(Ordering::Relaxed) {
            status.push_str("; Kubernetes API unreachable, retrying");
        }
        notify_systemd(&[sd_notify::NotifyState::Status(&status)]);
    }

    /// The node's power source, built once per providerID (only EC2 uses it).
    fn source_for(&mut self, name: &str, provider_id: Option<&str>) -> Option<MappedSource> {
        let tracker = self.trackers.entry(name.to_string()).or_default();
        let key = provider_id.map(String::from);
        match &tracker.source {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let s = self.sources.for_node(name, provider_id);
                tracker.source = Some((key, s.clone()));
                s
            }
        }
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
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        let source = self.source_for(&name, provider_id.as_deref());
        let lease = self
            .leases
            .get(&ObjectRef::new(&name).within(cluster::NODE_LEASE_NAMESPACE));
        let facts = cluster::node_facts(node, lease.as_deref(), source.is_some());
        let policy = self.cfg.policy.clone();
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        let decision = decision::decide(&facts, &tracker.reads, &policy, now);

        // Power read wanted now?
        if let (Some(at), Some(src)) = (decision.next_read_at, &source)
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

        // Refusals (one Event and one journal record per episode), dry runs, fence metrics.
        self.observe_node(node, &facts, &decision, source.as_ref(), changed, now);

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
            let fencing = matches!(decision.step, Step::Fence(_));
            let inputs = self.journal_inputs(&name, &facts, source.as_ref(), fencing);
            self.spawn_action(node.clone(), uid.clone(), decision.clone(), inputs);
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
            power_source: source.as_ref().map(|s| PowerSourceReport {
                backend: s.source.backend().to_string(),
                address: s.source.address(),
            }),
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
        // Before the tracker lookup: a deleted node has no tracker, its volumes still count.
        self.volumes_after_action(&done);
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

    fn spawn_action(
        &self,
        node: Arc<Node>,
        uid: String,
        decision: Decision,
        inputs: journal::Inputs,
    ) {
        let cluster = self.cluster.clone();
        let shared = self.shared.clone();
        let journal = self.journal.clone();
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
                    .map(|r| {
                        let mut line =
                            format!("{} {} in {:.2}s", r.at, r.state, r.latency.as_secs_f64());
                        for d in &r.details {
                            line.push_str(&format!(" [{d}]"));
                        }
                        line
                    })
                    .collect()
            })
            .unwrap_or_default();
        let volume_watch = self.ec2_volume_watch(&node, &decision);
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
                Step::Fence(FenceAction::DeleteNode) => {
                    let result = match cluster.delete_node(&name, &uid).await {
                        Ok(w) => {
                            // The Node is gone: its VolumeAttachments can go now instead of
                            // after the attach/detach controller's 6-minute force-detach.
                            let vas = match cluster.delete_volume_attachments(&name).await {
                                Ok(v) => {
                                    for _ in &v {
                                        shared.metrics.action("delete_volumeattachment", true);
                                    }
                                    if v.is_empty() {
                                        "no VolumeAttachments to delete".to_string()
                                    } else {
                                        format!("VolumeAttachments deleted: {}", v.join(", "))
                                    }
                                }
                                Err(e) => {
                                    shared.metrics.action("delete_volumeattachment", false);
                                    format!(
                                        "VolumeAttachments NOT deleted ({e}): they are force-detached after 6 minutes"
                                    )
                                }
                            };
                            Ok(format!(
                                "Node deleted: {evidence}; bootID at fence {}; {vas}; reads (newest first): {}",
                                w.boot_id,
                                reads.join("; ")
                            ))
                        }
                        Err(e) => Err(e),
                    };
                    ("delete_node", result)
                }
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
            let done_at = Timestamp::now();
            let mut record = journal.record(
                &name,
                &uid,
                RecordKind::Action,
                decision.rule.name(),
                inputs,
            );
            record.action = label.to_string();
            let outcome = match result {
                Ok(message) => {
                    if let Some(w) = volume_watch {
                        tokio::spawn(w.run(cluster.clone(), node.clone(), shared.clone()));
                    }
                    tracing::warn!(node = %name, action = label, rule = decision.rule.name(), "{message}");
                    cluster
                        .event(&node, EventType::Normal, reason, &message)
                        .await;
                    record.event = reason.to_string();
                    record.result = "success".into();
                    record.message = message;
                    Ok(())
                }
                Err(e) => {
                    let message = format!("{label} failed: {e}");
                    tracing::error!(node = %name, action = label, error = %e, "action failed; will retry");
                    cluster
                        .event(&node, EventType::Warning, reasons::FENCE_FAILED, &message)
                        .await;
                    record.event = reasons::FENCE_FAILED.to_string();
                    record.result = "failure".into();
                    record.error = Some(e.to_string());
                    record.message = message.clone();
                    Err(message)
                }
            };
            let fenced_at = match (decision.step, &outcome) {
                (Step::Fence(action), Ok(())) => {
                    observe_fence(
                        &shared.metrics,
                        &name,
                        &uid,
                        action,
                        &record.inputs,
                        done_at,
                    );
                    Some(done_at)
                }
                (Step::Unfence, Ok(())) => {
                    if let Some(f) = &record.inputs.fence {
                        shared
                            .metrics
                            .fence_to_recovery
                            .observe(seconds_between(f.at, done_at));
                    }
                    None
                }
                _ => None,
            };
            let volume_attachments = record.inputs.volume_attachments.clone();
            journal.submit_wait(&record).await;
            let _ = tx
                .send(ActionDone {
                    node: name,
                    uid,
                    result: outcome,
                    step: decision.step,
                    fenced_at,
                    volume_attachments,
                })
                .await;
        });
    }
}

impl Daemon {
    /// For a fence of an EC2 instance that held data volumes: what to watch until they are
    /// released.
    fn ec2_volume_watch(&self, node: &Node, decision: &Decision) -> Option<Ec2VolumeWatch> {
        if !matches!(decision.step, Step::Fence(_)) {
            return None;
        }
        let reader = self.sources.ec2()?.clone();
        let aws = self.cfg.aws.as_ref()?;
        let name = node.name_any();
        if !self.sources.needs_node_data(&name) {
            return None;
        }
        let instance = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| power::ec2::instance_id_from_provider_id(p).ok())?;
        let last = self.trackers.get(&name)?.reads.last()?;
        let volumes = power::ec2::volume_ids(&last.details);
        if volumes.is_empty() {
            return None;
        }
        Some(Ec2VolumeWatch {
            reader,
            instance,
            volumes,
            warn_after: aws.volume_release_warning,
        })
    }
}

/// Follows a fenced instance's EBS volumes until they are detached from it: an Event when they
/// are released (with how long it took) and a warning Event if they are still attached
/// `warn_after` the fence.
struct Ec2VolumeWatch {
    reader: Arc<power::ec2::Ec2Reader>,
    instance: String,
    volumes: Vec<String>,
    warn_after: Duration,
}

impl Ec2VolumeWatch {
    /// Polling interval, and the bound on how long one watch lasts.
    const EVERY: Duration = Duration::from_secs(10);
    const GIVE_UP: Duration = Duration::from_secs(6 * 3600);

    async fn run(self, cluster: Cluster, node: Arc<Node>, shared: Arc<Shared>) {
        let started = Instant::now();
        let mut warned = false;
        let max_polls = (Self::GIVE_UP.as_secs() / Self::EVERY.as_secs()) as usize;
        for _ in 0..max_polls {
            tokio::time::sleep(Self::EVERY).await;
            let held = match self
                .reader
                .still_attached(&self.instance, &self.volumes)
                .await
            {
                Ok(h) => h,
                Err(e) => {
                    tracing::debug!(instance = %self.instance, error = %e, "volume check failed; retrying");
                    continue;
                }
            };
            let took = started.elapsed();
            if held.is_empty() {
                let msg = format!(
                    "EBS volumes {} detached from {} {:.0}s after the fence",
                    self.volumes.join(", "),
                    self.instance,
                    took.as_secs_f64()
                );
                tracing::info!(node = %node.name_any(), "{msg}");
                shared
                    .metrics
                    .fence_to_ebs_detached
                    .observe(took.as_secs_f64());
                cluster
                    .event(&node, EventType::Normal, reasons::VOLUMES_RELEASED, &msg)
                    .await;
                return;
            }
            if !warned && took >= self.warn_after {
                warned = true;
                let msg = format!(
                    "EBS volumes {} are still attached to {} {:.0}s after the fence: check the CSI driver and `kubectl get volumeattachment`",
                    held.join(", "),
                    self.instance,
                    took.as_secs_f64()
                );
                tracing::warn!(node = %node.name_any(), "{msg}");
                cluster
                    .event(
                        &node,
                        EventType::Warning,
                        reasons::VOLUMES_STILL_ATTACHED,
                        &msg,
                    )
                    .await;
            }
        }
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

/// Seconds from `earlier` to `later`; 0 when the clock says otherwise.
fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64().max(0.0)
}

fn unix_seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// Metrics of a fence that landed at `at`.
fn observe_fence(
    m: &Metrics,
    node: &str,
    uid: &str,
    action: FenceAction,
    inputs: &journal::Inputs,
    at: Timestamp,
) {
    if let Some(since) = inputs.not_ready_since {
        m.notready_to_fence.observe(seconds_between(since, at));
    }
    if action == FenceAction::DeleteNode {
        m.node_deleted_by_fence(node, uid, unix_seconds(at));
    }
}

/// What the daemon reports about its decisions and what followed them: the decision journal,
/// per-node metrics, VolumeAttachment release.
impl Daemon {
    fn journal_inputs(
        &self,
        name: &str,
        facts: &decision::NodeFacts,
        source: Option<&MappedSource>,
        with_volumes: bool,
    ) -> journal::Inputs {
        let reads = self
            .trackers
            .get(name)
            .map(|t| t.reads.as_slice())
            .unwrap_or(&[]);
        journal::Inputs::new(
            facts,
            reads,
            source.map(|s| format!("{} {}", s.source.backend(), s.source.address())),
            if with_volumes {
                self.volumes.attached_to(name)
            } else {
                None
            },
        )
    }

    /// Per node, every evaluation: fence age series, resumed volume tracking after a restart,
    /// and the journal record and Event of a refusal or a dry-run decision.
    fn observe_node(
        &mut self,
        node: &Arc<Node>,
        facts: &decision::NodeFacts,
        decision: &Decision,
        source: Option<&MappedSource>,
        changed: bool,
        now: Timestamp,
    ) {
        let name = node.name_any();
        let uid = node.uid().unwrap_or_default();
        let m = &self.shared.metrics;
        let taint_fence = facts.fence.as_ref().filter(|f| f.taint_present);
        m.set_fenced_since(&name, &uid, taint_fence.map(|f| unix_seconds(f.at)));
        m.set_taint_age(&name, taint_fence.map(|f| seconds_between(f.at, now)));
        if let Some(f) = taint_fence
            && facts.readiness != decision::Readiness::Ready
        {
            self.volumes.resume(&name, f.at);
        }

        let Some(tracker) = self.trackers.get_mut(&name) else {
            return;
        };
        let previous = tracker.refusal;
        let current = journal::refusal(decision.rule, previous);
        tracker.refusal = current;
        m.set_node_blocked(&name, current.and_then(metrics::blocked_reason));
        let started = current.is_some() && current != previous;
        let dry_run = changed && matches!(decision.step, Step::WouldFence(_) | Step::WouldUnfence);
        if !started && !dry_run {
            return;
        }
        let message = format!("{} (rule {})", decision.reason, decision.rule.name());
        let inputs = self.journal_inputs(&name, facts, source, false);
        let (kind, event, action, result) = match decision.step {
            Step::WouldFence(a) if dry_run => (
                RecordKind::DryRun,
                reasons::WOULD_FENCE,
                action_label(a),
                "not_written",
            ),
            Step::WouldUnfence if dry_run => (
                RecordKind::DryRun,
                reasons::WOULD_UNFENCE,
                "untaint",
                "not_written",
            ),
            _ => {
                self.spawn_event(node, EventType::Warning, reasons::BLOCKED, decision);
                (RecordKind::Refusal, reasons::BLOCKED, "none", "refused")
            }
        };
        let mut record = self
            .journal
            .record(&name, &uid, kind, decision.rule.name(), inputs);
        record.event = event.to_string();
        record.action = action.to_string();
        record.result = result.to_string();
        record.message = message;
        self.journal.submit(&record);
    }

    /// Every pass: the metrics that count over nodes, and volume release.
    fn observe_all(&mut self, nodes: &[Arc<Node>], now: Timestamp) {
        let m = &self.shared.metrics;
        let mut blocked: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut failing: BTreeMap<FailingLabels, i64> = BTreeMap::new();
        for t in self.trackers.values() {
            if let Some(reason) = t.refusal.and_then(metrics::blocked_reason) {
                *blocked.entry(reason).or_default() += 1;
            }
            if let Some(last) = t.reads.last()
                && let PowerState::Error { kind, .. } = &last.state
                && seconds_between(last.at, now) <= FAILING_WINDOW.as_secs_f64()
            {
                let backend = t
                    .source
                    .as_ref()
                    .and_then(|(_, s)| s.as_ref())
                    .map(|s| s.source.backend())
                    .unwrap_or("none");
                let labels = FailingLabels {
                    backend,
                    error_kind: kind.to_string(),
                };
                *failing.entry(labels).or_default() += 1;
            }
        }
        m.set_blocked_counts(&blocked);
        m.set_power_sources_failing(&failing);

        let (mut foreign_ready, mut foreign_not_ready) = (0, 0);
        for n in nodes {
            let f = cluster::node_facts(n, None, false);
            if f.foreign_out_of_service {
                if f.readiness == decision::Readiness::Ready {
                    foreign_ready += 1;
                } else {
                    foreign_not_ready += 1;
                }
            }
        }
        m.set_foreign_taints(foreign_ready, foreign_not_ready);
        m.prune_deleted_fences(DELETED_FENCE_KEPT);

        m.volume_watch_up.set(i64::from(self.volumes.watch_up()));
        for r in self.volumes.check(now) {
            m.fence_to_volumes_released.observe(r.after.as_secs_f64());
            m.set_fenced_volume_attachments(&r.node, None);
            let message = format!(
                "all {} VolumeAttachment(s) that pointed at the node when it was fenced are gone, {:.0}s after the fence: {}",
                r.names.len(),
                r.after.as_secs_f64(),
                r.names.join(", ")
            );
            tracing::info!(node = %r.node, after_s = r.after.as_secs(), "{message}");
            let inputs = journal::Inputs {
                volume_attachments: Some(r.names.clone()),
                ..Default::default()
            };
            let mut record = self.journal.record(
                &r.node,
                "",
                RecordKind::Observation,
                "volumes-released",
                inputs,
            );
            record.result = "observed".into();
            record.message = message;
            self.journal.submit(&record);
        }
        for (node, remaining) in self.volumes.pending() {
            m.set_fenced_volume_attachments(node, Some(remaining));
        }
    }

    fn volumes_after_action(&mut self, done: &ActionDone) {
        match (done.step, &done.result) {
            (Step::Fence(_), Ok(())) => {
                if let (Some(at), Some(names)) = (done.fenced_at, &done.volume_attachments) {
                    self.volumes.track(&done.node, at, names);
                }
            }
            (Step::Unfence | Step::ClearRecord, Ok(())) => {
                self.volumes.forget(&done.node);
                self.shared
                    .metrics
                    .set_fenced_volume_attachments(&done.node, None);
            }
            _ => {}
        }
    }
}
