//! Paths to a wrong write through the wrong machine: a region that cannot see the instance,
//! "not found" without a binding learnt while healthy, reads from another machine or none,
//! a machine two nodes share; fence and untaint alike.

use super::*;

/// An EC2 node whose providerID zone is not in the configured region: its instance is
/// absent from every answer, which reads as "not found". Never gone, never deleted.
#[test]
fn region_mismatch_blocks_even_two_not_found_answers() {
    let facts = NodeFacts {
        mapping_conflict: Some(MappingConflict::RegionMismatch(
            "zone us-west-2a is not in region us-east-1".into(),
        )),
        ..bound()
    };
    let reads = [
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&facts, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::RegionMismatch)
    );
    assert!(d.reason.contains("us-west-2a"), "{}", d.reason);
}

/// "Not found" only means gone when this region and account once answered for the node's
/// machine: credentials of another account never find it, and must never delete it.
#[test]
fn not_found_without_a_learnt_binding_is_unverified() {
    let reads = [
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::IdentityUnverified)
    );
    // The same answers after the source proved it knows the machine: gone.
    let d = decide(&bound(), &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
    // A binding that was itself a mismatch proves nothing (and blocks on its own).
    let facts = NodeFacts {
        identity_binding: Some(IdentityBinding {
            at: t(-600),
            verdict: Verdict::Mismatch("other".into()),
            reader: READER.into(),
        }),
        ..dead()
    };
    assert_eq!(
        decide(&facts, &reads, &policy(), t(66)).rule,
        Rule::IdentityMismatch
    );
}

/// One Off then one not-found answer is one answer of each kind: no escalation to
/// `on_terminated` (delete-node), whatever the binding.
#[test]
fn off_then_one_not_found_does_not_escalate() {
    let reads = [off(60), gone(65, PowerState::NotFound)];
    let d = decide(&bound(), &reads, &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert!(d.reason.contains("1 of 2"), "{}", d.reason);
    // Off, Off, not found: the Off streak is broken, the gone streak has one answer.
    let reads = [off(55), off(60), gone(65, PowerState::NotFound)];
    let d = decide(&bound(), &reads, &policy(), t(66));
    assert!(!matches!(d.step, Step::Fence(_)), "{d:?}");
    // Two not-found answers after the Off: gone, on two answers of one kind.
    let reads = [
        off(55),
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&bound(), &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
}

#[test]
fn off_reads_from_another_machine_never_fence() {
    let reads = [
        read_from(60, PowerState::Off, other_machine()),
        read_from(65, PowerState::Off, other_machine()),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::IdentityMismatch)
    );
    assert!(d.reason.contains(OTHER_UUID), "{}", d.reason);
    // Unchecked does not excuse a machine that says it is another one.
    let facts = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..dead()
    };
    assert_eq!(
        decide(&facts, &reads, &policy(), t(66)).rule,
        Rule::IdentityMismatch
    );
    // One read from another machine in this period taints the whole period.
    let reads = [
        read_from(55, PowerState::On, other_machine()),
        off(60),
        off(65),
    ];
    assert_eq!(
        decide(&dead(), &reads, &policy(), t(66)).rule,
        Rule::IdentityMismatch
    );
}

#[test]
fn off_reads_without_identity_need_identity_unchecked() {
    let reads = [
        read_from(60, PowerState::Off, no_identity()),
        read_from(65, PowerState::Off, no_identity()),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::IdentityUnverified)
    );
    assert!(d.reason.contains("unchecked"), "{}", d.reason);
    let facts = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..dead()
    };
    let d = decide(&facts, &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    assert!(d.reason.contains("unchecked"), "{}", d.reason);
    // A node that reports no systemUUID cannot be verified either.
    let facts = NodeFacts {
        identity: NodeIdentity::default(),
        ..dead()
    };
    assert_eq!(
        decide(&facts, &[off(60), off(65)], &policy(), t(66)).rule,
        Rule::IdentityUnverified
    );
}

#[test]
fn a_mismatch_learnt_while_healthy_blocks_before_any_read() {
    let facts = NodeFacts {
        identity_binding: Some(IdentityBinding {
            at: t(-100),
            verdict: Verdict::Mismatch("system UUID differs".into()),
            reader: READER.into(),
        }),
        ..dead()
    };
    let d = decide(&facts, &[], &policy(), t(66));
    assert_eq!(
        (d.state, d.rule),
        (NodeState::Blocked, Rule::IdentityMismatch)
    );
    assert!(d.next_read_at.is_some(), "re-read to see it fixed");
}

#[test]
fn a_machine_shared_by_two_nodes_blocks() {
    let facts = NodeFacts {
        mapping_conflict: Some(MappingConflict::SharedMachine(
            "node a and node(s) b all map to ipmi 10.0.0.5:623".into(),
        )),
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::SharedMachine));
}

