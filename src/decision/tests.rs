//! One test per rule, then the property tests over every short sequence of reads. Longer than
//! the rest of the core on purpose: every rule that can refuse or allow a write is pinned here,
//! found by its name.

use super::reading::ReadErrorKind;
use super::*;
use crate::identity::{MachineIdentity, NodeIdentity};

mod trust;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

const UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";
const OTHER_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e33";
/// Who answers the reads of these tests, unless a test says otherwise.
const READER: &str = "ec2 us-east-1 at the region's endpoint, key AKIA…TEST";

/// A read from the node's own machine.
fn read(at: i64, state: PowerState) -> PowerReading {
    read_from(at, state, MachineIdentity::system_uuid(UUID, None).unwrap())
}

fn read_from(at: i64, state: PowerState, identity: MachineIdentity) -> PowerReading {
    PowerReading {
        at: t(at),
        latency: Duration::from_millis(120),
        state,
        details: Vec::new(),
        identity,
        reader: READER.into(),
        power_draw: None,
    }
}

/// A "gone" answer: an instance that no longer exists reports no addresses.
fn gone(at: i64, state: PowerState) -> PowerReading {
    read_from(at, state, no_identity())
}

/// A dead node whose power source proved, while it was healthy, that it knows its machine.
fn bound() -> NodeFacts {
    NodeFacts {
        identity_binding: Some(IdentityBinding {
            at: t(-600),
            verdict: Verdict::Match("instance i-1 has the Node's address 10.0.0.5".into()),
            reader: READER.into(),
        }),
        ..dead()
    }
}

fn other_machine() -> MachineIdentity {
    MachineIdentity::system_uuid(OTHER_UUID, None).unwrap()
}

fn no_identity() -> MachineIdentity {
    MachineIdentity::unreported("test")
}

fn off(at: i64) -> PowerReading {
    read(at, PowerState::Off)
}

/// NotReady since t(0), lease renewal last seen at t(-10): a dead node.
fn dead() -> NodeFacts {
    NodeFacts {
        uid: "uid-1".into(),
        readiness: Readiness::NotReady { since: t(0) },
        lease_renewal_seen: Some(t(-10)),
        lease_renew_time: Some(t(-12)),
        lease_duration: Some(Duration::from_secs(40)),
        ready_heartbeat: None,
        heartbeat_seen: None,
        boot_id: "boot-a".into(),
        being_deleted: false,
        fence: None,
        foreign_out_of_service: false,
        opted_out: None,
        not_ready_seen: vec![t(0)],
        other_remediator: None,
        has_power_source: true,
        mapping_conflict: None,
        off_while_alive: None,
        identity: NodeIdentity {
            system_uuid: UUID.to_uppercase(),
            addresses: vec!["10.0.0.5".into()],
            uuid_shared_with: Vec::new(),
        },
        identity_check: IdentityCheck::Checked,
        off_witness: None,
        identity_binding: None,
        holds: Holds::default(),
    }
}

/// A dead node without a Lease (very old clusters, or one deleted): nothing to go stale, so
/// nothing is read ahead and `not_ready_grace` always applies.
fn unleased() -> NodeFacts {
    NodeFacts {
        lease_renewal_seen: None,
        lease_renew_time: None,
        lease_duration: None,
        ..dead()
    }
}

fn fenced(readiness: Readiness, boot_id: &str) -> NodeFacts {
    NodeFacts {
        readiness,
        boot_id: boot_id.into(),
        fence: Some(FenceRecord {
            at: t(100),
            boot_id: "boot-a".into(),
            taint_present: true,
            ours: true,
        }),
        ..dead()
    }
}

/// Every sequence of up to `max_len` reads of the node's machine drawn from `states`, the
/// first at `t(start)` and each `gap` seconds after the previous.
fn sequences(
    states: &[PowerState],
    max_len: usize,
    start: i64,
    gap: i64,
) -> Vec<Vec<PowerReading>> {
    let mut all = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for i in 0..max_len as i64 {
        last = last
            .iter()
            .flat_map(|prefix: &Vec<PowerReading>| {
                states.iter().map(move |st| {
                    let mut r = prefix.clone();
                    r.push(read(start + i * gap, st.clone()));
                    r
                })
            })
            .collect();
        all.extend(last.iter().cloned());
    }
    all
}

fn policy() -> Policy {
    Policy::default() // grace 60s, 2 reads, 5s apart, max age 30s
}

