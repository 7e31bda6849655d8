//! The decision core: why a node is (or is not) fenced, in one pure function.
//!
//! `decide(facts, reads, policy, now) -> Decision`. No I/O, no clock: time is passed in, so every
//! rule is a plain unit test. The daemon turns the decision's [`Step`] into API calls; `oobfence
//! why` shows the [`Rule`] that produced it. A new guard is a new fact and a new rule here,
//! never a special case elsewhere.
//!
//! The one path to [`Step::Fence`]: the node is NotReady for at least `not_ready_grace`, its
//! kubelet stopped renewing its Lease, its power source is configured in the config file, and
//! the last `confirm_reads` reads all said Off, spaced at least `confirm_interval` apart, with
//! the newest no older than `read_max_age` — and `dry_run` is off. A cloud instance that is
//! terminated or unknown counts like Off (an unknown one needs at least two answers) and gets
//! `on_terminated` instead of `action`. Everything else waits, re-reads, or refuses.

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::power::{PowerReading, PowerState};

/// What oobfence does once a machine is proven off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceAction {
    /// Add `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`.
    Taint,
    /// Delete the Node object (what managed clusters do when an instance is gone).
    DeleteNode,
}

impl fmt::Display for FenceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FenceAction::Taint => "taint",
            FenceAction::DeleteNode => "delete-node",
        })
    }
}

/// The `[policy]` knobs the core needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub not_ready_grace: Duration,
    pub confirm_reads: u32,
    pub confirm_interval: Duration,
    /// The newest Off read must be at most this old when acting.
    pub read_max_age: Duration,
    /// How often to re-read a machine that reads On or whose BMC fails.
    pub recheck_interval: Duration,
    pub action: FenceAction,
    /// What to do when the cloud says the instance is gone (terminated / not found).
    pub on_terminated: FenceAction,
    pub untaint_on_recovery: bool,
    pub dry_run: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            not_ready_grace: Duration::from_secs(60),
            confirm_reads: 2,
            confirm_interval: Duration::from_secs(5),
            read_max_age: Duration::from_secs(30),
            recheck_interval: Duration::from_secs(30),
            action: FenceAction::Taint,
            on_terminated: FenceAction::DeleteNode,
            untaint_on_recovery: true,
            dry_run: false,
        }
    }
}

/// The node's Ready condition as the core sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "ready", rename_all = "snake_case")]
pub enum Readiness {
    Ready,
    /// Ready=False or Ready=Unknown, since the condition's lastTransitionTime.
    NotReady {
        since: Timestamp,
    },
    /// No Ready condition at all (a node that never reported).
    NoCondition,
}

/// What oobfence recorded on the node when it fenced it (annotations under `oobfence.io/`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FenceRecord {
    pub at: Timestamp,
    /// `status.nodeInfo.bootID` at fence time: the node must come back with another one.
    pub boot_id: String,
    /// Whether the out-of-service taint oobfence added is still on the node.
    pub taint_present: bool,
}

/// Everything the core knows about one node, read from the cluster and the config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    pub readiness: Readiness,
    /// When the node's Lease in kube-node-lease was last renewed, if it has one.
    pub lease_renewed: Option<Timestamp>,
    pub boot_id: String,
    pub being_deleted: bool,
    /// oobfence's own fence record, if it fenced this node.
    pub fence: Option<FenceRecord>,
    /// An out-of-service taint that oobfence did not place.
    pub foreign_out_of_service: bool,
    /// The config file maps this node to a power source.
    pub has_power_source: bool,
}

/// Where a node stands, for `why`, `/nodes` and the `node_state` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Healthy,
    /// NotReady, still within the grace period.
    Suspect,
    /// Reading power and collecting Off confirmations.
    Confirming,
    /// NotReady but fencing is refused (power on, unknown, no power source...).
    Blocked,
    Fenced,
    /// Fenced and Ready again; waiting for the proof needed to lift the fence.
    Recovering,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Healthy => "healthy",
            NodeState::Suspect => "suspect",
            NodeState::Confirming => "confirming",
            NodeState::Blocked => "blocked",
            NodeState::Fenced => "fenced",
            NodeState::Recovering => "recovering",
        }
    }
}

