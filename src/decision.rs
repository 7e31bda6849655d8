//! The decision core: why a node is (or is not) fenced, in one pure function.
//!
//! `decide(facts, reads, policy, now) -> Decision`. No I/O, no clock: time is passed in, so every
//! rule is a plain unit test. The daemon turns the decision's [`Step`] into API calls; `oobfence
//! why` shows the [`Rule`] that produced it. A new guard is a new fact and a new rule here,
//! never a special case elsewhere.
//!
//! Every path to a write, and what closes it:
//!
//! - [`Step::Fence`] with `action` (an Off machine): the node is NotReady, and either oobfence
//!   has seen no sign of life from its kubelet (Lease renewal, new Ready heartbeat) for
//!   `lease_stale_after` renewal intervals (its own clock: pre-attestation, whose reads may
//!   have begun while the node still showed Ready) or the node has been NotReady, with no Lease
//!   renewal seen, for at least `not_ready_grace`; no foreign out-of-service taint, no other
//!   remediator, no opt-out, no flapping; its power source is configured in the config file
//!   and maps to no other node's machine, in the region read; no read of it ever came from
//!   another machine; it never said Off or gone while the kubelet lived on
//!   (`off-while-alive`, `gone-while-alive`); and the last `confirm_reads` reads all said Off,
//!   spaced at least `confirm_interval` apart, with the newest no older than `read_max_age` —
//!   each from a machine that proved it is the node's machine ([`crate::identity`]: a UUID
//!   another Node reports too proves nothing, `duplicate-system-uuid`), unless the entry says
//!   `identity = "unchecked"`; where the entry asks for a second witness
//!   (`corroborate = "power-draw"`), each Off drew at most `max_off_watts`
//!   (`off-uncorroborated`); a sleeping or hibernated machine is never Off
//!   (`power-suspended`).
//! - The same [`Step::Fence`] while the Node still shows Ready, with `release_at_attestation`
//!   (the default): everything above but NotReady, on a stale Lease (`lease_stale_after`
//!   renewal intervals without a sign of life). The writer then re-checks at the last moment
//!   that the Lease is unrenewed and the Ready heartbeat unchanged.
//! - Force-deleting the node's pods (`release_at_attestation`, the guard's `release_pods`):
//!   only right after this daemon's own fence of the same boot landed, on a fresh Node and
//!   Lease GET that shows it still in place, the Lease unrenewed, the bootID and uid the same
//!   and no hold ([`recheck`] as [`GuardPurpose::ReleasePods`]); grace period 0 and a uid
//!   precondition on each pod.
//! - A node of several power sources ([`levels`]: its BMC at level 1, the PDU outlets that
//!   feed it at level 2): each source is judged by every rule here on its own; a level proves
//!   the machine off only when every source in it does, the first level that can answer
//!   decides, an answer other than Off ends the question, and a level is skipped only when a
//!   source of it cannot answer (unreachable, timeout, credentials refused). A level that
//!   cannot tell whose machine it reads (an outlet) proves only the config's mapping, and the
//!   outcome says so.
//! - [`Step::Fence`] on a person's word ([`confirmation`], `oobfence confirm-off`): only where
//!   no source can answer (none maps the node, or every level is silent or unknown, none
//!   answering anything but Off), for the boot the node runs now, on a NotReady node with no
//!   sign of life since the word was given (the writer re-checks the Lease). Every hold holds
//!   it but a freeze, which distrusts reads, and this rests on none.
//! - [`Step::Fence`] with `on_terminated` (a cloud instance terminated or unknown): the same,
//!   but the streak is of such answers alone (an unknown one needs at least two), and each
//!   counts only through the reader — region, endpoint, credentials — that once found the
//!   instance as this node's (`reader-changed`); `identity = "unchecked"` never waives that.
//! - [`Step::Unfence`]: oobfence's own fence, its taint still there, the node Ready again
//!   with a new bootID, and a fresh On read from the node's machine.
//! - [`Step::ClearRecord`]: oobfence's own fence record whose taint someone else removed.
//!   Only the fence record goes: the record of a power-off of that boot stays, so a person's
//!   untaint never opens the way to a second power-off of one boot.
//! - [`Step::PowerOff`] (opt-in actuation, [`actuation`]): both opt-ins (`[actuation]
//!   enabled`, the entry's `actuate`), a NotReady node whose newest read is a fresh On from
//!   the node's own machine by identity (`identity = "unchecked"` never waives it), a hang and
//!   not an abandoned node — oobfence watched the kubelet alive (a Lease it saw change, not the
//!   one it first found) and the node Ready at or after its last sign of life, silent for at
//!   least `after` and at most `max_silence` — no maintenance (cordoned, a NodeMaintenance
//!   taint, a `MaintenanceInProgress` condition), no opt-out, no other remediator, a bootID,
//!   and no power-off of this boot recorded before. Every fence hold and the power budget
//!   hold it; the writer records it on a fresh Node and Lease GET ([`recheck`] as
//!   [`GuardPurpose::PowerOff`]) and the source reads the machine once more, right before the
//!   command, on the same connection.
//! - [`Step::PowerOn`]: this daemon's own fence, the node still NotReady, a power-off of the
//!   fenced boot recorded by this daemon and not yet undone, `power_on`, a fresh Off read from
//!   the node's own machine taken after the fence; and, as for a power-off, no opt-out, no
//!   other remediator, no maintenance, and the entry still saying `actuate` (a reload may
//!   have turned it off). A pause, a stale view, standby and the power budget hold it.
//!
//! Every write is then held when something bigger than the node says so
//! ([`holds`]: a pause, a stale view, standby under `[ha]`; and for a fence also a storm, a
//! freeze, a cooldown or a spent budget — which a restart or a new leader reads back from the
//! guards' record; reads from before a thaw never count), and `dry_run` writes nothing: a
//! fence or an unfence becomes its `Would…` step, a record to clear is left as it is.
//! Everything else waits, re-reads, or refuses.
//!
//! The guards' record fails closed: an instance that started or took over and has not read its
//! predecessor's record holds every new fence and power-off (`fence-budget`), never taking an
//! unreadable record for an empty one; power actions are kept in it beside the fences, so
//! `[actuation] max_per_hour` survives a restart or a takeover after an unfence or a
//! delete-node fence erased the Node's own record; entries dated after the reader's clock
//! count from its now. The daemon decides a write made between passes on a fresh census, never
//! on the last pass's count.
//!
//! A decision to write carries a [`WriteGuard`]: what it was based on. The writer checks it on
//! the fresh GET right before the write ([`recheck`]) and aborts when anything moved.
//!
//! The core owns its words: the facts and policy it is given ([`facts`]), what a power read
//! found ([`reading`]), how long a kubelet has been silent ([`silence`]), the write guard
//! ([`guard`]). It imports nothing that does I/O. This
//! file holds every rule of [`decide`] in order, so that "why was node X fenced" is read top to
//! bottom in one place; that is why it runs past 600 lines.

