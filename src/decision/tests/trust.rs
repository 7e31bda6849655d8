//! What a power source's answer may never be taken for: "gone" from a reader that never knew
//! the instance, or from an entry whose identity is unchecked; any answer from a machine whose
//! system UUID another node reports too.

use super::*;

/// Wrong-account credentials see no instance at all: "not found" twice. `identity =
/// "unchecked"` relaxes which machine answered an Off read; it never turns "I cannot see this
/// instance" into "gone".
#[test]
fn unchecked_identity_never_excuses_a_gone_answer() {
    let unchecked = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..dead()
    };
    for state in [PowerState::NotFound, PowerState::Terminated] {
        let reads = [gone(60, state.clone()), gone(65, state.clone())];
        let d = decide(&unchecked, &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::IdentityUnverified),
            "{state}: {}",
            d.reason
        );
        assert!(d.reason.contains("unchecked"), "{}", d.reason);
    }
    // What unchecked is for still works: Off reads from a machine that reports no identity.
    let d = decide(
        &unchecked,
        &[gone(60, PowerState::Off), gone(65, PowerState::Off)],
        &policy(),
        t(66),
    );
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{}", d.reason);
}

fn via(mut r: PowerReading, reader: &str) -> PowerReading {
    r.reader = reader.into();
    r
}

/// Another account's credentials (or another endpoint) see no instance at all. The binding
/// learnt through the old reader must not make their "not found" a proof: a binding belongs
/// to the reader that learnt it.
#[test]
fn a_gone_answer_counts_only_through_the_reader_that_knew_the_instance() {
    let new_key = "ec2 us-east-1 at the region's endpoint, key AKIA…NEW1";
    let new_endpoint = "ec2 us-east-1 at https://127.0.0.1:4566, key AKIA…TEST";
    let same = [
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&bound(), &same, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode), "{}", d.reason);
    assert!(d.reason.contains(READER), "{}", d.reason);
    for other in [new_key, new_endpoint] {
        let reads = [
            via(gone(60, PowerState::NotFound), other),
            via(gone(65, PowerState::NotFound), other),
        ];
        let d = decide(&bound(), &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::ReaderChanged),
            "{}",
            d.reason
        );
        assert!(
            d.reason.contains(other) && d.reason.contains(READER),
            "{}",
            d.reason
        );
        // One answer through each reader is no streak of the binding's reader either.
        let mixed = [
            via(gone(60, PowerState::NotFound), other),
            gone(65, PowerState::NotFound),
        ];
        let d = decide(&bound(), &mixed, &policy(), t(66));
        assert!(!matches!(d.step, Step::Fence(_)), "{}", d.reason);
    }
}

/// A source that said "gone" while the kubelet lived on is refused by name, like one that
/// said Off.
#[test]
fn a_source_that_said_gone_while_the_kubelet_lived_never_deletes() {
    let facts = NodeFacts {
        off_while_alive: Some(OffWhileAlive {
            read_at: t(-300),
            signs_of_life_after: OFF_WHILE_ALIVE_PROOF,
            gone: true,
        }),
        ..bound()
    };
    let reads = [
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&facts, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::GoneWhileAlive),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("gone"), "{}", d.reason);
    // Its Off answers are refused as well.
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.rule, Rule::GoneWhileAlive, "{}", d.reason);
}

/// A UUID that another Node reports too proves neither machine: a BMC re-cabled to the clone
/// would pass as the node's own.
#[test]
fn a_system_uuid_reported_by_two_nodes_proves_no_machine() {
    let mut facts = dead();
    facts.identity.uuid_shared_with = vec!["node-b".into()];
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::DuplicateSystemUuid),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("node-b"), "{}", d.reason);
    // A machine that reports another UUID is still a mismatch, shared or not.
    let other = [
        read_from(60, PowerState::Off, other_machine()),
        read_from(65, PowerState::Off, other_machine()),
    ];
    assert_eq!(
        decide(&facts, &other, &policy(), t(66)).rule,
        Rule::IdentityMismatch
    );
    // An entry that says identity = "unchecked" takes Off reads without a usable identity,
    // this one included: check-config warns about such entries.
    let unchecked = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..facts
    };
    let d = decide(&unchecked, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{}", d.reason);
}

