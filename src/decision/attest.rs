//! Proving a machine off: the rules that read power and judge the reads (freshness, the
//! confirming streak, the read's machine against the node's: [`counting`](super::counting)), for a NotReady node or, ahead of
//! NotReady, a Ready one whose Lease is stale. "Why was node X fenced" is read here top to
//! bottom, after the node's own rules in [`decide_node`](super::decide_node).

use super::*;

/// The rules that read power and judge the reads, for a NotReady node or, ahead of NotReady,
/// a Ready one whose Lease is stale.
pub(super) fn attest(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
    phase: &Phase,
) -> Decision {
    use NodeState as S;

    if facts.foreign_out_of_service {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::ForeignOutOfServiceTaint,
            "node already carries an out-of-service taint that oobfence did not place; leaving it alone",
        );
    }

    if let Some(remediator) = &facts.other_remediator {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::OtherRemediator,
            format!(
                "another remediator is at work on this node ({remediator}); two fencers on one node can undo each other's work, so oobfence leaves it alone"
            ),
        );
    }

    if let Some(why) = &facts.opted_out {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::OptedOut,
            format!("the node is excluded from fencing ({why}); never fenced while it is"),
        );
    }

    let flaps = facts
        .not_ready_seen
        .iter()
        .filter(|t| elapsed(**t, now) <= policy.flap_window)
        .count();
    if policy.flap_limit > 0 && flaps > policy.flap_limit as usize {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::Flapping,
            format!(
                "the node went NotReady {flaps} times in the last {} (more than flap_limit = {}): a flapping node is held, not fenced, until it settles",
                secs(policy.flap_window),
                policy.flap_limit
            ),
        );
    }

    // The grace period is for a node whose power nobody read ahead: without a stale Lease,
    // NotReady alone is a weak sign.
    if let Phase::NotReady {
        not_ready_for,
        pre_attested: None,
        held_ahead,
        stale_at,
    } = phase
        && *not_ready_for < policy.not_ready_grace
    {
        return Decision::new(
            S::Suspect,
            Step::Idle,
            Rule::NotReadyGrace,
            format!(
                "NotReady for {} of the {} grace period; no power read yet{held_ahead}",
                secs(*not_ready_for),
                secs(policy.not_ready_grace)
            ),
        )
        .again_at(runs_out(
            plus(now, policy.not_ready_grace - *not_ready_for),
            *stale_at,
            now,
        ));
    }

    if !facts.has_power_source {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::NoPowerSource,
            "no [[bmc]] entry in the config matches this node; its power cannot be attested",
        );
    }

    match &facts.mapping_conflict {
        Some(MappingConflict::RegionMismatch(detail)) => {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::RegionMismatch,
                format!(
                    "{detail}: an instance of another region is absent from every answer, which must never read as gone; fix [aws] region"
                ),
            );
        }
        Some(MappingConflict::SharedMachine(detail)) => {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::SharedMachine,
                format!(
                    "{detail}: one machine's being off cannot tell which node is dead; fix the config's mapping"
                ),
            );
        }
        None => {}
    }

    if let Some(b) = &facts.identity_binding
        && let Verdict::Mismatch(detail) = &b.verdict
    {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::IdentityMismatch,
            format!(
                "the power source answers for another machine (seen {}): {detail}",
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        )
        .read_at(plus(b.at, policy.recheck_interval));
    }

    // A source that said Off (or gone) while the kubelet went on living reads another machine,
    // account or endpoint, or misreports: none of its Off or gone answers proves anything until
    // it says On again.
    if let Some(o) = &facts.off_while_alive
        && o.proven()
    {
        let (rule, said) = if o.gone {
            (
                Rule::GoneWhileAlive,
                "the instance is gone (terminated or not found)",
            )
        } else {
            (Rule::OffWhileAlive, "Off")
        };
        return Decision::new(
            S::Blocked,
            Step::Idle,
            rule,
            format!(
                "the power source said {said} at {} while the node was Ready, and its kubelet showed life {} times after that: it reads another machine or account, or misreports this one; never fenced until it reads On again",
                o.read_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                o.signs_of_life_after
            ),
        )
        .read_at(plus(o.read_at, policy.recheck_interval));
    }

    // A pre-attested node's Lease is stale by definition; otherwise a renewal within the grace
    // period says something on the machine is alive.
    if let Phase::NotReady {
        pre_attested: None,
        stale_at,
        ..
    } = phase
        && let Some(seen) = facts.lease_renewal_seen
    {
        let age = elapsed(seen, now);
        if age < policy.not_ready_grace {
            let reason = if facts.lease_first_sight {
                // After a restart the Lease is new to oobfence: its renewTime is the node's
                // clock, so the silence before is unknown, and the grace runs from the first
                // sight. Nothing is known to be alive.
                format!(
                    "oobfence first saw this node's Lease {} ago (when it started watching it) and has seen no renewal since; how long the kubelet was silent before is unknown, so the {} grace runs from then",
                    secs(age),
                    secs(policy.not_ready_grace)
                )
            } else {
                format!(
                    "oobfence saw the kubelet renew its Lease {} ago (less than the {} grace): something on the machine is alive",
                    secs(age),
                    secs(policy.not_ready_grace)
                )
            };
            return Decision::new(S::Blocked, Step::Idle, Rule::LeaseRenewedRecently, reason)
                .again_at(runs_out(plus(seen, policy.not_ready_grace), *stale_at, now));
        }
    }

    // The daemon drops a node's reads whenever it sees it come back Ready or its kubelet alive,
    // so every read here was taken during this period (by oobfence's clock, never compared with
    // the node's); and a read from before the last sign of life never counts, whoever forgot it.
    let reads = match last_sign_of_life(facts) {
        Some(alive) => &reads[reads.partition_point(|r| r.at < alive)..],
        None => reads,
    };
    let Some(last) = reads.last() else {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::AwaitingPowerRead,
            format!("{}; reading power", phase.describe()),
        )
        .read_at(now);
    };
    let age = elapsed(last.at, now);
    if age > policy.read_max_age {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::StalePowerRead,
            format!(
                "last power read is {} old (max {}); reading again",
                secs(age),
                secs(policy.read_max_age)
            ),
        )
        .read_at(now);
    }

    // A machine that ever answered as another machine in this period: the mapping is wrong,
    // whatever it says now.
    if let Some((r, detail)) = reads
        .iter()
        .rev()
        .find_map(|r| match identity_of(facts, r) {
            Verdict::Mismatch(d) => Some((r, d)),
            _ => None,
        })
    {
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::IdentityMismatch,
            format!(
                "the power source answered for another machine at {}: {detail}; never fenced",
                r.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval));
    }

    match &last.state {
        PowerState::On => on_reading(facts, last, phase, policy, now),
        PowerState::Transitional { detail } => Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::PowerTransitional,
            format!("power is changing ({detail}); not off yet, reading again"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Suspended { detail } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerSuspended,
            format!("the machine is suspended with its memory kept ({detail}): it resumes with the same processes and bootID, so it is not off; never fenced"),
        )
        .read_at(plus(last.at, policy.recheck_interval)),
        PowerState::Error { kind, detail } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerUnknown,
            format!("power state unknown ({kind}: {detail}); never fenced on an unknown"),
        )
        .read_at(plus(last.at, policy.confirm_interval)),
        PowerState::Off | PowerState::Terminated | PowerState::NotFound => {
            let gone = last.state.is_gone();
            // Only a streak of one kind counts: Off then not-found is one answer of each, not
            // two proofs that the instance is gone.
            let streak = confirming_streak(reads, gone, policy.confirm_interval);
            // Every read counted must come from the node's own machine.
            for r in &streak {
                if let Err(NotCounted { rule, why }) = identity_counts(facts, r) {
                    let advice = match rule {
                        Rule::IdentityUnverified if !r.state.is_gone() => {
                            "; set identity = \"unchecked\" on the entry only for machines that cannot report one"
                        }
                        _ => "",
                    };
                    return Decision::new(
                        S::Blocked,
                        Step::Idle,
                        rule,
                        format!(
                            "the {} read at {} cannot be tied to this node's machine: {why}{advice}",
                            r.state,
                            r.at.strftime("%Y-%m-%dT%H:%M:%SZ")
                        ),
                    )
                    .read_at(plus(last.at, policy.recheck_interval));
                }
            }
            // With a second witness asked for, every Off counted must have it agree.
            let mut witness = String::new();
            if let Some(required) = facts.off_witness.filter(|_| !gone) {
                for r in &streak {
                    match witness::check(required, r.power_draw.as_ref()) {
                        Ok(seen) if witness.is_empty() => witness = format!(", {seen}"),
                        Ok(_) => {}
                        Err(why) => {
                            return Decision::new(
                                S::Blocked,
                                Step::Idle,
                                Rule::OffUncorroborated,
                                format!(
                                    "the Off read at {} is not corroborated: {why}; never fenced on an Off the entry's corroborate = \"{}\" witness does not confirm",
                                    r.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                    required.name()
                                ),
                            )
                            .read_at(plus(last.at, policy.confirm_interval));
                        }
                    }
                }
            }
            let confirmed = streak.len();
            // A cloud that does not know an instance may just not have caught up yet
            // (eventual consistency): "not found" is never trusted on one answer.
            let needed = if streak.iter().any(|r| r.state == PowerState::NotFound) {
                policy.confirm_reads.max(2)
            } else {
                policy.confirm_reads
            } as usize;
            let what = if gone { "gone (terminated or not found)" } else { "Off" };
            if confirmed < needed {
                return Decision::new(
                    S::Confirming,
                    Step::Idle,
                    Rule::ConfirmingOff,
                    format!(
                        "{confirmed} of {needed} {what} reads spaced at least {} apart",
                        secs(policy.confirm_interval)
                    ),
                )
                .read_at(plus(last.at, policy.confirm_interval));
            }
            let (action, rule) = if gone {
                (policy.on_terminated, Rule::ConfirmedGone)
            } else {
                (policy.action, Rule::ConfirmedOff)
            };
            let evidence = format!(
                "{}, {confirmed} consecutive {what} reads spaced at least {} apart from the node's machine ({}{witness}), newest {} old ({})",
                phase.describe(),
                secs(policy.confirm_interval),
                identity_summary(facts, last),
                secs(age),
                last.state
            );
            let ahead = matches!(phase, Phase::Ahead(_));
            if ahead && !policy.release_at_attestation {
                // Kept fresh, so that it still counts the moment the node turns NotReady.
                let refresh = policy.confirm_interval.max(policy.read_max_age / 2);
                return Decision::new(
                    S::Suspect,
                    Step::Idle,
                    Rule::PreAttested,
                    format!(
                        "{evidence}: power attested ahead of NotReady; {action} the moment the node turns NotReady, without not_ready_grace"
                    ),
                )
                .read_at(plus(last.at, refresh));
            }
            // Released at attestation: the pods go with the fence, and a Ready node's fence
            // is not kept for NotReady.
            let what_now = match (policy.release_at_attestation, ahead) {
                (false, _) => action.to_string(),
                (true, false) => format!(
                    "{action}, then force-delete its pods (release_at_attestation)"
                ),
                (true, true) => format!(
                    "power attested while the Node still shows Ready: {action} now, then force-delete its pods, without waiting for NotReady (release_at_attestation)"
                ),
            };
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldFence(action),
                    Rule::DryRun,
                    format!("{evidence}; dry run: would {what_now}, writing nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::Fence(action),
                    rule,
                    format!("{evidence}: {what_now}"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::Fence,
                    uid: facts.uid.clone(),
                    boot_id: facts.boot_id.clone(),
                    lease_renew_time: facts.lease_renew_time,
                    evidence_at: last.at,
                    read_max_age: policy.read_max_age,
                    while_ready: ahead,
                    ready_heartbeat: facts.ready_heartbeat.filter(|_| ahead),
                    release_pods: policy.release_at_attestation,
                    on_word: false,
                })
            }
        }
    }
}
