//! What the daemon remembers about each node between passes, and which nodes' mappings cannot
//! be trusted.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use jiff::Timestamp;

use super::reads::ReadFor;
use crate::config::{Config, Mapping};
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
    pub(super) last_rule: Option<Rule>,
    /// The refusal the node is in (see `journal::refusal`).
    pub(super) refusal: Option<Rule>,
    /// The node's source, built for the providerID it was built with.
    pub(super) source: Option<(Option<String>, Option<MappedSource>)>,
    /// The Lease renewTime last seen, and when (oobfence's clock) it was first seen.
    pub(super) lease_seen: Option<(Option<Timestamp>, Timestamp)>,
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
    /// The node was last decided healthy (Ready, a fresh Lease, no fence) on this
    /// resourceVersion, then: until it changes, its Lease goes stale or [`QUIET_REFRESH`]
    /// passes, deciding it again would say the same.
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
    /// The key of the node's Lease in the cache.
    pub(super) lease_ref:
        Option<kube::runtime::reflector::ObjectRef<k8s_openapi::api::coordination::v1::Lease>>,
    /// Bumped when a reload maps the node to another power source: every read is tagged with
    /// it when sent, and an answer under an older one is dropped.
    pub(super) source_generation: u64,
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

/// What a node was last decided healthy on.
pub(super) struct Quiet {
    pub(super) resource_version: String,
    pub(super) at: Instant,
    /// [`super::Daemon::guards_epoch`] then: the holds every report shows were these.
    pub(super) guards_epoch: u64,
}

/// A quiet node is decided again at least this often (its report and holds refreshed).
pub(super) const QUIET_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

