//! Opt-in actuation: a hung node (NotReady, its kubelet silent for `[actuation] after`, its own
//! machine reading On) is powered off, then fenced on its Off reads as ever, then powered on;
//! never without both opt-ins, never a Ready node, never twice for one boot, never under a hold.

use super::holds_and_guards::{ALL_HOLDS, hold};
use super::*;
use crate::decision::actuation::{ActuationFacts, ActuationPolicy, PowerRecord};

/// Actuation on, after 300 s of silence.
fn actuating() -> Policy {
    Policy {
        actuation: Some(ActuationPolicy {
            after: Duration::from_secs(300),
            power_on: true,
        }),
        ..policy()
    }
}

fn on(at: i64) -> PowerReading {
    read(at, PowerState::On)
}

/// A dead node (NotReady since t(0), kubelet last seen t(-10)) whose source may act.
fn hung() -> NodeFacts {
    dead()
}

fn powered_off_at(at: i64, boot: &str) -> ActuationFacts {
    ActuationFacts {
        source_refuses: None,
        record: Some(PowerRecord {
            off_at: t(at),
            boot_id: boot.into(),
            on_at: None,
            ours: true,
        }),
    }
}

#[test]
fn a_hung_node_is_powered_off_once_its_kubelet_has_been_silent_long_enough() {
    let p = actuating();
    // Silent since t(-10): 300 s run out at t(290).
    let d = decide(&hung(), &[on(250)], &p, t(251));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::WaitingToActuate),
        "{}",
        d.reason
    );
    assert_eq!(d.decide_again_at, Some(t(290)));
    assert!(d.reason.contains("powered off at"), "{}", d.reason);
    let d = decide(&hung(), &[on(295)], &p, t(296));
    assert_eq!(
        (d.step, d.rule),
        (Step::PowerOff, Rule::PoweringOff),
        "{}",
        d.reason
    );
    let g = d.guard.expect("a power-off is guarded");
    assert_eq!(g.purpose, GuardPurpose::PowerOff);
    assert_eq!((g.uid.as_str(), g.boot_id.as_str()), ("uid-1", "boot-a"));
    assert_eq!(g.lease_renew_time, Some(t(-12)));
    assert_eq!(g.evidence_at, t(295));
    // A dry run says so and sends nothing.
    let dry = Policy {
        dry_run: true,
        ..actuating()
    };
    let d = decide(&hung(), &[on(295)], &dry, t(296));
    assert_eq!((d.step, d.rule), (Step::WouldPowerOff, Rule::DryRun));
    assert_eq!(d.guard, None);
}

#[test]
fn without_both_opt_ins_or_on_another_machines_word_nothing_is_powered_off() {
    let reads = [on(295)];
    let d = decide(&hung(), &reads, &policy(), t(296));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PowerOn));
    let refusing = NodeFacts {
        actuation: ActuationFacts {
            source_refuses: Some("its [[bmc]] entry does not say actuate = true".into()),
            record: None,
        },
        ..hung()
    };
    let d = decide(&refusing, &reads, &actuating(), t(296));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PowerOn));
    assert!(d.reason.contains("actuate = true"), "{}", d.reason);
    let other = [read_from(295, PowerState::On, other_machine())];
    let d = decide(&hung(), &other, &actuating(), t(296));
    assert_eq!(d.step, Step::Idle, "{}", d.reason);
    let unproven = [read_from(295, PowerState::On, no_identity())];
    let d = decide(&hung(), &unproven, &actuating(), t(296));
    assert_eq!(d.step, Step::Idle, "{}", d.reason);
    assert!(d.reason.contains("does not prove"), "{}", d.reason);
    let unchecked = NodeFacts {
        identity_check: IdentityCheck::Unchecked,
        ..hung()
    };
    let d = decide(&unchecked, &unproven, &actuating(), t(296));
    assert_eq!(
        d.step,
        Step::Idle,
        "identity = \"unchecked\" never waives it: {}",
        d.reason
    );
    // A Ready node, however silent, is never powered off.
    let ready = NodeFacts {
        readiness: Readiness::Ready,
        ..hung()
    };
    let d = decide(&ready, &reads, &actuating(), t(296));
    assert_eq!(d.step, Step::Idle, "{}", d.reason);
}