pub mod actuation;
pub mod confirmation;
pub mod facts;
pub mod guard;
pub mod holds;
pub mod levels;
pub mod reading;
mod silence;
#[cfg(test)]
mod tests;
pub mod witness;

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use crate::identity::{self, IdentityCheck, Verdict};

pub use facts::{
    DEFAULT_LEASE_DURATION, FenceAction, FenceRecord, IdentityBinding, MappingConflict, NodeFacts,
    OFF_WHILE_ALIVE_PROOF, OffWhileAlive, Policy, Readiness, Renewals,
};
pub use guard::{FreshNode, GuardPurpose, WriteGuard, recheck};
pub use holds::{Hold, HoldKind, Holds};
pub use reading::{PowerReading, PowerState, ReadDetail, ReadErrorKind};
use silence::lease_stale_at;
pub use silence::{LeaseSilence, LeaseState, last_sign_of_life, lease_silence, lease_state};
pub use witness::{OffWitness, PowerDraw, Watts};

/// Where a node stands, for `why`, `/nodes` and the `node_state` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Healthy,
    /// NotReady, still within the grace period; or Ready with a stale Lease, its power read
    /// ahead of NotReady (pre-attestation).
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
    /// Opt-in actuation: power off a hung node's machine (it reads On, its kubelet silent for
    /// `[actuation] after`); the fence follows on the Off reads, by the rules above.
    PowerOff,
    /// Dry run: everything says power off, nothing is sent.
    WouldPowerOff,
    /// Opt-in actuation: power on again the machine oobfence powered off, once fenced.
    PowerOn,
    /// Dry run: everything says power on, nothing is sent.
    WouldPowerOn,
}

impl Step {
    /// Whether carrying it out writes: to a Node (a fence, which may release its pods; an
    /// unfence; a record cleared) or to a machine's power.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Step::Fence(_) | Step::Unfence | Step::ClearRecord | Step::PowerOff | Step::PowerOn
        )
    }
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
    OtherRemediator,
    OptedOut,
    Flapping,
    NoPowerSource,
    RegionMismatch,
    SharedMachine,
    IdentityMismatch,
    OffWhileAlive,
    GoneWhileAlive,
    IdentityUnverified,
    ReaderChanged,
    DuplicateSystemUuid,
    OffUncorroborated,
    LeaseRenewedRecently,
    PreAttested,
    AwaitingPowerRead,
    StalePowerRead,
    PowerOn,
    PowerTransitional,
    PowerSuspended,
    PowerUnknown,
    ConfirmingOff,
    ConfirmedOff,
    ConfirmedGone,
    ConfirmedOffByPerson,
    DryRun,
    FencedAwaitingRecovery,
    FencedByAnother,
    FenceRemovedExternally,
    UntaintDisabled,
    RecoveryNeedsPowerOn,
    RecoveredSameBootId,
    RecoveredNewBoot,
    Paused,
    StaleView,
    SelfPartition,
    Storm,
    StormCooldown,
    FenceBudget,
    Standby,
    WaitingToActuate,
    PoweringOff,
    PoweredOffConfirming,
    PowerOffIgnored,
    PoweringOn,
    PowerBudget,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::NodeBeingDeleted => "node-being-deleted",
            Rule::NodeReady => "node-ready",
            Rule::NoReadyCondition => "no-ready-condition",
            Rule::NotReadyGrace => "not-ready-grace",
            Rule::ForeignOutOfServiceTaint => "foreign-out-of-service-taint",
            Rule::OtherRemediator => "other-remediator",
            Rule::OptedOut => "opted-out",
            Rule::Flapping => "flapping",
            Rule::NoPowerSource => "no-power-source",
            Rule::RegionMismatch => "region-mismatch",
            Rule::SharedMachine => "shared-machine",
            Rule::IdentityMismatch => "identity-mismatch",
            Rule::OffWhileAlive => "off-while-alive",
            Rule::GoneWhileAlive => "gone-while-alive",
            Rule::IdentityUnverified => "identity-unverified",
            Rule::ReaderChanged => "reader-changed",
            Rule::DuplicateSystemUuid => "duplicate-system-uuid",
            Rule::OffUncorroborated => "off-uncorroborated",
            Rule::LeaseRenewedRecently => "lease-renewed-recently",
            Rule::PreAttested => "pre-attested",
            Rule::AwaitingPowerRead => "awaiting-power-read",
            Rule::StalePowerRead => "stale-power-read",
            Rule::PowerOn => "power-on",
            Rule::PowerTransitional => "power-transitional",
            Rule::PowerSuspended => "power-suspended",
            Rule::PowerUnknown => "power-unknown",
            Rule::ConfirmingOff => "confirming-off",
            Rule::ConfirmedOff => "confirmed-off",
            Rule::ConfirmedGone => "confirmed-gone",
            Rule::ConfirmedOffByPerson => "confirmed-off-by-person",
            Rule::DryRun => "dry-run",
            Rule::FencedAwaitingRecovery => "fenced-awaiting-recovery",
            Rule::FencedByAnother => "fenced-by-another",
            Rule::FenceRemovedExternally => "fence-removed-externally",
            Rule::UntaintDisabled => "untaint-disabled",
            Rule::RecoveryNeedsPowerOn => "recovery-needs-power-on",
            Rule::RecoveredSameBootId => "recovered-same-boot-id",
            Rule::RecoveredNewBoot => "recovered-new-boot",
            Rule::Paused => "paused",
            Rule::StaleView => "stale-view",
            Rule::SelfPartition => "self-partition",
            Rule::Storm => "storm",
            Rule::StormCooldown => "storm-cooldown",
            Rule::FenceBudget => "fence-budget",
            Rule::Standby => "standby",
            Rule::WaitingToActuate => "waiting-to-actuate",
            Rule::PoweringOff => "powering-off",
            Rule::PoweredOffConfirming => "powered-off-confirming",
            Rule::PowerOffIgnored => "power-off-ignored",
            Rule::PoweringOn => "powering-on",
            Rule::PowerBudget => "power-budget",
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
    /// When this decision runs out by the clock alone (a grace period ends): decide again then,
    /// not at some later pass. Reads wanted are in `next_read_at`.
    pub decide_again_at: Option<Timestamp>,
    /// For [`Step::Fence`] and [`Step::Unfence`]: what the writer must re-check.
    pub guard: Option<WriteGuard>,
}

