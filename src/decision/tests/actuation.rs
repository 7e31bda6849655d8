//! Opt-in actuation: a hung node (NotReady, its kubelet silent for `[actuation] after`, its own
//! machine reading On) is powered off, then fenced on its Off reads as ever, then powered on;
//! never without both opt-ins, never a Ready node, never twice for one boot, never under a hold.

use super::holds_and_guards::{ALL_HOLDS, hold};
use super::*;
use crate::decision::actuation::{ActuationFacts, ActuationPolicy, PowerRecord};

/// Actuation on, after 300 s of silence.
pub(super) fn actuating() -> Policy {
    Policy {
        actuation: Some(ActuationPolicy {
            after: Duration::from_secs(300),
            power_on: true,
            ..ActuationPolicy::default()
        }),
        ..policy()
    }
}

fn on(at: i64) -> PowerReading {
    read(at, PowerState::On)
}

/// A dead node (NotReady since t(0), kubelet last seen t(-10)) whose source may act.
pub(super) fn hung() -> NodeFacts {
    dead()
}

pub(super) fn powered_off_at(at: i64, boot: &str) -> ActuationFacts {
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

/// A machine fenced after oobfence powered it off, reading Off: due to be powered on.
fn fenced_powered_off() -> NodeFacts {
    NodeFacts {
        actuation: powered_off_at(296, "boot-a"),
        ..fenced(Readiness::NotReady { since: t(0) }, "boot-a")
    }
}

#[test]
fn a_silence_that_did_not_begin_under_oobfences_watch_is_never_powered_off() {
    let p = actuating();
    // A restart (or a node long NotReady when oobfence first looked): the Lease's renewTime is
    // what oobfence found, not a renewal it watched; the silence before is unknown.
    let first_sight = NodeFacts {
        lease_first_sight: true,
        ..hung()
    };
    // Never seen Ready by this oobfence.
    let never_ready = NodeFacts {
        ready_seen: None,
        ..hung()
    };
    // Seen Ready only more than a Lease duration (40 s) before its kubelet's last sign of
    // life: the kubelet renewed on while the node was NotReady, so the silence began NotReady.
    let ready_before = NodeFacts {
        ready_seen: Some(t(-51)),
        ..hung()
    };
    for (name, f, says) in [
        ("first sight", first_sight, "silence begin"),
        ("never Ready", never_ready, "Ready"),
        ("Ready before the silence", ready_before, "Ready"),
    ] {
        let d = decide(&f, &[on(2000)], &p, t(2001));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::PowerOn),
            "{name}: {}",
            d.reason
        );
        assert!(d.reason.contains(says), "{name}: {}", d.reason);
        assert_eq!(d.guard, None, "{name}");
    }
}

/// The pass that first sees a kubelet's last renewal may be the one that sees the node
/// NotReady too (the kubelet posted NotReady and hung, or both came between two passes): the
/// node was seen Ready moments before that renewal, so the silence still began under watch.
#[test]
fn a_last_renewal_seen_together_with_not_ready_still_began_under_watch() {
    let p = actuating();
    for ready_seen in [-15, -49] {
        let f = NodeFacts {
            ready_seen: Some(t(ready_seen)),
            ..hung()
        };
        let d = decide(&f, &[on(2000)], &p, t(2001));
        assert_eq!(
            d.step,
            Step::PowerOff,
            "Ready seen at {ready_seen}: {}",
            d.reason
        );
    }
}

#[test]
fn a_node_silent_past_max_silence_is_abandoned_not_hung() {
    let p = actuating();
    // Silent since t(-10): past the hour at t(3590).
    let d = decide(&hung(), &[on(3585)], &p, t(3586));
    assert_eq!(d.step, Step::PowerOff, "{}", d.reason);
    let d = decide(&hung(), &[on(3600)], &p, t(3601));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::PowerOn),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("max_silence"), "{}", d.reason);
    // A node NotReady for weeks, its UUID unchanged: never.
    let d = decide(&hung(), &[on(1_800_000)], &p, t(1_800_001));
    assert_eq!(d.step, Step::Idle, "{}", d.reason);
}

