//! A fenced node: when its taint comes off (Ready, a new boot, a fresh On), when it stays,
//! and the fence records left without a taint; never another oobfence's fence.

use super::*;

#[test]
fn fenced_node_not_ready_waits() {
    let d = decide(
        &fenced(Readiness::NotReady { since: t(0) }, "boot-a"),
        &[],
        &policy(),
        t(200),
    );
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Fenced, Step::Idle, Rule::FencedAwaitingRecovery)
    );
    assert_eq!(d.next_read_at, None);
}

#[test]
fn untaint_needs_ready_fresh_on_and_new_boot_id() {
    let facts = fenced(Readiness::Ready, "boot-b");
    // No read yet: ask for one.
    let d = decide(&facts, &[], &policy(), t(300));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::RecoveryNeedsPowerOn));
    assert_eq!(d.next_read_at, Some(t(300)));
    // An On read from before the fence does not count.
    let d = decide(&facts, &[read(90, PowerState::On)], &policy(), t(95));
    assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
    // A stale On read does not count.
    let d = decide(&facts, &[read(250, PowerState::On)], &policy(), t(300));
    assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
    // Off or an error does not count either.
    let d = decide(&facts, &[off(290)], &policy(), t(300));
    assert_eq!(d.rule, Rule::RecoveryNeedsPowerOn);
    assert_eq!(d.next_read_at, Some(t(295)));
    // Fresh On + new boot id: unfence.
    let d = decide(&facts, &[read(295, PowerState::On)], &policy(), t(300));
    assert_eq!((d.step, d.rule), (Step::Unfence, Rule::RecoveredNewBoot));
}

#[test]
fn same_boot_id_never_untaints() {
    for boot in ["boot-a", ""] {
        let facts = fenced(Readiness::Ready, boot);
        let d = decide(&facts, &[read(295, PowerState::On)], &policy(), t(300));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::RecoveredSameBootId),
            "{boot:?}"
        );
    }
}

#[test]
fn untaint_disabled_holds_the_taint() {
    let p = Policy {
        untaint_on_recovery: false,
        ..policy()
    };
    let facts = fenced(Readiness::Ready, "boot-b");
    let d = decide(&facts, &[read(295, PowerState::On)], &p, t(300));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::UntaintDisabled));
}

#[test]
fn dry_run_would_unfence() {
    let p = Policy {
        dry_run: true,
        ..policy()
    };
    let facts = fenced(Readiness::Ready, "boot-b");
    let d = decide(&facts, &[read(295, PowerState::On)], &p, t(300));
    assert_eq!(d.step, Step::WouldUnfence);
}

#[test]
fn record_without_taint_is_cleared() {
    let mut facts = fenced(Readiness::NotReady { since: t(0) }, "boot-a");
    facts.fence.as_mut().unwrap().taint_present = false;
    let d = decide(&facts, &[], &policy(), t(300));
    assert_eq!(
        (d.step, d.rule),
        (Step::ClearRecord, Rule::FenceRemovedExternally)
    );
}

/// A dry run writes nothing, not even the removal of a record whose taint someone else took
/// off: it says what it would do.
#[test]
fn dry_run_keeps_a_record_without_taint() {
    let p = Policy {
        dry_run: true,
        ..policy()
    };
    for readiness in [Readiness::Ready, Readiness::NotReady { since: t(0) }] {
        let mut facts = fenced(readiness.clone(), "boot-a");
        facts.fence.as_mut().unwrap().taint_present = false;
        let d = decide(&facts, &[], &p, t(300));
        assert_eq!(
            (d.step, d.rule),
            (Step::Idle, Rule::DryRun),
            "{readiness:?}"
        );
        assert!(d.reason.contains("would drop"), "{}", d.reason);
    }
}

#[test]
fn another_oobfences_fence_is_never_lifted_or_cleared() {
    for taint_present in [true, false] {
        let mut facts = fenced(Readiness::Ready, "boot-b");
        facts.fence = Some(FenceRecord {
            ours: false,
            taint_present,
            ..facts.fence.clone().unwrap()
        });
        let d = decide(&facts, &[read(150, PowerState::On)], &policy(), t(151));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Fenced, Step::Idle, Rule::FencedByAnother)
        );
    }
}