impl Decision {
    fn new(state: NodeState, step: Step, rule: Rule, reason: impl Into<String>) -> Self {
        Decision {
            state,
            step,
            rule,
            reason: reason.into(),
            next_read_at: None,
            decide_again_at: None,
            guard: None,
        }
    }

    fn guarded(mut self, guard: WriteGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    fn read_at(mut self, at: Timestamp) -> Self {
        self.next_read_at = Some(at);
        self
    }

    fn again_at(mut self, at: Timestamp) -> Self {
        self.decide_again_at = Some(at);
        self
    }
}

/// When a wait that ends at `end` runs out: then, or earlier if the Lease goes stale first
/// (which waives the wait).
fn runs_out(end: Timestamp, stale_at: Option<Timestamp>, now: Timestamp) -> Timestamp {
    stale_at.filter(|s| *s > now).map_or(end, |s| s.min(end))
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// How long from `earlier` to `later`; zero if `later` is not after `earlier` (clock skew).
fn elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// `12.5s`, or `25s` when whole.
fn tenths(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        secs(d)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn secs(d: Duration) -> String {
    let d = Duration::from_secs(d.as_secs());
    humantime::format_duration(d).to_string()
}

/// Decides what to do about one node. `reads` are this node's power reads in time order, all
/// taken since the node was last seen Ready (the daemon drops them whenever it is).
///
/// The node's own rules come first ([`decide_node`]); a write they lead to is then held when
/// something outside the node says so ([`apply_holds`]): the last word before any write.
pub fn decide(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    // Reads from before a freeze thawed or the view recovered never count.
    let reads = match facts.holds.evidence_not_before {
        Some(t) => &reads[reads.partition_point(|r| r.at < t)..],
        None => reads,
    };
    apply_holds(
        decide_node(facts, reads, policy, now),
        &facts.holds,
        reads,
        policy,
    )
}

fn hold_rule(kind: HoldKind) -> Rule {
    match kind {
        HoldKind::Paused => Rule::Paused,
        HoldKind::StaleView => Rule::StaleView,
        HoldKind::SelfPartition => Rule::SelfPartition,
        HoldKind::Storm => Rule::Storm,
        HoldKind::StormCooldown => Rule::StormCooldown,
        HoldKind::FenceBudget => Rule::FenceBudget,
        HoldKind::Standby => Rule::Standby,
        HoldKind::PowerBudget => Rule::PowerBudget,
    }
}

/// A pause or a stale view holds every write; a storm, a freeze, a cooldown or a spent budget
/// holds a new fence. A held fence keeps its node read now and then, so that evidence is fresh
/// when the hold lifts (and the reads must confirm again if it is not).
fn apply_holds(d: Decision, holds: &Holds, reads: &[PowerReading], policy: &Policy) -> Decision {
    // A power-off leads to a fence: every fence hold holds it, and the power actions' own.
    let powering_off = matches!(d.step, Step::PowerOff | Step::WouldPowerOff);
    let fencing = matches!(d.step, Step::Fence(_) | Step::WouldFence(_)) || powering_off;
    let writing = fencing
        || matches!(
            d.step,
            Step::Unfence
                | Step::WouldUnfence
                | Step::ClearRecord
                | Step::PowerOn
                | Step::WouldPowerOn
        );
    let hold = match (&holds.write, &holds.fence, &holds.power) {
        (Some(h), _, _) if writing => h,
        (_, Some(h), _) if fencing => h,
        (_, _, Some(h)) if powering_off || matches!(d.step, Step::PowerOn | Step::WouldPowerOn) => {
            h
        }
        _ => return d,
    };
    let state = if fencing { NodeState::Blocked } else { d.state };
    let mut held = Decision::new(
        state,
        Step::Idle,
        hold_rule(hold.kind),
        format!("{}; without it: {}", hold.reason, d.reason),
    );
    if fencing && let Some(last) = reads.last() {
        held = held.read_at(plus(last.at, policy.recheck_interval));
    }
    held
}

/// Every rule about the node itself, in order.
fn decide_node(
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

    let silence = lease_silence(last_sign_of_life(facts), facts.lease_duration, policy, now);
    let held = facts.holds.pre_attest.as_deref().or(facts
        .holds
        .lease_not_yet_counted
        .then_some("its Lease went stale after the last count of the datacenter's Leases; read ahead once counted"));
    let ahead = silence.filter(|_| held.is_none());
    let held_ahead = match (&silence, held) {
        (Some(s), Some(why)) => format!(
            "; {}, but power is not read ahead of NotReady: {why}",
            s.describe()
        ),
        _ => String::new(),
    };
    let phase = match facts.readiness {
        Readiness::Ready => match ahead {
            Some(silence) => Phase::Ahead(silence),
            None => {
                return Decision::new(
                    S::Healthy,
                    Step::Idle,
                    Rule::NodeReady,
                    format!("node is Ready{held_ahead}"),
                );
            }
        },
        Readiness::NoCondition => {
            return Decision::new(
                S::Suspect,
                Step::Idle,
                Rule::NoReadyCondition,
                "node has no Ready condition yet; nothing is decided about a node that never reported",
            );
        }
        Readiness::NotReady { since } => Phase::NotReady {
            not_ready_for: elapsed(since, now),
            pre_attested: ahead,
            held_ahead,
            // The clock alone can waive the grace: the moment the Lease goes stale.
            stale_at: match (silence, held) {
                (None, None) => lease_stale_at(facts, policy),
                _ => None,
            },
        },
    };
    let d = attest(facts, reads, policy, now, &phase);
    match phase {
        Phase::Ahead(silence) => ahead_of_not_ready(d, &silence),
        Phase::NotReady { .. } => d,
    }
}

/// Which question the power reads answer.
enum Phase {
    /// Ready, but the Lease is stale: read ahead of NotReady; written only once proven off
    /// with `release_at_attestation`.
    Ahead(LeaseSilence),
    NotReady {
        not_ready_for: Duration,
        /// The Lease was stale (and reading ahead allowed): `not_ready_grace` does not apply.
        pre_attested: Option<LeaseSilence>,
        /// Why the Lease's silence was not used, as a clause for the reason (may be empty).
        held_ahead: String,
        /// When the Lease goes stale, if it is not yet and reading ahead is not held: from
        /// then on `not_ready_grace` does not apply.
        stale_at: Option<Timestamp>,
    },
}

impl Phase {
    fn describe(&self) -> String {
        match self {
            Phase::Ahead(s) => format!("Ready, {}", s.describe()),
            Phase::NotReady {
                not_ready_for,
                pre_attested: Some(s),
                ..
            } => format!(
                "NotReady for {} (pre-attested: {}; not_ready_grace does not apply)",
                secs(*not_ready_for),
                s.describe()
            ),
            Phase::NotReady { not_ready_for, .. } => {
                format!("NotReady for {}", secs(*not_ready_for))
            }
        }
    }
}

/// What the reads ahead of NotReady found, as a suspect's decision: a Ready node is written
/// only when they prove it off and `release_at_attestation` is on.
fn ahead_of_not_ready(d: Decision, silence: &LeaseSilence) -> Decision {
    // Proven off, released at attestation: the one write a Ready node may get.
    if matches!(d.step, Step::Fence(_) | Step::WouldFence(_)) {
        return d;
    }
    // A rule that wants no read (no power source, opted out, another remediator...) leaves
    // the node as healthy as it shows: there is nothing to read ahead.
    let (state, reason) = if d.rule == Rule::PreAttested {
        (NodeState::Suspect, d.reason)
    } else if d.next_read_at.is_none() {
        (
            NodeState::Healthy,
            format!(
                "Ready, but {}; nothing is read ahead of NotReady: {}",
                silence.describe(),
                d.reason
            ),
        )
    } else {
        (
            NodeState::Suspect,
            format!(
                "Ready, but {}: reading power ahead of NotReady, nothing written yet; {}",
                silence.describe(),
                d.reason
            ),
        )
    };
    Decision {
        state,
        step: Step::Idle,
        guard: None,
        reason,
        ..d
    }
}

/// The rules that read power and judge the reads, for a NotReady node or, ahead of NotReady,
/// a Ready one whose Lease is stale.
fn attest(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
    phase: &Phase,
) -> Decision {
    use NodeState as S;

    if facts.foreign_out_of_service {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::ForeignOutOfServiceTaint,
            "node already carries an out-of-service taint that oobfence did not place; leaving it alone",
        );
    }

    if let Some(remediator) = &facts.other_remediator {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::OtherRemediator,
            format!(
                "another remediator is at work on this node ({remediator}); two fencers on one node can undo each other's work, so oobfence leaves it alone"
            ),
        );
    }

    if let Some(why) = &facts.opted_out {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::OptedOut,
            format!("the node is excluded from fencing ({why}); never fenced while it is"),
        );
    }

