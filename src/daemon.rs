//! The daemon: watch Nodes and Leases, read power when the core asks, carry out its decisions.
//!
//! One loop owns all per-node state. Power reads and cluster writes run as tasks that report
//! back over channels, so one node's slow BMC or failing write never holds up another node:
//! reads are bounded in number (a semaphore) and in time (a deadline per read).
//!
//! This file is the loop: tick, evaluate each node, dispatch. What it starts with (the client,
//! the watches, the HTTP server, the journal, the elector...) is set up in `start`; what a pass
//! remembers per node is in `tracker`, the reads in `reads`, the writes in `writer`, and
//! everything reported about decisions (journal, metrics, identity) in `observe`.

mod guard_record;
mod observe;
mod reads;
mod reload;
mod start;
mod tracker;
mod uuids;
mod writer;

pub use crate::status::{LOOP_STALL, Shared};
pub use reads::read_once;
pub use tracker::mapping_conflicts;

use reads::{ReadDone, ReadPurpose, ReadSlots, spawn_read};
use tracker::Tracker;
use writer::{ActionDone, action_label};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;

use crate::cluster::{self, Cluster, EventType, reasons};
use crate::config::Config;
use crate::decision::holds::{Calm, Census, CensusNode, GuardPolicy, View};
use crate::decision::{self, Decision, MappingConflict, Readiness, Rule, Step};
use crate::identity;
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
/// A healthy node's power source whose last read failed is read again this soon: a freeze
/// (too many sources failing) thaws once they answer, and a broken BMC shows before its node
/// fails.
const FAILED_SOURCE_RETRY: Duration = Duration::from_secs(15);

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
    read_slots: ReadSlots,
    reads_tx: mpsc::Sender<ReadDone>,
    actions_tx: mpsc::Sender<ActionDone>,
    journal: Journal,
    volumes: VolumeWatch,
    /// Nodes whose mapping cannot be trusted, recomputed whenever the node names or their
    /// providerIDs change (`conflicts_of`: the names and providerIDs they were computed on).
    conflicts: HashMap<String, MappingConflict>,
    conflicts_of: HashMap<String, Option<String>>,
    /// Nodes that report another Node's system UUID: it proves neither machine.
    shared_uuids: uuids::SharedUuids,
    /// The guards' memory: storms, freezes, the fence budget.
    calm: Calm,
    /// Its record on the cluster, for a restart or a new leader.
    guard_keeper: guard_record::Keeper,
    /// `[ha]`: whether this instance may write.
    leadership: Option<crate::leader::LeadershipHandle>,
    /// Counts the passes where what the guards hold changed (pause, view, standby, a storm,
    /// a freeze, the budget, a lease storm): every node is then decided again.
    guards_epoch: u64,
    /// Nodes to decide again at a set time (a grace ends, a confirming read is due), soonest
    /// first: so that a node becomes eligible when its waits end, not at the next tick.
    /// An entry no longer its tracker's `wake_at` is stale and skipped.
    wakeups: BinaryHeap<Reverse<(Timestamp, String)>>,
    /// The token every request carries; a reload replaces it.
    credentials: cluster::Credentials,
}

