//! What stands between a decision and its write: the guard a write re-checks on a fresh GET,
//! and the daemon-wide holds (pause, stale view, storm, budget, standby, ...) that refuse a
//! fence the node's own rules allow.

use super::*;

#[test]
fn a_fence_decision_carries_what_the_writer_must_recheck() {
    let d = decide(&dead(), &[off(60), off(65)], &policy(), t(66));
    let g = d.guard.expect("a fence is guarded");
    assert_eq!(g.purpose, GuardPurpose::Fence);
    assert_eq!(g.uid, "uid-1");
    assert_eq!(g.boot_id, "boot-a");
    assert_eq!(g.lease_renew_time, Some(t(-12)));
    assert_eq!(g.evidence_at, t(65));
    assert_eq!(g.read_max_age, policy().read_max_age);
    // Nothing else is guarded: there is nothing to write.
    assert!(
        decide(&dead(), &[off(60)], &policy(), t(61))
            .guard
            .is_none()
    );
}

pub(super) fn fresh_like(g: &WriteGuard) -> FreshNode {
    FreshNode {
        uid: g.uid.clone(),
        readiness: Readiness::NotReady { since: t(0) },
        boot_id: g.boot_id.clone(),
        lease_renew_time: g.lease_renew_time,
        ready_heartbeat: None,
        fence: None,
    }
}

/// What the write re-checks on its fresh GET: everything the decision used that can move.
#[test]
fn recheck_refuses_a_fence_when_anything_moved() {
    let g = decide(&dead(), &[off(60), off(65)], &policy(), t(66))
        .guard
        .unwrap();
    assert_eq!(
        recheck(&g, &fresh_like(&g), &Holds::default(), t(70)),
        Ok(())
    );
    let cases: Vec<(&str, FreshNode, Timestamp)> = vec![
        (
            "uid",
            FreshNode {
                uid: "uid-2".into(),
                ..fresh_like(&g)
            },
            t(70),
        ),
        (
            "Ready",
            FreshNode {
                readiness: Readiness::Ready,
                ..fresh_like(&g)
            },
            t(70),
        ),
        (
            "bootID",
            FreshNode {
                boot_id: "boot-b".into(),
                ..fresh_like(&g)
            },
            t(70),
        ),
        (
            "Lease",
            FreshNode {
                lease_renew_time: Some(t(68)),
                ..fresh_like(&g)
            },
            t(70),
        ),
        // GET, PATCH and 409 retries took long enough for the Off read to go stale.
        ("old at write time", fresh_like(&g), t(65 + 31)),
    ];
    for (what, fresh, now) in cases {
        let e = recheck(&g, &fresh, &Holds::default(), now).expect_err(what);
        assert!(e.contains(what), "{what}: {e}");
    }
}

#[test]
fn recheck_refuses_an_unfence_unless_ready_new_boot_fresh_on_and_ours() {
    let facts = fenced(Readiness::Ready, "boot-b");
    let reads = [read(150, PowerState::On)];
    let g = decide(&facts, &reads, &policy(), t(151)).guard.unwrap();
    assert_eq!(g.purpose, GuardPurpose::Unfence);
    let record = facts.fence.clone().unwrap();
    let ok = FreshNode {
        uid: g.uid.clone(),
        readiness: Readiness::Ready,
        boot_id: "boot-b".into(),
        lease_renew_time: None,
        ready_heartbeat: None,
        fence: Some(record.clone()),
    };
    assert_eq!(recheck(&g, &ok, &Holds::default(), t(160)), Ok(()));
    let cases: Vec<(&str, FreshNode, Timestamp)> = vec![
        (
            "not Ready",
            FreshNode {
                readiness: Readiness::NotReady { since: t(155) },
                ..ok.clone()
            },
            t(160),
        ),
        (
            "bootID",
            FreshNode {
                boot_id: "boot-a".into(),
                ..ok.clone()
            },
            t(160),
        ),
        (
            "another oobfence",
            FreshNode {
                fence: Some(FenceRecord {
                    ours: false,
                    ..record.clone()
                }),
                ..ok.clone()
            },
            t(160),
        ),
        (
            "no oobfence record",
            FreshNode {
                fence: None,
                ..ok.clone()
            },
            t(160),
        ),
        ("old at write time", ok.clone(), t(150 + 31)),
    ];
    for (what, fresh, now) in cases {
        let e = recheck(&g, &fresh, &Holds::default(), now).expect_err(what);
        assert!(e.contains(what), "{what}: {e}");
    }
}

