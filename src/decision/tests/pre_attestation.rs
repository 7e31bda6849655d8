//! Pre-attestation: reading power while the node still shows Ready, once its Lease is stale,
//! so that a node already proven Off is fenced the moment it turns NotReady; how staleness
//! is counted, and what discards the early evidence.

use super::*;

/// Ready, its kubelet last seen alive at t(0) with a 20 s Lease (renewals every 5 s): stale
/// after 2.5 renewals, at t(12.5).
pub(super) fn going_silent() -> NodeFacts {
    NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(0)),
        lease_first_sight: false,
        lease_renew_time: Some(t(-1)),
        lease_duration: Some(Duration::from_secs(20)),
        ..dead()
    }
}

/// Pre-attestation alone: fences at NotReady, never before.
fn fence_at_not_ready() -> Policy {
    Policy {
        release_at_attestation: false,
        ..policy()
    }
}

#[test]
fn a_ready_node_whose_lease_goes_stale_is_read_ahead_and_never_written() {
    let p = fence_at_not_ready();
    let d = decide(&going_silent(), &[], &p, t(12));
    assert_eq!((d.state, d.rule), (NodeState::Healthy, Rule::NodeReady));
    assert_eq!(d.next_read_at, None);
    let d = decide(&going_silent(), &[], &p, t(13));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Suspect, Step::Idle, Rule::AwaitingPowerRead)
    );
    assert_eq!(d.next_read_at, Some(t(13)));
    assert!(d.reason.contains("ahead of NotReady"), "{}", d.reason);
    let d = decide(&going_silent(), &[off(13)], &p, t(14));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert_eq!(d.next_read_at, Some(t(18)));
    // Confirmed: attested, still nothing written, kept fresh for the moment it turns NotReady.
    let d = decide(&going_silent(), &[off(13), off(18)], &p, t(19));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Suspect, Step::Idle, Rule::PreAttested)
    );
    assert_eq!(d.guard, None);
    assert_eq!(
        d.next_read_at,
        Some(t(33)),
        "half of read_max_age after the newest"
    );
    // A dry run says nothing more while the node is Ready.
    let dry = Policy {
        dry_run: true,
        ..fence_at_not_ready()
    };
    let d = decide(&going_silent(), &[off(13), off(18)], &dry, t(19));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PreAttested));
}

#[test]
fn a_pre_attested_node_is_fenced_the_moment_it_turns_not_ready() {
    let p = policy();
    let reads = [off(13), off(18)];
    let facts = NodeFacts {
        readiness: Readiness::NotReady { since: t(21) },
        ..going_silent()
    };
    // NotReady for 0 s of the 60 s grace: the grace is for nodes nobody read ahead.
    let d = decide(&facts, &reads, &p, t(21));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{}", d.reason);
    assert_eq!(d.rule, Rule::ConfirmedOff);
    assert!(d.reason.contains("pre-attested"), "{}", d.reason);
    let g = d.guard.expect("a fence carries its guard");
    assert_eq!(g.lease_renew_time, Some(t(-1)));
    assert_eq!(g.evidence_at, t(18));
    // Same silence, same reads, but the power was not confirmed ahead: it is confirmed now,
    // still without the grace.
    let d = decide(&facts, &[off(18)], &p, t(21));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert_eq!(d.next_read_at, Some(t(23)));
    let d = decide(&facts, &[off(18), off(23)], &p, t(24));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    // The evidence must still be fresh: a pre-attestation gone stale is read again.
    let d = decide(&facts, &reads, &p, t(49));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::StalePowerRead));
    // Dry run: would fence, at once too.
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    let d = decide(&facts, &reads, &dry, t(21));
    assert_eq!(d.step, Step::WouldFence(FenceAction::Taint));
}

