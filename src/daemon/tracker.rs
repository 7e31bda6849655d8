//! What the daemon remembers about each node between passes, and which nodes' mappings cannot
//! be trusted.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use jiff::Timestamp;

use super::reads::ReadFor;
use crate::config::{Config, Mapping};
use crate::decision::holds::{HoldKind, Holds};
use crate::decision::{
    self, IdentityBinding, MappingConflict, OffWhileAlive, PowerReading, Readiness, Rule,
};
use crate::power::{self, MappedSource};

/// NotReady transitions remembered per node: more than any sensible `flap_limit`.
const NOT_READY_KEPT: usize = 32;

#[derive(Default)]
pub(super) struct Tracker {
    pub(super) uid: String,
    pub(super) reads: Vec<PowerReading>,
    pub(super) read_in_flight: bool,
    pub(super) action_in_flight: bool,
    /// The cached resourceVersion an action was taken on: no new action until the cache moves
    /// past it, so a write that succeeded is not repeated from a stale cache.
    pub(super) acted_on: Option<String>,
    pub(super) retry_after: Option<Instant>,
    pub(super) last_action_error: Option<String>,
    /// Power commands in a row that were not sent or failed: each waits longer before the
    /// next ([`super::state::power_action_retry`]).
    pub(super) power_failures: u32,
    pub(super) last_rule: Option<Rule>,
    /// The refusal the node is in (see `journal::refusal`).
    pub(super) refusal: Option<Rule>,
    /// The node's source, built for the providerID it was built with.
    pub(super) source: Option<(Option<String>, Option<MappedSource>)>,
    /// The Lease renewTime last seen, and when (oobfence's clock) it was first seen.
    pub(super) lease_seen: Option<(Option<Timestamp>, Timestamp)>,
    /// The renewTime the Lease had when oobfence first saw it: until it changes, the sighting
    /// is no renewal oobfence watched.
    pub(super) lease_first_value: Option<Timestamp>,
    /// The Ready heartbeat last seen while Ready, and when (oobfence's clock) it changed.
    pub(super) heartbeat: Option<(Timestamp, Timestamp)>,
    /// The last identity verdict a read of the node's machine gave.
    pub(super) binding: Option<IdentityBinding>,
    /// When a healthy node's next identity read is due.
    pub(super) identity_due: Option<Instant>,
    /// Whether the node was Ready when last seen, and when it was seen going NotReady.
    pub(super) was_ready: Option<bool>,
    pub(super) not_ready_seen: Vec<Timestamp>,
    /// The bootID the kept reads were taken against.
    pub(super) reads_boot_id: Option<String>,
    /// The last read of the node's machine, for any purpose: when, and how it failed if it did.
    pub(super) last_read: Option<(Timestamp, Option<decision::ReadErrorKind>)>,
    /// The last read of the node's machine that was answered (not an error).
    pub(super) last_answer: Option<Timestamp>,
    /// The state `oobfence_node_state` shows for the node.
    pub(super) metric_state: Option<decision::NodeState>,
    /// What the node was last decided on: until that changes, a due time comes or
    /// [`QUIET_REFRESH`] passes, deciding it again would say the same (see `pass::is_quiet`).
    pub(super) quiet: Option<Quiet>,
    /// The Lease's `leaseDurationSeconds`, as last seen.
    pub(super) lease_duration: Option<std::time::Duration>,
    /// When the last decision asked to be decided again (a grace ending, a read due): the
    /// node's entry in [`super::Daemon::wakeups`].
    pub(super) wake_at: Option<Timestamp>,
    /// The identity check of the config's mapping for the node (`Some(None)`: unmapped),
    /// matched once: the mapping's name patterns are not matched every pass.
    pub(super) mapping_identity: Option<Option<crate::identity::IdentityCheck>>,
    /// The second witness the mapping asks of an Off read (`Some(None)`: none or unmapped),
    /// matched once like `mapping_identity`.
    pub(super) mapping_witness: Option<Option<crate::decision::OffWitness>>,
    /// The node's power source said Off while the node was Ready (since its last On), and the
    /// signs of life seen since.
    pub(super) off_while_alive: Option<OffSeen>,
    /// Bumped when a reload maps the node to another power source: every read is tagged with
    /// it when sent, and an answer under an older one is dropped.
    pub(super) source_generation: u64,
    /// The dry-run write last announced for the node (its action, and the bootID it was
    /// decided for): announced once, not on every re-decision (see `carry_out::announce`).
    pub(super) would_announced: Option<(&'static str, String)>,
}

/// An Off read of a Ready node's machine, and the kubelet's signs of life seen after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OffSeen {
    pub(super) read_at: Timestamp,
    /// When the read's answer arrived (oobfence's clock): only later signs count.
    pub(super) answered_at: Timestamp,
    pub(super) signs: u32,
    pub(super) last_sign: Option<Timestamp>,
    /// Whether the proof was reported (log, Event, journal).
    pub(super) reported: bool,
    /// The read said gone (terminated, not found) rather than Off.
    pub(super) gone: bool,
    /// The bootID then: signs of life from another boot prove nothing (the machine may well
    /// have been off, then started again).
    pub(super) boot_id: Option<String>,
}