pub(super) fn hold(kind: HoldKind) -> Hold {
    Hold {
        kind,
        reason: format!("held by {}", kind.name()),
    }
}

pub(super) const ALL_HOLDS: [HoldKind; 7] = [
    HoldKind::Paused,
    HoldKind::StaleView,
    HoldKind::SelfPartition,
    HoldKind::Storm,
    HoldKind::StormCooldown,
    HoldKind::FenceBudget,
    HoldKind::Standby,
];

/// Each hold turns a fence that the node's own rules allow into a refusal named after it,
/// keeps the node read, and says what would happen without it.
#[test]
fn every_hold_turns_a_fence_into_its_own_rule() {
    let reads = [off(60), off(65)];
    assert_eq!(
        decide(&dead(), &reads, &policy(), t(66)).step,
        Step::Fence(FenceAction::Taint)
    );
    for kind in ALL_HOLDS {
        for as_write in [false, true] {
            let mut facts = dead();
            if as_write {
                facts.holds.write = Some(hold(kind));
            } else {
                facts.holds.fence = Some(hold(kind));
            }
            let d = decide(&facts, &reads, &policy(), t(66));
            assert_eq!(
                (d.state, d.step),
                (NodeState::Blocked, Step::Idle),
                "{kind:?}"
            );
            assert_eq!(d.rule.name(), kind.name());
            assert!(
                d.reason.starts_with(&format!("held by {}", kind.name())),
                "{}",
                d.reason
            );
            assert!(
                d.reason.contains("without it: NotReady for"),
                "{}",
                d.reason
            );
            assert_eq!(
                d.next_read_at,
                Some(t(65 + 30)),
                "re-read at recheck_interval"
            );
            assert_eq!(d.guard, None);
            // A dry run shows the hold too, not a fence that would not happen.
            let dry = Policy {
                dry_run: true,
                ..policy()
            };
            let d = decide(&facts, &reads, &dry, t(66));
            assert_eq!((d.step, d.rule.name()), (Step::Idle, kind.name()));
        }
    }
}

/// A pause or a stale view holds an untaint and a record clear; a storm, a freeze, a cooldown
/// or a spent budget does not: lifting a fence never adds to a storm.
#[test]
fn write_holds_stop_untaints_fence_holds_do_not() {
    let facts = fenced(Readiness::Ready, "boot-b");
    let on = [read(150, PowerState::On)];
    for kind in ALL_HOLDS {
        let mut f = facts.clone();
        f.holds.fence = Some(hold(kind));
        assert_eq!(
            decide(&f, &on, &policy(), t(151)).step,
            Step::Unfence,
            "{kind:?}"
        );
        let mut f = facts.clone();
        f.holds.write = Some(hold(kind));
        let d = decide(&f, &on, &policy(), t(151));
        assert_eq!(
            (d.state, d.step),
            (NodeState::Recovering, Step::Idle),
            "{kind:?}"
        );
        assert_eq!(d.rule.name(), kind.name());
    }
    let mut cleared = facts.clone();
    cleared.fence.as_mut().unwrap().taint_present = false;
    assert_eq!(
        decide(&cleared, &[], &policy(), t(151)).step,
        Step::ClearRecord
    );
    cleared.holds.write = Some(hold(HoldKind::Paused));
    let d = decide(&cleared, &[], &policy(), t(151));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::Paused));
}

/// Reads from before a freeze thawed (or the view recovered) never count: the Off reads must
/// be confirmed again after it.
#[test]
fn reads_from_before_a_thaw_do_not_count() {
    let mut facts = dead();
    facts.holds.evidence_not_before = Some(t(63));
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert!(d.reason.starts_with("1 of 2"), "{}", d.reason);
    let d = decide(&facts, &[off(60), off(65), off(70)], &policy(), t(71));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    // Every read from before: read again now.
    facts.holds.evidence_not_before = Some(t(66));
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.rule, d.next_read_at),
        (Rule::AwaitingPowerRead, Some(t(66)))
    );
}

