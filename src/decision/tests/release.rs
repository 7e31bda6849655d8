//! Release at attestation: a node proven off while it still shows Ready is fenced at once and
//! its pods released; what the writer re-checks before the fence and before the pods go; and
//! that no pod is ever deleted without this daemon's attested fence of the same boot.

use super::holds_and_guards::{ALL_HOLDS, fresh_like, hold};
use super::pre_attestation::going_silent;
use super::*;

/// Ready, Lease stale at t(12.5), two Off reads 5 s apart: proven off at t(18).
fn proven_off_while_ready() -> (NodeFacts, [PowerReading; 2]) {
    let facts = NodeFacts {
        ready_heartbeat: Some(t(-300)),
        ..going_silent()
    };
    (facts, [off(13), off(18)])
}

#[test]
fn a_node_proven_off_while_ready_is_fenced_at_once_and_its_pods_released() {
    let (facts, reads) = proven_off_while_ready();
    let d = decide(&facts, &reads, &policy(), t(19));
    assert_eq!(
        (d.state, d.step, d.rule),
        (
            NodeState::Confirming,
            Step::Fence(FenceAction::Taint),
            Rule::ConfirmedOff
        ),
        "{}",
        d.reason
    );
    assert!(
        d.reason.contains("Ready") && d.reason.contains("release_at_attestation"),
        "{}",
        d.reason
    );
    let g = d.guard.expect("a fence carries its guard");
    assert!(g.while_ready && g.release_pods);
    assert_eq!(g.ready_heartbeat, Some(t(-300)));
    assert_eq!(g.lease_renew_time, Some(t(-1)));
    assert_eq!((g.boot_id.as_str(), g.evidence_at), ("boot-a", t(18)));
    // Not yet proven: read on, nothing written.
    let d = decide(&facts, &reads[..1], &policy(), t(14));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    // A dry run says what it would do, and writes nothing.
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    let d = decide(&facts, &reads, &dry, t(19));
    assert_eq!(
        (d.step, d.rule),
        (Step::WouldFence(FenceAction::Taint), Rule::DryRun)
    );
    assert!(d.reason.contains("force-delete its pods"), "{}", d.reason);
    assert_eq!(d.guard, None);
    // The same node turned NotReady: fenced as before, and its pods released too.
    let not_ready = NodeFacts {
        readiness: Readiness::NotReady { since: t(19) },
        ..facts.clone()
    };
    let g = decide(&not_ready, &reads, &policy(), t(20)).guard.unwrap();
    assert!(g.release_pods && !g.while_ready);
    assert_eq!(g.ready_heartbeat, None);
}

#[test]
fn with_release_off_a_ready_node_waits_for_not_ready_and_no_pod_is_released() {
    let (facts, reads) = proven_off_while_ready();
    let p = Policy {
        release_at_attestation: false,
        ..policy()
    };
    let d = decide(&facts, &reads, &p, t(19));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PreAttested));
    let not_ready = NodeFacts {
        readiness: Readiness::NotReady { since: t(19) },
        ..facts
    };
    let d = decide(&not_ready, &reads, &p, t(20));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    assert!(!d.guard.unwrap().release_pods);
    assert!(!d.reason.contains("pods"), "{}", d.reason);
}

/// Every hold stops a release at attestation as it stops a fence at NotReady, and so do a
/// sign of life, a hold on reading ahead and the node's own refusals.
#[test]
fn every_hold_and_every_sign_of_life_stops_a_release_at_attestation() {
    let (facts, reads) = proven_off_while_ready();
    for kind in ALL_HOLDS {
        for as_write in [false, true] {
            let mut f = facts.clone();
            if as_write {
                f.holds.write = Some(hold(kind));
            } else {
                f.holds.fence = Some(hold(kind));
            }
            let d = decide(&f, &reads, &policy(), t(19));
            assert_eq!(
                (d.step, d.rule.name()),
                (Step::Idle, kind.name()),
                "{kind:?}"
            );
            assert_eq!(d.guard, None);
        }
    }
    let stopped = |f: NodeFacts, what: &str| {
        let d = decide(&f, &reads, &policy(), t(19));
        assert_eq!(d.step, Step::Idle, "{what}: {d:?}");
        assert_eq!(d.guard, None, "{what}");
    };
    stopped(
        NodeFacts {
            lease_renewal_seen: Some(t(17)),
            lease_first_sight: false,
            ..facts.clone()
        },
        "a renewal after the first read",
    );
    stopped(
        NodeFacts {
            heartbeat_seen: Some(t(15)),
            ..facts.clone()
        },
        "a Ready heartbeat after the first read",
    );
    let mut held = facts.clone();
    held.holds.pre_attest = Some("a lease storm".into());
    stopped(held, "reading ahead held");
    let mut f = facts.clone();
    f.holds.lease_not_yet_counted = true;
    stopped(f, "the Lease not yet counted stale");
    stopped(
        NodeFacts {
            opted_out: Some("label".into()),
            ..facts.clone()
        },
        "opted out",
    );
    stopped(
        NodeFacts {
            other_remediator: Some("medik8s".into()),
            ..facts.clone()
        },
        "another remediator",
    );
}

