//! Fencing levels: a node whose power more than one source can tell, tried in order.
//!
//! A node may be mapped to several power sources, each at a level (`[[bmc]] level = N`,
//! default 1): typically its BMC at level 1 and the PDU outlets that feed it at level 2, since
//! the commonest power loss (a tripped breaker, a pulled cord, a dead PSU) takes the BMC with
//! the machine. The rules, as Pacemaker's fencing topology has them:
//!
//! - Each source is judged on its own by every rule of [`super::decide`] (reads confirmed,
//!   spaced, fresh, after the last sign of life, from the node's machine where the source can
//!   tell).
//! - A level proves the machine off only when **every** source in it does: a server fed by two
//!   PDUs is off only when both outlets are.
//! - The first level that can answer decides. A level whose source answers anything but Off
//!   (On, suspended, another machine, an Off while the kubelet lived...) ends the question:
//!   the next level is never asked to find an Off.
//! - A level is skipped only when it cannot answer: a source's newest read failed as
//!   unreachable, timed out, or was refused its credentials. A level with one source that
//!   cannot answer cannot prove anything either, so it is skipped too, once its other sources
//!   have answered Off (one still reading may yet say On, and is waited for).
//! - When no level can answer (or the node has no source), a person's confirmation of the
//!   current boot ([`super::confirmation`]) stands in for the proof; nothing else does.
//!
//! Identity: a level whose sources do not prove whose machine they read (a PDU outlet, an
//! entry with `identity = "unchecked"`) proves only the mapping the operator wrote, and the
//! outcome says so ([`Basis::Reads`]`{ attested: false }`), for `why`, the journal, the Event
//! and the metrics.
//!
//! With a single source at level 1, the outcome is exactly [`super::decide`]'s.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde::Serialize;

use super::confirmation::{self, Standing};
use super::{
    Decision, GuardPurpose, NodeFacts, NodeState, Policy, PowerReading, PowerState, ReadErrorKind,
    Rule, Step, WriteGuard, apply_holds, decide_node, plus,
};

/// One power source of a node, with what the core knows of it.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub level: u32,
    /// How `why` names it (the entry and its target).
    pub label: String,
    /// The source proves whose machine it reads. `false`: the mapping the operator wrote is
    /// all there is (a PDU outlet, an entry with `identity = "unchecked"`).
    pub attested: bool,
    /// The node's facts with this source's own: identity check, witness, binding, Off while
    /// alive, mapping conflict, actuation.
    pub facts: NodeFacts,
    /// This source's reads of the node's machine, oldest first.
    pub reads: &'a [PowerReading],
}

/// What the fence or the refusal rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "basis", rename_all = "snake_case")]
pub enum Basis {
    /// Nothing decided on power (a node-level rule, or no source answered).
    None,
    /// The reads of this level's sources; `attested`: every one proves whose machine it read.
    Reads { level: u32, attested: bool },
    /// A person's confirmation, no source being able to answer.
    Person,
}

impl Basis {
    /// The `basis` label of metrics: `none`, `attested`, `unattested`, `person`.
    pub fn label(&self) -> &'static str {
        match self {
            Basis::None => "none",
            Basis::Reads { attested: true, .. } => "attested",
            Basis::Reads {
                attested: false, ..
            } => "unattested",
            Basis::Person => "person",
        }
    }
}

/// The decision about a node of several sources, and whom it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// The source whose decision it is (its guard, its power action), if one.
    pub member: Option<usize>,
    /// Sources to read, and from when: every source of the levels asked so far.
    pub reads_wanted: Vec<(usize, Timestamp)>,
    pub basis: Basis,
}

/// How one source's own decision bears on its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// A rule about the node, the same whatever the source (Ready, grace, opted out...).
    Node,
    /// Proven off (or gone): a fence, or a proof kept for NotReady.
    Proof,
    /// Reading, confirming: no answer yet.
    Pending,
    /// Its newest read could not reach the source, or was refused its credentials.
    Silent,
    /// Anything else: On, suspended, another machine, an unknown answer... The question ends.
    Final,
}

