//! The write-time re-check: what a write was decided on, checked again on a fresh read right
//! before the write.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::holds::Holds;
use super::{FenceRecord, Readiness, elapsed, secs};

/// What a write was decided on. The writer re-checks it on a fresh GET right before the write
/// (see [`recheck`]): the cache the decision used may be seconds old, and the GET, the PATCH
/// and retries after a 409 take more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteGuard {
    pub purpose: GuardPurpose,
    pub uid: String,
    /// The bootID the reads were taken against (fence), or the new one seen Ready (unfence).
    pub boot_id: String,
    /// The Lease renewTime the decision saw (fence only: it must not have moved).
    pub lease_renew_time: Option<Timestamp>,
    /// The newest read behind the decision (Off or gone for a fence, On for an unfence): it
    /// must still be within `read_max_age` at write time.
    pub evidence_at: Timestamp,
    pub read_max_age: Duration,
    /// Fence only: decided while the Node still showed Ready (released at attestation), so a
    /// fresh Ready is no reason to stop; the Ready heartbeat it showed then must not have moved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub while_ready: bool,
    /// The Ready condition's `lastHeartbeatTime` the decision saw (`while_ready` only): a new
    /// one is the kubelet posting its status, alive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_heartbeat: Option<Timestamp>,
    /// Fence only: once the fence is written, force-delete the node's pods
    /// (`release_at_attestation`), each step re-checked as [`GuardPurpose::ReleasePods`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_pods: bool,
    /// Fence only: decided on a person's confirmation, no source being able to answer. A
    /// freeze (most power sources failing) does not hold it: the freeze distrusts reads, and
    /// this fence rests on none ([`Holds::fence_on_word`]); every other hold does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_word: bool,
}

impl WriteGuard {
    /// The guard of the pod deletions that follow this fence: the same evidence, and the
    /// fence itself, oobfence's own of the same boot, still in place.
    pub fn for_release(&self) -> WriteGuard {
        WriteGuard {
            purpose: GuardPurpose::ReleasePods,
            ..self.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardPurpose {
    Fence,
    /// Force-deleting the pods of a node oobfence just fenced.
    ReleasePods,
    Unfence,
    /// Opt-in actuation: powering off a hung node's machine (checked as a fence is).
    PowerOff,
    /// Opt-in actuation: powering on the machine of a node oobfence fenced.
    PowerOn,
}

/// The node as a fresh GET (and, for a fence, a fresh GET of its Lease) shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreshNode {
    pub uid: String,
    pub readiness: Readiness,
    pub boot_id: String,
    pub lease_renew_time: Option<Timestamp>,
    /// The Ready condition's `lastHeartbeatTime`.
    pub ready_heartbeat: Option<Timestamp>,
    /// The fence record on it, if any.
    pub fence: Option<FenceRecord>,
}

/// Whether a write decided under `guard` may still go ahead on the node as freshly read, with
/// the holds as they stand right before the write, at `now`. `Err` says what moved; the write
/// is then abandoned and the node decided again from scratch.
pub fn recheck(
    guard: &WriteGuard,
    fresh: &FreshNode,
    holds: &Holds,
    now: Timestamp,
) -> Result<(), String> {
    if let Some(h) = &holds.write {
        return Err(h.reason.clone());
    }
    if matches!(
        guard.purpose,
        GuardPurpose::Fence | GuardPurpose::ReleasePods | GuardPurpose::PowerOff
    ) && let Some(h) = if guard.on_word {
        &holds.fence_on_word
    } else {
        &holds.fence
    } {
        return Err(h.reason.clone());
    }
    if matches!(
        guard.purpose,
        GuardPurpose::PowerOff | GuardPurpose::PowerOn
    ) && let Some(h) = &holds.power
    {
        return Err(h.reason.clone());
    }
    if fresh.uid != guard.uid {
        return Err(format!(
            "the Node now has uid {}, not the {} the decision was about (deleted and re-created)",
            fresh.uid, guard.uid
        ));
    }
    if fresh.boot_id != guard.boot_id {
        return Err(format!(
            "the Node's bootID changed from {:?} to {:?} since the decision: the machine booted",
            guard.boot_id, fresh.boot_id
        ));
    }
    let age = elapsed(guard.evidence_at, now);
    if age > guard.read_max_age {
        return Err(format!(
            "the newest power read behind the decision is {} old at write time (max {})",
            secs(age),
            secs(guard.read_max_age)
        ));
    }
    match guard.purpose {
        GuardPurpose::PowerOff => {
            if fresh.readiness == Readiness::Ready {
                return Err("the Node is Ready again on a fresh read".into());
            }
            if fresh.lease_renew_time != guard.lease_renew_time {
                return Err(format!(
                    "the kubelet renewed its Lease since the decision ({} -> {}): something on the machine is alive",
                    show_time(guard.lease_renew_time),
                    show_time(fresh.lease_renew_time)
                ));
            }
        }
        GuardPurpose::PowerOn => {
            if fresh.readiness == Readiness::Ready {
                return Err("the Node is Ready again on a fresh read".into());
            }
            match &fresh.fence {
                Some(r) if r.ours && r.taint_present && r.boot_id == guard.boot_id => {}
                _ => {
                    return Err(
                        "the Node no longer carries this daemon's fence of the boot it powered off"
                            .into(),
                    );
                }
            }
        }
        GuardPurpose::Fence | GuardPurpose::ReleasePods => {
            if fresh.readiness == Readiness::Ready && !guard.while_ready {
                return Err("the Node is Ready again on a fresh read".into());
            }
            if fresh.lease_renew_time != guard.lease_renew_time {
                return Err(format!(
                    "the kubelet renewed its Lease since the decision ({} -> {}): something on the machine is alive",
                    show_time(guard.lease_renew_time),
                    show_time(fresh.lease_renew_time)
                ));
            }
            if guard.while_ready
                && fresh.readiness == Readiness::Ready
                && fresh.ready_heartbeat != guard.ready_heartbeat
            {
                return Err(format!(
                    "the kubelet posted a new Ready heartbeat since the decision ({} -> {}): something on the machine is alive",
                    show_time(guard.ready_heartbeat),
                    show_time(fresh.ready_heartbeat)
                ));
            }
            if guard.purpose == GuardPurpose::ReleasePods {
                match &fresh.fence {
                    Some(r) if r.ours && r.taint_present && r.boot_id == guard.boot_id => {}
                    Some(r) if r.ours && r.taint_present => {
                        return Err(format!(
                            "the fence on the Node was written for bootID {:?}, not the {:?} its pods were to be released for",
                            r.boot_id, guard.boot_id
                        ));
                    }
                    _ => {
                        return Err(
                            "the Node no longer carries this daemon's fence (its out-of-service taint and record): its pods are released only under it".into(),
                        );
                    }
                }
            }
        }
        GuardPurpose::Unfence => {
            if fresh.readiness != Readiness::Ready {
                return Err("the Node is not Ready on a fresh read".into());
            }
            match &fresh.fence {
                None => return Err("the Node carries no oobfence record any more".into()),
                Some(r) if !r.ours => {
                    return Err(
                        "the fence on the Node was placed by another oobfence (oobfence.io/fenced-by); it is not this daemon's to lift".into(),
                    );
                }
                Some(r) if r.boot_id == fresh.boot_id || fresh.boot_id.is_empty() => {
                    return Err(format!(
                        "the Node's bootID {:?} is the one recorded at fence time",
                        fresh.boot_id
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

fn show_time(t: Option<Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_else(|| "none".into())
}
