//! The machine reads On: never fenced; with opt-in actuation, a hung node powered off.

use super::*;

/// The machine reads On: never fenced. With opt-in actuation ([`actuation`]), a NotReady node
/// whose kubelet has been silent for `[actuation] after` is powered off, on this very read's
/// proof that the machine is the node's; a machine oobfence already powered off is waited for.
pub(super) fn on_reading(
    facts: &NodeFacts,
    last: &PowerReading,
    phase: &Phase,
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;
    const NEVER: &str = "the power source says On: likely a partition or a hung OS, not a dead machine; never fenced";
    let blocked = |reason: String| {
        Decision::new(S::Blocked, Step::Idle, Rule::PowerOn, reason)
            .read_at(plus(last.at, policy.recheck_interval))
    };
    let Some(actuation) = policy.actuation.as_ref() else {
        return blocked(NEVER.into());
    };
    let at = |t: Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    if let Some(r) = facts.actuation.powered_off(&facts.boot_id) {
        let since = elapsed(r.off_at, now);
        if since <= actuation::POWER_OFF_TAKES {
            return Decision::new(
                S::Confirming,
                Step::Idle,
                Rule::PoweredOffConfirming,
                format!(
                    "oobfence powered the machine off at {} ({} ago); it still reads On: reading again",
                    at(r.off_at),
                    secs(since)
                ),
            )
            .read_at(plus(last.at, policy.confirm_interval));
        }
        return Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerOffIgnored,
            format!(
                "oobfence powered the machine off at {}, {} ago, and it still reads On: the BMC took the command but the machine did not turn off; never powered off twice for one boot, a person must look",
                at(r.off_at),
                secs(since)
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval));
    }
    if !matches!(phase, Phase::NotReady { .. }) {
        return blocked(NEVER.into());
    }
    let Verdict::Match(machine) = identity_of(facts, last) else {
        return blocked(format!(
            "{NEVER}; not powered off: this On read does not prove it comes from the node's machine"
        ));
    };
    match actuation::off_verdict(Some(actuation), facts, now) {
        actuation::OffVerdict::PowerOff => {
            let reason = format!(
                "{}, the power source says On from the node's machine ({machine}) and oobfence has seen no sign of life from its kubelet for at least {} ([actuation] after): a hung node",
                phase.describe(),
                secs(actuation.after)
            );
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldPowerOff,
                    Rule::DryRun,
                    format!("{reason}; dry run: would power it off, sending nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::PowerOff,
                    Rule::PoweringOff,
                    format!("{reason}: power it off, then fence it on its Off reads"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::PowerOff,
                    uid: facts.uid.clone(),
                    boot_id: facts.boot_id.clone(),
                    lease_renew_time: facts.lease_renew_time,
                    evidence_at: last.at,
                    read_max_age: policy.read_max_age,
                    while_ready: false,
                    ready_heartbeat: None,
                    release_pods: false,
                    on_word: false,
                })
            }
        }
        actuation::OffVerdict::Wait { at: when, why } => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::WaitingToActuate,
            format!(
                "the power source says On: a partition or a hung OS; {why}: powered off at {} unless its kubelet shows life",
                at(when)
            ),
        )
        .read_at(plus(last.at, policy.recheck_interval))
        .again_at(when),
        actuation::OffVerdict::No(why) => blocked(format!("{NEVER}; not powered off: {why}")),
    }
}
