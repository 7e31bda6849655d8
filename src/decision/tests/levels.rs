//! Levels: a node's sources tried in order, all-of within a level, an answer other than Off
//! ending the question, only a silent level skipped; and a person's confirmation where no
//! source can answer. The property pins the whole: no fence without either every source of
//! the deciding level proving the machine off (every level above it silent) or a standing
//! confirmation of the current boot, and never after a sign of life.

use proptest::prelude::*;

use super::*;
use crate::decision::confirmation::{Confirmation, ConfirmationNote};
use crate::decision::holds::Hold;
use crate::decision::levels::{Basis, Member, decide_levels, decide_one};

fn failed(at: i64, kind: ReadErrorKind) -> PowerReading {
    read(at, PowerState::error(kind, "no answer"))
}

/// An outlet: it proves no machine's identity, so its entry says `identity = "unchecked"`.
fn outlet_facts() -> NodeFacts {
    NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..dead()
    }
}

fn outlet_off(at: i64) -> PowerReading {
    read_from(at, PowerState::Off, no_identity())
}

fn outlet_on(at: i64) -> PowerReading {
    read_from(at, PowerState::On, no_identity())
}

fn bmc(reads: &[PowerReading]) -> Member<'_> {
    Member {
        level: 1,
        label: "bmc".into(),
        attested: true,
        facts: dead(),
        reads,
    }
}

fn outlet<'r>(level: u32, name: &str, reads: &'r [PowerReading]) -> Member<'r> {
    Member {
        level,
        label: name.into(),
        attested: false,
        facts: outlet_facts(),
        reads,
    }
}

const UNREACHABLE: ReadErrorKind = ReadErrorKind::Unreachable;

#[test]
fn a_dark_bmc_is_skipped_and_the_outlet_proves_the_machine_off() {
    let dark = [failed(60, UNREACHABLE), failed(64, ReadErrorKind::Timeout)];
    let a = [outlet_off(61), outlet_off(66)];
    let out = decide_levels(
        &dead(),
        &[bmc(&dark), outlet(2, "pdu-a outlet 3", &a)],
        &policy(),
        t(67),
    );
    assert_eq!(
        out.decision.step,
        Step::Fence(FenceAction::Taint),
        "{out:?}"
    );
    assert_eq!(
        out.basis,
        Basis::Reads {
            level: 2,
            attested: false
        }
    );
    assert_eq!(out.member, Some(1));
    let reason = &out.decision.reason;
    assert!(reason.contains("level 2 speaks"), "{reason}");
    assert!(reason.contains("level 1 cannot answer"), "{reason}");
    assert!(reason.contains("only the mapping"), "{reason}");
    // The dark BMC is still read, so that it can speak again.
    assert!(out.reads_wanted.iter().any(|(i, _)| *i == 0), "{out:?}");
}

#[test]
fn a_bmc_that_answers_on_ends_the_question_whatever_the_outlet_says() {
    let on = [read(60, PowerState::On)];
    let a = [outlet_off(61), outlet_off(66)];
    let out = decide_levels(&dead(), &[bmc(&on), outlet(2, "a", &a)], &policy(), t(67));
    assert_eq!(out.decision.step, Step::Idle);
    assert_eq!(out.decision.rule, Rule::PowerOn);
    assert_eq!(out.basis, Basis::None);
    // Level 2 is not even read.
    assert!(out.reads_wanted.iter().all(|(i, _)| *i == 0), "{out:?}");
}

#[test]
fn a_bmc_answering_nonsense_is_not_silent_and_is_never_skipped() {
    let bad = [
        failed(60, ReadErrorKind::BadReply),
        failed(65, ReadErrorKind::BadReply),
    ];
    let a = [outlet_off(61), outlet_off(66)];
    let out = decide_levels(&dead(), &[bmc(&bad), outlet(2, "a", &a)], &policy(), t(67));
    assert!(!out.decision.step.writes(), "{out:?}");
    assert_eq!(out.decision.rule, Rule::PowerUnknown);
}