/// What the daemon should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "step", content = "action", rename_all = "snake_case")]
pub enum Step {
    Idle,
    /// Apply the fence.
    Fence(FenceAction),
    /// Dry run: everything says fence, nothing is written.
    WouldFence(FenceAction),
    /// Remove oobfence's taint and annotations.
    Unfence,
    /// Dry run: everything says unfence, nothing is written.
    WouldUnfence,
    /// oobfence's annotations are on the node but its taint is gone (removed by someone else):
    /// drop the stale record.
    ClearRecord,
}

/// The rule that produced a decision. Its name is stable: it shows in `why`, logs, Events and
/// the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    NodeBeingDeleted,
    NodeReady,
    NoReadyCondition,
    NotReadyGrace,
    ForeignOutOfServiceTaint,
    NoPowerSource,
    LeaseRenewedRecently,
    AwaitingPowerRead,
    StalePowerRead,
    PowerOn,
    PowerTransitional,
    PowerUnknown,
    ConfirmingOff,
    ConfirmedOff,
    ConfirmedGone,
    DryRun,
    FencedAwaitingRecovery,
    FenceRemovedExternally,
    UntaintDisabled,
    RecoveryNeedsPowerOn,
    RecoveredSameBootId,
    RecoveredNewBoot,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::NodeBeingDeleted => "node-being-deleted",
            Rule::NodeReady => "node-ready",
            Rule::NoReadyCondition => "no-ready-condition",
            Rule::NotReadyGrace => "not-ready-grace",
            Rule::ForeignOutOfServiceTaint => "foreign-out-of-service-taint",
            Rule::NoPowerSource => "no-power-source",
            Rule::LeaseRenewedRecently => "lease-renewed-recently",
            Rule::AwaitingPowerRead => "awaiting-power-read",
            Rule::StalePowerRead => "stale-power-read",
            Rule::PowerOn => "power-on",
            Rule::PowerTransitional => "power-transitional",
            Rule::PowerUnknown => "power-unknown",
            Rule::ConfirmingOff => "confirming-off",
            Rule::ConfirmedOff => "confirmed-off",
            Rule::ConfirmedGone => "confirmed-gone",
            Rule::DryRun => "dry-run",
            Rule::FencedAwaitingRecovery => "fenced-awaiting-recovery",
            Rule::FenceRemovedExternally => "fence-removed-externally",
            Rule::UntaintDisabled => "untaint-disabled",
            Rule::RecoveryNeedsPowerOn => "recovery-needs-power-on",
            Rule::RecoveredSameBootId => "recovered-same-boot-id",
            Rule::RecoveredNewBoot => "recovered-new-boot",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of [`decide`]: what to do, which rule said so, and a sentence for humans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub state: NodeState,
    pub step: Step,
    pub rule: Rule,
    pub reason: String,
    /// Read the power state at or after this time (none: no read wanted).
    pub next_read_at: Option<Timestamp>,
}

impl Decision {
    fn new(state: NodeState, step: Step, rule: Rule, reason: impl Into<String>) -> Self {
        Decision {
            state,
            step,
            rule,
            reason: reason.into(),
            next_read_at: None,
        }
    }

    fn read_at(mut self, at: Timestamp) -> Self {
        self.next_read_at = Some(at);
        self
    }
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// How long from `earlier` to `later`; zero if `later` is not after `earlier` (clock skew).
fn elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

fn secs(d: Duration) -> String {
    let d = Duration::from_secs(d.as_secs());
    humantime::format_duration(d).to_string()
}

/// Decides what to do about one node. `reads` are this node's power reads in time order (the
/// daemon keeps them per incident); reads older than the current NotReady period are ignored.
pub fn decide(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;

    if facts.being_deleted {
        return Decision::new(
            S::Healthy,
            Step::Idle,
            Rule::NodeBeingDeleted,
            "the Node is being deleted; nothing to do",
        );
    }

    if let Some(record) = &facts.fence {
        return decide_fenced(facts, record, reads, policy, now);
    }

    let since = match facts.readiness {
        Readiness::Ready => {
            return Decision::new(S::Healthy, Step::Idle, Rule::NodeReady, "node is Ready");
        }
        Readiness::NoCondition => {
            return Decision::new(
                S::Suspect,
                Step::Idle,
                Rule::NoReadyCondition,
                "node has no Ready condition yet; nothing is decided about a node that never reported",
            );
        }
        Readiness::NotReady { since } => since,
    };

    if facts.foreign_out_of_service {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::ForeignOutOfServiceTaint,
            "node already carries an out-of-service taint that oobfence did not place; leaving it alone",
        );
    }