/// Runs the daemon until `shutdown` completes: everything started ([`start::start`]), the
/// caches synced, then the loop.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let start::Started {
        mut daemon,
        mut events,
        background,
    } = start::start(cfg).await?;
    let (nodes, leases) = (daemon.nodes.clone(), daemon.leases.clone());
    let shared = daemon.shared.clone();

    tokio::pin!(shutdown);
    let synced = async {
        let _ = nodes.wait_until_ready().await;
        let _ = leases.wait_until_ready().await;
    };
    tokio::select! {
        _ = synced => {}
        _ = &mut shutdown => {
            background.stop(daemon).await;
            return Ok(());
        }
    }
    shared.synced.store(true, Ordering::Relaxed);
    tracing::info!(nodes = daemon.nodes.len(), "node cache synced");
    daemon.restore_guards(Timestamp::now()).await;
    // READY=1 only now: both caches hold a full list, so the API server answered.
    let synced_status = format!(
        "node cache synced: {} nodes; starting the decision loop",
        daemon.nodes.len()
    );
    notify_systemd(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&synced_status),
    ]);

    shared
        .metrics
        .config_reload_time
        .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
    // `systemctl reload` sends SIGHUP (ExecReload=): the config and its secrets are read again.
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let (reloads_tx, mut reloads_rx) = mpsc::channel(4);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = Instant::now() - Duration::from_secs(3600);
    loop {
        let wake = daemon.next_wakeup();
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(wake) => daemon.wake_due(),
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
            Some(done) = events.reads.recv() => daemon.read_done(done),
            Some(name) = events.changed.recv() => daemon.node_changed(&name),
            Some(done) = events.actions.recv() => daemon.action_done(done),
            Some(()) = async {
                match hangups.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                notify_systemd(&[sd_notify::NotifyState::Reloading]);
                let tx = reloads_tx.clone();
                let (running, stats) = (daemon.cfg.clone(), daemon.shared.metrics.ec2.clone());
                let credentials = daemon.credentials.clone();
                tokio::spawn(async move {
                    let _ = tx.send(reload::prepare(running, stats, credentials).await).await;
                });
            }
            Some(prepared) = reloads_rx.recv() => {
                let result = prepared.and_then(|p| daemon.apply_reload(p));
                let m = &daemon.shared.metrics;
                match result {
                    Ok(summary) => {
                        m.config_reload_ok.set(1);
                        m.config_reload_time.set(Timestamp::now().as_millisecond() as f64 / 1000.0);
                        tracing::info!("{summary}");
                    }
                    Err(why) => {
                        m.config_reload_ok.set(0);
                        tracing::error!("config reload refused, the daemon runs on with the config it had: {why}");
                    }
                }
                notify_systemd(&[sd_notify::NotifyState::Ready]);
            }
        }
    }
    tracing::info!("shutting down");
    notify_systemd(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
    background.stop(daemon).await;
    Ok(())
}