#[test]
fn a_dual_fed_machine_is_off_only_when_both_outlets_are() {
    let dark = [failed(60, UNREACHABLE)];
    let off_a = [outlet_off(61), outlet_off(66)];
    let on_b = [outlet_on(61), outlet_on(66)];
    let off_b = [outlet_off(62), outlet_off(67)];
    let one_on = decide_levels(
        &dead(),
        &[bmc(&dark), outlet(2, "a", &off_a), outlet(2, "b", &on_b)],
        &policy(),
        t(68),
    );
    assert_eq!(one_on.decision.rule, Rule::PowerOn, "{one_on:?}");
    assert!(!one_on.decision.step.writes());

    let both = decide_levels(
        &dead(),
        &[bmc(&dark), outlet(2, "a", &off_a), outlet(2, "b", &off_b)],
        &policy(),
        t(68),
    );
    assert_eq!(
        both.decision.step,
        Step::Fence(FenceAction::Taint),
        "{both:?}"
    );
    assert!(both.decision.reason.contains("every source of level 2"));
    // The write re-checks freshness against the older of the two proofs.
    assert_eq!(both.decision.guard.unwrap().evidence_at, t(66));
}

#[test]
fn one_outlet_off_and_the_other_silent_proves_nothing() {
    let dark = [failed(60, UNREACHABLE)];
    let off_a = [outlet_off(61), outlet_off(66)];
    let dark_b = [failed(62, UNREACHABLE)];
    let out = decide_levels(
        &dead(),
        &[bmc(&dark), outlet(2, "a", &off_a), outlet(2, "b", &dark_b)],
        &policy(),
        t(68),
    );
    assert!(!out.decision.step.writes(), "{out:?}");
    assert_eq!(out.decision.rule, Rule::PowerUnknown);
    assert!(
        out.decision.reason.contains("no level can answer"),
        "{}",
        out.decision.reason
    );
}

#[test]
fn a_level_still_reading_is_waited_for_not_passed_over() {
    let a = [outlet_off(61), outlet_off(66)];
    let out = decide_levels(&dead(), &[bmc(&[]), outlet(2, "a", &a)], &policy(), t(67));
    assert_eq!(out.decision.rule, Rule::AwaitingPowerRead);
    assert_eq!(out.reads_wanted, vec![(0, t(67))]);
}

#[test]
fn a_node_rule_is_the_same_whatever_the_sources_say() {
    let facts = NodeFacts {
        opted_out: Some("oobfence.io/exclude".into()),
        ..dead()
    };
    let dark = [failed(60, UNREACHABLE)];
    let a = [outlet_off(61), outlet_off(66)];
    let mut m = outlet(2, "a", &a);
    m.facts.opted_out = facts.opted_out.clone();
    let mut b = bmc(&dark);
    b.facts.opted_out = facts.opted_out.clone();
    let out = decide_levels(&facts, &[b, m], &policy(), t(67));
    assert_eq!(out.decision.rule, Rule::OptedOut);
}

fn confirmed(boot: &str, at: i64) -> Confirmation {
    Confirmation {
        note: ConfirmationNote {
            boot_id: boot.into(),
            reason: "pulled the cord, rack 4 PDU dark".into(),
            by: "alice".into(),
            at: Some(t(at)),
        },
        seen: t(at + 1),
    }
}

fn unmapped(confirmation: Option<Confirmation>) -> NodeFacts {
    NodeFacts {
        has_power_source: false,
        confirmation,
        ..dead()
    }
}

#[test]
fn a_person_confirms_a_node_no_source_can_read() {
    let refused = decide_one(&unmapped(None), &[], &policy(), t(70));
    assert_eq!(refused.decision.rule, Rule::NoPowerSource);

    let out = decide_one(
        &unmapped(Some(confirmed("boot-a", 65))),
        &[],
        &policy(),
        t(70),
    );
    assert_eq!(
        out.decision.step,
        Step::Fence(FenceAction::Taint),
        "{out:?}"
    );
    assert_eq!(out.decision.rule, Rule::ConfirmedOffByPerson);
    assert_eq!(out.basis, Basis::Person);
    assert!(
        out.decision.reason.contains("alice"),
        "{}",
        out.decision.reason
    );
    assert!(out.decision.reason.contains("pulled the cord"));
    let g = out.decision.guard.unwrap();
    assert_eq!((g.boot_id.as_str(), g.release_pods), ("boot-a", true));
}