#[test]
fn ready_node_is_healthy_and_never_read() {
    let facts = NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(80)),
        ..dead()
    };
    let d = decide(&facts, &[off(70), off(80)], &policy(), t(90));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Healthy, Step::Idle, Rule::NodeReady)
    );
    assert_eq!(d.next_read_at, None);
}

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
fn within_grace_no_read_no_action() {
    let d = decide(&unleased(), &[off(10), off(20)], &policy(), t(59));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NotReadyGrace));
    assert_eq!(d.next_read_at, None);
    assert_eq!(d.state, NodeState::Suspect);
    // The grace ends by the clock alone: the node is decided again the moment it does.
    assert_eq!(d.decide_again_at, Some(t(60)));
    let d = decide(&unleased(), &[], &policy(), t(60));
    assert_ne!(d.rule, Rule::NotReadyGrace);
}

#[test]
fn after_grace_asks_for_a_read_now() {
    let d = decide(&dead(), &[], &policy(), t(60));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::AwaitingPowerRead));
    assert_eq!(d.next_read_at, Some(t(60)));
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
fn no_power_source_blocks() {
    let facts = NodeFacts {
        has_power_source: false,
        ..dead()
    };
    let d = decide(&facts, &[], &policy(), t(70));
    assert_eq!((d.state, d.rule), (NodeState::Blocked, Rule::NoPowerSource));
    assert_eq!(d.next_read_at, None);
}

#[test]
fn a_lease_renewed_during_not_ready_blocks() {
    let facts = NodeFacts {
        lease_renewal_seen: Some(t(50)),
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.state, d.rule),
        (NodeState::Blocked, Rule::LeaseRenewedRecently)
    );
    assert_eq!(d.step, Step::Idle);
    // The renewal ages out by the clock alone: decided again when it has, or, sooner, when the
    // Lease goes stale (25 s after the renewal: the grace no longer applies then).
    assert_eq!(d.decide_again_at, Some(t(75)));
    let p_off = Policy {
        pre_attest_after: None,
        ..policy()
    };
    assert_eq!(
        decide(&facts, &[off(60), off(65)], &p_off, t(66)).decide_again_at,
        Some(t(110))
    );
    // A node with no Lease at all (very old clusters) is judged on Ready and power alone.
    let facts = NodeFacts {
        lease_renewal_seen: None,
        lease_renew_time: None,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint));
}

#[test]
fn foreign_taint_is_left_alone() {
    let facts = NodeFacts {
        foreign_out_of_service: true,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(
        (d.step, d.rule),
        (Step::Idle, Rule::ForeignOutOfServiceTaint)
    );
}

#[test]
fn no_ready_condition_is_not_acted_on() {
    let facts = NodeFacts {
        readiness: Readiness::NoCondition,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NoReadyCondition));
}

#[test]
fn being_deleted_is_left_alone() {
    let facts = NodeFacts {
        being_deleted: true,
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::NodeBeingDeleted));
}

#[test]
fn clock_skew_into_the_future_counts_as_within_grace() {
    let facts = NodeFacts {
        readiness: Readiness::NotReady { since: t(500) },
        ..unleased()
    };
    let d = decide(&facts, &[], &policy(), t(100));
    assert_eq!(d.rule, Rule::NotReadyGrace);
}

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

// --- paths to a wrong write -------------------------------------------------------------

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

/// An entry with `corroborate = "power-draw"`: Off counts only with the system drawing at most
/// 20 W in the same read.
fn witnessed() -> NodeFacts {
    NodeFacts {
        off_witness: Some(OffWitness::PowerDraw {
            max_off_watts: Watts::whole(20),
        }),
        ..dead()
    }
}

fn off_drawing(at: i64, draw: Option<PowerDraw>) -> PowerReading {
    PowerReading {
        power_draw: draw,
        ..off(at)
    }
}

fn drawing(watts: f64) -> Option<PowerDraw> {
    Some(PowerDraw::Seen {
        watts: Watts::from_f64(watts).unwrap(),
        from: "PowerControl[0].PowerConsumedWatts of /redfish/v1/Chassis/1/Power".into(),
    })
}

#[test]
fn an_off_drawing_power_is_not_counted() {
    // A BMC restarted while its host ran: Off, and 180 W drawn.
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::OffUncorroborated)
    );
    assert!(d.reason.contains("180 W"), "{}", d.reason);
    assert!(d.reason.contains("never fenced"), "{}", d.reason);
    // One stale Off among good ones is enough to refuse.
    let reads = [
        off_drawing(60, drawing(5.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::OffUncorroborated);
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(5.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::OffUncorroborated);
}

#[test]
fn an_off_without_its_witness_is_not_counted() {
    let unavailable = || {
        Some(PowerDraw::Unavailable {
            why: "the Chassis links neither Power nor EnvironmentMetrics".into(),
        })
    };
    for draw in [None, unavailable()] {
        let reads = [off_drawing(60, draw.clone()), off_drawing(65, draw.clone())];
        let d = decide(&witnessed(), &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::OffUncorroborated),
            "{draw:?}"
        );
    }
}