fn notify_systemd(states: &[sd_notify::NotifyState<'_>]) {
    // Outside systemd there is no NOTIFY_SOCKET and this does nothing.
    let _ = sd_notify::notify(states);
}

fn log_startup_warnings(cfg: &Config) {
    // The same findings `check-config` prints, one line each: WARN, or INFO for a note.
    for f in crate::config::checks::warnings(cfg) {
        if f.severity == crate::config::checks::Severity::Note {
            tracing::info!("{}: {}", f.key, f.problem);
        } else {
            tracing::warn!("{}: {}", f.key, f.problem);
        }
    }
}

impl Daemon {
    fn evaluate_all(&mut self) {
        let now = Timestamp::now();
        let nodes = self.nodes.state();
        // Forget nodes that are gone. Every tracker was made for a node of the cache, so a gone
        // one leaves more trackers than nodes (a pass late at worst, when a new node has no
        // tracker yet): only then is it worth looking for it.
        let gone: Vec<String> = if self.trackers.len() > nodes.len() {
            let names: std::collections::HashSet<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            self.trackers
                .keys()
                .filter(|k| !names.contains(k.as_str()))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        for name in gone {
            if let Some(t) = self.trackers.remove(&name)
                && let Ok(mut h) = self.shared.holds.write()
            {
                h.remove(&t.uid);
            }
            self.shared.metrics.forget_node(&name);
            if let Ok(mut r) = self.shared.reports.write() {
                r.remove(&name);
            }
        }
        // The mapping's conflicts depend on the node names and providerIDs alone: worked out
        // again only when those change, not on every pass over thousands of nodes.
        let mapped_nodes = || {
            nodes.iter().map(|n| {
                (
                    n.metadata.name.as_deref().unwrap_or(""),
                    cluster::provider_id(n),
                )
            })
        };
        let changed = self.conflicts_of.len() != nodes.len()
            || mapped_nodes()
                .any(|(name, pid)| self.conflicts_of.get(name).map(Option::as_deref) != Some(pid));
        if changed {
            self.conflicts = mapping_conflicts(&self.cfg, mapped_nodes());
            self.conflicts_of = mapped_nodes()
                .map(|(name, pid)| (name.to_string(), pid.map(String::from)))
                .collect();
        }
        let newly_shared = self.shared_uuids.update(nodes.iter().map(|n| {
            (
                n.metadata.name.as_deref().unwrap_or(""),
                n.status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map_or("", |i| i.system_uuid.as_str()),
            )
        }));
        self.report_shared_uuids(&nodes, &newly_shared);
        self.update_guards(&nodes, now);
        for node in &nodes {
            if !self.still_quiet(node, now) {
                self.evaluate(node, now);
            }
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

    /// Counts the datacenter and brings the guards up to date, before any node is decided.
    fn update_guards(&mut self, nodes: &[Arc<Node>], now: Timestamp) {
        let g = &self.cfg.guards;
        let census_nodes: Vec<CensusNode> = nodes
            .iter()
            .map(|n| {
                let tracker = n
                    .metadata
                    .name
                    .as_deref()
                    .and_then(|name| self.trackers.get(name));
                let failing = tracker.and_then(|t| {
                    t.last_read
                        .filter(|(at, _)| decision_elapsed(*at, now) <= FAILING_WINDOW)
                        .map(|(_, failure)| failure.is_some())
                });
                // The Lease as the last pass (or this one's quiet check) saw it.
                let lease = tracker.and_then(|t| {
                    decision::lease_state(t.last_alive(), t.lease_duration, &self.cfg.policy, now)
                });
                CensusNode {
                    uid: n.metadata.uid.as_deref().unwrap_or_default().into(),
                    lease,
                    domain: g
                        .failure_domain_label
                        .as_deref()
                        .and_then(|label| n.labels().get(label))
                        .map(|d| d.as_str().into()),
                    unhealthy: matches!(cluster::readiness(n), Readiness::NotReady { .. }),
                    source_failing: failing,
                }
            })
            .collect();
        let census = Census::count(&census_nodes, g.failure_domain_label.is_some());
        let view = View {
            broken_watches: self.shared.watches.broken(),
            last_round_trip: self.shared.last_round_trip.lock().ok().and_then(|t| *t),
        };
        let pause = self
            .shared
            .pause
            .read()
            .map(|p| p.clone())
            .unwrap_or_default();
        let before = self.calm.clone();
        self.calm.update(&census, &view, pause, g, now);
        // Fences on the Nodes count against the budget whoever of this daemon (or its [ha]
        // group) wrote them: after a restart, or for a standby that took over.
        for n in nodes {
            if let Some(f) = cluster::fence_record(n, self.cluster.actor())
                && f.ours
                && decision_elapsed(f.at, now) < g.fence_budget_window
            {
                self.calm.record_fence(&n.uid().unwrap_or_default(), f.at);
            }
        }
        let leadership = self
            .leadership
            .as_ref()
            .and_then(|l| l.read().ok().map(|l| l.clone()));
        self.calm.standby = leadership.as_ref().and_then(|l| l.standby_reason());
        self.keep_guard_record(now);
        let g = &self.cfg.guards;
        self.shared.metrics.set_leadership(leadership.as_ref());
        self.log_guard_changes(&before);
        if guards_summary(&before, g) != guards_summary(&self.calm, g) {
            self.guards_epoch += 1;
        }
        self.shared.metrics.set_guards(&self.calm, g, now);
        if let Ok(mut c) = self.shared.calm.write() {
            *c = self.calm.clone();
        }
    }

    /// One log line for each guard that starts or ends.
    fn log_guard_changes(&self, before: &Calm) {
        if before.stale.is_none()
            && let Some(why) = &self.calm.stale
        {
            tracing::error!(why = %why, "view of the cluster is STALE: no writes until it is fresh again");
        }
        // [ha]: a leader whose renewals do not come back in time stops by its own clock,
        // without any answer to say so: say it here.
        match (&before.standby, &self.calm.standby) {
            (None, Some(why)) if self.leadership.is_some() => {
                tracing::warn!(why = %why, "standby: this instance writes nothing")
            }
            (Some(_), None) => tracing::warn!("this instance writes again: it holds the Lease"),
            _ => {}
        }
        if before.stale.is_some() && self.calm.stale.is_none() {
            tracing::warn!(
                "view of the cluster is fresh again; reads from before now do not count"
            );
        }
        match (before.lease_storm_since, self.calm.lease_storm_since) {
            (None, Some(_)) => {
                tracing::error!(
                    leases = self.calm.leases.0,
                    late = self.calm.leases_late,
                    stale = self.calm.leases.1,
                    "LEASE STORM: most Leases went unrenewed at once; that is the control plane (or oobfence's view of it) not hearing the kubelets, not the machines: no power is read ahead of NotReady until it passes"
                )
            }
            (Some(_), None) => tracing::warn!(
                stale = self.calm.leases.1,
                "lease storm over: power is read ahead of NotReady again"
            ),
            _ => {}
        }
        for (scope, st) in &self.calm.scopes {
            let old = before.scopes.get(scope);
            let was_storm = old.is_some_and(|o| o.storm_since.is_some());
            let was_frozen = old.is_some_and(|o| o.frozen_since.is_some());
            let c = &st.count;
            match (was_storm, st.storm_since.is_some()) {
                (false, true) => {
                    tracing::error!(scope = %scope, unhealthy = c.unhealthy, nodes = c.nodes, "STORM: too many NotReady nodes; no new fence in this scope")
                }
                (true, false) => {
                    tracing::warn!(scope = %scope, unhealthy = c.unhealthy, nodes = c.nodes, "storm over; fences resume after the cooldown")
                }
                _ => {}
            }
            match (was_frozen, st.frozen_since.is_some()) {
                (false, true) => {
                    tracing::error!(scope = %scope, failing = c.sources_failing, read = c.sources_read, "FROZEN: too many power sources fail at once (oobfence is likely cut off); no new fence in this scope")
                }
                (true, false) => {
                    tracing::warn!(scope = %scope, "freeze over; reads from before now do not count")
                }
                _ => {}
            }
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
        if !self.shared.watches.all_ok() {
            status.push_str("; Kubernetes API unreachable, retrying");
        }
        if let Some(l) = self.leadership.as_ref().and_then(|l| l.read().ok()) {
            if l.may_write() {
                status.push_str(&format!("; role leader (term {})", l.term));
            } else if l.duplicate_identity {
                status.push_str(&format!(
                    "; role standby: ANOTHER PROCESS renews the Lease as {} (duplicate [ha] identity)",
                    l.identity
                ));
            } else {
                status.push_str(&format!(
                    "; role standby (Lease held by {})",
                    l.holder.as_deref().unwrap_or("nobody")
                ));
            }
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

    /// Whether a node decided healthy is still so without deciding it again: the same Node
    /// object, nothing in flight, no identity read due, and its Lease, observed here so that
    /// renewals keep being dated by this pass, not stale. Thousands of healthy nodes then cost
    /// a lookup each per pass.
    fn still_quiet(&mut self, node: &Node, now: Timestamp) -> bool {
        let Some(name) = node.metadata.name.as_deref() else {
            return false;
        };
        let Some(t) = self.trackers.get_mut(name) else {
            return false;
        };
        let quiet = match (&t.quiet, node.metadata.resource_version.as_deref()) {
            (Some(q), Some(rv)) => {
                q.resource_version == rv
                    && q.guards_epoch == self.guards_epoch
                    && q.at.elapsed() < tracker::QUIET_REFRESH
            }
            _ => false,
        };
        // A node without a power source has no identity to read.
        let mapped = matches!(t.source, Some((_, Some(_))));
        let identity_due = mapped && t.identity_due.is_none_or(|due| Instant::now() >= due);
        if !quiet || t.read_in_flight || t.action_in_flight || identity_due {
            return false;
        }
        // The Lease's key is kept: building it (two Strings) for every node every pass showed.
        let lease_ref = t
            .lease_ref
            .get_or_insert_with(|| ObjectRef::new(name).within(cluster::NODE_LEASE_NAMESPACE));
        let lease = self.leases.get(lease_ref);
        let Some(renew) = lease.as_deref().and_then(cluster::lease_renewed) else {
            return false;
        };
        tracker::observe_lease(&mut t.lease_seen, Some(renew), now);
        decision::lease_silence(t.last_alive(), t.lease_duration, &self.cfg.policy, now).is_none()
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
        facts.identity.uuid_shared_with = self.shared_uuids.of(&name);
        facts.has_power_source = source.is_some();
        facts.identity_check = self
            .trackers
            .get_mut(&name)
            .and_then(|t| {
                *t.mapping_identity
                    .get_or_insert_with(|| self.cfg.mapping_for(&name).map(|m| m.identity()))
            })
            .unwrap_or_default();
        facts.off_witness = self.trackers.get_mut(&name).and_then(|t| {
            *t.mapping_witness
                .get_or_insert_with(|| self.cfg.mapping_for(&name).and_then(|m| m.off_witness()))
        });
        facts.mapping_conflict = self.conflicts.get(&name).cloned();
        facts.holds = self.calm.holds(
            failure_domain(node, self.cfg.guards.failure_domain_label.as_deref()).as_deref(),
            &uid,
            &self.cfg.guards,
            now,
        );
        if let Ok(mut h) = self.shared.holds.write() {
            h.insert(uid.clone(), facts.holds.clone());
        }
        let policy = self.cfg.policy.clone();
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.observe(&mut facts, now);
        let newly_proven = match tracker.off_while_alive.as_mut() {
            Some(o)
                if !o.reported && facts.off_while_alive.as_ref().is_some_and(|f| f.proven()) =>
            {
                o.reported = true;
                Some((o.read_at, o.signs, o.gone))
            }
            _ => None,
        };
        if let Some((read_at, signs, gone)) = newly_proven {
            self.report_off_while_alive(node, read_at, signs, gone);
        }
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.lease_duration = facts.lease_duration;
        let decision = decision::decide(&facts, &tracker.reads, &policy, now);

        // Power read wanted now?
        if let (Some(at), Some(src)) = (decision.next_read_at, &source)
            && at <= now
            && !tracker.read_in_flight
        {
            tracker.read_in_flight = true;
            spawn_read(
                tracker.read_for(&name),
                src.clone(),
                ReadPurpose::Decision,
                facts.readiness == Readiness::Ready,
                self.read_slots.clone(),
                self.reads_tx.clone(),
            );
        } else if let Some(src) = &source
            && decision.rule == Rule::NodeReady
            && !tracker.read_in_flight
            && tracker.identity_due.is_none_or(|t| Instant::now() >= t)
            && self.read_slots.identity_room()
        {
            // A healthy node: learn (and re-check) that its power source answers, for its
            // machine, and says it runs.
            tracker.read_in_flight = true;
            tracker.identity_due = Some(Instant::now() + jittered(self.cfg.health_read_interval));
            spawn_read(
                tracker.read_for(&name),
                src.clone(),
                ReadPurpose::Health,
                true,
                self.read_slots.clone(),
                self.reads_tx.clone(),
            );
        }

        // Transitions: log once, emit Events for refusals that matter.
        let changed = tracker.last_rule != Some(decision.rule);
        if changed {
            tracker.last_rule = Some(decision.rule);
            if refuses_a_fence(&decision) {
                tracing::warn!(
                    node = %name,
                    state = decision.state.as_str(),
                    rule = decision.rule.name(),
                    reason = %decision.reason,
                    "decision: fencing refused"
                );
            } else {
                tracing::info!(
                    node = %name,
                    state = decision.state.as_str(),
                    rule = decision.rule.name(),
                    reason = %decision.reason,
                    "decision"
                );
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
            if fencing {
                // Counted now, so that the next node of this very pass sees the budget spent,
                // and recorded on the cluster alongside the write.
                self.calm.record_fence(&uid, now);
                self.keep_guard_record(now);
            }
            let inputs = self.journal_inputs(&name, &facts, source.as_ref(), fencing);
            self.spawn_action(node.clone(), uid.clone(), decision.clone(), inputs);
        }

        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        let wake = [decision.next_read_at, decision.decide_again_at]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min();
        if let Some(at) = wake
            && tracker.wake_at != wake
        {
            tracker.wake_at = wake;
            self.wakeups.push(Reverse((at, name.clone())));
        }
        tracker.quiet = (decision.rule == Rule::NodeReady
            && decision.state == decision::NodeState::Healthy
            && facts.fence.is_none()
            && facts.lease_renew_time.is_some())
        .then(|| tracker::Quiet {
            resource_version: node.resource_version().unwrap_or_default(),
            at: Instant::now(),
            guards_epoch: self.guards_epoch,
        });
        if tracker.metric_state != Some(decision.state) {
            tracker.metric_state = Some(decision.state);
            self.shared.metrics.set_node_state(&name, decision.state);
        }
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
                last_answer: tracker.last_answer,
                last_read: tracker.last_read.map(|(at, _)| at),
                last_read_failed: tracker.last_read.is_some_and(|(_, e)| e.is_some()),
                off_while_alive: facts.off_while_alive.clone(),
            }),
            dry_run: self.cfg.policy.dry_run,
            read_in_flight: tracker.read_in_flight,
            last_action_error: tracker.last_action_error.clone(),
            lease_stale_after: self.cfg.policy.pre_attest_after.map(|r| {
                r.of(facts
                    .lease_duration
                    .unwrap_or(decision::DEFAULT_LEASE_DURATION))
            }),
        });
        if let Ok(mut r) = self.shared.reports.write() {
            r.insert(name, report);
        }
        decision
    }

    /// A Node changed in the cache: decide it now. Only a node the last pass saw (its guards
    /// and census are counted per pass); a new one waits for the next tick.
    /// When the soonest wakeup is due (far ahead when none is).
    fn next_wakeup(&self) -> tokio::time::Instant {
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        let Some(Reverse((at, _))) = self.wakeups.peek() else {
            return far.into();
        };
        let wait = at.duration_since(Timestamp::now());
        let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
        (now + wait).min(far).into()
    }

    /// Decides again every node whose wakeup is due.
    fn wake_due(&mut self) {
        let now = Timestamp::now();
        while let Some(Reverse((at, _))) = self.wakeups.peek()
            && *at <= now
        {
            let Some(Reverse((at, name))) = self.wakeups.pop() else {
                break;
            };
            let Some(t) = self.trackers.get_mut(&name) else {
                continue;
            };
            if t.wake_at != Some(at) {
                continue;
            }
            t.wake_at = None;
            if let Some(node) = self.nodes.get(&ObjectRef::new(&name)) {
                self.evaluate(&node, now);
            }
        }
    }

    fn node_changed(&mut self, name: &str) {
        if !self.trackers.contains_key(name) {
            return;
        }
        if let Some(node) = self.nodes.get(&ObjectRef::new(name)) {
            self.evaluate(&node, Timestamp::now());
        }
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
        if !t.takes_read(&done.uid, done.generation) {
            // Sent to the source a reload replaced: no evidence about the node's machine now.
            tracing::debug!(node = %done.node, "power read from before a reload remapped the node dropped");
            return self.node_changed(&done.node);
        }
        let failure = match &done.reading.state {
            PowerState::Error { kind, .. } => Some(*kind),
            _ => None,
        };
        let failed = failure.is_some();
        // One line when a source starts failing (or fails another way) and one when it answers
        // again, not one per retry: the classified reason is what the operator acts on.
        let failed_before = t.last_read.and_then(|(_, f)| f);
        match (&done.reading.state, failed_before) {
            (PowerState::Error { kind, detail }, before) if before != Some(*kind) => {
                tracing::warn!(
                    node = %done.node,
                    backend = done.backend,
                    error = %kind,
                    "power source read failed: {detail} (logged again when it answers or fails otherwise)"
                );
            }
            (PowerState::Error { .. }, _) => {}
            (_, Some(_)) => {
                tracing::info!(node = %done.node, backend = done.backend, "power source answers again");
            }
            (_, None) => {}
        }
        t.last_read = Some((done.reading.at, failure));
        if !failed {
            t.last_answer = Some(done.reading.at);
        }
        t.power_answered(
            &done.reading.state,
            done.reading.at,
            done.ready_when_started,
            Timestamp::now(),
        );
        m.power_source_answered(
            &done.node,
            done.backend,
            (!failed).then(|| done.reading.at.as_millisecond() as f64 / 1000.0),
        );
        if failed && done.purpose == ReadPurpose::Health {
            t.identity_due = Some(Instant::now() + FAILED_SOURCE_RETRY);
        }
        let node = self.nodes.get(&ObjectRef::new(&done.node));
        if let Some(node) = &node {
            let verdict = identity::verify(&self.node_identity(node), &done.reading.identity);
            let reader = done.reading.reader.clone();
            self.learn_identity(node, verdict, done.reading.at, &reader);
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
        if matches!(done.step, Step::Fence(_)) && done.result.is_err() {
            // Nothing was written: the budget gets its place back.
            self.calm.forget_fence(&done.uid);
        }
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

/// What of the guards can change a healthy node's decision or report: whether each hold is
/// on, not the counts behind it.
fn guards_summary<'a>(c: &'a Calm, policy: &GuardPolicy) -> impl PartialEq + use<'a> {
    (
        &c.pause.by,
        &c.stale,
        &c.standby,
        c.view_recovered,
        c.lease_storm_since,
        c.record_pending,
        // Not the fence count: below the budget it holds nobody, and a storm's fences would
        // otherwise have every healthy node decided again at every pass.
        c.budget_spent(policy),
        c.scopes
            .iter()
            .map(|(s, st)| {
                (
                    s,
                    st.storm_since,
                    st.storm_ended,
                    st.frozen_since,
                    st.thawed,
                )
            })
            .collect::<Vec<_>>(),
    )
}

/// The node's failure domain: the value of `label` (None: no such label, or no label set).
/// A decision that refuses to fence a node that is down: logged at WARN (`journalctl -p
/// warning` shows fences, refusals and failures), where waiting and healthy ones are INFO.
fn refuses_a_fence(d: &Decision) -> bool {
    d.state == decision::NodeState::Blocked
}

/// `interval`, give or take a tenth at random: health reads spread out instead of coming back
/// in one burst every interval after a start.
fn jittered(interval: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    interval.mul_f64(0.9 + 0.2 * f64::from(r) / f64::from(u32::MAX))
}

fn failure_domain(node: &Node, label: Option<&str>) -> Option<String> {
    node.labels().get(label?).cloned()
}

fn decision_elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// Used by `check-config --probe`: a client for listing nodes.
pub async fn client_for(cfg: &Config) -> Result<Client, cluster::ClusterError> {
    cluster::connect(&cfg.kubernetes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the README and runbook promise: `journalctl -p warning` shows refusals. A refusal
    /// is logged at WARN; waiting (grace, confirming) and healthy decisions are not.
    #[test]
    fn refusals_are_logged_at_warn_and_waiting_is_not() {
        let d = |state, rule| Decision {
            state,
            step: Step::Idle,
            rule,
            reason: String::new(),
            next_read_at: None,
            decide_again_at: None,
            guard: None,
        };
        use decision::NodeState as S;
        assert!(refuses_a_fence(&d(S::Blocked, Rule::PowerOn)));
        assert!(refuses_a_fence(&d(S::Blocked, Rule::OffWhileAlive)));
        assert!(refuses_a_fence(&d(S::Blocked, Rule::Paused)));
        assert!(!refuses_a_fence(&d(S::Healthy, Rule::NodeReady)));
        assert!(!refuses_a_fence(&d(S::Suspect, Rule::NotReadyGrace)));
        assert!(!refuses_a_fence(&d(S::Confirming, Rule::ConfirmingOff)));
    }
}