    let flaps = facts
        .not_ready_seen
        .iter()
        .filter(|t| elapsed(**t, now) <= policy.flap_window)
        .count();
    if policy.flap_limit > 0 && flaps > policy.flap_limit as usize {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::Flapping,
            format!(
                "the node went NotReady {flaps} times in the last {} (more than flap_limit = {}): a flapping node is held, not fenced, until it settles",
                secs(policy.flap_window),
                policy.flap_limit
            ),
        );
    }

    // The grace period is for a node whose power nobody read ahead: without a stale Lease,
    // NotReady alone is a weak sign.
    if let Phase::NotReady {
        not_ready_for,
        pre_attested: None,
        held_ahead,
        stale_at,
    } = phase
        && *not_ready_for < policy.not_ready_grace
    {
        return Decision::new(
            S::Suspect,
            Step::Idle,
            Rule::NotReadyGrace,
            format!(
                "NotReady for {} of the {} grace period; no power read yet{held_ahead}",
                secs(*not_ready_for),
                secs(policy.not_ready_grace)
            ),
        )
        .again_at(runs_out(
            plus(now, policy.not_ready_grace - *not_ready_for),
            *stale_at,
            now,
        ));
    }

    if !facts.has_power_source {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::NoPowerSource,
            "no [[bmc]] entry in the config matches this node; its power cannot be attested",
        );
    }

    match &facts.mapping_conflict {
        Some(MappingConflict::RegionMismatch(detail)) => {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::RegionMismatch,
                format!(
                    "{detail}: an instance of another region is absent from every answer, which must never read as gone; fix [aws] region"
                ),
            );
        }
        Some(MappingConflict::SharedMachine(detail)) => {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::SharedMachine,
                format!(
                    "{detail}: one machine's being off cannot tell which node is dead; fix the config's mapping"
                ),
            );
        }
        None => {}
    }

    if let Some(b) = &facts.identity_binding
        && let Verdict::Mismatch(detail) = &b.verdict
    {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::IdentityMismatch,
            format!(
                "the power source answers for another machine (seen {}): {detail}",
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        )
        .read_at(plus(b.at, policy.recheck_interval));
    }

    // A source that said Off (or gone) while the kubelet went on living reads another machine,
    // account or endpoint, or misreports: none of its Off or gone answers proves anything until
    // it says On again.
    if let Some(o) = &facts.off_while_alive
        && o.proven()
    {
        let (rule, said) = if o.gone {
            (
                Rule::GoneWhileAlive,
                "the instance is gone (terminated or not found)",
            )
        } else {
            (Rule::OffWhileAlive, "Off")
        };
        return Decision::new(
            S::Blocked,
            Step::Idle,
            rule,
            format!(
                "the power source said {said} at {} while the node was Ready, and its kubelet showed life {} times after that: it reads another machine or account, or misreports this one; never fenced until it reads On again",
                o.read_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                o.signs_of_life_after
            ),
        )
        .read_at(plus(o.read_at, policy.recheck_interval));
    }

    // A pre-attested node's Lease is stale by definition; otherwise a renewal within the grace
    // period says something on the machine is alive.
    if let Phase::NotReady {
        pre_attested: None,
        stale_at,
        ..
    } = phase
        && let Some(seen) = facts.lease_renewal_seen
    {
        let age = elapsed(seen, now);
        if age < policy.not_ready_grace {
            let reason = if facts.lease_first_sight {
                // After a restart the Lease is new to oobfence: its renewTime is the node's
                // clock, so the silence before is unknown, and the grace runs from the first
                // sight. Nothing is known to be alive.
                format!(
                    "oobfence first saw this node's Lease {} ago (when it started watching it) and has seen no renewal since; how long the kubelet was silent before is unknown, so the {} grace runs from then",
                    secs(age),
                    secs(policy.not_ready_grace)
                )
            } else {
                format!(
                    "oobfence saw the kubelet renew its Lease {} ago (less than the {} grace): something on the machine is alive",
                    secs(age),
                    secs(policy.not_ready_grace)
                )
            };
            return Decision::new(S::Blocked, Step::Idle, Rule::LeaseRenewedRecently, reason)
                .again_at(runs_out(plus(seen, policy.not_ready_grace), *stale_at, now));
        }
    }

    // The daemon drops a node's reads whenever it sees it come back Ready or its kubelet alive,
    // so every read here was taken during this period (by oobfence's clock, never compared with
    // the node's); and a read from before the last sign of life never counts, whoever forgot it.
    let reads = match last_sign_of_life(facts) {
        Some(alive) => &reads[reads.partition_point(|r| r.at < alive)..],
        None => reads,
    };
    let Some(last) = reads.last() else {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::AwaitingPowerRead,
            format!("{}; reading power", phase.describe()),
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

    // A machine that ever answered as another machine in this period: the mapping is wrong,
    // whatever it says now.
    if let Some((r, detail)) = reads
        .iter()
        .rev()
        .find_map(|r| match identity_of(facts, r) {
            Verdict::Mismatch(d) => Some((r, d)),
            _ => None,
        })
    {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::IdentityMismatch,
            format!(
                "the power source answered for another machine at {}: {detail}; never fenced",
                r.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval));
    }

    match &last.state {
        PowerState::On => on_reading(facts, last, phase, policy, now),
        PowerState::Transitional { detail } => Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::PowerTransitional,
            format!("power is changing ({detail}); not off yet, reading again"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Suspended { detail } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerSuspended,
            format!("the machine is suspended with its memory kept ({detail}): it resumes with the same processes and bootID, so it is not off; never fenced"),
        )
        .read_at(plus(last.at, policy.recheck_interval)),
        PowerState::Error { kind, detail } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerUnknown,
            format!("power state unknown ({kind}: {detail}); never fenced on an unknown"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Off | PowerState::Terminated | PowerState::NotFound => {
            let gone = last.state.is_gone();
            // Only a streak of one kind counts: Off then not-found is one answer of each, not
            // two proofs that the instance is gone.
            let streak = confirming_streak(reads, gone, policy.confirm_interval);
            // Every read counted must come from the node's own machine.
            for r in &streak {
                if let Err(NotCounted { rule, why }) = identity_counts(facts, r) {
                    let advice = match rule {
                        Rule::IdentityUnverified if !r.state.is_gone() => {
                            "; set identity = \"unchecked\" on the entry only for machines that cannot report one"
                        }
                        _ => "",
                    };
                    return Decision::new(
                        S::Blocked,
                        Step::Idle,
                        rule,
                        format!(
                            "the {} read at {} cannot be tied to this node's machine: {why}{advice}",
                            r.state,
                            r.at.strftime("%Y-%m-%dT%H:%M:%SZ")
                        ),
                    )
                    .read_at(plus(last.at, policy.recheck_interval));
                }
            }
            // With a second witness asked for, every Off counted must have it agree.
            let mut witness = String::new();
            if let Some(required) = facts.off_witness.filter(|_| !gone) {
                for r in &streak {
                    match witness::check(required, r.power_draw.as_ref()) {
                        Ok(seen) if witness.is_empty() => witness = format!(", {seen}"),
                        Ok(_) => {}
                        Err(why) => {
                            return Decision::new(
                                S::Blocked,
                                Step::Idle,
                                Rule::OffUncorroborated,
                                format!(
                                    "the Off read at {} is not corroborated: {why}; never fenced on an Off the entry's corroborate = \"{}\" witness does not confirm",
                                    r.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                    required.name()
                                ),
                            )
                            .read_at(plus(last.at, policy.confirm_interval));
                        }
                    }
                }
            }
            let confirmed = streak.len();
            // A cloud that does not know an instance may just not have caught up yet
            // (eventual consistency): "not found" is never trusted on one answer.
            let needed = if streak.iter().any(|r| r.state == PowerState::NotFound) {
                policy.confirm_reads.max(2)
            } else {
                policy.confirm_reads
            } as usize;
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
                "{}, {confirmed} consecutive {what} reads spaced at least {} apart from the node's machine ({}{witness}), newest {} old ({})",
                phase.describe(),
                secs(policy.confirm_interval),
                identity_summary(facts, last),
                secs(age),
                last.state
            );
            let ahead = matches!(phase, Phase::Ahead(_));
            if ahead && !policy.release_at_attestation {
                // Kept fresh, so that it still counts the moment the node turns NotReady.
                let refresh = policy.confirm_interval.max(policy.read_max_age / 2);
                return Decision::new(
                    S::Suspect,
                    Step::Idle,
                    Rule::PreAttested,
                    format!(
                        "{evidence}: power attested ahead of NotReady; {action} the moment the node turns NotReady, without not_ready_grace"
                    ),
                )
                .read_at(plus(last.at, refresh));
            }
            // Released at attestation: the pods go with the fence, and a Ready node's fence
            // is not kept for NotReady.
            let what_now = match (policy.release_at_attestation, ahead) {
                (false, _) => action.to_string(),
                (true, false) => format!(
                    "{action}, then force-delete its pods (release_at_attestation)"
                ),
                (true, true) => format!(
                    "power attested while the Node still shows Ready: {action} now, then force-delete its pods, without waiting for NotReady (release_at_attestation)"
                ),
            };
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldFence(action),
                    Rule::DryRun,
                    format!("{evidence}; dry run: would {what_now}, writing nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::Fence(action),
                    rule,
                    format!("{evidence}: {what_now}"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::Fence,
                    uid: facts.uid.clone(),
                    boot_id: facts.boot_id.clone(),
                    lease_renew_time: facts.lease_renew_time,
                    evidence_at: last.at,
                    read_max_age: policy.read_max_age,
                    while_ready: ahead,
                    ready_heartbeat: facts.ready_heartbeat.filter(|_| ahead),
                    release_pods: policy.release_at_attestation,
                    on_word: false,
                })
            }
        }
    }
}

