//! How power reads confirm a death: enough Off reads, spaced and fresh; what resets the
//! count; what a power state that is not Off does; "not found" and terminated; dry run and
//! the configured action.

use super::*;

#[test]
fn terminated_instance_gets_the_on_terminated_action() {
    let reads = [
        read(60, PowerState::Terminated),
        read(65, PowerState::Terminated),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
    assert_eq!(d.rule, Rule::ConfirmedGone);
    // Stopped then terminated: one answer of each kind is not two proofs that it is gone.
    let reads = [off(60), read(65, PowerState::Terminated)];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    let p = Policy {
        on_terminated: FenceAction::Taint,
        ..policy()
    };
    let d = decide(
        &dead(),
        &[
            read(60, PowerState::Terminated),
            read(65, PowerState::Terminated),
        ],
        &p,
        t(66),
    );
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
}

#[test]
fn not_found_needs_two_answers_even_with_confirm_reads_1() {
    let p = Policy {
        confirm_reads: 1,
        ..policy()
    };
    let facts = bound();
    let d = decide(&facts, &[gone(60, PowerState::NotFound)], &p, t(61));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert_eq!(d.next_read_at, Some(t(65)));
    // Two answers closer than confirm_interval still count once.
    let reads = [
        gone(60, PowerState::NotFound),
        gone(62, PowerState::NotFound),
    ];
    assert_eq!(decide(&facts, &reads, &p, t(62)).rule, Rule::ConfirmingOff);
    let reads = [
        gone(60, PowerState::NotFound),
        gone(65, PowerState::NotFound),
    ];
    let d = decide(&facts, &reads, &p, t(66));
    assert_eq!(
        (d.step, d.rule),
        (Step::Fence(FenceAction::DeleteNode), Rule::ConfirmedGone)
    );
    // One Off read confirmed: confirm_reads = 1 fences at once.
    let d = decide(&dead(), &[off(60)], &p, t(61));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
}

#[test]
fn fences_after_confirm_reads_spaced_and_fresh() {
    let reads = [off(60), off(65)];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
    assert_eq!(d.rule, Rule::ConfirmedOff);
}

#[test]
fn one_off_read_is_not_enough() {
    let d = decide(&dead(), &[off(60)], &policy(), t(61));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    assert_eq!(d.next_read_at, Some(t(65)));
    assert!(d.reason.starts_with("1 of 2"), "{}", d.reason);
}

#[test]
fn off_reads_closer_than_interval_count_once() {
    let reads = [off(60), off(61), off(62), off(64)];
    let d = decide(&dead(), &reads, &policy(), t(64));
    assert_eq!(d.rule, Rule::ConfirmingOff);
    let reads = [off(60), off(61), off(62), off(65)];
    assert_eq!(
        decide(&dead(), &reads, &policy(), t(65)).step,
        Step::Fence(FenceAction::Taint)
    );
}

#[test]
fn any_non_off_read_resets_the_count() {
    let breakers = [
        PowerState::On,
        PowerState::Transitional {
            detail: "PoweringOff".into(),
        },
        PowerState::error(ReadErrorKind::Timeout, "no answer in 5s"),
    ];
    for b in breakers {
        let reads = [off(60), read(65, b.clone()), off(70)];
        let d = decide(&dead(), &reads, &policy(), t(71));
        assert_eq!(d.rule, Rule::ConfirmingOff, "after {b:?}");
        assert_eq!(d.step, Step::Idle);
    }
}

#[test]
fn stale_reads_never_act() {
    let reads = [off(60), off(65)];
    let d = decide(&dead(), &reads, &policy(), t(96));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::StalePowerRead));
    assert_eq!(d.next_read_at, Some(t(96)));
}

#[test]
fn power_on_never_fences_and_rechecks_later() {
    let reads = [off(60), read(65, PowerState::On)];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::PowerOn)
    );
    assert_eq!(d.next_read_at, Some(t(95)));
}