/// Property, over every short sequence of Off / not-found / terminated / On answers through
/// two readers, with and without a binding (through either reader), the identity checked or
/// not, a UUID shared or not, a source proven to have lied while the kubelet lived or not:
/// - a "gone" fence only ever follows a binding that matched through the reader of every
///   answer it counts, and never a source that said Off or gone while the kubelet lived;
/// - an Off fence never follows a shared UUID on a checked entry, nor a proven lie.
#[test]
fn property_gone_needs_the_binding_reader_and_no_lie_and_no_shared_uuid() {
    const OTHER: &str = "ec2 us-east-1 at the region's endpoint, key AKIA…NEW1";
    let states = [
        PowerState::Off,
        PowerState::NotFound,
        PowerState::Terminated,
        PowerState::On,
    ];
    let readers = [READER, OTHER];
    let bindings = [None, Some(READER), Some(OTHER)];
    let lies = [None, Some(false), Some(true)];
    let p = policy();
    let (mut checked, mut fences, mut deletes) = (0, 0, 0);
    for identity_check in [IdentityCheck::Checked, IdentityCheck::Unchecked] {
        for binding in bindings {
            for lie in lies {
                for shared in [false, true] {
                    let mut facts = NodeFacts {
                        identity_check,
                        identity_binding: binding.map(|reader| IdentityBinding {
                            reader: reader.into(),
                            ..bound().identity_binding.unwrap()
                        }),
                        off_while_alive: lie.map(|gone| OffWhileAlive {
                            read_at: t(-300),
                            signs_of_life_after: OFF_WHILE_ALIVE_PROOF,
                            gone,
                        }),
                        ..dead()
                    };
                    if shared {
                        facts.identity.uuid_shared_with = vec!["clone".into()];
                    }
                    let kinds = states.len() * readers.len();
                    for len in 1..=3u32 {
                        for combo in 0..kinds.pow(len) {
                            let mut c = combo;
                            let reads: Vec<PowerReading> = (0..len as i64)
                                .map(|i| {
                                    let k = c % kinds;
                                    c /= kinds;
                                    let state = states[k % states.len()].clone();
                                    let reader = readers[k / states.len()];
                                    let r = if state.is_gone() {
                                        gone(60 + i * 5, state)
                                    } else {
                                        read(60 + i * 5, state)
                                    };
                                    via(r, reader)
                                })
                                .collect();
                            let now = t(61 + (len as i64 - 1) * 5);
                            let d = decide(&facts, &reads, &p, now);
                            checked += 1;
                            let Step::Fence(_) = d.step else { continue };
                            fences += 1;
                            assert!(lie.is_none(), "{facts:?} {reads:?}: {}", d.reason);
                            let last = reads.last().unwrap();
                            if last.state.is_gone() {
                                deletes += 1;
                                let bound_reader = binding.expect("a binding");
                                let run = reads.iter().rev().take_while(|r| r.state.is_gone());
                                for r in run {
                                    assert_eq!(r.reader, bound_reader, "{reads:?}: {}", d.reason);
                                }
                            } else {
                                assert!(
                                    !(shared && identity_check == IdentityCheck::Checked),
                                    "{reads:?}: {}",
                                    d.reason
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
    assert!(
        fences > 0 && deletes > 0,
        "no fence ({fences}) or no delete ({deletes}): the generator is wrong"
    );
}

/// A reader that could not tell which key signed its call (EC2: no access key id seen, or
/// another one on a retry) names nobody: two accounts in that state read as the same words.
/// Its answers never match a binding, not even one learnt through those same words.
#[test]
fn a_reader_whose_key_is_unknown_never_matches_a_binding() {
    let unknown = "ec2 us-east-1 at the region's endpoint, key unknown";
    let learnt_unknown = NodeFacts {
        identity_binding: bound().identity_binding.map(|b| IdentityBinding {
            reader: unknown.into(),
            ..b
        }),
        ..bound()
    };
    let through_unknown = [
        via(gone(60, PowerState::NotFound), unknown),
        via(gone(65, PowerState::NotFound), unknown),
    ];
    for facts in [learnt_unknown, bound()] {
        let d = decide(&facts, &through_unknown, &policy(), t(66));
        assert_eq!(
            (d.state, d.step),
            (NodeState::Blocked, Step::Idle),
            "{}",
            d.reason
        );
        assert!(
            d.reason.contains("key unknown") && d.reason.contains("proves nothing"),
            "{}",
            d.reason
        );
    }
}