/// The writer re-checks the holds as they stand right before the write.
#[test]
fn recheck_abandons_a_write_placed_under_a_hold() {
    let facts = dead();
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    let g = d.guard.unwrap();
    let fresh = fresh_like(&g);
    for kind in ALL_HOLDS {
        let fence_hold = Holds {
            fence: Some(hold(kind)),
            ..Holds::default()
        };
        let e = recheck(&g, &fresh, &fence_hold, t(67)).unwrap_err();
        assert!(e.contains(kind.name()), "{e}");
        let write_hold = Holds {
            write: Some(hold(kind)),
            ..Holds::default()
        };
        assert!(recheck(&g, &fresh, &write_hold, t(67)).is_err());
    }
    // An unfence is held by a write hold only.
    let facts = fenced(Readiness::Ready, "boot-b");
    let d = decide(&facts, &[read(150, PowerState::On)], &policy(), t(151));
    let g = d.guard.unwrap();
    let mut fresh = fresh_like(&g);
    fresh.readiness = Readiness::Ready;
    fresh.fence = facts.fence.clone();
    let storm = Holds {
        fence: Some(hold(HoldKind::Storm)),
        ..Holds::default()
    };
    assert_eq!(recheck(&g, &fresh, &storm, t(152)), Ok(()));
    let paused = Holds {
        write: Some(hold(HoldKind::Paused)),
        ..Holds::default()
    };
    assert!(recheck(&g, &fresh, &paused, t(152)).is_err());
}

/// Property: under any hold, whatever the node's facts and reads, no fence; under a pause or a
/// stale view, no write at all; an untaint or a record clear only ever touches a fence this
/// daemon placed. Exhaustive over every hold (as a fence hold and as a write hold) x opt-out x
/// the node's fence record (none, ours, another's; taint present or gone) x readiness x every
/// sequence of up to 3 reads from {On, Off, terminated, error}.
#[test]
fn property_no_fence_under_a_hold_and_no_foreign_untaint() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::Terminated,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let records = [
        None,
        Some((true, true)),
        Some((true, false)),
        Some((false, true)),
        Some((false, false)),
    ];
    let holds_set: Vec<Holds> = std::iter::once(Holds::default())
        .chain(ALL_HOLDS.iter().flat_map(|k| {
            [
                Holds {
                    fence: Some(hold(*k)),
                    ..Holds::default()
                },
                Holds {
                    write: Some(hold(*k)),
                    ..Holds::default()
                },
            ]
        }))
        .collect();
    let p = policy();
    let (mut checked, mut fences, mut unfences) = (0, 0, 0);
    for holds in &holds_set {
        for opted in [false, true] {
            for record in records {
                for ready in [false, true] {
                    let mut facts = dead();
                    facts.holds = holds.clone();
                    facts.boot_id = "boot-b".into();
                    if opted {
                        facts.opted_out = Some("annotation oobfence.io/exclude=true".into());
                    }
                    if ready {
                        facts.readiness = Readiness::Ready;
                    }
                    facts.fence = record.map(|(ours, taint_present)| FenceRecord {
                        at: t(50),
                        boot_id: "boot-a".into(),
                        taint_present,
                        ours,
                    });
                    facts.foreign_out_of_service = record.is_some_and(|(ours, _)| !ours);
                    for reads in sequences(&states, 3, 60, 5) {
                        let len = reads.len();
                        let d = decide(&facts, &reads, &p, t(61 + 5 * len as i64));
                        checked += 1;
                        match d.step {
                            Step::Fence(_) | Step::WouldFence(_) => {
                                fences += 1;
                                assert!(holds.fence.is_none() && holds.write.is_none(), "{d:?}");
                                assert!(!opted, "{d:?}");
                            }
                            Step::Unfence | Step::WouldUnfence | Step::ClearRecord => {
                                unfences += 1;
                                assert!(holds.write.is_none(), "{d:?}");
                                assert!(record.is_some_and(|(ours, _)| ours), "{d:?}");
                                if d.step == Step::Unfence {
                                    assert!(record == Some((true, true)), "{d:?}");
                                }
                            }
                            Step::Idle => {}
                            // Actuation is off in this policy: never a power action.
                            Step::PowerOff
                            | Step::WouldPowerOff
                            | Step::PowerOn
                            | Step::WouldPowerOn => panic!("{d:?}"),
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 20_000, "{checked}");
    assert!(
        fences > 0 && unfences > 0,
        "the generator never reached a write"
    );
}