#[test]
fn a_person_confirms_a_node_whose_every_level_is_dark() {
    let dark = [failed(60, UNREACHABLE)];
    let dark_a = [failed(61, ReadErrorKind::Timeout)];
    let facts = NodeFacts {
        confirmation: Some(confirmed("boot-a", 65)),
        ..dead()
    };
    let out = decide_levels(
        &facts,
        &[bmc(&dark), outlet(2, "a", &dark_a)],
        &policy(),
        t(70),
    );
    assert_eq!(out.decision.rule, Rule::ConfirmedOffByPerson, "{out:?}");
}

#[test]
fn a_confirmation_never_outweighs_an_answer() {
    let facts = NodeFacts {
        confirmation: Some(confirmed("boot-a", 65)),
        ..dead()
    };
    for reads in [
        vec![read(66, PowerState::On)],
        vec![read(60, PowerState::Off)],
        vec![read_from(66, PowerState::Off, other_machine())],
        vec![read(
            66,
            PowerState::Suspended {
                detail: "S3".into(),
            },
        )],
    ] {
        let out = decide_one(&facts, &reads, &policy(), t(67));
        assert!(!out.decision.step.writes(), "{reads:?}: {out:?}");
        assert_ne!(out.basis, Basis::Person);
    }
}

#[test]
fn a_confirmation_of_another_boot_a_ready_node_or_life_after_it_does_not_stand() {
    let cases = [
        (
            unmapped(Some(confirmed("boot-old", 65))),
            "never outlives its boot",
        ),
        (
            NodeFacts {
                readiness: Readiness::Ready,
                ..unmapped(Some(confirmed("boot-a", 65)))
            },
            "",
        ),
        (
            NodeFacts {
                lease_renewal_seen: Some(t(68)),
                ..unmapped(Some(confirmed("boot-a", 65)))
            },
            "alive at",
        ),
    ];
    for (facts, words) in cases {
        let out = decide_one(&facts, &[], &policy(), t(130));
        assert!(!out.decision.step.writes(), "{out:?}");
        assert!(
            out.decision.reason.contains(words),
            "{}",
            out.decision.reason
        );
    }
    // The Lease as first found after a restart is no sign of life.
    let restarted = NodeFacts {
        lease_renewal_seen: Some(t(68)),
        lease_first_sight: true,
        ..unmapped(Some(confirmed("boot-a", 65)))
    };
    let out = decide_one(&restarted, &[], &policy(), t(130));
    assert_eq!(out.decision.rule, Rule::ConfirmedOffByPerson, "{out:?}");
}

#[test]
fn every_hold_still_holds_a_confirmed_node() {
    let mut facts = unmapped(Some(confirmed("boot-a", 65)));
    facts.holds.write = Some(Hold {
        kind: HoldKind::Paused,
        reason: "paused by bob".into(),
    });
    let out = decide_one(&facts, &[], &policy(), t(70));
    assert_eq!(out.decision.rule, Rule::Paused, "{out:?}");
    assert!(!out.decision.step.writes());

    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    let out = decide_one(&unmapped(Some(confirmed("boot-a", 65))), &[], &dry, t(70));
    assert_eq!(out.decision.step, Step::WouldFence(FenceAction::Taint));
}

#[test]
fn a_node_fenced_on_a_persons_word_is_unfenced_on_its_new_boot() {
    let mut facts = NodeFacts {
        has_power_source: false,
        ..fenced(Readiness::Ready, "boot-b")
    };
    let out = decide_one(&facts, &[], &policy(), t(150));
    assert_eq!(out.decision.step, Step::Unfence, "{out:?}");
    facts.boot_id = "boot-a".into();
    let out = decide_one(&facts, &[], &policy(), t(150));
    assert!(!out.decision.step.writes(), "{out:?}");
}

