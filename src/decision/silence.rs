//! How long a node's kubelet has been silent, by oobfence's own clock: the last sign of life
//! seen (a Lease renewal, a new Ready heartbeat), when that silence makes its Lease stale
//! (power is read ahead of NotReady) or late (it counts toward a lease storm). Facts the rules
//! of [`super::decide`] and the datacenter's census both use.

use std::time::Duration;

use jiff::Timestamp;

use super::{DEFAULT_LEASE_DURATION, NodeFacts, Policy, elapsed, plus, secs, tenths};

/// How long oobfence has heard nothing from a node's kubelet, once that makes its Lease stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseSilence {
    /// The last sign of life oobfence saw (its own clock).
    pub since: Timestamp,
    pub silent_for: Duration,
    /// `pre_attest_after` renewal intervals of this Lease.
    pub stale_after: Duration,
}

impl LeaseSilence {
    pub(super) fn describe(&self) -> String {
        format!(
            "no sign of life from its kubelet for {} (its Lease is stale after {})",
            secs(self.silent_for),
            tenths(self.stale_after)
        )
    }
}

/// The Lease is stale: oobfence last saw the kubelet alive at `last_alive` (its own clock), at
/// least `pre_attest_after` renewal intervals of a Lease of `lease_duration` ago. `None`: not
/// stale, no Lease (`last_alive` is `None`), or pre-attestation is off.
pub fn lease_silence(
    last_alive: Option<Timestamp>,
    lease_duration: Option<Duration>,
    policy: &Policy,
    now: Timestamp,
) -> Option<LeaseSilence> {
    let renewals = policy.pre_attest_after?;
    let since = last_alive?;
    let stale_after = renewals.of(lease_duration.unwrap_or(DEFAULT_LEASE_DURATION));
    let silent_for = elapsed(since, now);
    (silent_for >= stale_after).then_some(LeaseSilence {
        since,
        silent_for,
        stale_after,
    })
}

/// Where a node's Lease stands, for the datacenter's lease-storm count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed within [`Renewals::late`] intervals.
    Renewing,
    /// Not renewed for [`Renewals::late`] intervals: counts toward a lease storm.
    Late,
    /// Stale by [`lease_silence`]'s measure: read ahead of NotReady, unless in a storm.
    Stale,
}

/// The node's [`LeaseState`] after oobfence last saw its kubelet alive at `last_alive`;
/// `None`: no Lease, or pre-attestation is off.
pub fn lease_state(
    last_alive: Option<Timestamp>,
    lease_duration: Option<Duration>,
    policy: &Policy,
    now: Timestamp,
) -> Option<LeaseState> {
    let renewals = policy.pre_attest_after?;
    let silent_for = elapsed(last_alive?, now);
    let duration = lease_duration.unwrap_or(DEFAULT_LEASE_DURATION);
    Some(if silent_for >= renewals.of(duration) {
        LeaseState::Stale
    } else if silent_for >= renewals.late().of(duration) {
        LeaseState::Late
    } else {
        LeaseState::Renewing
    })
}

/// When the node's Lease goes (or went) stale by [`lease_silence`]'s measure; `None` without a
/// Lease or with pre-attestation off.
pub(super) fn lease_stale_at(facts: &NodeFacts, policy: &Policy) -> Option<Timestamp> {
    let renewals = policy.pre_attest_after?;
    let alive = last_sign_of_life(facts)?;
    Some(plus(
        alive,
        renewals.of(facts.lease_duration.unwrap_or(DEFAULT_LEASE_DURATION)),
    ))
}

/// The last time oobfence saw the node's kubelet alive, by its own clock: a Lease renewal, or
/// a new Ready heartbeat. `None` for a node without a Lease: silence means nothing there.
pub fn last_sign_of_life(facts: &NodeFacts) -> Option<Timestamp> {
    let lease = facts.lease_renewal_seen?;
    Some(facts.heartbeat_seen.map_or(lease, |h| h.max(lease)))
}