fn answer(d: &Decision, reads: &[PowerReading]) -> Answer {
    use Rule as R;
    match d.rule {
        R::NodeBeingDeleted
        | R::NodeReady
        | R::NoReadyCondition
        | R::NotReadyGrace
        | R::ForeignOutOfServiceTaint
        | R::OtherRemediator
        | R::OptedOut
        | R::Flapping
        | R::LeaseRenewedRecently => Answer::Node,
        R::PreAttested => Answer::Proof,
        _ if matches!(d.step, Step::Fence(_) | Step::WouldFence(_)) => Answer::Proof,
        R::ConfirmingOff | R::AwaitingPowerRead | R::StalePowerRead | R::PowerTransitional => {
            Answer::Pending
        }
        R::PowerUnknown if silent(reads) => Answer::Silent,
        _ => Answer::Final,
    }
}

/// The newest read failed for want of an answer: unreachable, timed out, or credentials
/// refused. A source answering nonsense is not silent: it answered.
fn silent(reads: &[PowerReading]) -> bool {
    matches!(
        reads.last().map(|r| &r.state),
        Some(PowerState::Error {
            kind: ReadErrorKind::Unreachable | ReadErrorKind::Timeout | ReadErrorKind::Auth,
            ..
        })
    )
}

/// Reads from before a freeze thawed or the view recovered never count (as in `decide`).
fn counted<'r>(facts: &NodeFacts, reads: &'r [PowerReading]) -> &'r [PowerReading] {
    match facts.holds.evidence_not_before {
        Some(t) => &reads[reads.partition_point(|r| r.at < t)..],
        None => reads,
    }
}

