//! What the daemon remembers about each node between passes, and which nodes' mappings cannot
//! be trusted.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use jiff::Timestamp;

use super::reads::ReadFor;
use super::sources::{OffSeen, SourceTrack};
use crate::config::{Config, Mapping};
use crate::decision::holds::{HoldKind, Holds};
use crate::decision::{self, MappingConflict, Readiness, Rule};
use crate::power;

/// NotReady transitions remembered per node: more than any sensible `flap_limit`.
const NOT_READY_KEPT: usize = 32;

#[derive(Default)]
pub(super) struct Tracker {
    pub(super) uid: String,
    /// The node's power sources, level by level (see [`super::sources`]).
    pub(super) sources: Vec<SourceTrack>,
    /// The providerID `sources` were built for; `None`: to be built (a new tracker, a reload).
    pub(super) sources_for: Option<Option<String>>,
    /// The last generation handed to a source of the node.
    pub(super) next_generation: u64,
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
    /// The Lease renewTime last seen, and when (oobfence's clock) it was first seen.
    pub(super) lease_seen: Option<(Option<Timestamp>, Timestamp)>,
    /// The renewTime the Lease had when oobfence first saw it: until it changes, the sighting
    /// is no renewal oobfence watched.
    pub(super) lease_first_value: Option<Timestamp>,
    /// The Lease's resourceVersion fingerprint last seen.
    pub(super) lease_version: Option<u64>,
    /// The Ready heartbeat last seen while Ready, and when (oobfence's clock) it changed.
    pub(super) heartbeat: Option<(Timestamp, Timestamp)>,
    /// Whether the node was Ready when last seen, and when it was seen going NotReady.
    pub(super) was_ready: Option<bool>,
    /// When the node was last seen Ready (oobfence's clock).
    pub(super) ready_seen: Option<Timestamp>,
    pub(super) not_ready_seen: Vec<Timestamp>,
    /// The bootID the kept reads were taken against.
    pub(super) reads_boot_id: Option<String>,
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
    /// The dry-run write last announced for the node (its action, and the bootID it was
    /// decided for): announced once, not on every re-decision (see `carry_out::announce`).
    pub(super) would_announced: Option<(&'static str, String)>,
    /// The Node's `oobfence.io/confirmed-off` annotation as last seen (see
    /// [`SeenConfirmation`]); `None` once it goes.
    pub(super) confirmation: Option<SeenConfirmation>,
}

/// A person's confirmation annotation, and when this daemon first saw that exact value: a
/// changed value is a new sighting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SeenConfirmation {
    pub(super) value: String,
    /// oobfence's clock.
    pub(super) seen: Timestamp,
    /// The note, or what is wrong with the value (never a confirmation).
    pub(super) note: Result<decision::confirmation::ConfirmationNote, String>,
}

impl SeenConfirmation {
    /// Brings the annotation's value as it is now into `seen`: kept while unchanged, a new
    /// sighting at `now` when changed, gone with the annotation. Whether this is a new
    /// sighting of a value that is not a confirmation (to be reported once).
    pub(super) fn observe(
        seen: &mut Option<SeenConfirmation>,
        value: Option<&str>,
        now: Timestamp,
    ) -> bool {
        let Some(value) = value else {
            *seen = None;
            return false;
        };
        if seen.as_ref().is_some_and(|s| s.value == value) {
            return false;
        }
        let note = decision::confirmation::ConfirmationNote::parse(value);
        let invalid = note.is_err();
        *seen = Some(SeenConfirmation {
            value: value.to_string(),
            seen: now,
            note,
        });
        invalid
    }