fn fresh_ready(g: &WriteGuard) -> FreshNode {
    FreshNode {
        readiness: Readiness::Ready,
        ready_heartbeat: g.ready_heartbeat,
        ..fresh_like(g)
    }
}

/// The write-time re-check of a fence decided while Ready: a fresh Ready is expected, a new
/// Ready heartbeat or a Lease renewal is the kubelet alive.
#[test]
fn recheck_of_a_fence_while_ready_refuses_any_sign_of_life() {
    let (facts, reads) = proven_off_while_ready();
    let g = decide(&facts, &reads, &policy(), t(19)).guard.unwrap();
    let now = t(20);
    assert_eq!(
        recheck(&g, &fresh_ready(&g), &Holds::default(), now),
        Ok(())
    );
    let not_ready = FreshNode {
        readiness: Readiness::NotReady { since: t(19) },
        ready_heartbeat: Some(t(-300)),
        ..fresh_like(&g)
    };
    assert_eq!(recheck(&g, &not_ready, &Holds::default(), now), Ok(()));
    let heartbeat = FreshNode {
        ready_heartbeat: Some(t(19)),
        ..fresh_ready(&g)
    };
    let e = recheck(&g, &heartbeat, &Holds::default(), now).unwrap_err();
    assert!(e.contains("heartbeat"), "{e}");
    let renewed = FreshNode {
        lease_renew_time: Some(t(19)),
        ..fresh_ready(&g)
    };
    let e = recheck(&g, &renewed, &Holds::default(), now).unwrap_err();
    assert!(e.contains("renewed its Lease"), "{e}");
    // A fence decided at NotReady still refuses a node Ready again.
    let not_ready_facts = NodeFacts {
        readiness: Readiness::NotReady { since: t(19) },
        ..facts
    };
    let g = decide(&not_ready_facts, &reads, &policy(), t(20))
        .guard
        .unwrap();
    let e = recheck(&g, &fresh_ready(&g), &Holds::default(), now).unwrap_err();
    assert!(e.contains("Ready again"), "{e}");
}

fn our_fence(boot_id: &str) -> FenceRecord {
    FenceRecord {
        at: t(19),
        boot_id: boot_id.into(),
        taint_present: true,
        ours: true,
    }
}

/// The pods go only under this daemon's fence of the same boot, still in place, on the same
/// evidence, with no hold.
#[test]
fn recheck_before_the_pods_go_needs_our_fence_of_the_same_boot() {
    let (facts, reads) = proven_off_while_ready();
    let g = decide(&facts, &reads, &policy(), t(19))
        .guard
        .unwrap()
        .for_release();
    assert_eq!(g.purpose, GuardPurpose::ReleasePods);
    let fenced = FreshNode {
        fence: Some(our_fence("boot-a")),
        ..fresh_ready(&g)
    };
    let now = t(20);
    assert_eq!(recheck(&g, &fenced, &Holds::default(), now), Ok(()));
    let cases = [
        ("no fence", None),
        (
            "taint removed",
            Some(FenceRecord {
                taint_present: false,
                ..our_fence("boot-a")
            }),
        ),
        (
            "another oobfence's",
            Some(FenceRecord {
                ours: false,
                ..our_fence("boot-a")
            }),
        ),
        ("another boot's", Some(our_fence("boot-z"))),
    ];
    for (what, fence) in cases {
        let fresh = FreshNode {
            fence,
            ..fenced.clone()
        };
        assert!(
            recheck(&g, &fresh, &Holds::default(), now).is_err(),
            "{what}"
        );
    }
    for kind in ALL_HOLDS {
        for as_write in [false, true] {
            let mut holds = Holds::default();
            if as_write {
                holds.write = Some(hold(kind));
            } else {
                holds.fence = Some(hold(kind));
            }
            assert!(recheck(&g, &fenced, &holds, now).is_err(), "{kind:?}");
        }
    }
    let renewed = FreshNode {
        lease_renew_time: Some(t(19)),
        ..fenced.clone()
    };
    assert!(recheck(&g, &renewed, &Holds::default(), now).is_err());
}

