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
//! ([`guard`]), what it answers ([`outcome`]). It imports nothing that does I/O. This file
//! holds [`decide`] and the node's own rules in order; "why was node X fenced", the proof that
//! a machine is off, is read top to bottom in [`attest`]; the On read in [`machine_on`], a
//! fenced node's return and power-on in [`fenced`].

pub mod actuation;
mod attest;
pub mod confirmation;
mod counting;
pub mod facts;
mod fenced;
pub mod guard;
pub mod holds;
pub mod levels;
mod machine_on;
mod outcome;
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

use attest::attest;
use counting::{NotCounted, confirming_streak, identity_counts, identity_of, identity_summary};
pub use facts::{
    DEFAULT_LEASE_DURATION, FenceAction, FenceRecord, IdentityBinding, MappingConflict, NodeFacts,
    OFF_WHILE_ALIVE_PROOF, OffWhileAlive, Policy, Readiness, Renewals,
};
use fenced::decide_fenced;
pub use guard::{FreshNode, GuardPurpose, WriteGuard, recheck};
pub use holds::{Hold, HoldKind, Holds};
use machine_on::on_reading;
pub use outcome::{Decision, NodeState, Rule, Step};
pub use reading::{PowerReading, PowerState, ReadDetail, ReadErrorKind};
use silence::lease_stale_at;
pub use silence::{LeaseSilence, LeaseState, last_sign_of_life, lease_silence, lease_state};
pub use witness::{OffWitness, PowerDraw, Watts};

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