/// Decides about a node from its sources, level by level; `base` is the node's facts
/// without any source's (what a node of no source is decided on).
pub fn decide_levels(
    base: &NodeFacts,
    members: &[Member<'_>],
    policy: &Policy,
    now: Timestamp,
) -> Outcome {
    if members.is_empty() {
        return unmapped(base, policy, now);
    }
    let decided: Vec<Decision> = members
        .iter()
        .map(|m| decide_node(&m.facts, counted(&m.facts, m.reads), policy, now))
        .collect();
    let levels: BTreeSet<u32> = members.iter().map(|m| m.level).collect();
    let of_level = |l: u32| -> Vec<usize> {
        (0..members.len())
            .filter(|&i| members[i].level == l)
            .collect()
    };
    let mut asked: Vec<usize> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let fenced = base.fence.is_some();

    for &level in &levels {
        let idx = of_level(level);
        asked.extend(&idx);
        let answers: Vec<Answer> = idx
            .iter()
            .map(|&i| answer(&decided[i], counted(&members[i].facts, members[i].reads)))
            .collect();
        let first = idx[0];
        if answers[0] == Answer::Node {
            return finish(members, &decided, first, &[first], Basis::None, policy);
        }
        if fenced {
            // Lifting a fence: the first level that can answer; one On read of the node's
            // machine from it, with the node Ready on a new boot, is the proof.
            let unfence =
                |i: &usize| matches!(decided[*i].step, Step::Unfence | Step::WouldUnfence);
            let power_on =
                |i: &usize| matches!(decided[*i].step, Step::PowerOn | Step::WouldPowerOn);
            let acting = idx.iter().copied().find(unfence);
            if let Some(i) = acting.or_else(|| idx.iter().copied().find(power_on)) {
                if power_on(&i) && idx.len() > 1 {
                    return one_of_many(members, &decided, i, idx.len(), &asked, policy);
                }
                return finish(
                    members,
                    &decided,
                    i,
                    &asked,
                    reads_basis(members, &idx),
                    policy,
                );
            }
            if idx
                .iter()
                .all(|&i| silent(counted(&members[i].facts, members[i].reads)))
            {
                skipped.push(skip_reason(members, &decided, &idx));
                continue;
            }
            return finish(members, &decided, first, &asked, Basis::None, policy);
        }

        // A source that answers anything but Off ends the question.
        if let Some(k) = answers.iter().position(|a| *a == Answer::Final) {
            let i = idx[k];
            if matches!(decided[i].step, Step::PowerOff | Step::WouldPowerOff) && idx.len() > 1 {
                return one_of_many(members, &decided, i, idx.len(), &asked, policy);
            }
            let mut out = finish(members, &decided, i, &asked, Basis::None, policy);
            say_level(&mut out.decision, level, &levels, &skipped);
            if out.decision.rule != Rule::PowerUnknown || base.confirmation.is_none() {
                return out;
            }
            // A person's word may stand in for an unknown, if no other source answers: every
            // source is read, so that one that does is heard.
            let everyone: Vec<usize> = (0..members.len()).collect();
            let mut out = finish(members, &decided, i, &everyone, Basis::None, policy);
            say_level(&mut out.decision, level, &levels, &skipped);
            if !nothing_answers(members, &decided) {
                return out;
            }
            return maybe_confirmed(base, out, policy, now);
        }
        // A source still reading may yet answer On: it is waited for, silent ones or not.
        if let Some(k) = answers.iter().position(|a| *a == Answer::Pending) {
            let mut out = finish(members, &decided, idx[k], &asked, Basis::None, policy);
            say_level(&mut out.decision, level, &levels, &skipped);
            return out;
        }
        if answers.contains(&Answer::Silent) {
            skipped.push(skip_reason(members, &decided, &idx));
            continue;
        }
        // Every source of the level proved the machine off.
        let mut out = finish(
            members,
            &decided,
            first,
            &asked,
            reads_basis(members, &idx),
            policy,
        );
        if idx.len() > 1 {
            let oldest = idx
                .iter()
                .filter_map(|&i| decided[i].guard.as_ref().map(|g| g.evidence_at))
                .min();
            if let (Some(g), Some(at)) = (out.decision.guard.as_mut(), oldest) {
                // The write re-checks freshness against the oldest of the proofs.
                g.evidence_at = at;
            }
            let each: Vec<String> = idx
                .iter()
                .map(|&i| format!("{}: {}", members[i].label, decided[i].reason))
                .collect();
            out.decision.reason = format!(
                "every source of level {level} proves the machine off: {}",
                each.join("; ")
            );
        }
        say_level(&mut out.decision, level, &levels, &skipped);
        // One source alone already says so in its own words ("identity unchecked").
        let several = members.len() > 1;
        if several && idx.iter().any(|&i| !members[i].attested) {
            out.decision.reason.push_str(
                "; this level proves only the mapping the config wrote (it cannot tell whose machine it reads)",
            );
        }
        return out;
    }

    // No level could answer. Spoken for by a silent source: a level skipped for one silent
    // source may hold others that proved the machine off, and their fence is no answer.
    let first = (0..members.len())
        .find(|&i| silent(counted(&members[i].facts, members[i].reads)))
        .unwrap_or(0);
    let mut out = finish(members, &decided, first, &asked, Basis::None, policy);
    if fenced {
        return out;
    }
    if levels.len() > 1 || members.len() > 1 {
        out.decision.reason = format!(
            "no level can answer, so the power is unknown and the node is never fenced on it: {}",
            skipped.join("; ")
        );
    }
    maybe_confirmed(base, out, policy, now)
}

/// No source answers the power question: each is silent or answers an unknown. Where one
/// answers anything else (On, Off, suspended, another machine), or has not been read, a
/// person's word does not stand in for it.
fn nothing_answers(members: &[Member<'_>], decided: &[Decision]) -> bool {
    members.iter().zip(decided).all(|(m, d)| {
        let reads = counted(&m.facts, m.reads);
        matches!(answer(d, reads), Answer::Silent) || d.rule == Rule::PowerUnknown
    })
}

fn reads_basis(members: &[Member<'_>], idx: &[usize]) -> Basis {
    Basis::Reads {
        level: members[idx[0]].level,
        attested: idx.iter().all(|&i| members[i].attested),
    }
}

fn skip_reason(members: &[Member<'_>], decided: &[Decision], idx: &[usize]) -> String {
    let who: Vec<String> = idx
        .iter()
        .filter(|&&i| silent(counted(&members[i].facts, members[i].reads)))
        .map(|&i| format!("{}: {}", members[i].label, decided[i].reason))
        .collect();
    format!(
        "level {} cannot answer ({})",
        members[idx[0]].level,
        who.join("; ")
    )
}

/// Says which level spoke, and why the ones above it did not, where there is more than one.
fn say_level(d: &mut Decision, level: u32, levels: &BTreeSet<u32>, skipped: &[String]) {
    if levels.len() < 2 {
        return;
    }
    let above = if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({})", skipped.join("; "))
    };
    d.reason = format!("level {level} speaks{above}: {}", d.reason);
}

/// A power action through one of several sources that feed the machine would not cut its
/// power: it is never sent.
fn one_of_many(
    members: &[Member<'_>],
    decided: &[Decision],
    i: usize,
    n: usize,
    asked: &[usize],
    policy: &Policy,
) -> Outcome {
    let mut out = finish(members, decided, i, asked, Basis::None, policy);
    out.decision = Decision::new(
        NodeState::Blocked,
        Step::Idle,
        Rule::PowerOffIgnored,
        format!(
            "level {} has {n} sources (a machine fed by several outlets): oobfence sends no power action through one of them; without that: {}",
            members[i].level, decided[i].reason
        ),
    );
    out.member = None;
    out
}

/// The chosen source's decision, held where something outside the node says so, with the
/// reads every asked source wants.
fn finish(
    members: &[Member<'_>],
    decided: &[Decision],
    i: usize,
    asked: &[usize],
    basis: Basis,
    policy: &Policy,
) -> Outcome {
    let m = &members[i];
    let reads = counted(&m.facts, m.reads);
    let decision = apply_holds(decided[i].clone(), &m.facts.holds, reads, policy);
    let held = decision.rule != decided[i].rule;
    let reads_wanted = asked
        .iter()
        .filter_map(|&j| {
            if held && j != i {
                // A held fence keeps every asked source read now and then.
                let last = counted(&members[j].facts, members[j].reads).last()?;
                return Some((j, plus(last.at, policy.recheck_interval)));
            }
            let at = if j == i {
                decision.next_read_at
            } else {
                decided[j].next_read_at
            };
            at.map(|t| (j, t))
        })
        .collect();
    Outcome {
        decision,
        member: Some(i),
        reads_wanted,
        basis,
    }
}

/// A node no source maps: decided on its own facts, where a person's word may stand in.
fn unmapped(base: &NodeFacts, policy: &Policy, now: Timestamp) -> Outcome {
    let d = decide_node(base, &[], policy, now);
    let out = Outcome {
        decision: apply_holds(d, &base.holds, &[], policy),
        member: None,
        reads_wanted: Vec::new(),
        basis: Basis::None,
    };
    if out.decision.rule == Rule::RecoveryNeedsPowerOn {
        return recovered_unread(base, out, policy);
    }
    maybe_confirmed(base, out, policy, now)
}

/// A fenced node that no source maps (fenced on a person's word) is back, Ready on a new
/// boot: that boot is the proof, as there is no machine to read.
fn recovered_unread(base: &NodeFacts, out: Outcome, policy: &Policy) -> Outcome {
    let Some(record) = &base.fence else {
        return out;
    };
    if base.boot_id.is_empty() || base.boot_id == record.boot_id {
        return out;
    }
    let reason = format!(
        "node is Ready on a new boot ({} -> {}); no power source maps it, so the new boot is the proof",
        record.boot_id, base.boot_id
    );
    let decision = if policy.dry_run {
        Decision::new(
            NodeState::Recovering,
            Step::WouldUnfence,
            Rule::DryRun,
            format!("{reason}; dry run: would remove the taint"),
        )
    } else {
        Decision::new(
            NodeState::Recovering,
            Step::Unfence,
            Rule::RecoveredNewBoot,
            reason,
        )
        .guarded(WriteGuard {
            purpose: GuardPurpose::Unfence,
            uid: base.uid.clone(),
            boot_id: base.boot_id.clone(),
            lease_renew_time: None,
            evidence_at: record.at.max(base.ready_seen.unwrap_or(record.at)),
            read_max_age: policy.read_max_age,
            while_ready: false,
            ready_heartbeat: None,
            release_pods: false,
            on_word: false,
        })
    };
    let decision = apply_holds(decision, &base.holds, &[], policy);
    Outcome { decision, ..out }
}

/// Where nothing can answer the power question (no source, or every level silent or
/// unknown), a person's confirmation of the current boot decides; never over an answer.
fn maybe_confirmed(base: &NodeFacts, out: Outcome, policy: &Policy, now: Timestamp) -> Outcome {
    if !matches!(out.decision.rule, Rule::NoPowerSource | Rule::PowerUnknown) {
        return out;
    }
    let Some(c) = &base.confirmation else {
        return out;
    };
    let unread = out.decision.reason.clone();
    let decision = match confirmation::standing(c, base) {
        Standing::Void(why) => Decision {
            reason: format!("{unread}; a person's confirmation does not stand: {why}"),
            ..out.decision
        },
        Standing::Stands => {
            let what_now = if policy.release_at_attestation {
                format!(
                    "{}, then force-delete its pods (release_at_attestation)",
                    policy.action
                )
            } else {
                policy.action.to_string()
            };
            let evidence = format!("no source can answer ({unread}); {}", c.describe());
            if policy.dry_run {
                Decision::new(
                    NodeState::Confirming,
                    Step::WouldFence(policy.action),
                    Rule::DryRun,
                    format!("{evidence}; dry run: would {what_now}, writing nothing"),
                )
            } else {
                Decision::new(
                    NodeState::Confirming,
                    Step::Fence(policy.action),
                    Rule::ConfirmedOffByPerson,
                    format!("{evidence}: {what_now}"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::Fence,
                    uid: base.uid.clone(),
                    boot_id: base.boot_id.clone(),
                    lease_renew_time: base.lease_renew_time,
                    evidence_at: now,
                    read_max_age: policy.read_max_age,
                    while_ready: false,
                    ready_heartbeat: None,
                    release_pods: policy.release_at_attestation,
                    on_word: true,
                })
            }
        }
    };
    let standing = matches!(decision.step, Step::Fence(_) | Step::WouldFence(_));
    let decision = if standing {
        let holds = super::Holds {
            fence: base.holds.fence_on_word.clone(),
            ..base.holds.clone()
        };
        apply_holds(decision, &holds, &[], policy)
    } else {
        decision
    };
    Outcome {
        basis: if standing { Basis::Person } else { out.basis },
        member: if standing { None } else { out.member },
        decision,
        ..out
    }
}

/// A node of one source (or none), as the daemon maps it today: [`decide_levels`] with that
/// source alone at level 1.
pub fn decide_one(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Outcome {
    if !facts.has_power_source {
        return decide_levels(facts, &[], policy, now);
    }
    let member = Member {
        level: 1,
        label: "its power source".into(),
        attested: facts.identity_check == crate::identity::IdentityCheck::Checked,
        facts: facts.clone(),
        reads,
    };
    decide_levels(facts, &[member], policy, now)
}
