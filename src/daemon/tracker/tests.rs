//! The tracker: what it remembers of reads, Leases and signs of life, and which mappings
//! are in conflict.

use std::time::Duration;

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
        let mut facts =
            crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
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
        reads: vec![off(10), off(15)],
        ..Default::default()
    };
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
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
    let mut facts = crate::cluster::node_facts(&crate::cluster::NodeView::default(), None, "me");
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
