//! Opt-in actuation, the core's part: when a NotReady node whose kubelet has been silent for
//! `after` reads On from its own machine, power it off (then today's rules fence it on the Off
//! reads that follow); once it is fenced, power it on again. Pure, like the rest of the core.
//!
//! Both opt-ins must say yes: the datacenter's `[actuation] enabled` (here: `Policy::actuation`
//! is `Some`) and the node's power source (`actuate = true` on its entry: [`ActuationFacts`]).
//! What oobfence did is recorded on the Node before each command is sent ([`PowerRecord`]), so
//! that a restart or another `[ha]` instance never powers one boot off twice.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::{elapsed, plus, secs};

/// How long a machine oobfence powered off may go on reading On before it counts as having
/// ignored the command (`power-off-ignored`); until then its failure domain is busy.
pub const POWER_OFF_TAKES: Duration = Duration::from_secs(120);

/// `[actuation]`, when enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ActuationPolicy {
    /// How long oobfence must have seen no sign of life from a NotReady node's kubelet (by its
    /// own clock) before it powers the machine off.
    pub after: Duration,
    /// Power the machine on again once it is fenced.
    pub power_on: bool,
}

impl Default for ActuationPolicy {
    fn default() -> Self {
        ActuationPolicy {
            // Well past the controller's grace and `not_ready_grace`: a kubelet stalled by a
            // long GC pause or a saturated link has every chance to come back first.
            after: Duration::from_secs(300),
            power_on: true,
        }
    }
}

/// What oobfence recorded on the Node about its power actions (annotations written before each
/// command).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerRecord {
    /// When the power-off was decided and recorded.
    pub off_at: Timestamp,
    /// The bootID the machine ran when it was powered off: never a second power-off of it.
    pub boot_id: String,
    /// When it was powered on again, if it was.
    pub on_at: Option<Timestamp>,
    /// Written by this daemon (or its `[ha]` group), not another oobfence.
    pub ours: bool,
}

/// The node's side of actuation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ActuationFacts {
    /// Why the node's power source may not act (`None`: its entry says `actuate = true`).
    pub source_refuses: Option<String>,
    pub record: Option<PowerRecord>,
}

impl ActuationFacts {
    /// The record of a power-off of this very boot, if oobfence made one.
    pub fn powered_off(&self, boot_id: &str) -> Option<&PowerRecord> {
        self.record
            .as_ref()
            .filter(|r| r.ours && !boot_id.is_empty() && r.boot_id == boot_id)
    }
}

/// Why a silent node reading On is not powered off now, or `Ok` with when its silence began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OffVerdict {
    /// Power it off now.
    PowerOff,
    /// Not yet: the silence runs out at `at`.
    Wait { at: Timestamp, why: String },
    /// Not at all, as things stand.
    No(String),
}

/// Whether a NotReady node whose machine reads On (fresh, from its own machine: the caller
/// checked) is to be powered off: both opt-ins, no power-off of this boot yet, and no sign of
/// life from its kubelet for `after`.
pub fn off_verdict(
    policy: Option<&ActuationPolicy>,
    facts: &ActuationFacts,
    boot_id: &str,
    last_alive: Option<Timestamp>,
    now: Timestamp,
) -> OffVerdict {
    let Some(p) = policy else {
        return OffVerdict::No("[actuation] is not enabled".into());
    };
    if let Some(why) = &facts.source_refuses {
        return OffVerdict::No(why.clone());
    }
    if boot_id.is_empty() {
        return OffVerdict::No(
            "the node reports no bootID, so a power-off could not be told from the next one".into(),
        );
    }
    if let Some(r) = facts.powered_off(boot_id) {
        return OffVerdict::No(format!(
            "oobfence already powered this boot off at {}; never twice",
            r.off_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        ));
    }
    let Some(alive) = last_alive else {
        return OffVerdict::No(
            "the node has no Lease: oobfence cannot see how long its kubelet has been silent"
                .into(),
        );
    };
    let silent = elapsed(alive, now);
    if silent < p.after {
        return OffVerdict::Wait {
            at: plus(alive, p.after),
            why: format!(
                "no sign of life from its kubelet for {} of the {} [actuation] after",
                secs(silent),
                secs(p.after)
            ),
        };
    }
    OffVerdict::PowerOff
}

/// Whether a fenced, NotReady node is to be powered on again: oobfence powered this boot off,
/// has not powered it on, and `power_on` is set.
pub fn on_due(policy: Option<&ActuationPolicy>, facts: &ActuationFacts, fenced_boot: &str) -> bool {
    policy.is_some_and(|p| p.power_on)
        && facts
            .powered_off(fenced_boot)
            .is_some_and(|r| r.on_at.is_none())
}