#[test]
fn a_node_under_maintenance_is_never_powered_off_nor_on() {
    let p = actuating();
    for why in [
        "cordoned (spec.unschedulable = true)",
        "taint medik8s.io/drain:NoSchedule (NodeMaintenance)",
        "condition MaintenanceInProgress=True",
    ] {
        let f = NodeFacts {
            maintenance: Some(why.into()),
            ..hung()
        };
        let d = decide(&f, &[on(295)], &p, t(296));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::PowerOn),
            "{why}: {}",
            d.reason
        );
        assert!(d.reason.contains(why), "{}", d.reason);
        // Maintenance never blocks the fence of a machine proven off.
        let d = decide(&f, &[off(290), off(295)], &p, t(296));
        assert_eq!(
            d.step,
            Step::Fence(FenceAction::Taint),
            "{why}: {}",
            d.reason
        );
        let fenced = NodeFacts {
            maintenance: Some(why.into()),
            ..fenced_powered_off()
        };
        let d = decide(&fenced, &[off(150)], &p, t(151));
        assert_eq!(d.step, Step::Idle, "{why}: {}", d.reason);
        assert!(d.reason.contains(why), "{}", d.reason);
    }
}

#[test]
fn a_power_on_honours_opt_outs_other_remediators_and_a_reload_that_turned_actuate_off() {
    let p = actuating();
    let off = [off(150)];
    assert_eq!(
        decide(&fenced_powered_off(), &off, &p, t(151)).step,
        Step::PowerOn
    );
    let mut refusing = fenced_powered_off();
    refusing.actuation.source_refuses =
        Some("its [[bmc]] entry does not say actuate = true".into());
    for (name, f, says) in [
        (
            "opted out",
            NodeFacts {
                opted_out: Some("annotation oobfence.io/exclude=true".into()),
                ..fenced_powered_off()
            },
            "exclude",
        ),
        (
            "another remediator",
            NodeFacts {
                other_remediator: Some("taint medik8s.io/remediation".into()),
                ..fenced_powered_off()
            },
            "medik8s.io/remediation",
        ),
        ("actuate turned off", refusing, "actuate = true"),
    ] {
        let d = decide(&f, &off, &p, t(151));
        assert_eq!(d.step, Step::Idle, "{name}: {}", d.reason);
        assert_eq!(d.guard, None, "{name}");
        assert!(d.reason.contains(says), "{name}: {}", d.reason);
    }
}

#[test]
fn a_persons_untaint_never_opens_a_second_power_off_of_the_boot() {
    let p = actuating();
    // Fenced after oobfence powered it off; a person removes the taint: the fence record
    // goes.
    let mut untainted = fenced_powered_off();
    untainted.fence.as_mut().unwrap().taint_present = false;
    let d = decide(&untainted, &[], &p, t(400));
    assert_eq!(d.step, Step::ClearRecord, "{}", d.reason);
    // The power-off record of the boot stays (the cluster drops it only on another bootID):
    // the machine, powered on again by the person, reads On with its kubelet still silent,
    // long past `after`. Never a second power-off of that boot.
    let cleared = NodeFacts {
        fence: None,
        ..fenced_powered_off()
    };
    let d = decide(&cleared, &[on(1000)], &p, t(1001));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::PowerOffIgnored),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("never powered off twice"), "{}", d.reason);
    // A new boot is a new machine life: its own hang may be powered off once.
    let rebooted = NodeFacts {
        boot_id: "boot-b".into(),
        actuation: powered_off_at(100, "boot-a"),
        ..hung()
    };
    assert_eq!(
        decide(&rebooted, &[on(295)], &p, t(296)).step,
        Step::PowerOff
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
            ..ActuationPolicy::default()
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
