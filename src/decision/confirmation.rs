//! A person's word that a node's machine is off, on record: what `oobfence confirm-off` (or
//! the Node annotation it writes, from `kubectl`) says, and when it stands.
//!
//! It stands in for a power read only where no power source can answer: no source is
//! configured for the node, or every level's sources are unreachable (a power cord pulled
//! takes the BMC with it). It never outweighs a source that answers: an On, a machine that
//! answers for another, an Off while the kubelet lived. It names the boot it was given for
//! and never outlives it, and any sign of life from the kubelet after it was written voids
//! it: the person was wrong, or the machine came back.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{NodeFacts, Readiness, last_sign_of_life};

/// The Node annotation that carries a confirmation, as JSON ([`ConfirmationNote`]).
pub const ANNOTATION: &str = "oobfence.io/confirmed-off";

/// What the annotation holds: written by `oobfence confirm-off` or by hand with `kubectl
/// annotate` (the API server's audit log then names the person).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmationNote {
    /// The node's `status.nodeInfo.bootID` the person confirmed off.
    #[serde(rename = "bootID")]
    pub boot_id: String,
    /// Why the person is sure (who looked at what): shown in `why`, the journal and the Event.
    pub reason: String,
    /// Who confirmed, as the person gave it (`oobfence confirm-off` fills in the login name);
    /// the audit log has the identity the API server checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    /// When it was written (the writer's clock). Optional by hand: oobfence then counts from
    /// when it first saw the annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
}

impl ConfirmationNote {
    /// Reads the annotation's value, naming what is wrong with it.
    pub fn parse(value: &str) -> Result<ConfirmationNote, String> {
        let note: ConfirmationNote = serde_json::from_str(value).map_err(|e| {
            format!(
                "{ANNOTATION} is not the JSON oobfence expects ({e}); write it with `oobfence confirm-off NODE --reason TEXT`, or as {{\"bootID\": \"<the node's bootID>\", \"reason\": \"<who looked at what>\"}}"
            )
        })?;
        if note.boot_id.trim().is_empty() {
            return Err(format!(
                "{ANNOTATION} names no bootID: a confirmation must name the boot it confirms off"
            ));
        }
        if note.reason.trim().is_empty() {
            return Err(format!(
                "{ANNOTATION} gives no reason: say who looked at what"
            ));
        }
        Ok(note)
    }
}

/// A confirmation as the core sees it: the note, and when oobfence first saw it (its own
/// clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Confirmation {
    pub note: ConfirmationNote,
    pub seen: Timestamp,
}

impl Confirmation {
    /// When the confirmation was made, as far as oobfence can tell: the writer's time, never
    /// later than oobfence's first sight of it.
    pub fn made_at(&self) -> Timestamp {
        match self.note.at {
            Some(at) if at < self.seen => at,
            _ => self.seen,
        }
    }

    /// Who and why, for the reason of a decision, the journal and the Event.
    pub fn describe(&self) -> String {
        let by = if self.note.by.is_empty() {
            "a person (the API server's audit log names who)".to_string()
        } else {
            self.note.by.clone()
        };
        format!(
            "confirmed off by {by} at {} for boot {}: {:?}",
            self.made_at().strftime("%Y-%m-%dT%H:%M:%SZ"),
            self.note.boot_id,
            self.note.reason
        )
    }
}

/// Whether a confirmation stands for the node as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    Stands,
    /// It does not, and why.
    Void(String),
}

/// Whether `c` stands: it names the node's current boot, the node is NotReady, and oobfence
/// has seen no sign of life from the kubelet since it was made.
pub fn standing(c: &Confirmation, facts: &NodeFacts) -> Standing {
    if facts.boot_id.is_empty() || c.note.boot_id != facts.boot_id {
        return Standing::Void(format!(
            "it confirms boot {} off, and the node reports boot {:?}: a confirmation never outlives its boot",
            c.note.boot_id, facts.boot_id
        ));
    }
    if !matches!(facts.readiness, Readiness::NotReady { .. }) {
        return Standing::Void("the node is not NotReady".into());
    }
    // The Lease as first found after a restart is no renewal oobfence watched happen.
    let alive = if facts.lease_first_sight {
        facts.heartbeat_seen
    } else {
        last_sign_of_life(facts)
    };
    if let Some(alive) = alive.filter(|t| *t >= c.made_at()) {
        return Standing::Void(format!(
            "oobfence saw the kubelet alive at {}, after the confirmation",
            alive.strftime("%Y-%m-%dT%H:%M:%SZ")
        ));
    }
    Standing::Stands
}

/// Whether a person may confirm the node off now (`oobfence confirm-off`), from a fresh read:
/// it reports a boot to name, it is NotReady, and its kubelet has been silent for at least
/// the Lease's duration (`renewed` and `now` by the writer's clock). The daemon judges the
/// silence again by its own clock: any sign of life after the confirmation voids it.
pub fn may_confirm(
    readiness: &Readiness,
    boot_id: &str,
    renewed: Option<Timestamp>,
    lease_duration: std::time::Duration,
    now: Timestamp,
) -> Result<(), String> {
    if boot_id.is_empty() {
        return Err(
            "it reports no bootID (status.nodeInfo.bootID): there is no boot to confirm off".into(),
        );
    }
    match readiness {
        Readiness::NotReady { .. } => {}
        Readiness::Ready => {
            return Err("it is Ready: its kubelet is alive, so its machine is not off".into());
        }
        Readiness::NoCondition => {
            return Err(
                "it has no Ready condition: nothing says it went down; a confirmation is only for a NotReady node"
                    .into(),
            );
        }
    }
    if let Some(at) = renewed {
        let silent = now.duration_since(at);
        let needed = jiff::SignedDuration::try_from(lease_duration).unwrap_or_default();
        if silent < needed {
            return Err(format!(
                "its kubelet renewed its Lease {}s ago (at {}), within the Lease's {}s: it is not silent; a machine that is off renews nothing, so look again after {}",
                silent.as_secs().max(0),
                at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                lease_duration.as_secs(),
                (at + needed).strftime("%Y-%m-%dT%H:%M:%SZ"),
            ));
        }
    }
    Ok(())
}