#[test]
fn untaint_needs_the_on_read_from_the_nodes_machine() {
    let facts = fenced(Readiness::Ready, "boot-b");
    let reads = [read_from(150, PowerState::On, other_machine())];
    let d = decide(&facts, &reads, &policy(), t(151));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::IdentityMismatch));
    let reads = [read_from(150, PowerState::On, no_identity())];
    let d = decide(&facts, &reads, &policy(), t(151));
    assert_eq!(d.step, Step::Idle, "{d:?}");
    let d = decide(&facts, &[read(150, PowerState::On)], &policy(), t(151));
    assert_eq!(d.step, Step::Unfence);
}

/// Property: no fence without a matching identity, and no escalation to `on_terminated` on
/// a mixed streak. Exhaustive over every sequence of up to 4 reads drawn from {On, Off, not
/// found, terminated} x {the node's machine, another machine, no identity}, at three
/// spacings, three ages, with and without an identity learnt while healthy.
#[test]
fn property_no_fence_without_identity_and_no_mixed_escalation() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::NotFound,
        PowerState::Terminated,
    ];
    let ids = [
        MachineIdentity::system_uuid(UUID, None).unwrap(),
        other_machine(),
        no_identity(),
    ];
    let p = policy();
    let (mut fences, mut deletes, mut checked) = (0, 0, 0);
    for facts in [dead(), bound()] {
        for len in 1..=4usize {
            let kinds = states.len() * ids.len();
            for combo in 0..kinds.pow(len as u32) {
                for gap in [1i64, 5, 40] {
                    let mut reads = Vec::new();
                    let mut c = combo;
                    for i in 0..len {
                        let k = c % kinds;
                        c /= kinds;
                        reads.push(read_from(
                            60 + i as i64 * gap,
                            states[k % states.len()].clone(),
                            ids[k / states.len()].clone(),
                        ));
                    }
                    for now_offset in [0i64, 10, 31] {
                        let now = t(60 + (len as i64 - 1) * gap + now_offset);
                        let d = decide(&facts, &reads, &p, now);
                        checked += 1;
                        let Step::Fence(action) = d.step else {
                            continue;
                        };
                        fences += 1;
                        let matching = |r: &PowerReading| {
                            identity::verify(&facts.identity, &r.identity).is_match()
                        };
                        let other = |r: &PowerReading| {
                            identity::verify(&facts.identity, &r.identity).label() == "mismatch"
                        };
                        assert!(!reads.iter().any(other), "{reads:?}");
                        let last = reads.last().unwrap();
                        let gone = last.state.is_gone();
                        let run: Vec<_> = reads
                            .iter()
                            .rev()
                            .take_while(|r| r.state.is_gone() == gone && r.state.is_down())
                            .collect();
                        if gone {
                            deletes += 1;
                            assert_eq!(action, p.on_terminated);
                            assert!(run.iter().all(|r| r.state.is_gone()));
                            // At least two gone answers, spaced, with no Off among them.
                            assert!(run.len() >= 2, "{reads:?}");
                            let oldest = run.last().unwrap();
                            assert!(elapsed(oldest.at, last.at) >= p.confirm_interval);
                            assert!(
                                run.iter().all(|r| matching(r)) || facts.identity_binding.is_some(),
                                "{reads:?}"
                            );
                        } else {
                            assert_eq!(action, p.action);
                            assert!(run.iter().all(|r| r.state == PowerState::Off));
                            assert!(run.len() >= p.confirm_reads as usize);
                            // Every Off read that could count came from the node's machine.
                            assert!(run.iter().all(|r| matching(r)), "{reads:?}");
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
    assert!(
        fences > 0 && deletes > 0,
        "the property never saw a fence ({fences}) or a delete ({deletes}): the generator is wrong"
    );
}

/// Property: no untaint without a fresh On read from the node's own machine.
#[test]
fn property_no_untaint_without_identity() {
    let facts = fenced(Readiness::Ready, "boot-b");
    let ids = [
        MachineIdentity::system_uuid(UUID, None).unwrap(),
        other_machine(),
        no_identity(),
    ];
    let mut unfences = 0;
    for id in &ids {
        for state in [PowerState::On, PowerState::Off, PowerState::NotFound] {
            for age in [0i64, 10, 31] {
                let reads = [read_from(150, state.clone(), id.clone())];
                let d = decide(&facts, &reads, &policy(), t(150 + age));
                if d.step == Step::Unfence {
                    unfences += 1;
                    assert_eq!(state, PowerState::On);
                    assert!(identity::verify(&facts.identity, id).is_match());
                    assert!(age <= 30);
                    assert!(d.guard.is_some());
                }
            }
        }
    }
    assert!(unfences > 0);
}