#[test]
fn an_off_under_the_threshold_fences() {
    let reads = [
        off_drawing(60, drawing(4.5)),
        off_drawing(65, drawing(20.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::ConfirmedOff, "{}", d.reason);
    assert!(matches!(d.step, Step::Fence(_)));
    assert!(d.reason.contains("drawing 20 W"), "{}", d.reason);
    // Without corroborate, the power draw is evidence only: a high one does not block.
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::ConfirmedOff, "{}", d.reason);
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

/// The Lease rule runs on oobfence's own observation of a renewal, whatever the kubelet's
/// clock wrote: a renewal seen 10 s ago blocks even if the kubelet's clock says last year.
#[test]
fn lease_renewal_is_judged_by_when_oobfence_saw_it() {
    let facts = NodeFacts {
        lease_renewal_seen: Some(t(56)),
        lease_renew_time: Some(Timestamp::from_second(1_700_000_000).unwrap()),
        ..dead()
    };
    let d = decide(&facts, &[off(60), off(65)], &policy(), t(66));
    assert_eq!(d.rule, Rule::LeaseRenewedRecently);
}

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

fn fresh_like(g: &WriteGuard) -> FreshNode {
    FreshNode {
        uid: g.uid.clone(),
        readiness: Readiness::NotReady { since: t(0) },
        boot_id: g.boot_id.clone(),
        lease_renew_time: g.lease_renew_time,
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

/// A source that said Off while the kubelet went on living is refused: its Off reads never
/// fence, whatever they say later, until the tracker sees it read On (and drops the fact).
/// One sign of life after the Off is not enough: it may be a renewal delivered late.
#[test]
fn a_source_that_read_off_while_the_kubelet_lived_never_fences() {
    let reads = [off(60), off(65)];
    let watching = NodeFacts {
        off_while_alive: Some(OffWhileAlive {
            read_at: t(-300),
            signs_of_life_after: OFF_WHILE_ALIVE_PROOF - 1,
            gone: false,
        }),
        ..dead()
    };
    let d = decide(&watching, &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{d:?}");
    let proven = NodeFacts {
        off_while_alive: Some(OffWhileAlive {
            read_at: t(-300),
            signs_of_life_after: OFF_WHILE_ALIVE_PROOF,
            gone: false,
        }),
        ..dead()
    };
    for facts in [
        proven.clone(),
        NodeFacts {
            identity_check: IdentityCheck::Unchecked,
            ..proven.clone()
        },
    ] {
        let d = decide(&facts, &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::OffWhileAlive),
            "{d:?}"
        );
        assert!(
            d.reason.contains("never fenced until it reads On"),
            "{}",
            d.reason
        );
        assert!(d.next_read_at.is_some(), "read again, to see it say On");
    }
    // Ready: healthy as ever (the problem shows in metrics, Events and `why`).
    let ready = NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(60)),
        ..proven
    };
    assert_eq!(decide(&ready, &[], &policy(), t(66)).rule, Rule::NodeReady);
}

/// An opt-out or another remediator can only ever block: whatever the reads, no fence.
#[test]
fn opt_out_and_other_remediators_only_ever_block() {
    let reads = [off(60), off(65)];
    let opted = NodeFacts {
        opted_out: Some("annotation oobfence.io/exclude=true".into()),
        ..dead()
    };
    let d = decide(&opted, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::OptedOut)
    );
    assert_eq!(d.next_read_at, None, "an opted-out node is not even read");
    let other = NodeFacts {
        other_remediator: Some(
            "taint medik8s.io/remediation=self-node-remediation:NoExecute".into(),
        ),
        ..dead()
    };
    let d = decide(&other, &reads, &policy(), t(66));
    assert_eq!((d.step, d.rule), (Step::Idle, Rule::OtherRemediator));
    assert!(d.reason.contains("medik8s.io/remediation"), "{}", d.reason);
    // Opting out a node oobfence already fenced does not strand its taint: the fence still
    // comes off on the usual proof.
    let mut fenced_opted = fenced(Readiness::Ready, "boot-b");
    fenced_opted.opted_out = opted.opted_out.clone();
    let d = decide(
        &fenced_opted,
        &[read(150, PowerState::On)],
        &policy(),
        t(151),
    );
    assert_eq!(d.step, Step::Unfence);
    // Exhaustively over short read sequences: never a fence.
    let states = [PowerState::On, PowerState::Off, PowerState::NotFound];
    for facts in [&opted, &other] {
        for combo in 0..27usize {
            let reads: Vec<PowerReading> = (0..3)
                .map(|i| {
                    read(
                        60 + 5 * i as i64,
                        states[(combo / 3usize.pow(i)) % 3].clone(),
                    )
                })
                .collect();
            let d = decide(facts, &reads, &policy(), t(71));
            assert!(
                !matches!(d.step, Step::Fence(_) | Step::WouldFence(_)),
                "{d:?}"
            );
        }
    }
}

/// A node that keeps going NotReady is held, not fenced, until it settles: its Off reads may
/// be the gaps of a boot loop, not a dead machine.
#[test]
fn a_flapping_node_is_held_until_it_settles() {
    let reads = [off(60), off(65)];
    // Four NotReady periods in ten minutes, limit 3: held.
    let flapping = NodeFacts {
        not_ready_seen: vec![t(-400), t(-250), t(-100), t(0)],
        ..dead()
    };
    let d = decide(&flapping, &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::Flapping)
    );
    assert!(d.reason.contains("4 times"), "{}", d.reason);
    // Three within the window (the fourth is older): fenced as usual.
    let settled = NodeFacts {
        not_ready_seen: vec![t(-700), t(-250), t(-100), t(0)],
        ..dead()
    };
    assert_eq!(
        decide(&settled, &reads, &policy(), t(66)).step,
        Step::Fence(FenceAction::Taint)
    );
    // flap_limit = 0 turns the guard off.
    let off_guard = Policy {
        flap_limit: 0,
        ..policy()
    };
    assert_eq!(
        decide(&flapping, &reads, &off_guard, t(66)).step,
        Step::Fence(FenceAction::Taint)
    );
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

fn hold(kind: HoldKind) -> Hold {
    Hold {
        kind,
        reason: format!("held by {}", kind.name()),
    }
}

const ALL_HOLDS: [HoldKind; 7] = [
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

// Pre-attestation: reading power while the node still shows Ready, once its Lease is stale.

/// Ready, its kubelet last seen alive at t(0) with a 20 s Lease (renewals every 5 s): stale
/// after 2.5 renewals, at t(12.5).
fn going_silent() -> NodeFacts {
    NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(0)),
        lease_renew_time: Some(t(-1)),
        lease_duration: Some(Duration::from_secs(20)),
        ..dead()
    }
}