#[test]
fn an_opted_out_node_or_one_another_remediator_owns_is_never_powered_off() {
    let reads = [on(295)];
    let opted_out = NodeFacts {
        opted_out: Some("label oobfence.io/exclude=true".into()),
        ..hung()
    };
    let d = decide(&opted_out, &reads, &actuating(), t(296));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::OptedOut),
        "{}",
        d.reason
    );
    let remediated = NodeFacts {
        other_remediator: Some("taint medik8s.io/remediation".into()),
        ..hung()
    };
    let d = decide(&remediated, &reads, &actuating(), t(296));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::OtherRemediator),
        "{}",
        d.reason
    );
}

#[test]
fn every_hold_stops_a_power_off_and_only_write_and_power_holds_a_power_on() {
    let reads = [on(295)];
    for kind in ALL_HOLDS {
        for slot in 0..3 {
            let mut f = hung();
            match slot {
                0 => f.holds.write = Some(hold(kind)),
                1 => f.holds.fence = Some(hold(kind)),
                _ => f.holds.power = Some(hold(kind)),
            }
            let d = decide(&f, &reads, &actuating(), t(296));
            assert_eq!(d.step, Step::Idle, "{kind:?} in slot {slot}");
            assert_eq!(d.guard, None);
        }
    }
    let fenced_off = NodeFacts {
        actuation: powered_off_at(296, "boot-a"),
        ..fenced(Readiness::NotReady { since: t(0) }, "boot-a")
    };
    let off = [off(150)];
    let d = decide(&fenced_off, &off, &actuating(), t(151));
    assert_eq!(
        (d.step, d.rule),
        (Step::PowerOn, Rule::PoweringOn),
        "{}",
        d.reason
    );
    let mut f = fenced_off.clone();
    f.holds.fence = Some(hold(HoldKind::Storm));
    assert_eq!(
        decide(&f, &off, &actuating(), t(151)).step,
        Step::PowerOn,
        "a storm never keeps a machine off"
    );
    for slot in [0, 1] {
        let mut f = fenced_off.clone();
        match slot {
            0 => f.holds.write = Some(hold(HoldKind::Paused)),
            _ => f.holds.power = Some(hold(HoldKind::PowerBudget)),
        }
        assert_eq!(
            decide(&f, &off, &actuating(), t(151)).step,
            Step::Idle,
            "slot {slot}"
        );
    }
}

#[test]
fn after_the_power_off_the_fence_needs_its_off_reads_and_the_power_on_comes_once() {
    let p = actuating();
    let after = NodeFacts {
        actuation: powered_off_at(296, "boot-a"),
        ..hung()
    };
    // Still On right after the command: waited for, never a second power-off.
    let d = decide(&after, &[on(300)], &p, t(301));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PoweredOffConfirming));
    let d = decide(&after, &[on(450)], &p, t(451));
    assert_eq!(
        (d.state, d.rule),
        (NodeState::Blocked, Rule::PowerOffIgnored),
        "{}",
        d.reason
    );
    // Off: confirmed as ever, then fenced.
    let d = decide(&after, &[off(300)], &p, t(301));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::ConfirmingOff));
    let d = decide(&after, &[off(300), off(305)], &p, t(306));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{}", d.reason);
    // Fenced: powered on once, on a fresh Off read of its own machine.
    let fenced_off = NodeFacts {
        actuation: powered_off_at(296, "boot-a"),
        ..fenced(Readiness::NotReady { since: t(0) }, "boot-a")
    };
    let d = decide(&fenced_off, &[], &p, t(151));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::PoweringOn));
    assert_eq!(d.next_read_at, Some(t(151)));
    let d = decide(&fenced_off, &[off(150)], &p, t(151));
    let g = d.guard.expect("a power-on is guarded");
    assert_eq!(
        (g.purpose, g.boot_id.as_str()),
        (GuardPurpose::PowerOn, "boot-a")
    );
    let mut done = fenced_off.clone();
    if let Some(r) = done.actuation.record.as_mut() {
        r.on_at = Some(t(152));
    }
    let d = decide(&done, &[off(150)], &p, t(160));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::FencedAwaitingRecovery));
    // Without power_on, or for a fence oobfence did not power off, it stays off.
    let no_on = Policy {
        actuation: Some(ActuationPolicy {
            after: Duration::from_secs(300),
            power_on: false,
        }),
        ..policy()
    };
    assert_eq!(
        decide(&fenced_off, &[off(150)], &no_on, t(151)).step,
        Step::Idle
    );
    let not_ours = NodeFacts {
        actuation: ActuationFacts::default(),
        ..fenced_off.clone()
    };
    assert_eq!(decide(&not_ours, &[off(150)], &p, t(151)).step, Step::Idle);
}