// The property. Each source is one of a few read histories, at level 1 or 2; the node may
// carry a confirmation of its boot or another, and a sign of life may come late.

fn history(kind: u8, unchecked: bool) -> Vec<PowerReading> {
    let r = |at, s: PowerState| {
        if unchecked {
            read_from(at, s, no_identity())
        } else {
            read(at, s)
        }
    };
    match kind {
        0 => vec![r(60, PowerState::Off), r(65, PowerState::Off)],
        1 => vec![r(60, PowerState::On)],
        2 => vec![failed(60, UNREACHABLE), failed(65, ReadErrorKind::Timeout)],
        3 => vec![failed(65, ReadErrorKind::BadReply)],
        4 => vec![r(65, PowerState::Off)],
        5 => Vec::new(),
        6 => vec![r(
            60,
            PowerState::Suspended {
                detail: "S3".into(),
            },
        )],
        _ => vec![
            read_from(60, PowerState::Off, other_machine()),
            r(65, PowerState::Off),
        ],
    }
}

proptest! {
    #![proptest_config(crate::fuzz::config())]

    #[test]
    fn no_fence_without_a_proving_level_or_a_standing_confirmation(
        sources in proptest::collection::vec((1u32..=3, 0u8..8, any::<bool>()), 0..5),
        confirmation in proptest::option::of((any::<bool>(), 50i64..70)),
        alive_late in any::<bool>(),
        ready in any::<bool>(),
    ) {
        let mut base = dead();
        if alive_late {
            base.lease_renewal_seen = Some(t(69));
        }
        if ready {
            base.readiness = Readiness::Ready;
        }
        base.has_power_source = !sources.is_empty();
        base.confirmation = confirmation.map(|(this_boot, at)| {
            confirmed(if this_boot { "boot-a" } else { "boot-old" }, at)
        });
        let histories: Vec<Vec<PowerReading>> =
            sources.iter().map(|(_, k, u)| history(*k, *u)).collect();
        let members: Vec<Member<'_>> = sources
            .iter()
            .zip(&histories)
            .map(|((level, _, unchecked), reads)| Member {
                level: *level,
                label: format!("source at level {level}"),
                attested: !unchecked,
                facts: NodeFacts {
                    identity_check: if *unchecked {
                        IdentityCheck::Unchecked
                    } else {
                        IdentityCheck::Checked
                    },
                    ..base.clone()
                },
                reads,
            })
            .collect();
        let now = t(70);
        let out = decide_levels(&base, &members, &policy(), now);
        if !matches!(out.decision.step, Step::Fence(_)) {
            return Ok(());
        }
        // Never after a sign of life.
        prop_assert!(!alive_late || base.lease_renewal_seen < Some(t(60)), "{out:?}");
        match out.basis {
            Basis::Reads { level, .. } => {
                // Every source of that level, alone, proves the machine off...
                for m in members.iter().filter(|m| m.level == level) {
                    let alone = decide(&m.facts, m.reads, &policy(), now);
                    prop_assert!(matches!(alone.step, Step::Fence(_)), "{m:?}: {alone:?}");
                }
                // ...and every level above it cannot answer: a source of it is silent, and
                // none answered anything but Off.
                for l in members.iter().map(|m| m.level).filter(|l| *l < level) {
                    let above: Vec<_> = members.iter().filter(|m| m.level == l).collect();
                    let silent = |m: &Member<'_>| {
                        m.reads.last().map(|r| r.state.label()) == Some("error")
                    };
                    prop_assert!(above.iter().any(|m| silent(m)), "{:?}", above);
                    for m in above {
                        let alone = decide(&m.facts, m.reads, &policy(), now);
                        prop_assert!(
                            silent(m) || matches!(alone.step, Step::Fence(_)),
                            "{m:?}: {alone:?}"
                        );
                    }
                }
            }
            Basis::Person => {
                let c = base.confirmation.as_ref().expect("a confirmation");
                prop_assert_eq!(c.note.boot_id.as_str(), "boot-a");
                prop_assert!(!ready);
                // No source answered anything but silence, an unknown, or Off.
                for m in &members {
                    let alone = decide(&m.facts, m.reads, &policy(), now);
                    prop_assert!(
                        alone.rule == Rule::PowerUnknown || matches!(alone.step, Step::Fence(_)),
                        "{m:?}: {alone:?}"
                    );
                }
            }
            Basis::None => prop_assert!(false, "a fence on no basis: {out:?}"),
        }
    }

    #[test]
    fn one_source_at_level_one_decides_as_it_always_did(
        kind in 0u8..8,
        unchecked in any::<bool>(),
        now in 60i64..140,
    ) {
        let reads = history(kind, unchecked);
        let facts = NodeFacts {
            identity_check: if unchecked { IdentityCheck::Unchecked } else { IdentityCheck::Checked },
            ..dead()
        };
        let alone = decide(&facts, &reads, &policy(), t(now));
        let out = decide_one(&facts, &reads, &policy(), t(now));
        prop_assert_eq!(out.decision, alone);
    }
}