/// Signs of life closer together than this count once: a watch that lagged delivers a
/// renewal and a heartbeat written before the read in one burst after it.
const SIGNS_APART: std::time::Duration = std::time::Duration::from_secs(1);

/// What a node was last decided on.
pub(super) struct Quiet {
    pub(super) resource_version: String,
    pub(super) at: Instant,
    /// [`super::state::Daemon::guards_epoch`] then: what every node's decision shares (the
    /// guards, the mapping's conflicts, shared UUIDs) was this.
    pub(super) guards_epoch: u64,
    /// Decided healthy (Ready, a fresh Lease, no fence): a renewal changes nothing until the
    /// Lease goes stale. Any other node is decided again on every renewal (a sign of life).
    pub(super) healthy: bool,
    /// The Lease's renewTime then.
    pub(super) lease_renew: Option<Timestamp>,
    /// The holds on the node then.
    pub(super) holds: HoldsShape,
}

/// What of a node's holds its decision depends on: which are on, not their wording (a reason
/// may count seconds; the reports render it afresh).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HoldsShape {
    write: Option<HoldKind>,
    fence: Option<HoldKind>,
    evidence_not_before: Option<Timestamp>,
    pre_attest: bool,
    lease_not_yet_counted: bool,
}

impl HoldsShape {
    pub(super) fn of(h: &Holds) -> HoldsShape {
        HoldsShape {
            write: h.write.as_ref().map(|h| h.kind),
            fence: h.fence.as_ref().map(|h| h.kind),
            evidence_not_before: h.evidence_not_before,
            pre_attest: h.pre_attest.is_some(),
            lease_not_yet_counted: h.lease_not_yet_counted,
        }
    }
}

/// A quiet node is decided again at least this often (its holds and identity re-checked).
pub(super) const QUIET_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

impl Tracker {
    /// Brings what the tracker knows into the node's facts, and what the facts show into the
    /// tracker: when the kubelet was last seen alive (oobfence's clock), the identity binding,
    /// and the reads — evidence about one silence of the kubelet only, so a node seen coming
    /// back Ready, renewing its Lease or posting a new Ready heartbeat starts afresh (a fenced
    /// one keeps them: they are what lifts its fence).
    pub(super) fn observe(&mut self, facts: &mut decision::NodeFacts, now: Timestamp) {
        let lease_before = self.lease_seen.map(|(_, at)| at);
        let first_sight = self.lease_seen.is_none();
        facts.lease_renewal_seen = observe_lease(&mut self.lease_seen, facts.lease_renew_time, now);
        if first_sight && facts.lease_renewal_seen.is_some() {
            self.lease_first_value = facts.lease_renew_time;
        }
        facts.lease_first_sight = facts.lease_renewal_seen.is_some()
            && self.lease_first_value.is_some()
            && self.lease_first_value == facts.lease_renew_time;
        let renewed =
            facts.lease_renewal_seen.is_some() && facts.lease_renewal_seen != lease_before;
        let ready = facts.readiness == Readiness::Ready;
        let mut beat = false;
        if ready && let Some(hb) = facts.ready_heartbeat {
            match self.heartbeat {
                Some((value, _)) if value == hb => {}
                _ => {
                    self.heartbeat = Some((hb, now));
                    beat = true;
                }
            }
        }
        facts.heartbeat_seen = self.heartbeat.map(|(_, at)| at);
        if self
            .off_while_alive
            .as_ref()
            .is_some_and(|o| o.boot_id.as_deref() != Some(facts.boot_id.as_str()))
        {
            self.off_while_alive = None;
        }
        if (renewed || beat)
            && let Some(o) = &mut self.off_while_alive
            && now > o.answered_at
            && o.last_sign
                .is_none_or(|last| now.duration_since(last) >= SIGNS_APART.try_into().unwrap())
        {
            o.signs += 1;
            o.last_sign = Some(now);
        }
        facts.off_while_alive = self.off_while_alive.as_ref().map(|o| OffWhileAlive {
            read_at: o.read_at,
            signs_of_life_after: o.signs,
            gone: o.gone,
        });
        let came_back = ready && self.was_ready == Some(false);
        if facts.fence.is_none() && (renewed || beat || came_back) {
            self.reads.clear();
        }
        // Off reads taken before the machine booted again say nothing about this boot: the
        // write would check the bootID anyway, but the decision must not count them either.
        if self.reads_boot_id.as_deref() != Some(facts.boot_id.as_str()) {
            if facts.fence.is_none() {
                self.reads.clear();
            }
            self.reads_boot_id = Some(facts.boot_id.clone());
        }
        let ready = facts.readiness == Readiness::Ready;
        if !ready && self.was_ready != Some(false) {
            self.not_ready_seen.push(now);
            if self.not_ready_seen.len() > NOT_READY_KEPT {
                self.not_ready_seen.remove(0);
            }
        }
        self.was_ready = Some(ready);
        facts.not_ready_seen = self.not_ready_seen.clone();
        facts.identity_binding = self.binding.clone();
    }
}