impl Tracker {
    /// Brings what the tracker knows into the node's facts, and what the facts show into the
    /// tracker: when the kubelet was last seen alive (oobfence's clock), the identity binding,
    /// and the reads — evidence about one silence of the kubelet only, so a node seen coming
    /// back Ready, renewing its Lease or posting a new Ready heartbeat starts afresh (a fenced
    /// one keeps them: they are what lifts its fence).
    pub(super) fn observe(&mut self, facts: &mut decision::NodeFacts, now: Timestamp) {
        let lease_before = self.lease_seen.map(|(_, at)| at);
        facts.lease_renewal_seen = observe_lease(&mut self.lease_seen, facts.lease_renew_time, now);
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
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::decision::PowerState;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn off(at: i64) -> PowerReading {
        PowerReading {
            at: t(at),
            latency: Duration::from_millis(5),
            state: PowerState::Off,
            details: Vec::new(),
            identity: crate::identity::MachineIdentity::unreported("test"),
            reader: "test".into(),
            power_draw: None,
        }
    }

    /// A read sent before a reload mapped the node to another power source, answered after
    /// it, is no evidence about the node: dropped. A node the reload left on its source keeps
    /// its reads and takes the answers under way.
    #[test]
    fn a_read_sent_before_a_remapping_reload_is_dropped() {
        let mut t = Tracker {
            uid: "uid-1".into(),
            reads: vec![off(0)],
            ..Default::default()
        };
        let sent = t.read_for("n1");
        assert_eq!((sent.node.as_str(), sent.uid.as_str()), ("n1", "uid-1"));
        let kept = Tracker {
            uid: "uid-2".into(),
            reads: vec![off(0)],
            ..Default::default()
        };
        let kept_sent = kept.read_for("n2");

        t.remapped();
        assert!(t.reads.is_empty(), "the old source's reads go");
        assert!(
            !t.takes_read(&sent.uid, sent.generation),
            "sent to the old source"
        );
        let after = t.read_for("n1");
        assert!(
            t.takes_read(&after.uid, after.generation),
            "sent to the new one"
        );
        // Another reload: an answer from two sources ago is dropped as well.
        t.remapped();
        assert!(!t.takes_read(&after.uid, after.generation));
        assert!(
            !t.takes_read("uid-other", t.source_generation),
            "another object"
        );

        assert!(kept.takes_read(&kept_sent.uid, kept_sent.generation));
        assert_eq!(kept.reads.len(), 1);
    }

    /// A Lease renewal is dated by when oobfence saw it, never by the kubelet's clock: a
    /// kubelet whose clock is a year behind still counts as renewing.
    #[test]
    fn lease_renewals_are_dated_by_oobfences_clock() {
        let mut seen = None;
        let year_ago = t(-365 * 86_400);
        // First sighting: counts as renewed now (the node lifecycle controller does the same).
        assert_eq!(observe_lease(&mut seen, Some(year_ago), t(0)), Some(t(0)));
        // Unchanged: still the time it was first seen.
        assert_eq!(observe_lease(&mut seen, Some(year_ago), t(30)), Some(t(0)));
        // Renewed, by a clock still a year behind: seen now.
        let renewed = year_ago + jiff::SignedDuration::from_secs(10);
        assert_eq!(observe_lease(&mut seen, Some(renewed), t(40)), Some(t(40)));
        // No Lease: nothing to judge by.
        assert_eq!(observe_lease(&mut seen, None, t(50)), None);
    }

    /// An Off read of a Ready node opens a watch: signs of life after the answer (a second
    /// apart, from the same boot) count; an On read closes it, and so does another boot.
    #[test]
    fn signs_of_life_after_an_off_read_of_a_ready_node_are_counted() {
        let mut tracker = Tracker::default();
        let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
        facts.readiness = Readiness::Ready;
        facts.boot_id = "boot-1".into();
        let mut renew = 0;
        let pass = |tracker: &mut Tracker,
                    facts: &mut decision::NodeFacts,
                    renew: &mut i64,
                    renewal: bool,
                    at: i64| {
            if renewal {
                *renew += 1;
            }
            facts.lease_renew_time = Some(t(*renew));
            tracker.observe(facts, t(at));
            facts.off_while_alive.clone().map(|o| o.signs_of_life_after)
        };
        assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 0), None);
        // An Off read of a node that was NotReady when it started opens nothing.
        tracker.power_answered(&PowerState::Off, t(1), false, t(2));
        assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 3), None);
        // Ready when read: watched from the answer on.
        tracker.power_answered(&PowerState::Off, t(4), true, t(5));
        assert_eq!(
            pass(&mut tracker, &mut facts, &mut renew, false, 5),
            Some(0)
        );
        assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 6), Some(1));
        let renewed_twice_in_one_burst = pass(&mut tracker, &mut facts, &mut renew, true, 6);
        assert_eq!(
            renewed_twice_in_one_burst,
            Some(1),
            "a second apart at least"
        );
        assert_eq!(
            pass(&mut tracker, &mut facts, &mut renew, true, 16),
            Some(2)
        );
        assert!(facts.off_while_alive.as_ref().unwrap().proven());
        // Another Off keeps the count; an On drops it.
        tracker.power_answered(&PowerState::Off, t(20), true, t(21));
        assert_eq!(
            pass(&mut tracker, &mut facts, &mut renew, false, 22),
            Some(2)
        );
        tracker.power_answered(&PowerState::On, t(30), true, t(31));
        assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 32), None);
        // Signs of life from another boot prove nothing: the machine may have been off.
        tracker.power_answered(&PowerState::Off, t(40), true, t(41));
        assert_eq!(
            pass(&mut tracker, &mut facts, &mut renew, true, 42),
            Some(1)
        );
        facts.boot_id = "boot-2".into();
        assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 52), None);
    }

    /// "Gone" (terminated, not found) for a node whose kubelet lives on is the same lie as
    /// Off: the source reads another account, endpoint or region. It opens the same watch.
    #[test]
    fn a_gone_answer_for_a_ready_node_is_watched_like_an_off_one() {
        for state in [PowerState::NotFound, PowerState::Terminated] {
            let mut tracker = Tracker::default();
            let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
            facts.readiness = Readiness::Ready;
            facts.boot_id = "boot-1".into();
            facts.lease_renew_time = Some(t(0));
            tracker.observe(&mut facts, t(0));
            tracker.power_answered(&state, t(1), true, t(2));
            for (renewal, at) in [(1, 12), (2, 22)] {
                facts.lease_renew_time = Some(t(renewal));
                tracker.observe(&mut facts, t(at));
            }
            let o = facts.off_while_alive.as_ref();
            assert!(o.is_some_and(|o| o.proven()), "{state}: {o:?}");
            assert!(o.is_some_and(|o| o.gone), "{state}: {o:?}");
        }
    }

    /// Each transition into NotReady is dated by oobfence's clock, once; staying NotReady adds
    /// nothing.
    #[test]
    fn not_ready_transitions_are_counted_once_each() {
        let mut tracker = Tracker::default();
        let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
        let mut see = |ready: bool, at: i64| {
            facts.readiness = if ready {
                Readiness::Ready
            } else {
                Readiness::NotReady { since: t(-9999) }
            };
            tracker.observe(&mut facts, t(at));
            facts.not_ready_seen.clone()
        };
        assert!(see(true, 0).is_empty());
        assert_eq!(see(false, 10), vec![t(10)]);
        assert_eq!(see(false, 11), vec![t(10)], "still the same period");
        see(true, 20);
        assert_eq!(see(false, 30), vec![t(10), t(30)]);
        for i in 0..40 {
            see(true, 100 + 2 * i);
            see(false, 101 + 2 * i);
        }
        assert_eq!(see(false, 200).len(), NOT_READY_KEPT, "bounded");
    }

    /// Reads are evidence about one NotReady period: whatever clock the controller stamps
    /// `lastTransitionTime` with, a node seen Ready in between leaves none behind.
    #[test]
    fn reads_are_dropped_whenever_the_node_is_seen_ready() {
        let mut tracker = Tracker {
            reads: vec![off(10), off(15)],
            ..Default::default()
        };
        let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
        facts.readiness = Readiness::NotReady {
            // A controller clock far ahead of ours: a time filter would keep stale reads.
            since: t(-3600),
        };
        tracker.reads_boot_id = Some(facts.boot_id.clone());
        tracker.observe(&mut facts, t(20));
        assert_eq!(tracker.reads.len(), 2, "still the same NotReady period");
        // The node reports another bootID while still NotReady: it booted since the reads.
        facts.boot_id = "boot-2".into();
        tracker.observe(&mut facts, t(20));
        assert!(tracker.reads.is_empty(), "reads of another boot");
        tracker.reads = vec![off(17), off(19)];
        tracker.observe(&mut facts, t(20));
        assert_eq!(tracker.reads.len(), 2, "reads of this boot stay");
        facts.readiness = Readiness::Ready;
        tracker.observe(&mut facts, t(21));
        assert!(tracker.reads.is_empty(), "seen Ready: the period is over");
        // A fenced node seen Ready keeps its reads: they are what lifts the fence.
        tracker.reads = vec![off(30)];
        facts.fence = Some(decision::FenceRecord {
            at: t(25),
            boot_id: "b".into(),
            taint_present: true,
            ours: true,
        });
        tracker.observe(&mut facts, t(31));
        assert_eq!(tracker.reads.len(), 1);
    }

    /// Reads taken ahead of NotReady are kept while the node shows Ready with a silent
    /// kubelet, and dropped at its first sign of life: a Lease renewal, or a new Ready
    /// heartbeat.
    #[test]
    fn reads_ahead_of_not_ready_last_until_a_sign_of_life() {
        let mut tracker = Tracker::default();
        let mut facts = crate::cluster::node_facts(&Node::default(), None, "me");
        facts.readiness = Readiness::Ready;
        facts.lease_renew_time = Some(t(-100));
        facts.ready_heartbeat = Some(t(-200));
        tracker.observe(&mut facts, t(0));
        assert_eq!(tracker.last_alive(), Some(t(0)), "first sighting");
        tracker.reads = vec![off(13), off(18)];
        tracker.observe(&mut facts, t(19));
        assert_eq!(tracker.reads.len(), 2, "Ready, silent: kept");
        assert_eq!(facts.lease_renewal_seen, Some(t(0)));
        // A new heartbeat while Ready: alive.
        facts.ready_heartbeat = Some(t(-150));
        tracker.observe(&mut facts, t(20));
        assert!(tracker.reads.is_empty());
        assert_eq!(facts.heartbeat_seen, Some(t(20)));
        assert_eq!(tracker.last_alive(), Some(t(20)));
        // A renewal: alive.
        tracker.reads = vec![off(40)];
        facts.lease_renew_time = Some(t(-90));
        tracker.observe(&mut facts, t(41));
        assert!(tracker.reads.is_empty());
        assert_eq!(tracker.last_alive(), Some(t(41)));
        // NotReady: a heartbeat field moving then (the controller's write) is no sign of life.
        tracker.reads = vec![off(50)];
        facts.readiness = Readiness::NotReady { since: t(49) };
        facts.ready_heartbeat = Some(t(-140));
        tracker.observe(&mut facts, t(51));
        assert_eq!(tracker.reads.len(), 1);
        assert_eq!(facts.heartbeat_seen, Some(t(20)));
    }

    fn config(dir: &std::path::Path, body: &str) -> Config {
        let pw = dir.join("pw");
        std::fs::write(&pw, "x\n").unwrap();
        let text = format!(
            "datacenter = \"dc1\"\n{}",
            body.replace("PW", &pw.display().to_string())
        );
        Config::parse(&text, std::path::Path::new("dc1.toml")).unwrap()
    }

    #[test]
    fn nodes_mapped_to_one_machine_are_all_in_conflict() {
        let dir = tempfile::tempdir().unwrap();
        // One template whose {node} lands in the path: two node names that a glob maps to the
        // same BMC host and the same system.
        let cfg = config(
            dir.path(),
            r#"
[[bmc]]
nodes = ["rack1-*"]
protocol = "redfish"
address = "https://bmc.example"
system = "/redfish/v1/Systems/{node}"
username = "u"
password_file = "PW"
[[bmc]]
nodes = ["db-1"]
protocol = "redfish"
address = "https://BMC.example:443/"
system = "/redfish/v1/Systems/rack1-01/"
username = "u"
password_file = "PW"
[aws]
region = "us-east-1"
nodes = ["ip-*"]
"#,
        );
        let conflicts = mapping_conflicts(
            &cfg,
            [
                ("rack1-01", None),
                ("rack1-02", None),
                ("db-1", None),
                ("ip-10-0-0-1", Some("aws:///us-east-1a/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-2", Some("aws:///us-east-1b/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-3", Some("aws:///us-east-1a/i-0aaaaaaaaaaaaaaa3")),
            ],
        );
        for n in ["rack1-01", "db-1", "ip-10-0-0-1", "ip-10-0-0-2"] {
            assert!(
                matches!(conflicts.get(n), Some(MappingConflict::SharedMachine(_))),
                "{n}: {conflicts:?}"
            );
        }
        assert!(!conflicts.contains_key("rack1-02"));
        assert!(!conflicts.contains_key("ip-10-0-0-3"));
    }

    /// The review's first path: a providerID in us-west-2 read with region us-east-1 would be
    /// "not in the answer", twice, and the node deleted while its instance runs.
    #[test]
    fn an_instance_of_another_region_is_a_conflict_not_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(
            dir.path(),
            "[aws]\nregion = \"us-east-1\"\nnodes = [\"ip-*\"]\n",
        );
        let conflicts = mapping_conflicts(
            &cfg,
            [
                ("ip-10-0-0-1", Some("aws:///us-west-2a/i-0aaaaaaaaaaaaaaa1")),
                ("ip-10-0-0-2", Some("aws:///us-east-1c/i-0aaaaaaaaaaaaaaa2")),
            ],
        );
        match conflicts.get("ip-10-0-0-1") {
            Some(MappingConflict::RegionMismatch(d)) => {
                assert!(d.contains("us-west-2a") && d.contains("us-east-1"), "{d}")
            }
            other => panic!("{other:?}"),
        }
        assert!(!conflicts.contains_key("ip-10-0-0-2"));
    }
}
