//! The tracker: what it remembers of reads, Leases and signs of life, and which mappings
//! are in conflict.

use std::time::Duration;

use super::super::sources::{SourceTrack, member_facts};
use super::*;
use crate::decision::{PowerReading, PowerState};

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
/// it, is no evidence about the node: dropped. A source the reload left as it was keeps its
/// reads and takes the answers under way.
#[test]
fn a_read_sent_before_a_remapping_reload_is_dropped() {
    let source = |target: &str, level: u32| SourceTrack {
        level,
        target: target.into(),
        ..Default::default()
    };
    let mut t = Tracker {
        uid: "uid-1".into(),
        ..Default::default()
    };
    let mut fresh = vec![source("redfish https://a", 1), source("fence-agent pdu", 2)];
    super::super::sources::carry_over(&mut t.sources, &mut fresh, &mut t.next_generation);
    t.sources = fresh;
    t.sources[0].reads = vec![off(0)];
    t.sources[1].reads = vec![off(0)];
    let sent = t.read_for("n1", 0);
    let kept_sent = t.read_for("n1", 1);
    assert_eq!((sent.node.as_str(), sent.uid.as_str()), ("n1", "uid-1"));

    // The reload maps the BMC elsewhere and leaves the outlet as it was.
    let mut fresh = vec![source("redfish https://b", 1), source("fence-agent pdu", 2)];
    assert!(super::super::sources::carry_over(
        &mut t.sources,
        &mut fresh,
        &mut t.next_generation
    ));
    t.sources = fresh;
    assert!(t.sources[0].reads.is_empty(), "the old source's reads go");
    assert_eq!(
        t.takes_read(&sent.uid, sent.generation),
        None,
        "sent to the old source"
    );
    let after = t.read_for("n1", 0);
    assert_eq!(
        t.takes_read(&after.uid, after.generation),
        Some(0),
        "sent to the new one"
    );
    assert_eq!(
        t.takes_read(&kept_sent.uid, kept_sent.generation),
        Some(1),
        "the outlet stays"
    );
    assert_eq!(t.sources[1].reads.len(), 1);
    // Another reload: an answer from two sources ago is dropped as well.
    let mut fresh = vec![source("redfish https://c", 1), source("fence-agent pdu", 2)];
    super::super::sources::carry_over(&mut t.sources, &mut fresh, &mut t.next_generation);
    t.sources = fresh;
    assert_eq!(t.takes_read(&after.uid, after.generation), None);
    assert_eq!(
        t.takes_read("uid-other", t.sources[1].generation),
        None,
        "another object"
    );
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
    let mut tracker = one_source();
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
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
        observe(tracker, facts, t(at));
        facts.off_while_alive.clone().map(|o| o.signs_of_life_after)
    };
    assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 0), None);
    // An Off read of a node that was NotReady when it started opens nothing.
    tracker.power_answered(0, &PowerState::Off, t(1), false, t(2));
    assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 3), None);
    // Ready when read: watched from the answer on.
    tracker.power_answered(0, &PowerState::Off, t(4), true, t(5));
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
    tracker.power_answered(0, &PowerState::Off, t(20), true, t(21));
    assert_eq!(
        pass(&mut tracker, &mut facts, &mut renew, false, 22),
        Some(2)
    );
    tracker.power_answered(0, &PowerState::On, t(30), true, t(31));
    assert_eq!(pass(&mut tracker, &mut facts, &mut renew, true, 32), None);
    // Signs of life from another boot prove nothing: the machine may have been off.
    tracker.power_answered(0, &PowerState::Off, t(40), true, t(41));
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
        let mut tracker = one_source();
        let mut facts =
            crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
        facts.readiness = Readiness::Ready;
        facts.boot_id = "boot-1".into();
        facts.lease_renew_time = Some(t(0));
        observe(&mut tracker, &mut facts, t(0));
        tracker.power_answered(0, &state, t(1), true, t(2));
        for (renewal, at) in [(1, 12), (2, 22)] {
            facts.lease_renew_time = Some(t(renewal));
            observe(&mut tracker, &mut facts, t(at));
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
    let mut tracker = one_source();
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
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
        sources: vec![SourceTrack {
            reads: vec![off(10), off(15)],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
    facts.readiness = Readiness::NotReady {
        // A controller clock far ahead of ours: a time filter would keep stale reads.
        since: t(-3600),
    };
    tracker.reads_boot_id = Some(facts.boot_id.clone());
    tracker.observe(&mut facts, t(20));
    assert_eq!(
        tracker.sources[0].reads.len(),
        2,
        "still the same NotReady period"
    );
    // The node reports another bootID while still NotReady: it booted since the reads.
    facts.boot_id = "boot-2".into();
    tracker.observe(&mut facts, t(20));
    assert!(tracker.sources[0].reads.is_empty(), "reads of another boot");
    tracker.sources[0].reads = vec![off(17), off(19)];
    tracker.observe(&mut facts, t(20));
    assert_eq!(tracker.sources[0].reads.len(), 2, "reads of this boot stay");
    facts.readiness = Readiness::Ready;
    tracker.observe(&mut facts, t(21));
    assert!(
        tracker.sources[0].reads.is_empty(),
        "seen Ready: the period is over"
    );
    // A fenced node seen Ready keeps its reads: they are what lifts the fence.
    tracker.sources[0].reads = vec![off(30)];
    facts.fence = Some(decision::FenceRecord {
        at: t(25),
        boot_id: "b".into(),
        taint_present: true,
        ours: true,
    });
    tracker.observe(&mut facts, t(31));
    assert_eq!(tracker.sources[0].reads.len(), 1);
}

/// Reads taken ahead of NotReady are kept while the node shows Ready with a silent
/// kubelet, and dropped at its first sign of life: a Lease renewal, or a new Ready
/// heartbeat.
#[test]
fn reads_ahead_of_not_ready_last_until_a_sign_of_life() {
    let mut tracker = one_source();
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
    facts.readiness = Readiness::Ready;
    facts.lease_renew_time = Some(t(-100));
    facts.ready_heartbeat = Some(t(-200));
    tracker.observe(&mut facts, t(0));
    assert_eq!(tracker.last_alive(), Some(t(0)), "first sighting");
    tracker.sources[0].reads = vec![off(13), off(18)];
    tracker.observe(&mut facts, t(19));
    assert_eq!(tracker.sources[0].reads.len(), 2, "Ready, silent: kept");
    assert_eq!(facts.lease_renewal_seen, Some(t(0)));
    // A new heartbeat while Ready: alive.
    facts.ready_heartbeat = Some(t(-150));
    tracker.observe(&mut facts, t(20));
    assert!(tracker.sources[0].reads.is_empty());
    assert_eq!(facts.heartbeat_seen, Some(t(20)));
    assert_eq!(tracker.last_alive(), Some(t(20)));
    // A renewal: alive.
    tracker.sources[0].reads = vec![off(40)];
    facts.lease_renew_time = Some(t(-90));
    tracker.observe(&mut facts, t(41));
    assert!(tracker.sources[0].reads.is_empty());
    assert_eq!(tracker.last_alive(), Some(t(41)));
    // NotReady: a heartbeat field moving then (the controller's write) is no sign of life.
    tracker.sources[0].reads = vec![off(50)];
    facts.readiness = Readiness::NotReady { since: t(49) };
    facts.ready_heartbeat = Some(t(-140));
    tracker.observe(&mut facts, t(51));
    assert_eq!(tracker.sources[0].reads.len(), 1);
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

/// Any change of the Lease is a sign of life, not only a new renewTime: a kubelet whose clock
/// stands still (or was stepped back) writes the same renewTime again, and its Lease's
/// resourceVersion is what moves. Counting only renewTime would date its last renewal at the
/// first one and let a live node look silent.
#[test]
fn a_lease_change_that_keeps_its_renew_time_is_a_renewal() {
    let mut tracker = one_source();
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
    facts.readiness = Readiness::Ready;
    facts.lease_renew_time = Some(t(0));
    facts.lease_version = Some(1);
    tracker.observe(&mut facts, t(0));
    assert_eq!(facts.lease_renewal_seen, Some(t(0)));
    assert!(
        facts.lease_first_sight,
        "the first sighting is no renewal watched"
    );
    // The same Lease seen again: nothing moved.
    tracker.observe(&mut facts, t(10));
    assert_eq!(facts.lease_renewal_seen, Some(t(0)));
    // Written again with the same renewTime: renewed now, and watched.
    facts.lease_version = Some(2);
    tracker.observe(&mut facts, t(20));
    assert_eq!(facts.lease_renewal_seen, Some(t(20)));
    assert!(!facts.lease_first_sight);
    assert_eq!(facts.ready_seen, Some(t(20)), "seen Ready on each pass");
}

/// A confirmation annotation is first seen once per value: kept while unchanged, a new
/// sighting when changed, forgotten when it goes; a malformed one is reported once and is
/// never a confirmation.
#[test]
fn a_confirmation_is_sighted_once_per_value_and_forgotten_with_its_annotation() {
    let good = r#"{"bootID":"boot-a","reason":"cord pulled"}"#;
    let mut seen = None;
    assert!(!SeenConfirmation::observe(&mut seen, Some(good), t(0)));
    assert!(!SeenConfirmation::observe(&mut seen, Some(good), t(5)));
    let c = seen.as_ref().unwrap().confirmation().unwrap();
    assert_eq!((c.seen, c.note.boot_id.as_str()), (t(0), "boot-a"));

    let changed = r#"{"bootID":"boot-a","reason":"cord pulled, checked twice"}"#;
    assert!(!SeenConfirmation::observe(&mut seen, Some(changed), t(7)));
    assert_eq!(seen.as_ref().unwrap().confirmation().unwrap().seen, t(7));

    assert!(SeenConfirmation::observe(&mut seen, Some("off"), t(8)));
    assert!(!SeenConfirmation::observe(&mut seen, Some("off"), t(9)));
    let s = seen.as_ref().unwrap();
    assert!(s.confirmation().is_none());
    assert!(s.note.as_ref().unwrap_err().contains("not the JSON"));

    assert!(!SeenConfirmation::observe(&mut seen, None, t(10)));
    assert_eq!(seen, None);
}

/// A tracker of one power source.
fn one_source() -> Tracker {
    Tracker {
        sources: vec![SourceTrack::default()],
        ..Default::default()
    }
}

/// What the tracker tells of the node and of its one source, into `facts`.
fn observe(tracker: &mut Tracker, facts: &mut decision::NodeFacts, at: Timestamp) {
    tracker.observe(facts, at);
    *facts = member_facts(facts, &tracker.sources[0], false);
}

/// One outlet above level 1 feeding two nodes (a twin server on one feed) is one source for
/// both: no shared-machine conflict, and the nodes it feeds are known (actuation asks them
/// before switching it). At level 1 such an entry is still refused.
#[test]
fn an_outlet_above_level_1_feeding_several_nodes_is_no_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let entries = |level: &str| {
        format!(
            r#"
[[bmc]]
nodes = ["twin-*"]
protocol = "redfish"
address = "https://{{node}}-bmc.example"
username = "u"
password_file = "PW"
[[bmc]]
nodes = ["twin-a", "twin-b"]
protocol = "redfish"
address = "https://pdu-7.example"
system = "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A3"
username = "u"
password_file = "PW"
{level}
"#
        )
    };
    let nodes = [("twin-a", None), ("twin-b", None)];
    let cfg = config(dir.path(), &entries("level = 2"));
    let conflicts = mapping_conflicts(&cfg, nodes);
    assert!(conflicts.is_empty(), "{conflicts:?}");
    let outlets = shared_outlets(&cfg, nodes.iter().map(|(n, _)| *n));
    assert_eq!(outlets.len(), 1, "{outlets:?}");
    assert_eq!(
        outlets.values().next().unwrap(),
        &["twin-a".to_string(), "twin-b".to_string()]
    );
    // At level 1 one entry for both is two nodes on one machine, refused as before.
    let pw = dir.path().join("pw");
    let text =
        format!("datacenter = \"dc1\"\n{}", entries("")).replace("PW", &pw.display().to_string());
    let e = Config::parse(&text, std::path::Path::new("dc1.toml")).unwrap_err();
    assert!(
        e.problem
            .contains("every one of them would read the same machine"),
        "{e}"
    );
}