#[test]
fn power_read_ahead_that_is_not_off_never_fences() {
    let p = policy();
    let facts = NodeFacts {
        readiness: Readiness::NotReady { since: t(21) },
        ..going_silent()
    };
    for state in [
        PowerState::On,
        PowerState::Transitional {
            detail: "PoweringOff".into(),
        },
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ] {
        let reads = [off(13), read(18, state.clone())];
        let ahead = decide(&going_silent(), &reads, &p, t(19));
        assert_eq!((ahead.state, ahead.step), (NodeState::Suspect, Step::Idle));
        assert_ne!(ahead.rule, Rule::PreAttested, "{state}");
        let d = decide(&facts, &reads, &p, t(21));
        assert_eq!(d.step, Step::Idle, "{state}: {}", d.reason);
    }
    // Nothing to read ahead for a node that could never be fenced: healthy, and why.
    let unmapped = NodeFacts {
        has_power_source: false,
        ..going_silent()
    };
    let d = decide(&unmapped, &[], &p, t(19));
    assert_eq!(
        (d.state, d.rule, d.next_read_at),
        (NodeState::Healthy, Rule::NoPowerSource, None)
    );
    assert!(d.reason.contains("nothing is read ahead"), "{}", d.reason);
    // On while Ready: said as it is, not as a NotReady node's refusal.
    let d = decide(&going_silent(), &[read(18, PowerState::On)], &p, t(19));
    assert_eq!(d.rule, Rule::PowerOn);
    assert!(
        d.reason.starts_with("Ready, but no sign of life"),
        "{}",
        d.reason
    );
}

/// "A renewal seen at any point discards the pre-attestation (the kubelet is alive); so does
/// Ready with a new heartbeat."
#[test]
fn a_sign_of_life_discards_the_pre_attestation() {
    let p = policy();
    let reads = [off(13), off(18)];
    for alive in ["lease", "heartbeat"] {
        let mut facts = going_silent();
        match alive {
            "lease" => facts.lease_renewal_seen = Some(t(20)),
            _ => facts.heartbeat_seen = Some(t(20)),
        }
        // Ready and no longer stale: healthy, nothing read.
        let d = decide(&facts, &reads, &p, t(21));
        assert_eq!(d.rule, Rule::NodeReady, "{alive}");
        // NotReady a moment later: the grace applies again, as for any node.
        facts.readiness = Readiness::NotReady { since: t(22) };
        let d = decide(&facts, &reads, &p, t(23));
        assert_eq!(d.rule, Rule::NotReadyGrace, "{alive}: {}", d.reason);
        // Stale again later: the reads from before the sign of life never count.
        let d = decide(&facts, &[off(13), off(18), off(33)], &p, t(34));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::ConfirmingOff),
            "{alive}: {}",
            d.reason
        );
        assert!(d.reason.starts_with("1 of 2"), "{}", d.reason);
    }
}