/// Over readiness, signs of life, opt-ins, records, holds and every short sequence of reads: a
/// power-off only with both opt-ins, on a NotReady node silent for `after`, its newest read a
/// fresh On from its own machine, no hold, and no power-off of this boot before; a power-on
/// only of a fence of a boot oobfence powered off.
#[test]
fn property_no_power_action_without_the_opt_ins_the_silence_a_fresh_own_on_read_and_no_hold() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let readiness = [Readiness::Ready, Readiness::NotReady { since: t(0) }];
    let records = [
        None,
        Some(powered_off_at(100, "boot-a")),
        Some(powered_off_at(100, "boot-z")),
    ];
    let (mut checked, mut offs, mut ons) = (0, 0, 0);
    for enabled in [false, true] {
        let p = if enabled { actuating() } else { policy() };
        for r in &readiness {
            for alive in [-10i64, 200] {
                for record in &records {
                    for refuses in [false, true] {
                        for held in [false, true] {
                            for fenced_node in [false, true] {
                                let mut f = if fenced_node {
                                    fenced(r.clone(), "boot-a")
                                } else {
                                    NodeFacts {
                                        readiness: r.clone(),
                                        ..hung()
                                    }
                                };
                                f.lease_renewal_seen = Some(t(alive));
                                f.actuation = record.clone().unwrap_or_default();
                                if refuses {
                                    f.actuation.source_refuses = Some("no".into());
                                }
                                if held {
                                    f.holds.power = Some(hold(HoldKind::PowerBudget));
                                }
                                for reads in sequences(&states, 2, 280, 10) {
                                    for now in [291i64, 310] {
                                        let d = decide(&f, &reads, &p, t(now));
                                        checked += 1;
                                        match d.step {
                                            Step::PowerOff | Step::WouldPowerOff => {
                                                offs += 1;
                                                assert!(enabled && !refuses && !held, "{d:?}");
                                                assert!(!fenced_node, "{d:?}");
                                                assert_ne!(f.readiness, Readiness::Ready, "{d:?}");
                                                assert!(now - alive >= 300, "{d:?}");
                                                let last = reads.last().unwrap();
                                                assert_eq!(last.state, PowerState::On);
                                                assert!(identity_of(&f, last).is_match());
                                                assert!(elapsed(last.at, t(now)) <= p.read_max_age);
                                                assert!(
                                                    f.actuation.powered_off(&f.boot_id).is_none(),
                                                    "{d:?}"
                                                );
                                            }
                                            Step::PowerOn | Step::WouldPowerOn => {
                                                ons += 1;
                                                assert!(enabled && !held && fenced_node, "{d:?}");
                                                let fence = f.fence.as_ref().unwrap();
                                                assert!(
                                                    f.actuation
                                                        .powered_off(&fence.boot_id)
                                                        .is_some(),
                                                    "{d:?}"
                                                );
                                                assert_ne!(f.readiness, Readiness::Ready);
                                            }
                                            _ => {}
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 4_000, "{checked}");
    assert!(
        offs > 0 && ons > 0,
        "the generator never reached a power action: {offs} {ons}"
    );
}
