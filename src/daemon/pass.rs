//! The pass: what the loop does every tick, and the nodes it decides then. Most nodes are
//! quiet (nothing they are decided on changed) and cost a lookup; the others are decided
//! ([`super::evaluate`]). Nodes whose waits end between ticks are decided at that moment, from
//! a heap of wake-up times, not at the next tick.

use std::cmp::Reverse;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::guards::failure_domain;
use super::state::{Daemon, MAPPING_CHECK_PASSES};
use super::tracker::{self, HoldsShape, QUIET_REFRESH, mapping_conflicts};
use crate::cluster;
use crate::cluster::NodeView;
use crate::decision;

impl Daemon {
    /// The tick's pass: forget the nodes gone, work out what every node's decision shares
    /// (the mapping's conflicts, shared UUIDs, the guards), decide every node that is not
    /// quiet, and count what the metrics count over all nodes.
    pub(super) fn pass(&mut self) {
        let started = Instant::now();
        let now = crate::clock::now();
        if let Some(step) = crate::clock::stepped() {
            tracing::warn!("{step}");
        }
        let nodes = self.nodes.all();
        // Forget nodes that are gone. Every tracker was made for a node of the cache, so a gone
        // one leaves more trackers than nodes (a pass late at worst, when a new node has no
        // tracker yet): only then is it worth looking for it.
        let gone: Vec<String> = if self.trackers.len() > nodes.len() {
            let names: std::collections::HashSet<&str> =
                nodes.iter().map(|n| n.name.as_str()).collect();
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
        }
        // The mapping's conflicts and shared UUIDs depend on the node names, providerIDs and
        // system UUIDs alone: checked only when the node watch says one changed (and now and
        // then), not on every pass over thousands of nodes.
        self.passes_since_mapping_check += 1;
        let check = std::mem::take(&mut self.mapping_check_due)
            | self.changes_missed.swap(false, Ordering::Relaxed)
            | (self.conflicts_of.len() != nodes.len())
            | (self.passes_since_mapping_check >= MAPPING_CHECK_PASSES);
        let newly_shared = if check {
            self.passes_since_mapping_check = 0;
            self.check_mapping(&nodes)
        } else {
            Vec::new()
        };
        self.report_shared_uuids(&nodes, &newly_shared);
        self.update_guards(&nodes, now);
        self.census_current = true;
        for node in &nodes {
            if !self.is_quiet(node, now) {
                self.evaluate(node, now);
            }
        }
        self.census_current = false;
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
        self.shared
            .metrics
            .decision_pass_duration
            .observe(started.elapsed().as_secs_f64());
    }

    /// Works out the mapping's conflicts and the shared UUIDs again where the nodes' names,
    /// providerIDs or system UUIDs changed; the nodes that share a UUID now and did not before.
    fn check_mapping(&mut self, nodes: &[Arc<NodeView>]) -> Vec<String> {
        let mapped_nodes = || {
            nodes
                .iter()
                .map(|n| (n.name.as_str(), cluster::provider_id(n)))
        };
        let changed = self.conflicts_of.len() != nodes.len()
            || mapped_nodes()
                .any(|(name, pid)| self.conflicts_of.get(name).map(Option::as_deref) != Some(pid));
        if changed {
            self.guards_epoch += 1;
            self.conflicts = mapping_conflicts(&self.cfg, mapped_nodes());
            self.outlets = tracker::shared_outlets(&self.cfg, mapped_nodes().map(|(n, _)| n));
            self.conflicts_of = mapped_nodes()
                .map(|(name, pid)| (name.to_string(), pid.map(String::from)))
                .collect();
        }
        let newly_shared = self.shared_uuids.update(
            nodes
                .iter()
                .map(|n| (n.name.as_str(), n.system_uuid.as_str())),
        );
        if !newly_shared.is_empty() {
            self.guards_epoch += 1;
        }
        newly_shared
    }

