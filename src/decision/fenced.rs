//! A node oobfence fenced: kept, unfenced on its return, its record cleared, or its machine
//! powered on again.

use super::*;

/// A fenced machine oobfence powered off, to be powered on again: on a fresh Off read from the
/// node's own machine, taken after the fence.
pub(super) fn power_on(
    facts: &NodeFacts,
    record: &FenceRecord,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;
    let fresh = reads
        .last()
        .filter(|r| r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age);
    let Some(off) =
        fresh.filter(|r| r.state == PowerState::Off && identity_of(facts, r).is_match())
    else {
        let next = match fresh {
            Some(r) => plus(r.at, policy.confirm_interval),
            None => now,
        };
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::PoweringOn,
            format!(
                "fenced at {}; powering the machine on needs a fresh Off read from the node's machine ({})",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                reads.last().map_or("no read yet".to_string(), |r| format!("last read: {}", r.state))
            ),
        )
        .read_at(next);
    };
    let reason = format!(
        "fenced at {} after oobfence powered the machine off; it reads Off ({}): power it on again, so that it boots and the fence comes off on its new bootID",
        record.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        identity_summary(facts, off)
    );
    if policy.dry_run {
        return Decision::new(
            S::Fenced,
            Step::WouldPowerOn,
            Rule::DryRun,
            format!("{reason}; dry run: would power it on, sending nothing"),
        );
    }
    Decision::new(S::Fenced, Step::PowerOn, Rule::PoweringOn, reason).guarded(WriteGuard {
        purpose: GuardPurpose::PowerOn,
        uid: facts.uid.clone(),
        boot_id: record.boot_id.clone(),
        lease_renew_time: facts.lease_renew_time,
        evidence_at: off.at,
        read_max_age: policy.read_max_age,
        while_ready: false,
        ready_heartbeat: None,
        release_pods: false,
        on_word: false,
    })
}

pub(super) fn decide_fenced(
    facts: &NodeFacts,
    record: &FenceRecord,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;

    if !record.ours {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedByAnother,
            "the node's fence was placed by another oobfence (another datacenter's or host's, oobfence.io/fenced-by); this daemon never lifts nor adopts it",
        );
    }
    if !record.taint_present && policy.dry_run {
        return Decision::new(
            S::Healthy,
            Step::Idle,
            Rule::DryRun,
            "oobfence's out-of-service taint was removed by someone else; dry run: would drop its fence record, which stays",
        );
    }
    if !record.taint_present {
        return Decision::new(
            S::Healthy,
            Step::ClearRecord,
            Rule::FenceRemovedExternally,
            "oobfence's out-of-service taint was removed by someone else; dropping its fence record",
        );
    }
    if facts.readiness != Readiness::Ready {
        let not_powered_on =
            match actuation::on_verdict(policy.actuation.as_ref(), facts, &record.boot_id) {
                actuation::OnVerdict::Due => return power_on(facts, record, reads, policy, now),
                actuation::OnVerdict::No(why) => {
                    format!("; oobfence powered its machine off but does not power it on: {why}")
                }
                actuation::OnVerdict::NotDue => String::new(),
            };
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {}; waiting for the node to return Ready{not_powered_on}",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        );
    }
    // Fenced while it still showed Ready (release at attestation): the Ready condition is the
    // dead kubelet's last word until the controller-manager marks it, not a return.
    if last_sign_of_life(facts).is_some_and(|alive| alive <= record.at) {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {} while the Node still showed Ready, and no sign of life from its kubelet since; waiting for the node to return",
                record.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        );
    }
    if !policy.untaint_on_recovery {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::UntaintDisabled,
            "node is Ready again but untaint_on_recovery = false: remove the taint by hand once checked",
        );
    }
    // Lifting a fence needs fresh proof the machine is on.
    let fresh_on = reads.last().filter(|r| {
        r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age && r.state == PowerState::On
    });
    let Some(on) = fresh_on else {
        let next = match reads.last() {
            Some(r) if r.at >= record.at && elapsed(r.at, now) <= policy.read_max_age => {
                plus(r.at, policy.confirm_interval)
            }
            _ => now,
        };
        let last = reads
            .last()
            .map(|r| format!("last read: {}", r.state))
            .unwrap_or_else(|| "no read yet".into());
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::RecoveryNeedsPowerOn,
            format!("node is Ready again; lifting the fence needs a fresh On read ({last})"),
        )
        .read_at(next);
    };
    // ...from the node's own machine.
    if let Err(NotCounted { why, .. }) = identity_counts(facts, on) {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::IdentityMismatch,
            format!("node is Ready and a machine reads On, but it is not proven to be this node's: {why}; the fence stays"),
        )
        .read_at(plus(on.at, policy.recheck_interval));
    }
    if facts.boot_id.is_empty() || facts.boot_id == record.boot_id {
        return Decision::new(
            S::Recovering,
            Step::Idle,
            Rule::RecoveredSameBootId,
            format!(
                "node is Ready and On but its bootID {:?} is the one recorded at fence time: it did not reboot, so the Off reads are suspect; check the machine, then remove the taint by hand",
                facts.boot_id
            ),
        );
    }
    let reason = format!(
        "node is Ready, power reads On ({}), bootID changed ({} -> {})",
        identity_summary(facts, on),
        record.boot_id,
        facts.boot_id
    );
    if policy.dry_run {
        Decision::new(
            S::Recovering,
            Step::WouldUnfence,
            Rule::DryRun,
            format!("{reason}; dry run: would remove the taint"),
        )
    } else {
        Decision::new(S::Recovering, Step::Unfence, Rule::RecoveredNewBoot, reason).guarded(
            WriteGuard {
                purpose: GuardPurpose::Unfence,
                uid: facts.uid.clone(),
                boot_id: facts.boot_id.clone(),
                lease_renew_time: None,
                evidence_at: on.at,
                read_max_age: policy.read_max_age,
                while_ready: false,
                ready_heartbeat: None,
                release_pods: false,
                on_word: false,
            },
        )
    }
}
