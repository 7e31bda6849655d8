//! When a NotReady node is read at all: the grace period, the Lease renewals oobfence saw
//! itself, and the time a decision says it holds until.

use super::*;

#[test]
fn ready_node_is_healthy_and_never_read() {
    let facts = NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(80)),
        lease_first_sight: false,
        ..dead()
    };
    let d = decide(&facts, &[off(70), off(80)], &policy(), t(90));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Healthy, Step::Idle, Rule::NodeReady)
    );
    assert_eq!(d.next_read_at, None);
}

#[test]
fn within_grace_no_read_no_action() {
    let d = decide(&unleased(), &[off(10), off(20)], &policy(), t(59));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NotReadyGrace));
    assert_eq!(d.next_read_at, None);
    assert_eq!(d.state, NodeState::Suspect);
    // The grace ends by the clock alone: the node is decided again the moment it does.
    assert_eq!(d.decide_again_at, Some(t(60)));
    let d = decide(&unleased(), &[], &policy(), t(60));
    assert_ne!(d.rule, Rule::NotReadyGrace);
}

#[test]
fn after_grace_asks_for_a_read_now() {
    let d = decide(&dead(), &[], &policy(), t(60));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::AwaitingPowerRead));
    assert_eq!(d.next_read_at, Some(t(60)));
}

#[test]
fn a_lease_renewed_during_not_ready_blocks() {
    let facts = NodeFacts {
        lease_renewal_seen: Some(t(50)),
        lease_first_sight: false,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.state, d.rule),
        (NodeState::Blocked, Rule::LeaseRenewedRecently)
    );
    assert_eq!(d.step, Step::Idle);
    // The renewal ages out by the clock alone: decided again when it has, or, sooner, when the
    // Lease goes stale (25 s after the renewal: the grace no longer applies then).
    assert_eq!(d.decide_again_at, Some(t(75)));
    let p_off = Policy {
        pre_attest_after: None,
        ..policy()
    };
    assert_eq!(
        decide(&facts, &[off(60), off(65)], &p_off, t(66)).decide_again_at,
        Some(t(110))
    );
    // A node with no Lease at all (very old clusters) is judged on Ready and power alone.
    let facts = NodeFacts {
        lease_renewal_seen: None,
        lease_first_sight: false,
        lease_renew_time: None,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
}

/// After a restart a dead node's Lease is new to oobfence: the grace runs from that first
/// sight, and the reason says so instead of calling the machine alive.
#[test]
fn a_lease_first_seen_at_start_waits_the_grace_without_calling_the_machine_alive() {
    let facts = NodeFacts {
        lease_renewal_seen: Some(t(50)),
        lease_first_sight: true,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::LeaseRenewedRecently)
    );
    assert!(
        d.reason.contains("first saw this node's Lease 16s ago"),
        "{}",
        d.reason
    );
    assert!(!d.reason.contains("alive"), "{}", d.reason);
}

#[test]
fn clock_skew_into_the_future_counts_as_within_grace() {
    let facts = NodeFacts {
        readiness: Readiness::NotReady { since: t(500) },
        ..unleased()
    };
    let d = decide(&facts, &[], &policy(), t(100));
    assert_eq!(d.rule, Rule::NotReadyGrace);
}

/// The Lease rule runs on oobfence's own observation of a renewal, whatever the kubelet's
/// clock wrote: a renewal seen 10 s ago blocks even if the kubelet's clock says last year.
#[test]
fn lease_renewal_is_judged_by_when_oobfence_saw_it() {
    let facts = NodeFacts {
        lease_renewal_seen: Some(t(56)),
        lease_first_sight: false,
        lease_renew_time: Some(Timestamp::from_second(1_700_000_000).unwrap()),
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.rule, Rule::LeaseRenewedRecently);
}

/// A decision that says when it runs out by the clock (`decide_again_at`, which the daemon
/// wakes for) names a time still to come, and holds, unchanged and writing nothing, until then:
/// waking at that time is never late for a change the clock alone brings.
#[test]
fn property_a_decision_holds_until_it_says_it_runs_out() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let pre_attest_off = Policy {
        pre_attest_after: None,
        ..policy()
    };
    let (mut timed, mut changed_at_wake) = (0, 0);
    for (p, lease_seen) in [policy(), pre_attest_off]
        .into_iter()
        .flat_map(|p| [None, Some(-10), Some(20), Some(50)].map(|l| (p.clone(), l)))
    {
        let facts = NodeFacts {
            lease_renewal_seen: lease_seen.map(t),
            lease_first_sight: false,
            ..dead()
        };
        for reads in sequences(&states, 2, 55, 5) {
            for now in [1i64, 30, 59, 65, 100] {
                let d = decide(&facts, &reads, &p, t(now));
                let Some(until) = d.decide_again_at else {
                    continue;
                };
                timed += 1;
                assert!(until > t(now), "{d:?} at {now}");
                assert_eq!(d.step, Step::Idle, "{d:?}");
                // In the tests' seconds (`t`), the last whole second before it.
                let last_second = until.duration_since(t(0)).as_secs() - 1;
                for then in [(now + last_second) / 2, last_second] {
                    if then <= now {
                        continue;
                    }
                    let later = decide(&facts, &reads, &p, t(then));
                    assert_eq!(
                        (later.rule, later.step),
                        (d.rule, d.step),
                        "decided at {now} to hold until {until}, but at {then}: {later:?}"
                    );
                }
                changed_at_wake += (decide(&facts, &reads, &p, until).rule != d.rule) as usize;
            }
        }
    }
    assert!(
        timed > 100 && changed_at_wake > 0,
        "the generator never reached a timed decision ({timed}) or its end ({changed_at_wake})"
    );
}
