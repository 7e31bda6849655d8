//! A decision carried out: the power read it wants sent, its change logged (and, in a dry
//! run, the write it would make announced), refusals and fences reported, its write started,
//! and the node's next wake-up and quiet state set.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::action::action_label;
use super::facts::Gathered;
use super::reads::{ReadPurpose, spawn_read};
use super::state::Daemon;
use super::tracker::{HoldsShape, Quiet};
use crate::cluster::NodeView;
use crate::cluster::{EventType, reasons};
use crate::decision::levels::{Basis, Outcome};
use crate::decision::{Decision, NodeFacts, NodeState, Readiness, Rule, Step};
use crate::journal::Topic;
use crate::metrics::WouldActLabels;
use crate::power::MappedSource;

/// The source whose decision the outcome is.
struct Chosen {
    source: MappedSource,
    facts: NodeFacts,
    index: usize,
}

/// What a record of the decision names: the source it rests on, which of the node's it is,
/// and its basis.
pub(super) struct Recorded<'a> {
    pub(super) source: Option<&'a MappedSource>,
    pub(super) member: Option<usize>,
    pub(super) basis: &'a Basis,
}

impl Daemon {
    /// Carries out the outcome, decided on `gathered`: the decision is the chosen source's
    /// (its power action, its guard's last-moment read).
    pub(super) fn carry_out(
        &mut self,
        node: &Arc<NodeView>,
        gathered: Gathered,
        outcome: Outcome,
        now: Timestamp,
    ) {
        let name = node.name.clone();
        let decision = &outcome.decision;
        self.send_reads(&name, &gathered.facts, &outcome, now);
        let chosen = outcome.member.and_then(|i| {
            let t = self.trackers.get(&name)?;
            Some(Chosen {
                source: t.sources.get(i)?.source.clone()?,
                facts: gathered.members.get(i)?.clone(),
                index: i,
            })
        });
        let facts = chosen.as_ref().map_or(&gathered.facts, |c| &c.facts);
        let source = chosen.as_ref().map(|c| &c.source);
        let new_would = self.announce(node, &name, facts, decision);
        // Refusals (one Event and one journal record per episode), dry runs, fence metrics.
        let recorded = Recorded {
            source,
            member: chosen.as_ref().map(|c| c.index),
            basis: &outcome.basis,
        };
        self.observe_node(node, facts, decision, &recorded, new_would, now);
        self.start_write(node, &name, facts, &recorded, decision, now);
        let wake = outcome.reads_wanted.iter().map(|(_, at)| *at).min();
        self.settle(node, &name, facts, decision, wake, now);
    }

    /// Sends the power reads the outcome wants now, or a healthy node's identity reads of
    /// each of its sources when due.
    fn send_reads(&mut self, name: &str, facts: &NodeFacts, outcome: &Outcome, now: Timestamp) {
        let tracker = self.trackers.get_mut(name).expect("facts were gathered");
        let mut sent = vec![false; tracker.sources.len()];
        for &(i, at) in &outcome.reads_wanted {
            let for_node = tracker.read_for(name, i);
            let Some(s) = tracker.sources.get_mut(i) else {
                continue;
            };
            let Some(src) = s.source.as_ref().filter(|_| at <= now && !s.read_in_flight) else {
                continue;
            };
            s.read_in_flight = true;
            sent[i] = true;
            spawn_read(
                for_node,
                src.clone(),
                ReadPurpose::Decision,
                facts.readiness == Readiness::Ready,
                self.read_slots.clone(),
                self.reads_tx.clone(),
            );
        }
        if outcome.decision.rule != Rule::NodeReady {
            return;
        }
        for (i, &was_sent) in sent.iter().enumerate() {
            let for_node = tracker.read_for(name, i);
            let s = &mut tracker.sources[i];
            if let Some(src) = s.source.as_ref()
                && !was_sent
                && !s.read_in_flight
                && s.identity_due.is_none_or(|t| Instant::now() >= t)
                && self.read_slots.identity_room()
            {
                // A healthy node: learn (and re-check) that each of its power sources
                // answers, for its machine, and says it runs.
                s.read_in_flight = true;
                s.identity_due = Some(Instant::now() + jittered(self.cfg.health_read_interval));
                spawn_read(
                    for_node,
                    src.clone(),
                    ReadPurpose::Health,
                    true,
                    self.read_slots.clone(),
                    self.reads_tx.clone(),
                );
            }
        }
    }