    /// The confirmation the core is given: none for a malformed value.
    pub(super) fn confirmation(&self) -> Option<decision::confirmation::Confirmation> {
        let note = self.note.as_ref().ok()?;
        Some(decision::confirmation::Confirmation {
            note: note.clone(),
            seen: self.seen,
        })
    }
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
        // Any write of the Lease is a renewal, its renewTime changed or not: a kubelet whose
        // clock stands still writes the same renewTime, and its resourceVersion moves.
        if let Some((value, _)) = self.lease_seen
            && value == facts.lease_renew_time
            && value.is_some()
            && self.lease_version.is_some()
            && facts.lease_version != self.lease_version
        {
            self.lease_seen = Some((value, now));
            self.lease_first_value = None;
        }
        self.lease_version = facts.lease_version;
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
        for s in &mut self.sources {
            if s.off_while_alive
                .as_ref()
                .is_some_and(|o| o.boot_id.as_deref() != Some(facts.boot_id.as_str()))
            {
                s.off_while_alive = None;
            }
            if (renewed || beat)
                && let Some(o) = &mut s.off_while_alive
                && now > o.answered_at
                && o.last_sign
                    .is_none_or(|last| now.duration_since(last) >= SIGNS_APART.try_into().unwrap())
            {
                o.signs += 1;
                o.last_sign = Some(now);
            }
        }
        let came_back = ready && self.was_ready == Some(false);
        if facts.fence.is_none() && (renewed || beat || came_back) {
            self.clear_reads();
        }
        // Off reads taken before the machine booted again say nothing about this boot: the
        // write would check the bootID anyway, but the decision must not count them either.
        if self.reads_boot_id.as_deref() != Some(facts.boot_id.as_str()) {
            if facts.fence.is_none() {
                self.clear_reads();
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
        if ready {
            self.ready_seen = Some(now);
        }
        facts.ready_seen = self.ready_seen;
        facts.not_ready_seen = self.not_ready_seen.clone();
    }

    /// Every source's reads go: they were evidence about a silence that is over.
    pub(super) fn clear_reads(&mut self) {
        for s in &mut self.sources {
            s.reads.clear();
        }
    }
}

impl Tracker {
    /// Whom a read sent now through source `i` is for.
    pub(super) fn read_for(&self, node: &str, i: usize) -> ReadFor {
        ReadFor {
            node: node.to_string(),
            uid: self.uid.clone(),
            generation: self.sources.get(i).map_or(0, |s| s.generation),
        }
    }

    /// The source a read's answer is evidence from: sent for this object, through a source
    /// the node is mapped to now (not one a reload has replaced since).
    pub(super) fn takes_read(&self, uid: &str, generation: u64) -> Option<usize> {
        if self.uid != uid {
            return None;
        }
        self.sources.iter().position(|s| s.generation == generation)
    }

    /// Takes what a read said about the power source's truthfulness: an Off, terminated or not
    /// found for a node that was Ready when the read started opens a watch for the kubelet's
    /// signs of life; an On closes it (the source reads a running machine again).
    pub(super) fn power_answered(
        &mut self,
        i: usize,
        state: &decision::PowerState,
        read_at: Timestamp,
        ready_when_read: bool,
        now: Timestamp,
    ) {
        let boot_id = self.reads_boot_id.clone();
        let Some(source) = self.sources.get_mut(i) else {
            return;
        };
        match state {
            decision::PowerState::On => source.off_while_alive = None,
            s if s.is_down() && ready_when_read && source.off_while_alive.is_none() => {
                source.off_while_alive = Some(OffSeen {
                    read_at,
                    answered_at: now,
                    signs: 0,
                    last_sign: None,
                    reported: false,
                    gone: s.is_gone(),
                    boot_id,
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
/// the same instance) through a level-1 source. Both sides of a shared machine are blocked,
/// not just the second. A source above level 1 may feed several nodes (a blade chassis's
/// outlet, a twin server's feed): one source for all of them ([`shared_outlets`]).
pub fn mapping_conflicts<'a>(
    cfg: &Config,
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> HashMap<String, MappingConflict> {
    let mut conflicts = HashMap::new();
    let mut by_machine: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, provider_id) in nodes {
        for mapping in cfg.mappings_for(name) {
            let key = match mapping {
                Mapping::Bmc(entry) if entry.level > 1 => continue,
                Mapping::Bmc(entry) => entry.machine_key(name),
                Mapping::Aws(aws) => {
                    let Some(pid) = provider_id else { continue };
                    if let Some(problem) = power::ec2::zone_region_mismatch(pid, &aws.region) {
                        conflicts
                            .insert(name.to_string(), MappingConflict::RegionMismatch(problem));
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

/// The sources above level 1 that feed several nodes (an outlet of a blade chassis or a twin
/// server), by the machine key they read: the nodes each feeds.
pub fn shared_outlets<'a>(
    cfg: &Config,
    nodes: impl IntoIterator<Item = &'a str>,
) -> HashMap<String, Vec<String>> {
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for name in nodes {
        for mapping in cfg.mappings_for(name) {
            if let Mapping::Bmc(entry) = mapping
                && entry.level > 1
            {
                by_key
                    .entry(entry.machine_key(name))
                    .or_default()
                    .push(name.to_string());
            }
        }
    }
    by_key.retain(|_, names| names.len() > 1);
    by_key
}

#[cfg(test)]
mod tests;
