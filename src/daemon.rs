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
use crate::config::{Config, Mapping};
use crate::decision::{
    self, Decision, FenceAction, IdentityBinding, MappingConflict, Readiness, Rule, Step,
};
use crate::identity::{self, IdentityCheck, Verdict};
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
/// How often a healthy node's machine is read to learn (and re-check) that it is the node's:
/// a low rate, so that a wrong mapping shows up before the node ever fails.
const IDENTITY_REFRESH: Duration = Duration::from_secs(600);

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
    /// The Lease renewTime last seen, and when (oobfence's clock) it was first seen.
    lease_seen: Option<(Option<Timestamp>, Timestamp)>,
    /// The last identity verdict a read of the node's machine gave.
    binding: Option<IdentityBinding>,
    /// When a healthy node's next identity read is due.
    identity_due: Option<Instant>,
    /// The bootID the kept reads were taken against.
    reads_boot_id: Option<String>,
}

impl Tracker {
    /// Brings what the tracker knows into the node's facts, and what the facts show into the
    /// tracker: when the Lease was seen renewed (oobfence's clock), the identity binding, and
    /// the reads — evidence about one NotReady period only, so a node seen Ready starts afresh
    /// (a fenced one keeps them: they are what lifts its fence).
    fn observe(&mut self, facts: &mut decision::NodeFacts, now: Timestamp) {
        facts.lease_renewal_seen = observe_lease(&mut self.lease_seen, facts.lease_renew_time, now);
        if facts.readiness == Readiness::Ready && facts.fence.is_none() {
            self.reads.clear();
        }
        // Off reads taken before the machine booted again say nothing about this boot: the
        // write would check the bootID anyway, but the decision must not count them either.
        if self.reads_boot_id.as_deref() != Some(facts.boot_id.as_str()) {
            if facts.fence.is_none() {
                self.reads.clear();
            }
            self.reads_boot_id = Some(facts.boot_id.clone());
        }
        facts.identity_binding = self.binding.clone();
    }
}

/// When oobfence saw the Lease take its current renewTime, by oobfence's own clock: the
/// kubelet's clock is never compared with ours (as the node lifecycle controller does). A Lease
/// seen for the first time counts as renewed now. `None` when the node has no Lease.
fn observe_lease(
    seen: &mut Option<(Option<Timestamp>, Timestamp)>,
    renew_time: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    renew_time?;
    match seen {
        Some((value, _)) if *value == renew_time => {}
        _ => *seen = Some((renew_time, now)),
    }
    seen.map(|(_, at)| at)
}

/// Why a read was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadPurpose {
    /// The decision asked for it (a NotReady or recovering node).
    Decision,
    /// A healthy node's identity check.
    Identity,
}

struct ReadDone {
    node: String,
    uid: String,
    reading: PowerReading,
    backend: &'static str,
    purpose: ReadPurpose,
}

struct ActionDone {
    node: String,
    uid: String,
    result: Result<(), String>,
    /// The write-time re-check refused: nothing was written; decide again at once.
    abandoned: bool,
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
    /// Nodes whose mapping cannot be trusted, recomputed every pass.
    conflicts: HashMap<String, MappingConflict>,
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
        conflicts: HashMap::new(),
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
    for b in cfg
        .bmc
        .iter()
        .filter(|b| b.identity == IdentityCheck::Unchecked)
    {
        tracing::warn!(
            entry = format!("bmc[{}]", b.index),
            address = %b.address,
            "identity = \"unchecked\" for this [[bmc]] entry: an Off read counts without the machine proving it is the node's; a wrong mapping can fence a running node"
        );
    }
    if let Some(a) = cfg
        .aws
        .as_ref()
        .filter(|a| a.identity == IdentityCheck::Unchecked)
    {
        tracing::warn!(
            region = %a.region,
            "identity = \"unchecked\" for [aws]: a stopped instance counts without its private address matching the node's"
        );
    }
}