    /// A new rule for the node: logged once (a refusal at WARN). In a dry run, a write the node
    /// was not yet announced for: counted and announced by an Event, once for its boot until
    /// the node is healthy again; the same decision re-made as its reads age out and are taken
    /// again is not a new one. Whether this is such a new dry-run write (its journal record is
    /// written by the caller).
    fn announce(
        &mut self,
        node: &Arc<NodeView>,
        name: &str,
        facts: &NodeFacts,
        decision: &Decision,
    ) -> bool {
        let tracker = self.trackers.get_mut(name).expect("facts were gathered");
        let changed = tracker.last_rule != Some(decision.rule);
        if decision.state == NodeState::Healthy {
            tracker.would_announced = None;
        }
        let would = match decision.step {
            Step::WouldFence(a) => Some(action_label(a)),
            Step::WouldUnfence => Some("untaint"),
            Step::WouldPowerOff => Some("power_off"),
            Step::WouldPowerOn => Some("power_on"),
            _ => None,
        };
        let new_would = match would {
            Some(action) => {
                let key = (action, facts.boot_id.clone());
                let new = tracker.would_announced.as_ref() != Some(&key);
                tracker.would_announced = Some(key);
                new
            }
            None => false,
        };
        if changed {
            tracker.last_rule = Some(decision.rule);
            if refuses_a_fence(decision) {
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
        }
        if new_would {
            match decision.step {
                Step::WouldFence(a) => {
                    self.shared
                        .metrics
                        .would_act
                        .get_or_create(&WouldActLabels {
                            action: action_label(a),
                        })
                        .inc();
                    self.spawn_event(node, EventType::Normal, reasons::WOULD_FENCE, decision);
                }
                Step::WouldUnfence => {
                    self.shared
                        .metrics
                        .would_act
                        .get_or_create(&WouldActLabels { action: "untaint" })
                        .inc();
                    self.spawn_event(node, EventType::Normal, reasons::WOULD_UNFENCE, decision);
                }
                Step::WouldPowerOff | Step::WouldPowerOn => {
                    let (action, reason) = if decision.step == Step::WouldPowerOff {
                        ("power_off", reasons::WOULD_POWER_OFF)
                    } else {
                        ("power_on", reasons::WOULD_POWER_ON)
                    };
                    self.shared
                        .metrics
                        .would_act
                        .get_or_create(&WouldActLabels { action })
                        .inc();
                    self.spawn_event(node, EventType::Normal, reason, decision);
                }
                _ => {}
            }
        }
        new_would
    }

    /// Starts the write the decision asks for, unless one is under way, a failed one waits
    /// for its retry, or the cache has not moved past the object the last one was made on.
    fn start_write(
        &mut self,
        node: &Arc<NodeView>,
        name: &str,
        facts: &NodeFacts,
        recorded: &Recorded<'_>,
        decision: &Decision,
        now: Timestamp,
    ) {
        let source = recorded.source;
        let uid = node.uid.clone();
        let may_act = self.write_may_start(node);
        let tracker = self.trackers.get_mut(name).expect("facts were gathered");
        let rv = Some(node.resource_version.clone());
        if may_act
            && matches!(decision.step, Step::PowerOff | Step::PowerOn)
            && let Some(src) = source
        {
            tracker.action_in_flight = true;
            tracker.acted_on = rv;
            // Counted now, so that the next node of this very pass sees the power budget and
            // its failure domain busy, and recorded on the cluster alongside the command.
            self.calm.record_power_action(&uid, now);
            self.keep_guard_record(now);
            self.journal_budget_spent(Topic::PowerBudget, name, now);
            if decision.step == Step::PowerOff {
                let domain = super::guards::failure_domain(
                    node,
                    self.cfg.guards.failure_domain_label.as_deref(),
                )
                .unwrap_or_default();
                self.calm.powering_off.insert(domain, uid.to_string());
            }
            let mut inputs = self.journal_inputs(name, facts, recorded, false);
            inputs.decided_at = Some(crate::clock::now());
            self.spawn_power_action(node.clone(), facts, src.clone(), decision.clone(), inputs);
            return;
        }
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
                self.journal_budget_spent(Topic::FenceBudget, name, now);
            }
            let mut inputs = self.journal_inputs(name, facts, recorded, fencing);
            inputs.decided_at = Some(crate::clock::now());
            self.spawn_action(node.clone(), uid, decision.clone(), inputs);
        }
    }

    /// Whether a write for the node may start now: none under way, no failed one waiting for
    /// its retry, and the cache moved past the object the last one was made on.
    pub(super) fn write_may_start(&self, node: &NodeView) -> bool {
        self.trackers.get(&node.name).is_some_and(|t| {
            !t.action_in_flight
                && t.retry_after.is_none_or(|at| Instant::now() >= at)
                && t.acted_on.as_deref() != Some(node.resource_version.as_str())
        })
    }

    /// What the loop remembers of the decision: when to wake for it, what it was made on (so
    /// that passes skip the node until something changes), the state metric.
    fn settle(
        &mut self,
        node: &Arc<NodeView>,
        name: &str,
        facts: &NodeFacts,
        decision: &Decision,
        read_wanted: Option<Timestamp>,
        now: Timestamp,
    ) {
        let tracker = self.trackers.get_mut(name).expect("facts were gathered");
        let wake = [decision.next_read_at, decision.decide_again_at, read_wanted]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min();
        if let Some(at) = wake
            && tracker.wake_at != wake
        {
            tracker.wake_at = wake;
            self.wakeups.push(Reverse((at, name.to_string())));
        } else if wake.is_none() && tracker.wake_at.is_some_and(|at| at <= now) {
            // Decided since it came due: nothing to wake for (its heap entry is skipped).
            tracker.wake_at = None;
        }
        tracker.quiet = Some(Quiet {
            resource_version: node.resource_version.clone(),
            at: Instant::now(),
            guards_epoch: self.guards_epoch,
            healthy: decision.rule == Rule::NodeReady
                && decision.state == NodeState::Healthy
                && facts.fence.is_none()
                && facts.lease_renew_time.is_some(),
            lease_renew: facts.lease_renew_time,
            holds: HoldsShape::of(&facts.holds),
        });
        if tracker.metric_state != Some(decision.state) {
            tracker.metric_state = Some(decision.state);
            self.shared.metrics.set_node_state(name, decision.state);
        }
    }
}