/// The machine reads On: never fenced. With opt-in actuation ([`actuation`]), a NotReady node
/// whose kubelet has been silent for `[actuation] after` is powered off, on this very read's
/// proof that the machine is the node's; a machine oobfence already powered off is waited for.
fn on_reading(
    facts: &NodeFacts,
    last: &PowerReading,
    phase: &Phase,
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;
    const NEVER: &str = "the power source says On: likely a partition or a hung OS, not a dead machine; never fenced";
    let blocked = |reason: String| {
        Decision::new(S::Blocked, Step::Idle, Rule::PowerOn, reason)
            .read_at(plus(last.at, policy.recheck_interval))
    };
    let Some(actuation) = policy.actuation.as_ref() else {
        return blocked(NEVER.into());
    };
    let at = |t: Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    if let Some(r) = facts.actuation.powered_off(&facts.boot_id) {
        let since = elapsed(r.off_at, now);
        if since <= actuation::POWER_OFF_TAKES {
            return Decision::new(
                S::Confirming,
                Step::Idle,
                Rule::PoweredOffConfirming,
                format!(
                    "oobfence powered the machine off at {} ({} ago); it still reads On: reading again",
                    at(r.off_at),
                    secs(since)
                ),
            )
            .read_at(plus(last.at, policy.confirm_interval));
        }
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerOffIgnored,
            format!(
                "oobfence powered the machine off at {}, {} ago, and it still reads On: the BMC took the command but the machine did not turn off; never powered off twice for one boot, a person must look",
                at(r.off_at),
                secs(since)
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval));
    }
    if !matches!(phase, Phase::NotReady { .. }) {
        return blocked(NEVER.into());
    }
    let Verdict::Match(machine) = identity_of(facts, last) else {
        return blocked(format!(
            "{NEVER}; not powered off: this On read does not prove it comes from the node's machine"
        ));
    };
    match actuation::off_verdict(Some(actuation), facts, now) {
        actuation::OffVerdict::PowerOff => {
            let reason = format!(
                "{}, the power source says On from the node's machine ({machine}) and oobfence has seen no sign of life from its kubelet for at least {} ([actuation] after): a hung node",
                phase.describe(),
                secs(actuation.after)
            );
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldPowerOff,
                    Rule::DryRun,
                    format!("{reason}; dry run: would power it off, sending nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::PowerOff,
                    Rule::PoweringOff,
                    format!("{reason}: power it off, then fence it on its Off reads"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::PowerOff,
                    uid: facts.uid.clone(),
                    boot_id: facts.boot_id.clone(),
                    lease_renew_time: facts.lease_renew_time,
                    evidence_at: last.at,
                    read_max_age: policy.read_max_age,
                    while_ready: false,
                    ready_heartbeat: None,
                    release_pods: false,
                    on_word: false,
                })
            }
        }
        actuation::OffVerdict::Wait { at: when, why } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::WaitingToActuate,
            format!(
                "the power source says On: a partition or a hung OS; {why}: powered off at {} unless its kubelet shows life",
                at(when)
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval))
        .again_at(when),
        actuation::OffVerdict::No(why) => blocked(format!("{NEVER}; not powered off: {why}")),
    }
}