/// Nodes whose config mapping cannot be trusted: an EC2 providerID whose zone is not in the
/// configured region, and several nodes that resolve to one machine (the same BMC and system,
/// the same instance). Both sides of a shared machine are blocked, not just the second.
pub fn mapping_conflicts<'a>(
    cfg: &Config,
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> HashMap<String, MappingConflict> {
    let mut conflicts = HashMap::new();
    let mut by_machine: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, provider_id) in nodes {
        let key = match cfg.mapping_for(name) {
            None => continue,
            Some(Mapping::Bmc(entry)) => entry.machine_key(name),
            Some(Mapping::Aws(aws)) => {
                let Some(pid) = provider_id else { continue };
                if let Some(problem) = power::ec2::zone_region_mismatch(pid, &aws.region) {
                    conflicts.insert(name.to_string(), MappingConflict::RegionMismatch(problem));
                    continue;
                }
                match power::ec2::instance_id_from_provider_id(pid) {
                    Ok(id) => format!("ec2 {id}"),
                    Err(_) => continue,
                }
            }
        };
        by_machine.entry(key).or_default().push(name);
    }
    for (machine, names) in by_machine {
        if names.len() < 2 {
            continue;
        }
        for name in &names {
            let others: Vec<&str> = names.iter().copied().filter(|n| n != name).collect();
            conflicts.insert(
                name.to_string(),
                MappingConflict::SharedMachine(format!(
                    "node {name} and node(s) {} all map to {machine}",
                    others.join(", ")
                )),
            );
        }
    }
    conflicts
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
        self.conflicts = mapping_conflicts(
            &self.cfg,
            nodes.iter().map(|n| {
                (
                    n.metadata.name.as_deref().unwrap_or(""),
                    cluster::provider_id(n),
                )
            }),
        );
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
        let mut facts = cluster::node_facts(node, lease.as_deref(), self.cluster.actor());
        facts.has_power_source = source.is_some();
        facts.identity_check = self
            .cfg
            .mapping_for(&name)
            .map(|m| m.identity())
            .unwrap_or_default();
        facts.mapping_conflict = self.conflicts.get(&name).cloned();
        let policy = self.cfg.policy.clone();
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.observe(&mut facts, now);
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
                ReadPurpose::Decision,
                self.read_slots.clone(),
                self.reads_tx.clone(),
            );
        } else if let Some(src) = &source
            && decision.rule == Rule::NodeReady
            && !tracker.read_in_flight
            && tracker.identity_due.is_none_or(|t| Instant::now() >= t)
        {
            // A healthy node: learn (and re-check) that its power source reads its machine.
            tracker.read_in_flight = true;
            tracker.identity_due = Some(Instant::now() + IDENTITY_REFRESH);
            spawn_read(
                name.clone(),
                uid.clone(),
                src.clone(),
                ReadPurpose::Identity,
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
        let node = self.nodes.get(&ObjectRef::new(&done.node));
        if let Some(node) = &node {
            let verdict = identity::verify(&cluster::node_identity(node), &done.reading.identity);
            self.learn_identity(node, verdict, done.reading.at);
        }
        if done.purpose == ReadPurpose::Decision
            && let Some(t) = self.trackers.get_mut(&done.node)
        {
            t.reads.push(done.reading);
            if t.reads.len() > READS_KEPT {
                t.reads.remove(0);
            }
        }
        // Decide again at once rather than at the next tick.
        if let Some(node) = node {
            self.evaluate(&node, Timestamp::now());
        }
    }

    /// Records what a read said about the node's machine. A match or a mismatch replaces the
    /// binding; "cannot tell" (a failed read, an instance that no longer exists) never erases
    /// an earlier match, since a "gone" answer relies on it. Changes are logged, journaled
    /// and, for a mismatch, an Event.
    fn learn_identity(&mut self, node: &Arc<Node>, verdict: Verdict, at: Timestamp) {
        let name = node.name_any();
        let Some(t) = self.trackers.get_mut(&name) else {
            return;
        };
        let previous = t.binding.as_ref().map(|b| b.verdict.clone());
        let keep_previous = matches!(verdict, Verdict::Unverifiable(_))
            && previous
                .as_ref()
                .is_some_and(|p| !matches!(p, Verdict::Unverifiable(_)));
        if keep_previous {
            return;
        }
        t.binding = Some(IdentityBinding {
            at,
            verdict: verdict.clone(),
        });
        let changed = previous.as_ref().map(Verdict::label) != Some(verdict.label());
        if !changed {
            return;
        }
        let uid = node.uid().unwrap_or_default();
        let message = format!("identity of the node's machine: {verdict}");
        let rule = match verdict {
            Verdict::Match(_) => {
                tracing::info!(node = %name, "{message}");
                "identity-verified"
            }
            Verdict::Mismatch(_) => {
                tracing::error!(node = %name, "{message}: the config maps this node to another machine; it will never be fenced until fixed");
                let cluster = self.cluster.clone();
                let node = node.clone();
                let event = format!("{message} (rule identity-mismatch)");
                tokio::spawn(async move {
                    cluster
                        .event(
                            &node,
                            EventType::Warning,
                            reasons::IDENTITY_MISMATCH,
                            &event,
                        )
                        .await
                });
                "identity-mismatch"
            }
            Verdict::Unverifiable(_) => {
                tracing::warn!(node = %name, "{message}");
                "identity-unverified"
            }
        };
        let mut record = self.journal.record(
            &name,
            &uid,
            RecordKind::Observation,
            rule,
            journal::Inputs::default(),
        );
        record.result = "observed".into();
        record.message = message;
        self.journal.submit(&record);
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
            Err(e) if done.abandoned => {
                // Nothing was written: decide again on the next pass, with fresh inputs.
                t.last_action_error = Some(e);
                t.acted_on = None;
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
            let guard = decision.guard.clone();
            let no_guard = || {
                cluster::ClusterError::Precondition(
                    "the decision carries no write guard; nothing written".into(),
                )
            };
            let (label, result) = match decision.step {
                Step::Fence(FenceAction::Taint) => (
                    "taint",
                    match &guard {
                        Some(g) => cluster.apply_fence_taint(&name, g, &evidence).await,
                        None => Err(no_guard()),
                    }
                    .map(|w| {
                        format!(
                            "out-of-service taint added: {evidence}; bootID at fence {}; reads (newest first): {}",
                            w.boot_id,
                            reads.join("; ")
                        )
                    }),
                ),
                Step::Fence(FenceAction::DeleteNode) => {
                    let result = match &guard {
                        Some(g) => delete_node_and_attachments(&cluster, &shared, &name, g).await,
                        None => Err(no_guard()),
                    }
                    .map(|(w, vas)| {
                        format!(
                            "Node deleted: {evidence}; bootID at fence {}; {vas}; reads (newest first): {}",
                            w.boot_id,
                            reads.join("; ")
                        )
                    });
                    ("delete_node", result)
                }
                Step::Unfence => (
                    "untaint",
                    match &guard {
                        Some(g) => cluster.remove_fence_taint(&name, g).await,
                        None => Err(no_guard()),
                    }
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
            let abandoned = matches!(result, Err(cluster::ClusterError::Abandoned(_)));
            shared.metrics.action_result(
                label,
                match (&result, abandoned) {
                    (Ok(_), _) => "success",
                    (Err(_), true) => "abandoned",
                    (Err(_), false) => "failure",
                },
            );
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
                Err(e) if abandoned => {
                    // Not a failure: the re-check did its job. Logged and journaled; the node
                    // is decided again on fresh inputs.
                    let message = format!("{label} not written: {e}; deciding again");
                    tracing::warn!(node = %name, action = label, "{message}");
                    record.result = "abandoned".into();
                    record.error = Some(e.to_string());
                    record.message = message.clone();
                    Err(message)
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
                    abandoned,
                    step: decision.step,
                    fenced_at,
                    volume_attachments,
                })
                .await;
        });
    }
}