    /// Whether deciding the node again now would say what its last decision said, so that
    /// the pass can skip it: the same Node object, the same shared state (guards, conflicts,
    /// UUIDs) and holds, no wake-up or write retry due, decided less than [`QUIET_REFRESH`]
    /// ago. A healthy node also needs no read in flight nor an identity read due, and a Lease
    /// not yet stale (its renewals are observed here, so that they keep being dated by this
    /// pass); any other node needs its Lease unrenewed since (a renewal is a sign of life).
    /// A read that lands and a write that ends decide their node again anyway. Thousands of
    /// nodes then cost a lookup each per pass, and a storm's nodes are decided when something
    /// about them changes rather than every second.
    fn is_quiet(&mut self, node: &NodeView, now: Timestamp) -> bool {
        let name = node.name.as_str();
        let Some(t) = self.trackers.get_mut(name) else {
            return false;
        };
        let Some(q) = &t.quiet else {
            return false;
        };
        let unchanged = node.resource_version == q.resource_version
            && q.guards_epoch == self.guards_epoch
            && q.at.elapsed() < QUIET_REFRESH;
        let due = t.wake_at.is_some_and(|at| at <= now)
            || t.retry_after.is_some_and(|at| Instant::now() >= at);
        // A write under way is no reason: its end decides the node again.
        if !unchanged || due {
            return false;
        }
        let renew = self.leases.get(name).and_then(|l| l.renewed);
        if q.healthy {
            // A node without a power source has no identity to read.
            let identity_due = t.sources.iter().any(|s| {
                s.source.is_some() && s.identity_due.is_none_or(|due| Instant::now() >= due)
            });
            let Some(renew) = renew else {
                return false;
            };
            if t.sources.iter().any(|s| s.read_in_flight) || identity_due {
                return false;
            }
            tracker::observe_lease(&mut t.lease_seen, Some(renew), now);
            // Its Node has not changed since it was decided healthy: still Ready, seen now. A
            // renewal seen here must never be later than the last sight of Ready, or a hang
            // that begins right after it would look like a silence that began NotReady.
            t.ready_seen = Some(now);
            return decision::lease_silence(
                t.last_alive(),
                t.lease_duration,
                &self.cfg.policy,
                now,
            )
            .is_none();
        }
        if renew != q.lease_renew {
            return false;
        }
        let holds = self.calm.holds(
            failure_domain(node, self.cfg.guards.failure_domain_label.as_deref()).as_deref(),
            &t.uid,
            &self.cfg.guards,
            now,
        );
        HoldsShape::of(&holds) == q.holds
    }

    /// When the soonest wakeup is due (far ahead when none is).
    pub(super) fn next_wakeup(&self) -> tokio::time::Instant {
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        let Some(Reverse((at, _))) = self.wakeups.peek() else {
            return far.into();
        };
        let wait = at.duration_since(crate::clock::now());
        let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
        (now + wait).min(far).into()
    }

    /// Decides again every node whose wakeup is due.
    pub(super) fn wake_due(&mut self) {
        let now = crate::clock::now();
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
            if let Some(node) = self.nodes.get(&name) {
                self.evaluate(&node, now);
            }
        }
    }

    /// A Node changed in the cache: decide it now. Only a node the last pass saw (its guards
    /// and census are counted per pass); a new one waits for the next tick.
    pub(super) fn node_changed(&mut self, name: &str) {
        let node = self.nodes.get(name);
        let mapping = node
            .as_deref()
            .map(|n| (cluster::provider_id(n), n.system_uuid.as_str()));
        let known = self.conflicts_of.get(name).map(|pid| {
            (
                pid.as_deref(),
                self.shared_uuids.reported(name).unwrap_or_default(),
            )
        });
        if mapping != known {
            self.mapping_check_due = true;
        }
        if !self.trackers.contains_key(name) {
            return;
        }
        if let Some(node) = node {
            self.evaluate(&node, crate::clock::now());
        }
    }
}