#[test]
fn a_ready_node_whose_lease_goes_stale_is_read_ahead_and_never_written() {
    let p = policy();
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
        ..policy()
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

/// Over Ready and NotReady, every sign of life, holds on or off, and every short sequence of
/// reads: nothing is ever written to a Ready node; a fence within `not_ready_grace` needs a
/// Lease silent for `stale_after`, reading ahead not held, and every counted read taken after
/// the last sign of life.
#[test]
fn property_pre_attestation_never_writes_early_or_on_old_evidence() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let p = policy();
    let (mut checked, mut early_fences, mut ahead) = (0, 0, 0);
    for ready in [true, false] {
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
                            if ready {
                                assert_eq!(d.step, Step::Idle, "{d:?}");
                                assert_eq!(d.guard, None);
                                ahead += (d.rule == Rule::PreAttested) as usize;
                                continue;
                            }
                            let Step::Fence(_) = d.step else { continue };
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
        early_fences > 0 && ahead > 0,
        "the generator never reached a pre-attested fence ({early_fences}) or attestation ({ahead})"
    );
}

/// A decision that says when it runs out by the clock (`decide_again_at`, which the daemon
/// wakes for) names a time still to come, and holds, unchanged and writing nothing, until then:
/// waking at that time is never late for a change the clock alone brings.
#[test]
fn property_a_decision_holds_until_it_says_it_runs_out() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let pre_attest_off = Policy {
        pre_attest_after: None,
        ..policy()
    };
    let (mut timed, mut changed_at_wake) = (0, 0);
    for (p, lease_seen) in [policy(), pre_attest_off]
        .into_iter()
        .flat_map(|p| [None, Some(-10), Some(20), Some(50)].map(|l| (p.clone(), l)))
    {
        let facts = NodeFacts {
            lease_renewal_seen: lease_seen.map(t),
            ..dead()
        };
        for reads in sequences(&states, 2, 55, 5) {
            for now in [1i64, 30, 59, 65, 100] {
                let d = decide(&facts, &reads, &p, t(now));
                let Some(until) = d.decide_again_at else {
                    continue;
                };
                timed += 1;
                assert!(until > t(now), "{d:?} at {now}");
                assert_eq!(d.step, Step::Idle, "{d:?}");
                // In the tests' seconds (`t`), the last whole second before it.
                let last_second = until.duration_since(t(0)).as_secs() - 1;
                for then in [(now + last_second) / 2, last_second] {
                    if then <= now {
                        continue;
                    }
                    let later = decide(&facts, &reads, &p, t(then));
                    assert_eq!(
                        (later.rule, later.step),
                        (d.rule, d.step),
                        "decided at {now} to hold until {until}, but at {then}: {later:?}"
                    );
                }
                changed_at_wake += (decide(&facts, &reads, &p, until).rule != d.rule) as usize;
            }
        }
    }
    assert!(
        timed > 100 && changed_at_wake > 0,
        "the generator never reached a timed decision ({timed}) or its end ({changed_at_wake})"
    );
}