/// A fenced machine oobfence powered off, to be powered on again: on a fresh Off read from the
/// node's own machine, taken after the fence.
fn power_on(
    facts: &NodeFacts,
    record: &FenceRecord,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;
    let fresh = reads
        .last()
        .filter(|r| r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age);
    let Some(off) =
        fresh.filter(|r| r.state == PowerState::Off && identity_of(facts, r).is_match())
    else {
        let next = match fresh {
            Some(r) => plus(r.at, policy.confirm_interval),
            None => now,
        };
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::PoweringOn,
            format!(
                "fenced at {}; powering the machine on needs a fresh Off read from the node's machine ({})",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                reads.last().map_or("no read yet".to_string(), |r| format!("last read: {}", r.state))
            ),
        )
        .read_at(next);
    };
    let reason = format!(
        "fenced at {} after oobfence powered the machine off; it reads Off ({}): power it on again, so that it boots and the fence comes off on its new bootID",
        record.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        identity_summary(facts, off)
    );
    if policy.dry_run {
        return Decision::new(
            S::Fenced,
            Step::WouldPowerOn,
            Rule::DryRun,
            format!("{reason}; dry run: would power it on, sending nothing"),
        );
    }
    Decision::new(S::Fenced, Step::PowerOn, Rule::PoweringOn, reason).guarded(WriteGuard {
        purpose: GuardPurpose::PowerOn,
        uid: facts.uid.clone(),
        boot_id: record.boot_id.clone(),
        lease_renew_time: facts.lease_renew_time,
        evidence_at: off.at,
        read_max_age: policy.read_max_age,
        while_ready: false,
        ready_heartbeat: None,
        release_pods: false,
        on_word: false,
    })
}