#[test]
fn without_a_lease_or_with_pre_attestation_off_or_held_the_grace_applies() {
    let reads = [off(13), off(18)];
    let not_ready = |facts: NodeFacts| NodeFacts {
        readiness: Readiness::NotReady { since: t(21) },
        ..facts
    };
    // No Lease: silence means nothing.
    let mut no_lease = going_silent();
    no_lease.lease_renewal_seen = None;
    no_lease.lease_renew_time = None;
    assert_eq!(
        decide(&no_lease, &reads, &policy(), t(19)).rule,
        Rule::NodeReady
    );
    assert_eq!(
        decide(&not_ready(no_lease), &reads, &policy(), t(22)).rule,
        Rule::NotReadyGrace
    );
    // Off by policy.
    let off_policy = Policy {
        pre_attest_after: None,
        ..policy()
    };
    assert_eq!(
        decide(&going_silent(), &reads, &off_policy, t(19)).rule,
        Rule::NodeReady
    );
    assert_eq!(
        decide(&not_ready(going_silent()), &reads, &off_policy, t(22)).rule,
        Rule::NotReadyGrace
    );
    // Held (a lease storm, a stale view, a storm): said so, then judged as any other node,
    // renewals within the grace included.
    let mut held = going_silent();
    held.holds.pre_attest = Some("37 of 40 Leases went unrenewed at once".into());
    let d = decide(&held, &reads, &policy(), t(19));
    assert_eq!((d.state, d.rule), (NodeState::Healthy, Rule::NodeReady));
    assert!(d.reason.contains("37 of 40 Leases"), "{}", d.reason);
    assert_eq!(d.next_read_at, None, "no read ahead while held");
    let d = decide(&not_ready(held.clone()), &reads, &policy(), t(22));
    assert_eq!(d.rule, Rule::NotReadyGrace);
    assert!(d.reason.contains("37 of 40 Leases"), "{}", d.reason);
    let d = decide(&not_ready(held), &[off(80), off(85)], &policy(), t(86));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{}", d.reason);
    // Stale since the last count of the datacenter's Leases: not yet (a storm is counted
    // before anything is read).
    let mut uncounted = going_silent();
    uncounted.holds.lease_not_yet_counted = true;
    let d = decide(&uncounted, &reads, &policy(), t(19));
    assert_eq!((d.rule, d.next_read_at), (Rule::NodeReady, None));
    assert!(d.reason.contains("last count"), "{}", d.reason);
}

/// A Lease is late (counted toward a lease storm) one renewal interval before it is stale,
/// never under 1.5 intervals nor past stale.
#[test]
fn a_lease_is_late_one_interval_before_it_is_stale_and_never_under_one_and_a_half() {
    for (stale, late) in [(1.5, 1.5), (2.0, 1.5), (2.5, 1.5), (3.0, 2.0), (10.0, 9.0)] {
        assert_eq!(
            Renewals::new(stale).unwrap().late(),
            Renewals::new(late).unwrap(),
            "lease_stale_after = {stale}"
        );
    }
    let p = policy();
    let at = |ms: i64| Timestamp::from_millisecond(t(0).as_millisecond() + ms).unwrap();
    let d40 = Some(Duration::from_secs(40));
    let state = |ms| lease_state(Some(t(0)), d40, &p, at(ms));
    assert_eq!(state(14_999), Some(LeaseState::Renewing));
    assert_eq!(state(15_000), Some(LeaseState::Late));
    assert_eq!(state(25_000), Some(LeaseState::Stale));
    assert_eq!(lease_state(None, d40, &p, at(0)), None, "no Lease");
}

/// The staleness scales with the Lease's own duration: a kubelet on a 40 s Lease (renewals
/// every 10 s) is stale after 25 s, one on a 20 s Lease after 12.5 s; with no duration set,
/// the kubelet's default of 40 s applies.
#[test]
fn staleness_is_counted_in_the_leases_own_renewal_intervals() {
    let p = policy();
    let alive = Some(t(0));
    let at = |ms: i64| Timestamp::from_millisecond(t(0).as_millisecond() + ms).unwrap();
    let d40 = Some(Duration::from_secs(40));
    assert!(lease_silence(alive, d40, &p, at(24_999)).is_none());
    assert_eq!(
        lease_silence(alive, d40, &p, at(25_000)).map(|s| s.stale_after),
        Some(Duration::from_secs(25))
    );
    assert!(lease_silence(alive, None, &p, at(24_999)).is_none());
    assert!(lease_silence(alive, None, &p, at(25_000)).is_some());
    let d20 = Some(Duration::from_secs(20));
    assert!(lease_silence(alive, d20, &p, at(12_499)).is_none());
    assert!(lease_silence(alive, d20, &p, at(12_500)).is_some());
    let three = Policy {
        pre_attest_after: Renewals::new(3.0),
        ..policy()
    };
    assert!(lease_silence(alive, d20, &three, at(14_999)).is_none());
    assert!(lease_silence(alive, d20, &three, at(15_000)).is_some());
    assert!(
        lease_silence(None, d20, &p, at(99_000)).is_none(),
        "no Lease"
    );
    assert!(Renewals::new(1.4).is_none() && Renewals::new(f64::NAN).is_none());
    assert_eq!(Renewals::new(2.5).unwrap().to_string(), "2.5");
}

