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

use super::{DEFAULT_LEASE_DURATION, NodeFacts, elapsed, last_sign_of_life, plus, secs};

/// How long a machine oobfence powered off may go on reading On before it counts as having
/// ignored the command (`power-off-ignored`); until then its failure domain is busy.
pub const POWER_OFF_TAKES: Duration = Duration::from_secs(120);

/// `[actuation]`, when enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ActuationPolicy {
    /// How long oobfence must have seen no sign of life from a NotReady node's kubelet (by its
    /// own clock) before it powers the machine off.
    pub after: Duration,
    /// The longest silence a node may have and still be powered off: past it the node is
    /// abandoned (reinstalled outside the cluster, retired, left NotReady), not hung, and a
    /// person must look.
    pub max_silence: Duration,
    /// Power the machine on again once it is fenced.
    pub power_on: bool,
}

impl Default for ActuationPolicy {
    fn default() -> Self {
        ActuationPolicy {
            // Well past the controller's grace and `not_ready_grace`: a kubelet stalled by a
            // long GC pause or a saturated link has every chance to come back first.
            after: Duration::from_secs(300),
            // An hour: twelve times `after`, room for holds and a busy failure domain, far
            // short of a machine forgotten for days.
            max_silence: Duration::from_secs(3600),
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
/// checked) is to be powered off: both opt-ins, no maintenance, no power-off of this boot yet,
/// and a hung kubelet rather than an abandoned one — a silence that oobfence watched begin
/// while the node showed Ready, at least `after` and at most `max_silence` long.
pub fn off_verdict(
    policy: Option<&ActuationPolicy>,
    node: &NodeFacts,
    now: Timestamp,
) -> OffVerdict {
    let facts = &node.actuation;
    let Some(p) = policy else {
        return OffVerdict::No("[actuation] is not enabled".into());
    };
    if let Some(why) = &facts.source_refuses {
        return OffVerdict::No(why.clone());
    }
    if let Some(why) = &node.maintenance {
        return OffVerdict::No(format!(
            "the node is under maintenance ({why}): a kubelet stopped for maintenance is silent on purpose, so its machine is never powered off"
        ));
    }
    let boot_id = node.boot_id.as_str();
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
    let Some(alive) = last_sign_of_life(node) else {
        return OffVerdict::No(
            "the node has no Lease: oobfence cannot see how long its kubelet has been silent"
                .into(),
        );
    };
    // Hung, not abandoned: oobfence must have seen the kubelet alive and the node Ready, then
    // the silence begin. A Lease as oobfence first found it (a restart, actuation just turned
    // on for a node long silent) says nothing of how long the silence has lasted.
    if node.lease_first_sight {
        return OffVerdict::No(
            "oobfence has not seen its kubelet renew its Lease since it started watching the node, so it did not see the silence begin: the machine may have been abandoned (reinstalled, retired) long before; only a silence watched from a Ready node is a hang".into(),
        );
    }
    // Seen Ready at most one Lease duration before the last sign of life: the pass that first
    // sees a kubelet's last renewal may already see the node NotReady (it posted NotReady and
    // hung, or both came between two passes). A kubelet that renewed on for longer while the
    // node was NotReady began its silence NotReady.
    let window = node.lease_duration.unwrap_or(DEFAULT_LEASE_DURATION);
    if node
        .ready_seen
        .is_none_or(|ready| plus(ready, window) < alive)
    {
        return OffVerdict::No(format!(
            "oobfence has not seen the node Ready within {} (its Lease duration) before its kubelet's last sign of life, so the silence did not begin while it watched a healthy node; only a silence watched from a Ready node is a hang",
            secs(window)
        ));
    }
    let silent = elapsed(alive, now);
    if silent > p.max_silence {
        return OffVerdict::No(format!(
            "its kubelet has been silent for {}, longer than [actuation] max_silence = {}: an abandoned node (reinstalled outside the cluster, retired, left NotReady), not a hung one; a person must look",
            secs(silent),
            secs(p.max_silence)
        ));
    }
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

/// Whether a fenced, NotReady node's machine, which oobfence powered off, is to be powered on
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnVerdict {
    /// Nothing to power on: oobfence did not power this boot off, it already powered it on,
    /// or `power_on` is not set.
    NotDue,
    /// Due, but not allowed now.
    No(String),
    Due,
}

/// A power-on asks what a power-off asks of the node, at the moment it is sent: the node not
/// opted out nor owned by another remediator, not under maintenance, and its power source still
/// allowed to act (a reload may have turned `actuate` off since the power-off).
pub fn on_verdict(
    policy: Option<&ActuationPolicy>,
    node: &NodeFacts,
    fenced_boot: &str,
) -> OnVerdict {
    let facts = &node.actuation;
    let due = policy.is_some_and(|p| p.power_on)
        && facts
            .powered_off(fenced_boot)
            .is_some_and(|r| r.on_at.is_none());
    if !due {
        return OnVerdict::NotDue;
    }
    if let Some(why) = &node.opted_out {
        return OnVerdict::No(format!("the node is excluded from oobfence ({why})"));
    }
    if let Some(who) = &node.other_remediator {
        return OnVerdict::No(format!("another remediator is at work on the node ({who})"));
    }
    if let Some(why) = &node.maintenance {
        return OnVerdict::No(format!("the node is under maintenance ({why})"));
    }
    if let Some(why) = &facts.source_refuses {
        return OnVerdict::No(why.clone());
    }
    OnVerdict::Due
}