/// A decision that refuses to fence a node that is down: logged at WARN (`journalctl -p
/// warning` shows fences, refusals and failures), where waiting and healthy ones are INFO.
fn refuses_a_fence(d: &Decision) -> bool {
    d.state == NodeState::Blocked
}

/// `interval`, give or take a tenth at random: health reads spread out instead of coming back
/// in one burst every interval after a start.
fn jittered(interval: Duration) -> Duration {
    let r = getrandom::u32().unwrap_or(u32::MAX / 2);
    interval.mul_f64(0.9 + 0.2 * f64::from(r) / f64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What docs/decisions.md and the runbook promise: `journalctl -p warning` shows refusals. A refusal
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
        use NodeState as S;
        assert!(refuses_a_fence(&d(S::Blocked, Rule::PowerOn)));
        assert!(refuses_a_fence(&d(S::Blocked, Rule::OffWhileAlive)));
        assert!(refuses_a_fence(&d(S::Blocked, Rule::Paused)));
        assert!(!refuses_a_fence(&d(S::Healthy, Rule::NodeReady)));
        assert!(!refuses_a_fence(&d(S::Suspect, Rule::NotReadyGrace)));
        assert!(!refuses_a_fence(&d(S::Confirming, Rule::ConfirmingOff)));
    }
}
