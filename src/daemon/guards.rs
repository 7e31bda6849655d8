//! The guards as the loop keeps them: the datacenter counted before any node is decided (the
//! census: unhealthy nodes, failing sources, stale Leases, per scope), what the counts hold
//! back, and the guards' record restored at start and kept on the cluster; `guard_changes`
//! tells when a guard starts or ends.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::state::{Daemon, FAILING_WINDOW};
use crate::cluster;
use crate::cluster::NodeView;
use crate::decision::actuation::POWER_OFF_TAKES;
use crate::decision::holds::{Calm, Census, CensusNode, GuardPolicy, View};
use crate::decision::{self, Readiness};

impl Daemon {
    /// Before the first pass: the guards' memory from the journal and the record on the
    /// cluster.
    pub(super) async fn restore_guards(&mut self, now: Timestamp) {
        let shared = self.shared.clone();
        self.guard_keeper
            .restore(&mut self.calm, &self.cfg, &shared.metrics, now)
            .await;
    }

    /// The guards' record kept on the cluster, once the guards are up to date (and after each
    /// fence started).
    pub(super) fn keep_guard_record(&mut self, now: Timestamp) {
        self.guard_keeper
            .keep(&mut self.calm, &self.cfg, &self.shared.metrics, now);
    }

    /// Counts the datacenter and brings the guards up to date, before any node is decided.
    pub(super) fn update_guards(&mut self, nodes: &[Arc<NodeView>], now: Timestamp) {
        let g = &self.cfg.guards;
        let census_nodes: Vec<CensusNode> = nodes
            .iter()
            .map(|n| {
                let tracker = self.trackers.get(&n.name);
                // Failing only when none of its levels answers: a rack whose BMCs went dark
                // with their machines while the PDU outlets answer is no network cut off.
                let failing = tracker
                    .and_then(|t| super::sources::census_failing(&t.sources, now, FAILING_WINDOW));
                // The Lease as the last pass (or this one's quiet check) saw it.
                let lease = tracker.and_then(|t| {
                    decision::lease_state(t.last_alive(), t.lease_duration, &self.cfg.policy, now)
                });
                CensusNode {
                    uid: n.uid.as_str().into(),
                    lease,
                    domain: g
                        .failure_domain_label
                        .as_deref()
                        .and_then(|label| n.labels.get(label))
                        .map(|d| d.as_str().into()),
                    unhealthy: CensusNode::counts_unhealthy(
                        matches!(cluster::readiness(n), Readiness::NotReady { .. }),
                        lease,
                        self.cfg.policy.release_at_attestation,
                    ),
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
                self.calm.record_fence(&n.uid.clone(), f.at);
            }
        }
        // Opt-in actuation: the power actions recorded on the Nodes count against their
        // budget (after a restart or a takeover too), and a node powered off but not fenced yet
        // keeps its failure domain busy.
        if self.cfg.actuation.is_some() {
            self.calm.powering_off.clear();
            for n in nodes {
                let Some(r) = cluster::power_record(n, self.cluster.actor()).filter(|r| r.ours)
                else {
                    continue;
                };
                self.calm.record_power_action(&n.uid.clone(), r.off_at);
                let fenced = cluster::fence_record(n, self.cluster.actor()).is_some();
                // Until it is fenced, or until it has ignored the command: a machine that does
                // not turn off is the operator's, and must not hold its domain's next hung
                // machine for ever.
                let on_its_way = decision_elapsed(r.off_at, now) <= POWER_OFF_TAKES;
                if !fenced && on_its_way && r.boot_id == cluster::boot_id(n) {
                    let domain =
                        failure_domain(n, g.failure_domain_label.as_deref()).unwrap_or_default();
                    self.calm.powering_off.insert(domain, n.uid.to_string());
                }
            }
            self.calm.expire_power_actions(now);
        }
        let leadership = self
            .leadership
            .as_ref()
            .and_then(|l| l.read().ok().map(|l| l.clone()));
        self.calm.standby = leadership.as_ref().and_then(|l| l.standby_reason());
        self.keep_guard_record(now);
        self.shared.metrics.set_leadership(leadership.as_ref());
        self.tell_guard_changes(&before);
        self.tell_leadership(&before, leadership.as_ref());
        let g = &self.cfg.guards;
        if guards_summary(&before, g) != guards_summary(&self.calm, g) {
            self.guards_epoch += 1;
        }
        self.shared.metrics.set_guards(&self.calm, g, now);
        if let Ok(mut c) = self.shared.calm.write() {
            *c = self.calm.clone();
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
pub(super) fn failure_domain(node: &NodeView, label: Option<&str>) -> Option<String> {
    node.labels.get(label?).cloned()
}

fn decision_elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}