/// How a read's machine compares with the node's.
fn identity_of(facts: &NodeFacts, r: &PowerReading) -> Verdict {
    identity::verify(&facts.identity, &r.identity)
}

/// Why a read may not count, and the rule that says so.
struct NotCounted {
    rule: Rule,
    why: String,
}

impl NotCounted {
    fn new(rule: Rule, why: impl Into<String>) -> Self {
        NotCounted {
            rule,
            why: why.into(),
        }
    }
}

/// Whether a read may count towards a fence (or an unfence): its machine proved it is the
/// node's; or, for "gone" (an instance that no longer exists reports no addresses), the same
/// reader (credentials, endpoint) proved earlier that it knew this node's machine; or, for an
/// Off read, the entry says `identity = "unchecked"`. A mismatch never counts, checked or not;
/// and `unchecked` never turns "this reader cannot see the instance" into "gone".
fn identity_counts(facts: &NodeFacts, r: &PowerReading) -> Result<(), NotCounted> {
    let d = match identity_of(facts, r) {
        Verdict::Match(_) => return Ok(()),
        Verdict::Mismatch(d) => return Err(NotCounted::new(Rule::IdentityMismatch, d)),
        Verdict::Unverifiable(d) => d,
    };
    if !r.state.is_gone() {
        if facts.identity_check == IdentityCheck::Unchecked {
            return Ok(());
        }
        if !facts.identity.uuid_shared_with.is_empty()
            && matches!(r.identity, identity::MachineIdentity::SystemUuid { .. })
        {
            return Err(NotCounted::new(Rule::DuplicateSystemUuid, d));
        }
        return Err(NotCounted::new(Rule::IdentityUnverified, d));
    }
    match &facts.identity_binding {
        // Equal words from two readers that each could not tell their key prove nothing.
        _ if !reading::reader_is_known(&r.reader) => Err(NotCounted::new(
            Rule::IdentityUnverified,
            format!(
                "{d}; this answer came through {}: a reader whose key is unknown names no account, so its \"gone\" proves nothing",
                r.reader
            ),
        )),
        Some(b) if b.verdict.is_match() && b.reader == r.reader => Ok(()),
        Some(b) if b.verdict.is_match() => Err(NotCounted::new(
            Rule::ReaderChanged,
            format!(
                "{d}; the instance was known as this node's machine through {} ({}), but this answer came through {}: new credentials, a new endpoint or another account prove nothing until they find the instance themselves",
                b.reader,
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                r.reader
            ),
        )),
        _ => Err(NotCounted::new(
            Rule::IdentityUnverified,
            format!(
                "{d}, and {} never answered for the node's machine, so \"gone\" may only mean \"not ours\"{}",
                r.reader,
                if facts.identity_check == IdentityCheck::Unchecked {
                    " (identity = \"unchecked\" relaxes which machine answers an Off read, never this)"
                } else {
                    ""
                }
            ),
        )),
    }
}