impl Tracker {
    /// Whom a read sent now is for.
    pub(super) fn read_for(&self, node: &str) -> ReadFor {
        ReadFor {
            node: node.to_string(),
            uid: self.uid.clone(),
            generation: self.source_generation,
        }
    }

    /// Whether a read's answer is evidence about this node now: sent for this object, to the
    /// power source it is mapped to now (not one a reload has replaced since).
    pub(super) fn takes_read(&self, uid: &str, generation: u64) -> bool {
        self.uid == uid && self.source_generation == generation
    }

    /// A reload maps the node to another power source: what the old one said about its machine
    /// goes, and so does any answer of it still on its way.
    pub(super) fn remapped(&mut self) {
        self.source_generation += 1;
        self.reads.clear();
        self.binding = None;
        self.off_while_alive = None;
        self.last_read = None;
        self.last_answer = None;
        self.identity_due = None;
    }

    /// Takes what a read said about the power source's truthfulness: an Off, terminated or not
    /// found for a node that was Ready when the read started opens a watch for the kubelet's
    /// signs of life; an On closes it (the source reads a running machine again).
    pub(super) fn power_answered(
        &mut self,
        state: &decision::PowerState,
        read_at: Timestamp,
        ready_when_read: bool,
        now: Timestamp,
    ) {
        match state {
            decision::PowerState::On => self.off_while_alive = None,
            s if s.is_down() && ready_when_read && self.off_while_alive.is_none() => {
                self.off_while_alive = Some(OffSeen {
                    read_at,
                    answered_at: now,
                    signs: 0,
                    last_sign: None,
                    reported: false,
                    gone: s.is_gone(),
                    boot_id: self.reads_boot_id.clone(),
                });
            }
            _ => {}
        }
    }

    /// The last sign of life seen from the kubelet (oobfence's clock), as
    /// [`decision::last_sign_of_life`] computes it from the facts; `None` without a Lease.
    pub(super) fn last_alive(&self) -> Option<Timestamp> {
        let (value, lease) = self.lease_seen?;
        value?;
        Some(self.heartbeat.map_or(lease, |(_, h)| h.max(lease)))
    }
}

/// When oobfence saw the Lease take its current renewTime, by oobfence's own clock: the
/// kubelet's clock is never compared with ours (as the node lifecycle controller does). A Lease
/// seen for the first time counts as renewed now. `None` when the node has no Lease.
pub(super) fn observe_lease(
    seen: &mut Option<(Option<Timestamp>, Timestamp)>,
    renew_time: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    renew_time?;
    match seen {
        Some((value, _)) if *value == renew_time => {}
        _ => *seen = Some((renew_time, now)),
    }
    seen.map(|(_, at)| at)
}

/// Nodes whose config mapping cannot be trusted: an EC2 providerID whose zone is not in the
/// configured region, and several nodes that resolve to one machine (the same BMC and system,
/// the same instance). Both sides of a shared machine are blocked, not just the second.
pub fn mapping_conflicts<'a>(
    cfg: &Config,
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> HashMap<String, MappingConflict> {
    let mut conflicts = HashMap::new();
    let mut by_machine: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, provider_id) in nodes {
        let key = match cfg.mapping_for(name) {
            None => continue,
            Some(Mapping::Bmc(entry)) => entry.machine_key(name),
            Some(Mapping::Aws(aws)) => {
                let Some(pid) = provider_id else { continue };
                if let Some(problem) = power::ec2::zone_region_mismatch(pid, &aws.region) {
                    conflicts.insert(name.to_string(), MappingConflict::RegionMismatch(problem));
                    continue;
                }
                match power::ec2::instance_id_from_provider_id(pid) {
                    Ok(id) => format!("ec2 {id}"),
                    Err(_) => continue,
                }
            }
        };
        by_machine.entry(key).or_default().push(name);
    }
    for (machine, names) in by_machine {
        if names.len() < 2 {
            continue;
        }
        for name in &names {
            let others: Vec<&str> = names.iter().copied().filter(|n| n != name).collect();
            conflicts.insert(
                name.to_string(),
                MappingConflict::SharedMachine(format!(
                    "node {name} and node(s) {} all map to {machine}",
                    others.join(", ")
                )),
            );
        }
    }
    conflicts
}

#[cfg(test)]
mod tests;