    let not_ready_for = elapsed(since, now);
    if not_ready_for < policy.not_ready_grace {
        return Decision::new(
            S::Suspect,
            Step::Idle,
            Rule::NotReadyGrace,
            format!(
                "NotReady for {} of the {} grace period; no power read yet",
                secs(not_ready_for),
                secs(policy.not_ready_grace)
            ),
        );
    }

    if !facts.has_power_source {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::NoPowerSource,
            "no [[bmc]] entry in the config matches this node; its power cannot be attested",
        );
    }

    if let Some(renewed) = facts.lease_renewed {
        let age = elapsed(renewed, now);
        if renewed > since || age < policy.not_ready_grace {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::LeaseRenewedRecently,
                format!(
                    "the kubelet renewed its Lease {} ago, after the node went NotReady: something on the machine is alive",
                    secs(age)
                ),
            );
        }
    }

    // Only reads taken during this NotReady period are evidence about it.
    let reads: Vec<&PowerReading> = reads.iter().filter(|r| r.at >= since).collect();
    let Some(last) = reads.last().copied() else {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::AwaitingPowerRead,
            format!("NotReady for {}; reading power", secs(not_ready_for)),
        )
        .read_at(now);
    };
    let age = elapsed(last.at, now);
    if age > policy.read_max_age {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::StalePowerRead,
            format!(
                "last power read is {} old (max {}); reading again",
                secs(age),
                secs(policy.read_max_age)
            ),
        )
        .read_at(now);
    }

    match &last.state {
        PowerState::On => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerOn,
            "NotReady but the power source says On: likely a partition or a hung OS, not a dead machine; never fenced",
        )
        .read_at(plus(last.at, policy.recheck_interval)),
        PowerState::Transitional { detail } => Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::PowerTransitional,
            format!("power is changing ({detail}); not off yet, reading again"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Error { kind, detail } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerUnknown,
            format!("power state unknown ({kind}: {detail}); never fenced on an unknown"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Off | PowerState::Terminated | PowerState::NotFound => {
            let confirmed = confirmed_off_reads(&reads, policy.confirm_interval);
            // A cloud that does not know an instance may just not have caught up yet
            // (eventual consistency): "not found" is never trusted on one answer.
            let needed = if last.state == PowerState::NotFound {
                policy.confirm_reads.max(2)
            } else {
                policy.confirm_reads
            } as usize;
            let gone = last.state.is_gone();
            let what = if gone { "gone (terminated or not found)" } else { "Off" };
            if confirmed < needed {
                return Decision::new(
                    S::Confirming,
                    Step::Idle,
                    Rule::ConfirmingOff,
                    format!(
                        "{confirmed} of {needed} {what} reads spaced at least {} apart",
                        secs(policy.confirm_interval)
                    ),
                )
                .read_at(plus(last.at, policy.confirm_interval));
            }
            let (action, rule) = if gone {
                (policy.on_terminated, Rule::ConfirmedGone)
            } else {
                (policy.action, Rule::ConfirmedOff)
            };
            let evidence = format!(
                "NotReady for {}, {confirmed} consecutive {what} reads spaced at least {} apart, newest {} old ({})",
                secs(not_ready_for),
                secs(policy.confirm_interval),
                secs(age),
                last.state
            );
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldFence(action),
                    Rule::DryRun,
                    format!("{evidence}; dry run: would {action}, writing nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::Fence(action),
                    rule,
                    format!("{evidence}: {action}"),
                )
            }
        }
    }
}

/// Counts the reads that confirm the newest one: walking back from the newest, each counted
/// read is at least `interval` older than the previous counted one; a down read closer than
/// that is skipped, and any read that is not down (Off, terminated, not found) ends the streak.
fn confirmed_off_reads(reads: &[&PowerReading], interval: Duration) -> usize {
    let mut count = 0;
    let mut last_counted: Option<Timestamp> = None;
    for r in reads.iter().rev() {
        if !r.state.is_down() {
            break;
        }
        match last_counted {
            Some(t) if elapsed(r.at, t) < interval => continue,
            _ => {
                count += 1;
                last_counted = Some(r.at);
            }
        }
    }
    count
}

