//! Nodes oobfence leaves alone whatever their reads say: no Ready condition, being deleted,
//! another's taint, opted out, another remediator at work, no power source, or flapping.

use super::*;

#[test]
fn no_power_source_blocks() {
    let facts = NodeFacts {
        has_power_source: false,
        ..dead()
    };
    let d = decide(&facts, &[], &policy(), t(70));
    assert_eq!((d.state, d.rule), (NodeState::Blocked, Rule::NoPowerSource));
    assert_eq!(d.next_read_at, None);
}

#[test]
fn foreign_taint_is_left_alone() {
    let facts = NodeFacts {
        foreign_out_of_service: true,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::ForeignOutOfServiceTaint)
    );
}

#[test]
fn no_ready_condition_is_not_acted_on() {
    let facts = NodeFacts {
        readiness: Readiness::NoCondition,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NoReadyCondition));
}

#[test]
fn being_deleted_is_left_alone() {
    let facts = NodeFacts {
        being_deleted: true,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NodeBeingDeleted));
}

/// An opt-out or another remediator can only ever block: whatever the reads, no fence.
#[test]
fn opt_out_and_other_remediators_only_ever_block() {
    let reads = [off(60), off(65)];
    let opted = NodeFacts {
        opted_out: Some("annotation oobfence.io/exclude=true".into()),
        ..dead()
    };
    let d = decide(&opted, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::OptedOut)
    );
    assert_eq!(d.next_read_at, None, "an opted-out node is not even read");
    let other = NodeFacts {
        other_remediator: Some(
            "taint medik8s.io/remediation=self-node-remediation:NoExecute".into(),
        ),
        ..dead()
    };
    let d = decide(&other, &reads, &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::OtherRemediator));
    assert!(d.reason.contains("medik8s.io/remediation"), "{}", d.reason);
    // Opting out a node oobfence already fenced does not strand its taint: the fence still
    // comes off on the usual proof.
    let mut fenced_opted = fenced(Readiness::Ready, "boot-b");
    fenced_opted.opted_out = opted.opted_out.clone();
    let d = decide(
        &fenced_opted,
        &[read(150, PowerState::On)],
        &policy(),
        t(151),
    );
    assert_eq!(d.step, Step::Unfence);
    // Exhaustively over short read sequences: never a fence.
    let states = [PowerState::On, PowerState::Off, PowerState::NotFound];
    for facts in [&opted, &other] {
        for combo in 0..27usize {
            let reads: Vec<PowerReading> = (0..3)
                .map(|i| {
                    read(
                        60 + 5 * i as i64,
                        states[(combo / 3usize.pow(i)) % 3].clone(),
                    )
                })
                .collect();
            let d = decide(facts, &reads, &policy(), t(71));
            assert!(
                !matches!(d.step, Step::Fence(_) | Step::WouldFence(_)),
                "{d:?}"
            );
        }
    }
}

/// A node that keeps going NotReady is held, not fenced, until it settles: its Off reads may
/// be the gaps of a boot loop, not a dead machine.
#[test]
fn a_flapping_node_is_held_until_it_settles() {
    let reads = [off(60), off(65)];
    // Four NotReady periods in ten minutes, limit 3: held.
    let flapping = NodeFacts {
        not_ready_seen: vec![t(-400), t(-250), t(-100), t(0)],
        ..dead()
    };
    let d = decide(&flapping, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::Flapping)
    );
    assert!(d.reason.contains("4 times"), "{}", d.reason);
    // Three within the window (the fourth is older): fenced as usual.
    let settled = NodeFacts {
        not_ready_seen: vec![t(-700), t(-250), t(-100), t(0)],
        ..dead()
    };
    assert_eq!(
        decide(&settled, &reads, &policy(), t(66)).step,
        Step::Fence(FenceAction::Taint)
    );
    // flap_limit = 0 turns the guard off.
    let off_guard = Policy {
        flap_limit: 0,
        ..policy()
    };
    assert_eq!(
        decide(&flapping, &reads, &off_guard, t(66)).step,
        Step::Fence(FenceAction::Taint)
    );
}