/// Deletes the Node (after the write-time re-check) and then exactly the VolumeAttachments
/// that pointed at it just before: recorded by name and uid, so that a node re-registered under
/// the same name keeps its own. Returns the write and a sentence about the attachments.
async fn delete_node_and_attachments(
    cluster: &Cluster,
    shared: &Shared,
    name: &str,
    guard: &decision::WriteGuard,
) -> Result<(cluster::FenceWrite, String), cluster::ClusterError> {
    let recorded = cluster.volume_attachments_of(name).await;
    let w = cluster.delete_node(name, guard).await?;
    // The Node is gone: its VolumeAttachments can go now instead of after the attach/detach
    // controller's 6-minute force-detach.
    let sentence = match recorded {
        Err(e) => format!(
            "VolumeAttachments NOT deleted (could not list them before the delete: {e}): they are force-detached after 6 minutes"
        ),
        Ok(recorded) => match cluster.delete_volume_attachments(&recorded).await {
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
        },
    };
    Ok((w, sentence))
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
    purpose: ReadPurpose,
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
                purpose,
            })
            .await;
    });
}

/// One read with a hard deadline; a panic in the backend becomes an error read.
pub async fn read_once(source: &Arc<dyn PowerSource>, deadline: Duration) -> PowerReading {
    // The read's time is when it started: whatever it says was true no later than that.
    let at = Timestamp::now();
    let started = Instant::now();
    let s = source.clone();
    let mut task = tokio::spawn(async move { s.read_reply().await });
    let reply = match tokio::time::timeout(deadline, &mut task).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(join)) => power::Reply::without_identity(
            PowerState::error(
                ReadErrorKind::BadReply,
                format!("power source failed internally: {join}"),
            ),
            "the read failed",
        ),
        Err(_) => {
            task.abort();
            power::Reply::without_identity(
                PowerState::error(
                    ReadErrorKind::Timeout,
                    format!("no answer within {deadline:?}"),
                ),
                "the read timed out",
            )
        }
    };
    PowerReading {
        at,
        latency: started.elapsed(),
        state: reply.state,
        details: reply.details,
        identity: reply.identity,
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

        let mut verdicts: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut unchecked = 0;
        for (name, t) in &self.trackers {
            let Some(mapping) = self.cfg.mapping_for(name) else {
                continue;
            };
            if mapping.identity() == IdentityCheck::Unchecked {
                unchecked += 1;
            }
            let verdict = t.binding.as_ref().map_or("unknown", |b| b.verdict.label());
            *verdicts.entry(verdict).or_default() += 1;
        }
        m.set_identity_counts(&verdicts, unchecked);
        let mut problems = std::collections::BTreeSet::new();
        for (name, t) in &self.trackers {
            if t.binding
                .as_ref()
                .is_some_and(|b| b.verdict.label() == "mismatch")
            {
                problems.insert((name.clone(), "identity-mismatch"));
            }
        }
        for (name, c) in &self.conflicts {
            let problem = match c {
                MappingConflict::RegionMismatch(_) => "region-mismatch",
                MappingConflict::SharedMachine(_) => "shared-machine",
            };
            problems.insert((name.clone(), problem));
        }
        m.set_identity_problems(&problems);

        let (mut foreign_ready, mut foreign_not_ready) = (0, 0);
        for n in nodes {
            let f = cluster::node_facts(n, None, self.cluster.actor());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// A Lease renewal is dated by when oobfence saw it, never by the kubelet's clock: a
    /// kubelet whose clock is a year behind still counts as renewing.
    #[test]
    fn lease_renewals_are_dated_by_oobfences_clock() {
        let mut seen = None;
        let year_ago = t(-365 * 86_400);
        // First sighting: counts as renewed now (the node lifecycle controller does the same).
        assert_eq!(observe_lease(&mut seen, Some(year_ago), t(0)), Some(t(0)));
        // Unchanged: still the time it was first seen.
        assert_eq!(observe_lease(&mut seen, Some(year_ago), t(30)), Some(t(0)));
        // Renewed, by a clock still a year behind: seen now.
        let renewed = year_ago + jiff::SignedDuration::from_secs(10);
        assert_eq!(observe_lease(&mut seen, Some(renewed), t(40)), Some(t(40)));
        // No Lease: nothing to judge by.
        assert_eq!(observe_lease(&mut seen, None, t(50)), None);
    }

    /// Reads are evidence about one NotReady period: whatever clock the controller stamps
    /// `lastTransitionTime` with, a node seen Ready in between leaves none behind.
    #[test]
    fn reads_are_dropped_whenever_the_node_is_seen_ready() {
        use crate::identity::MachineIdentity;
        let off = |at: i64| PowerReading {
            at: t(at),
            latency: Duration::from_millis(5),
            state: PowerState::Off,
            details: Vec::new(),
            identity: MachineIdentity::unreported("test"),
        };
        let mut tracker = Tracker {
            reads: vec![off(10), off(15)],
            ..Default::default()
        };
        let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
        facts.readiness = Readiness::NotReady {
            // A controller clock far ahead of ours: a time filter would keep stale reads.
            since: t(-3600),
        };
        tracker.reads_boot_id = Some(facts.boot_id.clone());
        tracker.observe(&mut facts, t(20));
        assert_eq!(tracker.reads.len(), 2, "still the same NotReady period");
        // The node reports another bootID while still NotReady: it booted since the reads.
        facts.boot_id = "boot-2".into();
        tracker.observe(&mut facts, t(20));
        assert!(tracker.reads.is_empty(), "reads of another boot");
        tracker.reads = vec![off(17), off(19)];
        tracker.observe(&mut facts, t(20));
        assert_eq!(tracker.reads.len(), 2, "reads of this boot stay");
        facts.readiness = Readiness::Ready;
        tracker.observe(&mut facts, t(21));
        assert!(tracker.reads.is_empty(), "seen Ready: the period is over");
        // A fenced node seen Ready keeps its reads: they are what lifts the fence.
        tracker.reads = vec![off(30)];
        facts.fence = Some(decision::FenceRecord {
            at: t(25),
            boot_id: "b".into(),
            taint_present: true,
            ours: true,
        });
        tracker.observe(&mut facts, t(31));
        assert_eq!(tracker.reads.len(), 1);
    }

    struct SlowOff;

    impl PowerSource for SlowOff {
        fn backend(&self) -> &'static str {
            "test"
        }
        fn address(&self) -> String {
            "slow".into()
        }
        fn read(&self) -> futures::future::BoxFuture<'_, PowerState> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                PowerState::Off
            })
        }
    }

    /// A read is dated when it started: an answer that took 1.5 s proves the machine was off
    /// no later than the request, not at its arrival.
    #[tokio::test]
    async fn a_read_is_dated_when_it_started() {
        let before = Timestamp::now();
        let source: Arc<dyn PowerSource> = Arc::new(SlowOff);
        let r = read_once(&source, Duration::from_secs(5)).await;
        let after = Timestamp::now();
        assert_eq!(r.state, PowerState::Off);
        assert!(r.latency >= Duration::from_millis(1500), "{:?}", r.latency);
        assert!(r.at >= before, "{} < {before}", r.at);
        assert!(
            after.duration_since(r.at) >= jiff::SignedDuration::from_millis(1500),
            "read dated {} but it ended at {after}",
            r.at
        );
    }

    fn config(dir: &std::path::Path, body: &str) -> Config {
        let pw = dir.join("pw");
        std::fs::write(&pw, "x\n").unwrap();
        let text = format!(
            "datacenter = \"dc1\"\n{}",
            body.replace("PW", &pw.display().to_string())
        );
        Config::parse(&text, std::path::Path::new("dc1.toml")).unwrap()
    }

    #[test]
    fn nodes_mapped_to_one_machine_are_all_in_conflict() {
        let dir = tempfile::tempdir().unwrap();
        // One template whose {node} lands in the path: two node names that a glob maps to the
        // same BMC host and the same system.
        let cfg = config(
            dir.path(),
            r#"
[[bmc]]
nodes = ["rack1-*"]
protocol = "redfish"
address = "https://bmc.example"
system = "/redfish/v1/Systems/{node}"
username = "u"
password_file = "PW"
[[bmc]]
nodes = ["db-1"]
protocol = "redfish"
address = "https://BMC.example:443/"
system = "/redfish/v1/Systems/rack1-01/"
username = "u"
password_file = "PW"
[aws]
region = "us-east-1"
nodes = ["ip-*"]
"#,
        );
        let conflicts = mapping_conflicts(
            &cfg,
            [
                ("rack1-01", None),
                ("rack1-02", None),
                ("db-1", None),
                ("ip-10-0-0-1", Some("aws:///us-east-1a/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-2", Some("aws:///us-east-1b/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-3", Some("aws:///us-east-1a/i-0aaaaaaaaaaaaaaa3")),
            ],
        );
        for n in ["rack1-01", "db-1", "ip-10-0-0-1", "ip-10-0-0-2"] {
            assert!(
                matches!(conflicts.get(n), Some(MappingConflict::SharedMachine(_))),
                "{n}: {conflicts:?}"
            );
        }
        assert!(!conflicts.contains_key("rack1-02"));
        assert!(!conflicts.contains_key("ip-10-0-0-3"));
    }

    /// The review's first path: a providerID in us-west-2 read with region us-east-1 would be
    /// "not in the answer", twice, and the node deleted while its instance runs.
    #[test]
    fn an_instance_of_another_region_is_a_conflict_not_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "[aws]\nregion = \"us-east-1\"\nnodes = [\"ip-*\"]\n",
        );
        let conflicts = mapping_conflicts(
            &cfg,
            [
                ("ip-10-0-0-1", Some("aws:///us-west-2a/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-2", Some("aws:///us-east-1c/i-0aaaaaaaaaaaaaaa2")),
            ],
        );
        match conflicts.get("ip-10-0-0-1") {
            Some(MappingConflict::RegionMismatch(d)) => {
                assert!(d.contains("us-west-2a") && d.contains("us-east-1"), "{d}")
            }
            other => panic!("{other:?}"),
        }
        assert!(!conflicts.contains_key("ip-10-0-0-2"));
    }
}