#[test]
fn unknown_power_blocks_and_says_why() {
    let e = PowerState::error(ReadErrorKind::Auth, "HTTP 401 from BMC");
    let d = decide(&dead(), &[read(60, e)], &policy(), t(61));
    assert_eq!((d.state, d.rule), (NodeState::Blocked, Rule::PowerUnknown));
    assert!(d.reason.contains("auth: HTTP 401"), "{}", d.reason);
    assert_eq!(d.step, Step::Idle);
}

#[test]
fn transitional_is_not_off() {
    for detail in ["PoweringOff", "PoweringOn", "Paused"] {
        let st = PowerState::Transitional {
            detail: detail.into(),
        };
        let d = decide(&dead(), &[off(60), read(65, st)], &policy(), t(66));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::PowerTransitional));
    }
}

#[test]
fn dry_run_decides_but_does_not_fence() {
    let p = Policy {
        dry_run: true,
        ..policy()
    };
    let d = decide(&dead(), &[off(60), off(65)], &p, t(66));
    assert_eq!(d.step, Step::WouldFence(FenceAction::Taint));
    assert_eq!(d.rule, Rule::DryRun);
}

#[test]
fn delete_node_action_is_passed_through() {
    let p = Policy {
        action: FenceAction::DeleteNode,
        ..policy()
    };
    let d = decide(&dead(), &[off(60), off(65)], &p, t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::DeleteNode));
}

#[test]
fn hibernated_instance_is_not_off() {
    let hibernated = || PowerState::Suspended {
        detail: "stopped, Client.UserInitiatedHibernate".into(),
    };
    let reads = [read(60, hibernated()), read(65, hibernated())];
    let d = decide(&bound(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::PowerSuspended)
    );
}

/// Property: whatever the reads, no decision fences unless the last `confirm_reads` counted
/// reads are Off and fresh, the grace period is over, and it is not a dry run. Exhaustive
/// over every sequence of up to 5 reads drawn from {On, Off, transitional, error} at a
/// handful of spacings.
#[test]
fn property_fence_only_on_fresh_confirmed_off() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::Transitional {
            detail: "PoweringOff".into(),
        },
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let spacings = [1i64, 5, 40];
    let p = policy();
    let mut fences = 0;
    let mut checked = 0;
    for len in 0..=5usize {
        let combos = 4usize.pow(len as u32);
        for combo in 0..combos {
            for &gap in &spacings {
                let mut reads = Vec::new();
                let mut c = combo;
                for i in 0..len {
                    reads.push(read(60 + i as i64 * gap, states[c % 4].clone()));
                    c /= 4;
                }
                // Pre-attested (a stale Lease) and not (no Lease: the grace applies).
                for (facts, now_offset) in [dead(), unleased()]
                    .into_iter()
                    .flat_map(|f| [0i64, 10, 31].map(|o| (f.clone(), o)))
                {
                    let now = t(60 + len.saturating_sub(1) as i64 * gap + now_offset);
                    let d = decide(&facts, &reads, &p, now);
                    checked += 1;
                    if let Step::Fence(_) = d.step {
                        fences += 1;
                        if facts.lease_renewal_seen.is_none() {
                            // Not pre-attested: the grace was waited (NotReady since t(0)).
                            assert!(elapsed(t(0), now) >= p.not_ready_grace, "{d:?}");
                        }
                        let last = reads.last().unwrap();
                        assert_eq!(last.state, PowerState::Off);
                        assert!(elapsed(last.at, now) <= p.read_max_age);
                        // The trailing run of Off reads must span the confirmation.
                        let run: Vec<_> = reads
                            .iter()
                            .rev()
                            .take_while(|r| r.state == PowerState::Off)
                            .collect();
                        assert!(run.len() >= p.confirm_reads as usize);
                        let oldest = run.last().unwrap();
                        assert!(elapsed(oldest.at, last.at) >= p.confirm_interval);
                    }
                }
            }
        }
    }
    assert!(checked > 6000, "{checked}");
    assert!(
        fences > 0,
        "the property never saw a fence: the generator is wrong"
    );
}