fn decide_fenced(
    facts: &NodeFacts,
    record: &FenceRecord,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;

    if !record.taint_present {
        return Decision::new(
            S::Healthy,
            Step::ClearRecord,
            Rule::FenceRemovedExternally,
            "oobfence's out-of-service taint was removed by someone else; dropping its fence record",
        );
    }
    if facts.readiness != Readiness::Ready {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {}; waiting for the node to return Ready",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        );
    }
    if !policy.untaint_on_recovery {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::UntaintDisabled,
            "node is Ready again but untaint_on_recovery = false: remove the taint by hand once checked",
        );
    }
    // Lifting a fence needs fresh proof the machine is on.
    let fresh_on = reads.last().filter(|r| {
        r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age && r.state == PowerState::On
    });
    if fresh_on.is_none() {
        let next = match reads.last() {
            Some(r) if r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age => {
                plus(r.at, policy.confirm_interval)
            }
            _ => now,
        };
        let last = reads
            .last()
            .map(|r| format!("last read: {}", r.state))
            .unwrap_or_else(|| "no read yet".into());
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::RecoveryNeedsPowerOn,
            format!("node is Ready again; lifting the fence needs a fresh On read ({last})"),
        )
        .read_at(next);
    }
    if facts.boot_id.is_empty() || facts.boot_id == record.boot_id {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::RecoveredSameBootId,
            format!(
                "node is Ready and On but its bootID {:?} is the one recorded at fence time: it did not reboot, so the Off reads are suspect; check the machine, then remove the taint by hand",
                facts.boot_id
            ),
        );
    }
    let reason = format!(
        "node is Ready, power reads On, bootID changed ({} -> {})",
        record.boot_id, facts.boot_id
    );
    if policy.dry_run {
        Decision::new(
            S::Recovering,
            Step::WouldUnfence,
            Rule::DryRun,
            format!("{reason}; dry run: would remove the taint"),
        )
    } else {
        Decision::new(S::Recovering, Step::Unfence, Rule::RecoveredNewBoot, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::power::ReadErrorKind;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn read(at: i64, state: PowerState) -> PowerReading {
        PowerReading {
            at: t(at),
            latency: Duration::from_millis(120),
            state,
            details: Vec::new(),
        }
    }

    fn off(at: i64) -> PowerReading {
        read(at, PowerState::Off)
    }

    /// NotReady since t(0), lease last renewed at t(-10): a dead node.
    fn dead() -> NodeFacts {
        NodeFacts {
            readiness: Readiness::NotReady { since: t(0) },
            lease_renewed: Some(t(-10)),
            boot_id: "boot-a".into(),
            being_deleted: false,
            fence: None,
            foreign_out_of_service: false,
            has_power_source: true,
        }
    }

    fn fenced(readiness: Readiness, boot_id: &str) -> NodeFacts {
        NodeFacts {
            readiness,
            boot_id: boot_id.into(),
            fence: Some(FenceRecord {
                at: t(100),
                boot_id: "boot-a".into(),
                taint_present: true,
            }),
            ..dead()
        }
    }

    fn policy() -> Policy {
        Policy::default() // grace 60s, 2 reads, 5s apart, max age 30s
    }

    #[test]
    fn ready_node_is_healthy_and_never_read() {
        let facts = NodeFacts {
            readiness: Readiness::Ready,
            ..dead()
        };
        let d = decide(&facts, &[off(70), off(80)], &policy(), t(90));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Healthy, Step::Idle, Rule::NodeReady)
        );
        assert_eq!(d.next_read_at, None);
    }

    #[test]
    fn terminated_instance_gets_the_on_terminated_action() {
        let reads = [
            read(60, PowerState::Terminated),
            read(65, PowerState::Terminated),
        ];
        let d = decide(&dead(), &reads, &policy(), t(66));
        assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
        assert_eq!(d.rule, Rule::ConfirmedGone);
        // Stopped then terminated: both down, the newest decides the action.
        let reads = [off(60), read(65, PowerState::Terminated)];
        let d = decide(&dead(), &reads, &policy(), t(66));
        assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
        let p = Policy {
            on_terminated: FenceAction::Taint,
            ..policy()
        };
        let d = decide(
            &dead(),
            &[
                read(60, PowerState::Terminated),
                read(65, PowerState::Terminated),
            ],
            &p,
            t(66),
        );
        assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    }

    #[test]
    fn not_found_needs_two_answers_even_with_confirm_reads_1() {
        let p = Policy {
            confirm_reads: 1,
            ..policy()
        };
        let d = decide(&dead(), &[read(60, PowerState::NotFound)], &p, t(61));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
        assert_eq!(d.next_read_at, Some(t(65)));
        // Two answers closer than confirm_interval still count once.
        let reads = [
            read(60, PowerState::NotFound),
            read(62, PowerState::NotFound),
        ];
        assert_eq!(decide(&dead(), &reads, &p, t(62)).rule, Rule::ConfirmingOff);
        let reads = [
            read(60, PowerState::NotFound),
            read(65, PowerState::NotFound),
        ];
        let d = decide(&dead(), &reads, &p, t(66));
        assert_eq!(
            (d.step, d.rule),
            (Step::Fence(FenceAction::DeleteNode), Rule::ConfirmedGone)
        );
        // One Off read confirmed: confirm_reads = 1 fences at once.
        let d = decide(&dead(), &[off(60)], &p, t(61));
        assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    }

    #[test]
    fn within_grace_no_read_no_action() {
        let d = decide(&dead(), &[off(10), off(20)], &policy(), t(59));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::NotReadyGrace));
        assert_eq!(d.next_read_at, None);
        assert_eq!(d.state, NodeState::Suspect);
    }

    #[test]
    fn after_grace_asks_for_a_read_now() {
        let d = decide(&dead(), &[], &policy(), t(60));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::AwaitingPowerRead));
        assert_eq!(d.next_read_at, Some(t(60)));
    }

    #[test]
    fn fences_after_confirm_reads_spaced_and_fresh() {
        let reads = [off(60), off(65)];
        let d = decide(&dead(), &reads, &policy(), t(66));
        assert_eq!(d.step, Step::Fence(FenceAction::Taint));
        assert_eq!(d.rule, Rule::ConfirmedOff);
    }

    #[test]
    fn one_off_read_is_not_enough() {
        let d = decide(&dead(), &[off(60)], &policy(), t(61));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
        assert_eq!(d.next_read_at, Some(t(65)));
        assert!(d.reason.starts_with("1 of 2"), "{}", d.reason);
    }

    #[test]
    fn off_reads_closer_than_interval_count_once() {
        let reads = [off(60), off(61), off(62), off(64)];
        let d = decide(&dead(), &reads, &policy(), t(64));
        assert_eq!(d.rule, Rule::ConfirmingOff);
        let reads = [off(60), off(61), off(62), off(65)];
        assert_eq!(
            decide(&dead(), &reads, &policy(), t(65)).step,
            Step::Fence(FenceAction::Taint)
        );
    }

    #[test]
    fn any_non_off_read_resets_the_count() {
        let breakers = [
            PowerState::On,
            PowerState::Transitional {
                detail: "PoweringOff".into(),
            },
            PowerState::error(ReadErrorKind::Timeout, "no answer in 5s"),
        ];
        for b in breakers {
            let reads = [off(60), read(65, b.clone()), off(70)];
            let d = decide(&dead(), &reads, &policy(), t(71));
            assert_eq!(d.rule, Rule::ConfirmingOff, "after {b:?}");
            assert_eq!(d.step, Step::Idle);
        }
    }

    #[test]
    fn stale_reads_never_act() {
        let reads = [off(60), off(65)];
        let d = decide(&dead(), &reads, &policy(), t(96));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::StalePowerRead));
        assert_eq!(d.next_read_at, Some(t(96)));
    }

    #[test]
    fn reads_from_before_this_not_ready_period_do_not_count() {
        let facts = NodeFacts {
            readiness: Readiness::NotReady { since: t(200) },
            lease_renewed: Some(t(190)),
            ..dead()
        };
        // Two Off reads from an earlier incident plus one fresh one: one confirmation only.
        let reads = [off(150), off(155), off(260)];
        let d = decide(&facts, &reads, &policy(), t(261));
        assert_eq!(d.rule, Rule::ConfirmingOff);
    }

    #[test]
    fn power_on_never_fences_and_rechecks_later() {
        let reads = [off(60), read(65, PowerState::On)];
        let d = decide(&dead(), &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::PowerOn)
        );
        assert_eq!(d.next_read_at, Some(t(95)));
    }

    #[test]
    fn unknown_power_blocks_and_says_why() {
        let e = PowerState::error(ReadErrorKind::Auth, "HTTP 401 from BMC");
        let d = decide(&dead(), &[read(60, e)], &policy(), t(61));
        assert_eq!((d.state, d.rule), (NodeState::Blocked, Rule::PowerUnknown));
        assert!(d.reason.contains("auth: HTTP 401"), "{}", d.reason);
        assert_eq!(d.step, Step::Idle);
    }

    #[test]
    fn transitional_is_not_off() {
        for detail in ["PoweringOff", "PoweringOn", "Paused"] {
            let st = PowerState::Transitional {
                detail: detail.into(),
            };
            let d = decide(&dead(), &[off(60), read(65, st)], &policy(), t(66));
            assert_eq!((d.step, d.rule), (Step::Idle, Rule::PowerTransitional));
        }
    }

    #[test]
    fn dry_run_decides_but_does_not_fence() {
        let p = Policy {
            dry_run: true,
            ..policy()
        };
        let d = decide(&dead(), &[off(60), off(65)], &p, t(66));
        assert_eq!(d.step, Step::WouldFence(FenceAction::Taint));
        assert_eq!(d.rule, Rule::DryRun);
    }

    #[test]
    fn delete_node_action_is_passed_through() {
        let p = Policy {
            action: FenceAction::DeleteNode,
            ..policy()
        };
        let d = decide(&dead(), &[off(60), off(65)], &p, t(66));
        assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
    }

    #[test]
    fn no_power_source_blocks() {
        let facts = NodeFacts {
            has_power_source: false,
            ..dead()
        };
        let d = decide(&facts, &[], &policy(), t(70));
        assert_eq!((d.state, d.rule), (NodeState::Blocked, Rule::NoPowerSource));
        assert_eq!(d.next_read_at, None);
    }

    #[test]
    fn a_lease_renewed_during_not_ready_blocks() {
        let facts = NodeFacts {
            lease_renewed: Some(t(50)),
            ..dead()
        };
        let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
        assert_eq!(
            (d.state, d.rule),
            (NodeState::Blocked, Rule::LeaseRenewedRecently)
        );
        assert_eq!(d.step, Step::Idle);
        // A node with no Lease at all (very old clusters) is judged on Ready and power alone.
        let facts = NodeFacts {
            lease_renewed: None,
            ..dead()
        };
        let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
        assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    }

    #[test]
    fn foreign_taint_is_left_alone() {
        let facts = NodeFacts {
            foreign_out_of_service: true,
            ..dead()
        };
        let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::ForeignOutOfServiceTaint)
        );
    }

    #[test]
    fn no_ready_condition_is_not_acted_on() {
        let facts = NodeFacts {
            readiness: Readiness::NoCondition,
            ..dead()
        };
        let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::NoReadyCondition));
    }

    #[test]
    fn being_deleted_is_left_alone() {
        let facts = NodeFacts {
            being_deleted: true,
            ..dead()
        };
        let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::NodeBeingDeleted));
    }

    #[test]
    fn clock_skew_into_the_future_counts_as_within_grace() {
        let facts = NodeFacts {
            readiness: Readiness::NotReady { since: t(500) },
            ..dead()
        };
        let d = decide(&facts, &[], &policy(), t(100));
        assert_eq!(d.rule, Rule::NotReadyGrace);
    }

    #[test]
    fn fenced_node_not_ready_waits() {
        let d = decide(
            &fenced(Readiness::NotReady { since: t(0) }, "boot-a"),
            &[],
            &policy(),
            t(200),
        );
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Fenced, Step::Idle, Rule::FencedAwaitingRecovery)
        );
        assert_eq!(d.next_read_at, None);
    }

    #[test]
    fn untaint_needs_ready_fresh_on_and_new_boot_id() {
        let facts = fenced(Readiness::Ready, "boot-b");
        // No read yet: ask for one.
        let d = decide(&facts, &[], &policy(), t(300));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::RecoveryNeedsPowerOn));
        assert_eq!(d.next_read_at, Some(t(300)));
        // An On read from before the fence does not count.
        let d = decide(&facts, &[read(90, PowerState::On)], &policy(), t(95));
        assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
        // A stale On read does not count.
        let d = decide(&facts, &[read(250, PowerState::On)], &policy(), t(300));
        assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
        // Off or an error does not count either.
        let d = decide(&facts, &[off(290)], &policy(), t(300));
        assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
        assert_eq!(d.next_read_at, Some(t(295)));
        // Fresh On + new boot id: unfence.
        let d = decide(&facts, &[read(295, PowerState::On)], &policy(), t(300));
        assert_eq!((d.step, d.rule), (Step::Unfence, Rule::RecoveredNewBoot));
    }

    #[test]
    fn same_boot_id_never_untaints() {
        for boot in ["boot-a", ""] {
            let facts = fenced(Readiness::Ready, boot);
            let d = decide(&facts, &[read(295, PowerState::On)], &policy(), t(300));
            assert_eq!(
                (d.step, d.rule),
                (Step::Idle, Rule::RecoveredSameBootId),
                "{boot:?}"
            );
        }
    }

    #[test]
    fn untaint_disabled_holds_the_taint() {
        let p = Policy {
            untaint_on_recovery: false,
            ..policy()
        };
        let facts = fenced(Readiness::Ready, "boot-b");
        let d = decide(&facts, &[read(295, PowerState::On)], &p, t(300));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::UntaintDisabled));
    }

    #[test]
    fn dry_run_would_unfence() {
        let p = Policy {
            dry_run: true,
            ..policy()
        };
        let facts = fenced(Readiness::Ready, "boot-b");
        let d = decide(&facts, &[read(295, PowerState::On)], &p, t(300));
        assert_eq!(d.step, Step::WouldUnfence);
    }

    #[test]
    fn record_without_taint_is_cleared() {
        let mut facts = fenced(Readiness::NotReady { since: t(0) }, "boot-a");
        facts.fence.as_mut().unwrap().taint_present = false;
        let d = decide(&facts, &[], &policy(), t(300));
        assert_eq!(
            (d.step, d.rule),
            (Step::ClearRecord, Rule::FenceRemovedExternally)
        );
    }

    /// Property: whatever the reads, no decision fences unless the last `confirm_reads` counted
    /// reads are Off and fresh, the grace period is over, and it is not a dry run. Exhaustive
    /// over every sequence of up to 5 reads drawn from {On, Off, transitional, error} at a
    /// handful of spacings.
    #[test]
    fn property_fence_only_on_fresh_confirmed_off() {
        let states = [
            PowerState::On,
            PowerState::Off,
            PowerState::Transitional {
                detail: "PoweringOff".into(),
            },
            PowerState::error(ReadErrorKind::Timeout, "t"),
        ];
        let spacings = [1i64, 5, 40];
        let p = policy();
        let mut fences = 0;
        let mut checked = 0;
        for len in 0..=5usize {
            let combos = 4usize.pow(len as u32);
            for combo in 0..combos {
                for &gap in &spacings {
                    let mut reads = Vec::new();
                    let mut c = combo;
                    for i in 0..len {
                        reads.push(read(60 + i as i64 * gap, states[c % 4].clone()));
                        c /= 4;
                    }
                    for now_offset in [0i64, 10, 31] {
                        let now = t(60 + len.saturating_sub(1) as i64 * gap + now_offset);
                        let d = decide(&dead(), &reads, &p, now);
                        checked += 1;
                        if let Step::Fence(_) = d.step {
                            fences += 1;
                            let last = reads.last().unwrap();
                            assert_eq!(last.state, PowerState::Off);
                            assert!(elapsed(last.at, now) <= p.read_max_age);
                            // The trailing run of Off reads must span the confirmation.
                            let run: Vec<_> = reads
                                .iter()
                                .rev()
                                .take_while(|r| r.state == PowerState::Off)
                                .collect();
                            assert!(run.len() >= p.confirm_reads as usize);
                            let oldest = run.last().unwrap();
                            assert!(elapsed(oldest.at, last.at) >= p.confirm_interval);
                        }
                    }
                }
            }
        }
        assert!(checked > 3000, "{checked}");
        assert!(
            fences > 0,
            "the property never saw a fence: the generator is wrong"
        );
    }
}