#[test]
fn a_freeze_does_not_hold_a_persons_word_and_a_storm_does() {
    let frozen = Hold {
        kind: HoldKind::SelfPartition,
        reason: "6 of 10 power sources read in rack r4 fail".into(),
    };
    let mut facts = unmapped(Some(confirmed("boot-a", 65)));
    facts.holds.fence = Some(frozen.clone());
    let out = decide_one(&facts, &[], &policy(), t(70));
    assert_eq!(out.decision.rule, Rule::ConfirmedOffByPerson, "{out:?}");
    let guard = out.decision.guard.clone().unwrap();
    assert!(guard.on_word);
    // The writer's last look agrees: the freeze does not stop it, a storm does.
    let fresh = FreshNode {
        uid: "uid-1".into(),
        readiness: facts.readiness.clone(),
        boot_id: "boot-a".into(),
        lease_renew_time: facts.lease_renew_time,
        ready_heartbeat: None,
        fence: None,
    };
    assert_eq!(recheck(&guard, &fresh, &facts.holds, t(71)), Ok(()));
    let by_reads = WriteGuard {
        on_word: false,
        ..guard.clone()
    };
    assert!(recheck(&by_reads, &fresh, &facts.holds, t(71)).is_err());

    let storm = Hold {
        kind: HoldKind::Storm,
        reason: "9 of 10 nodes in rack r4 are NotReady".into(),
    };
    facts.holds.fence_on_word = Some(storm);
    let out = decide_one(&facts, &[], &policy(), t(70));
    assert_eq!(out.decision.rule, Rule::Storm, "{out:?}");
    assert!(recheck(&guard, &fresh, &facts.holds, t(71)).is_err());

    // A dark rack read through its sources is held by the freeze, as ever.
    let dark = [failed(60, UNREACHABLE), failed(65, UNREACHABLE)];
    let mut by_source = dead();
    by_source.holds.fence = Some(frozen);
    let out = decide_one(&by_source, &dark, &policy(), t(70));
    assert!(!out.decision.step.writes());
}

#[test]
fn a_fence_is_lifted_through_the_first_level_that_answers() {
    let back = fenced(Readiness::Ready, "boot-b");
    let dark = [failed(150, UNREACHABLE)];
    let on = [outlet_on(151)];
    let mut b = bmc(&dark);
    b.facts = back.clone();
    let mut o = outlet(2, "a", &on);
    o.facts = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..back.clone()
    };
    let out = decide_levels(&back, &[b.clone(), o], &policy(), t(152));
    assert_eq!(out.decision.step, Step::Unfence, "{out:?}");
    assert_eq!(out.member, Some(1));
    // A level that answers, but not On yet, is waited for: the next level is not asked.
    let unknown_yet = [read(150, PowerState::Off)];
    b.reads = &unknown_yet;
    let out = decide_levels(&back, &[b, outlet(2, "a", &on)], &policy(), t(152));
    assert!(!out.decision.step.writes(), "{out:?}");
}
