//! The daemon: watch Nodes and Leases, read power when the core asks, carry out its decisions.
//!
//! One loop owns all per-node state. Power reads and cluster writes run as tasks that report
//! back over channels, so one node's slow BMC or failing write never holds up another node:
//! reads are bounded in number (a semaphore) and in time (a deadline per read).
//!
//! This file is the loop: tick, evaluate each node, dispatch. What a pass remembers per node is
//! in `tracker`, the reads in `reads`, the writes in `writer`, and everything reported
//! about decisions (journal, metrics, identity) in `observe`.

mod observe;
mod reads;
mod tracker;
mod writer;

pub use crate::status::{LOOP_STALL, Shared};
pub use reads::read_once;
pub use tracker::mapping_conflicts;

use reads::{ReadDone, ReadPurpose, spawn_read};
use tracker::Tracker;
use writer::{ActionDone, action_label};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
use crate::decision::{self, Decision, MappingConflict, Rule, Step};
use crate::identity::{self, IdentityCheck};
use crate::journal::Journal;
use crate::metrics::{BackendLabels, ReadLabels, WouldActLabels};
use crate::power::{MappedSource, PowerSources, PowerState};
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
/// How often a healthy node's machine is read to learn (and re-check) that it is the node's:
/// a low rate, so that a wrong mapping shows up before the node ever fails.
const IDENTITY_REFRESH: Duration = Duration::from_secs(600);

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
}

/// Used by `check-config --probe`: a client for listing nodes.
pub async fn client_for(cfg: &Config) -> Result<Client, cluster::ClusterError> {
    cluster::connect(&cfg.kubernetes).await
}