/// Over Ready and NotReady, every sign of life, holds on or off, release at attestation on or
/// off, and every short sequence of reads: a Ready node is written only with
/// `release_at_attestation`; a fence within `not_ready_grace` (or of a Ready node) needs a
/// Lease silent for `stale_after`, reading ahead not held, and every counted read taken after
/// the last sign of life; pods are released only with the fence of the boot the reads were
/// taken against.
#[test]
fn property_pre_attestation_never_writes_early_or_on_old_evidence() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let (mut checked, mut early_fences, mut ahead, mut released_ready) = (0, 0, 0, 0);
    for (release, ready) in [(false, true), (false, false), (true, true), (true, false)] {
        let p = Policy {
            release_at_attestation: release,
            ..policy()
        };
        for alive_at in [None, Some(0), Some(8), Some(16)] {
            for heartbeat_at in [None, Some(10)] {
                for held in [false, true] {
                    let mut facts = going_silent();
                    facts.lease_renewal_seen = alive_at.map(t);
                    if alive_at.is_none() {
                        facts.lease_renew_time = None;
                    }
                    facts.heartbeat_seen = heartbeat_at.map(t);
                    if held {
                        facts.holds.pre_attest = Some("held".into());
                    }
                    if !ready {
                        facts.readiness = Readiness::NotReady { since: t(20) };
                    }
                    for reads in sequences(&states, 3, 6, 7) {
                        for now in [20i64, 27, 33, 45] {
                            let d = decide(&facts, &reads, &p, t(now));
                            checked += 1;
                            if ready && !release {
                                assert_eq!(d.step, Step::Idle, "{d:?}");
                                assert_eq!(d.guard, None);
                                ahead += (d.rule == Rule::PreAttested) as usize;
                                continue;
                            }
                            assert_ne!(d.rule, Rule::PreAttested, "{d:?}");
                            let Step::Fence(_) = d.step else {
                                assert_eq!(d.guard, None, "{d:?}");
                                continue;
                            };
                            let g = d.guard.clone().expect("a fence carries its guard");
                            assert_eq!(g.release_pods, release, "{d:?}");
                            assert_eq!(g.while_ready, ready, "{d:?}");
                            assert_eq!(g.boot_id, facts.boot_id);
                            assert_eq!(g.lease_renew_time, facts.lease_renew_time);
                            released_ready += ready as usize;
                            // Every fence here is within the 60 s grace.
                            early_fences += 1;
                            let alive = last_sign_of_life(&facts).expect("{d:?}");
                            assert!(!held, "{d:?}");
                            let silence =
                                lease_silence(Some(alive), facts.lease_duration, &p, t(now))
                                    .expect("fenced early on a Lease that is not stale");
                            assert!(silence.silent_for >= silence.stale_after);
                            let counted: Vec<_> = reads
                                .iter()
                                .rev()
                                .take_while(|r| r.state == PowerState::Off)
                                .collect();
                            let oldest_counted = counted
                                .iter()
                                .rev()
                                .find(|r| r.at >= alive)
                                .expect("a fence with no read after the last sign of life");
                            assert!(
                                elapsed(oldest_counted.at, reads.last().unwrap().at)
                                    >= p.confirm_interval
                            );
                            assert!(elapsed(reads.last().unwrap().at, t(now)) <= p.read_max_age);
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 5_000, "{checked}");
    assert!(
        early_fences > 0 && ahead > 0 && released_ready > 0,
        "the generator never reached a pre-attested fence ({early_fences}), attestation ({ahead}) or a release at attestation ({released_ready})"
    );
}