/// Over every readiness, fence record, sign of life and short sequence of reads: a decision
/// that releases pods is always a fence of a node carrying no fence yet, guarded on the
/// node's bootID, on identity-matched Off or gone reads taken after the last sign of life; and
/// over every fresh Node, its re-check lets the pods go only under this daemon's own fence of
/// that bootID.
#[test]
fn property_no_pod_deletion_without_an_attested_fence_of_the_same_boot() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let readiness = [
        Readiness::Ready,
        Readiness::NotReady { since: t(0) },
        Readiness::NotReady { since: t(15) },
        Readiness::NoCondition,
    ];
    let fences = [None, Some(our_fence("boot-a")), Some(our_fence("boot-z"))];
    let (mut decided, mut releasing) = (0, 0);
    let mut guards = Vec::new();
    for r in &readiness {
        for fence in &fences {
            for alive_at in [0, 8] {
                let facts = NodeFacts {
                    readiness: r.clone(),
                    fence: fence.clone(),
                    lease_renewal_seen: Some(t(alive_at)),
                    lease_first_sight: false,
                    ..going_silent()
                };
                for reads in sequences(&states, 3, 6, 6) {
                    for now in [19i64, 25, 70] {
                        let d = decide(&facts, &reads, &policy(), t(now));
                        decided += 1;
                        let Some(g) = d.guard.clone().filter(|g| g.release_pods) else {
                            continue;
                        };
                        releasing += 1;
                        assert!(matches!(d.step, Step::Fence(_)), "{d:?}");
                        assert!(facts.fence.is_none(), "{d:?}");
                        assert_eq!(g.boot_id, facts.boot_id);
                        assert!(
                            matches!(d.rule, Rule::ConfirmedOff | Rule::ConfirmedGone),
                            "{d:?}"
                        );
                        let alive = last_sign_of_life(&facts).unwrap();
                        let counted: Vec<_> = reads
                            .iter()
                            .rev()
                            .take_while(|r| r.state == PowerState::Off && r.at >= alive)
                            .collect();
                        assert!(
                            counted.len() >= policy().confirm_reads as usize,
                            "{d:?} on {reads:?}"
                        );
                        guards.push(g.for_release());
                    }
                }
            }
        }
    }
    assert!(decided > 1_000 && releasing > 0, "{decided} {releasing}");
    guards.dedup();
    for g in &guards {
        for r in &readiness {
            for fence in &fences {
                for boot in ["boot-a", "boot-z"] {
                    for lease in [g.lease_renew_time, Some(t(30))] {
                        let fresh = FreshNode {
                            uid: g.uid.clone(),
                            readiness: r.clone(),
                            boot_id: boot.into(),
                            lease_renew_time: lease,
                            ready_heartbeat: g.ready_heartbeat,
                            fence: fence.clone(),
                        };
                        if recheck(g, &fresh, &Holds::default(), t(20)).is_ok() {
                            let f = fresh.fence.as_ref().expect("no fence");
                            assert!(f.ours && f.taint_present, "{fresh:?}");
                            assert_eq!(f.boot_id, g.boot_id);
                            assert_eq!(fresh.boot_id, g.boot_id);
                            assert_eq!(fresh.lease_renew_time, g.lease_renew_time);
                        }
                    }
                }
            }
        }
    }
}

/// A node fenced while it still showed Ready keeps showing Ready until the controller-manager
/// marks it: that is no return. It waits as a fenced node, reading nothing, until its kubelet
/// shows life again; then the usual proof lifts the fence.
#[test]
fn a_node_fenced_while_ready_is_not_taken_for_back_until_its_kubelet_shows_life() {
    let (facts, _) = proven_off_while_ready();
    let fenced = NodeFacts {
        fence: Some(our_fence("boot-a")),
        ..facts
    };
    let d = decide(&fenced, &[off(13), off(18)], &policy(), t(25));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Fenced, Step::Idle, Rule::FencedAwaitingRecovery),
        "{}",
        d.reason
    );
    assert_eq!(d.next_read_at, None);
    assert!(d.reason.contains("still showed Ready"), "{}", d.reason);
    // Back: a renewal seen after the fence, a new boot, a fresh On read.
    let back = NodeFacts {
        lease_renewal_seen: Some(t(60)),
        lease_first_sight: false,
        boot_id: "boot-b".into(),
        ..fenced
    };
    let d = decide(&back, &[read(61, PowerState::On)], &policy(), t(62));
    assert_eq!(
        (d.step, d.rule),
        (Step::Unfence, Rule::RecoveredNewBoot),
        "{}",
        d.reason
    );
}