fn identity_summary(facts: &NodeFacts, r: &PowerReading) -> String {
    match identity_of(facts, r) {
        Verdict::Match(d) => d,
        _ if r.state.is_gone() => match &facts.identity_binding {
            Some(b) if b.verdict.is_match() => format!(
                "{}, verified {} through {}",
                b.verdict.detail(),
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                b.reader
            ),
            _ => "identity unverified".into(),
        },
        _ if facts.identity_check == IdentityCheck::Unchecked => {
            "identity unchecked by configuration".into()
        }
        _ => "identity unverified".into(),
    }
}

/// The reads that confirm the newest one: walking back from the newest, reads of the same kind
/// (Off, or gone: terminated / not found), each at least `interval` older than the previous
/// counted one; a read of that kind closer than that is skipped, and any other read ends the
/// streak.
fn confirming_streak(reads: &[PowerReading], gone: bool, interval: Duration) -> Vec<&PowerReading> {
    let mut streak: Vec<&PowerReading> = Vec::new();
    for r in reads.iter().rev() {
        let same_kind = if gone {
            r.state.is_gone()
        } else {
            r.state == PowerState::Off
        };
        if !same_kind {
            break;
        }
        match streak.last() {
            Some(prev) if elapsed(r.at, prev.at) < interval => continue,
            _ => streak.push(r),
        }
    }
    streak
}

fn decide_fenced(
    facts: &NodeFacts,
    record: &FenceRecord,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;

    if !record.ours {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedByAnother,
            "the node's fence was placed by another oobfence (another datacenter's or host's, oobfence.io/fenced-by); this daemon never lifts nor adopts it",
        );
    }
    if !record.taint_present && policy.dry_run {
        return Decision::new(
            S::Healthy,
            Step::Idle,
            Rule::DryRun,
            "oobfence's out-of-service taint was removed by someone else; dry run: would drop its fence record, which stays",
        );
    }
    if !record.taint_present {
        return Decision::new(
            S::Healthy,
            Step::ClearRecord,
            Rule::FenceRemovedExternally,
            "oobfence's out-of-service taint was removed by someone else; dropping its fence record",
        );
    }
    if facts.readiness != Readiness::Ready {
        let not_powered_on =
            match actuation::on_verdict(policy.actuation.as_ref(), facts, &record.boot_id) {
                actuation::OnVerdict::Due => return power_on(facts, record, reads, policy, now),
                actuation::OnVerdict::No(why) => {
                    format!("; oobfence powered its machine off but does not power it on: {why}")
                }
                actuation::OnVerdict::NotDue => String::new(),
            };
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {}; waiting for the node to return Ready{not_powered_on}",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        );
    }
    // Fenced while it still showed Ready (release at attestation): the Ready condition is the
    // dead kubelet's last word until the controller-manager marks it, not a return.
    if last_sign_of_life(facts).is_some_and(|alive| alive <= record.at) {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {} while the Node still showed Ready, and no sign of life from its kubelet since; waiting for the node to return",
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
    let Some(on) = fresh_on else {
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
    };
    // ...from the node's own machine.
    if let Err(NotCounted { why, .. }) = identity_counts(facts, on) {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::IdentityMismatch,
            format!("node is Ready and a machine reads On, but it is not proven to be this node's: {why}; the fence stays"),
        )
        .read_at(plus(on.at, policy.recheck_interval));
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
        "node is Ready, power reads On ({}), bootID changed ({} -> {})",
        identity_summary(facts, on),
        record.boot_id,
        facts.boot_id
    );
    if policy.dry_run {
        Decision::new(
            S::Recovering,
            Step::WouldUnfence,
            Rule::DryRun,
            format!("{reason}; dry run: would remove the taint"),
        )
    } else {
        Decision::new(S::Recovering, Step::Unfence, Rule::RecoveredNewBoot, reason).guarded(
            WriteGuard {
                purpose: GuardPurpose::Unfence,
                uid: facts.uid.clone(),
                boot_id: facts.boot_id.clone(),
                lease_renew_time: None,
                evidence_at: on.at,
                read_max_age: policy.read_max_age,
                while_ready: false,
                ready_heartbeat: None,
                release_pods: false,
                on_word: false,
            },
        )
    }
}
