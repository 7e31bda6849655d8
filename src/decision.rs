//! The decision core: why a node is (or is not) fenced, in one pure function.
//!
//! `decide(facts, reads, policy, now) -> Decision`. No I/O, no clock: time is passed in, so every
//! rule is a plain unit test. The daemon turns the decision's [`Step`] into API calls; `oobfence
//! why` shows the [`Rule`] that produced it. A new guard is a new fact and a new rule here,
//! never a special case elsewhere.
//!
//! The one path to [`Step::Fence`]: the node is NotReady for at least `not_ready_grace`, oobfence
//! has seen no renewal of its Lease for that long (by its own clock), its power source is
//! configured in the config file and maps to no other node's machine, and the last
//! `confirm_reads` reads all said Off, spaced at least `confirm_interval` apart, with the newest
//! no older than `read_max_age` — each from a machine that proved it is the node's machine
//! ([`crate::identity`]) — and `dry_run` is off. A cloud instance that is terminated or unknown
//! gets `on_terminated` instead of `action`, only after a streak of such answers alone (an
//! unknown one needs at least two), from a region and account that once knew the instance as
//! this node's. Everything else waits, re-reads, or refuses.
//!
//! A decision to write carries a [`WriteGuard`]: what it was based on. The writer checks it on
//! the fresh GET right before the write ([`recheck`]) and aborts when anything moved.

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::identity::{self, IdentityCheck, NodeIdentity, Verdict};
use crate::power::{PowerReading, PowerState};

/// What oobfence does once a machine is proven off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FenceAction {
    /// Add `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`.
    Taint,
    /// Delete the Node object (what managed clusters do when an instance is gone).
    DeleteNode,
}

impl fmt::Display for FenceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FenceAction::Taint => "taint",
            FenceAction::DeleteNode => "delete-node",
        })
    }
}

/// The `[policy]` knobs the core needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub not_ready_grace: Duration,
    pub confirm_reads: u32,
    pub confirm_interval: Duration,
    /// The newest Off read must be at most this old when acting.
    pub read_max_age: Duration,
    /// How often to re-read a machine that reads On or whose BMC fails.
    pub recheck_interval: Duration,
    pub action: FenceAction,
    /// What to do when the cloud says the instance is gone (terminated / not found).
    pub on_terminated: FenceAction,
    pub untaint_on_recovery: bool,
    pub dry_run: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            not_ready_grace: Duration::from_secs(60),
            confirm_reads: 2,
            confirm_interval: Duration::from_secs(5),
            read_max_age: Duration::from_secs(30),
            recheck_interval: Duration::from_secs(30),
            action: FenceAction::Taint,
            on_terminated: FenceAction::DeleteNode,
            untaint_on_recovery: true,
            dry_run: false,
        }
    }
}

/// The node's Ready condition as the core sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "ready", rename_all = "snake_case")]
pub enum Readiness {
    Ready,
    /// Ready=False or Ready=Unknown, since the condition's lastTransitionTime.
    NotReady {
        since: Timestamp,
    },
    /// No Ready condition at all (a node that never reported).
    NoCondition,
}

/// What oobfence recorded on the node when it fenced it (annotations under `oobfence.io/`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FenceRecord {
    pub at: Timestamp,
    /// `status.nodeInfo.bootID` at fence time: the node must come back with another one.
    pub boot_id: String,
    /// Whether the out-of-service taint oobfence added is still on the node.
    pub taint_present: bool,
    /// `oobfence.io/fenced-by` names this daemon (datacenter and host). A fence placed by another
    /// datacenter's or host's oobfence is never lifted nor adopted here.
    pub ours: bool,
}

/// Why the config's mapping for this node cannot be trusted, whatever its machine says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "conflict", content = "detail", rename_all = "snake_case")]
pub enum MappingConflict {
    /// The zone in the node's providerID is not in the region oobfence reads: an instance of
    /// another region is simply absent from the answer, which must never read as "gone".
    RegionMismatch(String),
    /// Another Node resolves to the same machine: its being off cannot tell which node is dead.
    SharedMachine(String),
}

impl fmt::Display for MappingConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappingConflict::RegionMismatch(d) => write!(f, "region mismatch: {d}"),
            MappingConflict::SharedMachine(d) => write!(f, "shared machine: {d}"),
        }
    }
}

/// The last identity verification of the node's machine from a read, made while it was healthy
/// or since: proof that the power source knows this node's machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdentityBinding {
    pub at: Timestamp,
    pub verdict: Verdict,
}

/// Everything the core knows about one node, read from the cluster and the config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    pub uid: String,
    pub readiness: Readiness,
    /// When oobfence (by its own clock) last saw the node's Lease renewTime change; the first
    /// sighting counts as a renewal, as in the node lifecycle controller. `None`: no Lease.
    pub lease_renewal_seen: Option<Timestamp>,
    /// The Lease's renewTime as the kubelet wrote it (the kubelet's clock): only ever compared
    /// for equality, at write time.
    pub lease_renew_time: Option<Timestamp>,
    pub boot_id: String,
    pub being_deleted: bool,
    /// oobfence's fence record, if an oobfence fenced this node.
    pub fence: Option<FenceRecord>,
    /// An out-of-service taint that no oobfence placed.
    pub foreign_out_of_service: bool,
    /// The config file maps this node to a power source.
    pub has_power_source: bool,
    pub mapping_conflict: Option<MappingConflict>,
    /// What the kubelet reported about its machine (system UUID, addresses).
    pub identity: NodeIdentity,
    pub identity_check: IdentityCheck,
    /// The last identity verification from a read, if any.
    pub identity_binding: Option<IdentityBinding>,
}

/// Where a node stands, for `why`, `/nodes` and the `node_state` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Healthy,
    /// NotReady, still within the grace period.
    Suspect,
    /// Reading power and collecting Off confirmations.
    Confirming,
    /// NotReady but fencing is refused (power on, unknown, no power source...).
    Blocked,
    Fenced,
    /// Fenced and Ready again; waiting for the proof needed to lift the fence.
    Recovering,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Healthy => "healthy",
            NodeState::Suspect => "suspect",
            NodeState::Confirming => "confirming",
            NodeState::Blocked => "blocked",
            NodeState::Fenced => "fenced",
            NodeState::Recovering => "recovering",
        }
    }
}

/// What a write was decided on. The writer re-checks it on a fresh GET right before the write
/// (see [`recheck`]): the cache the decision used may be seconds old, and the GET, the PATCH
/// and retries after a 409 take more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteGuard {
    pub purpose: GuardPurpose,
    pub uid: String,
    /// The bootID the reads were taken against (fence), or the new one seen Ready (unfence).
    pub boot_id: String,
    /// The Lease renewTime the decision saw (fence only: it must not have moved).
    pub lease_renew_time: Option<Timestamp>,
    /// The newest read behind the decision (Off or gone for a fence, On for an unfence): it
    /// must still be within `read_max_age` at write time.
    pub evidence_at: Timestamp,
    pub read_max_age: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardPurpose {
    Fence,
    Unfence,
}

/// The node as a fresh GET (and, for a fence, a fresh GET of its Lease) shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreshNode {
    pub uid: String,
    pub readiness: Readiness,
    pub boot_id: String,
    pub lease_renew_time: Option<Timestamp>,
    /// The fence record on it, if any.
    pub fence: Option<FenceRecord>,
}

/// Whether a write decided under `guard` may still go ahead on the node as freshly read, at
/// `now` (taken right before the write). `Err` says what moved; the write is then abandoned and
/// the node decided again from scratch.
pub fn recheck(guard: &WriteGuard, fresh: &FreshNode, now: Timestamp) -> Result<(), String> {
    if fresh.uid != guard.uid {
        return Err(format!(
            "the Node now has uid {}, not the {} the decision was about (deleted and re-created)",
            fresh.uid, guard.uid
        ));
    }
    if fresh.boot_id != guard.boot_id {
        return Err(format!(
            "the Node's bootID changed from {:?} to {:?} since the decision: the machine booted",
            guard.boot_id, fresh.boot_id
        ));
    }
    let age = elapsed(guard.evidence_at, now);
    if age > guard.read_max_age {
        return Err(format!(
            "the newest power read behind the decision is {} old at write time (max {})",
            secs(age),
            secs(guard.read_max_age)
        ));
    }
    match guard.purpose {
        GuardPurpose::Fence => {
            if fresh.readiness == Readiness::Ready {
                return Err("the Node is Ready again on a fresh read".into());
            }
            if fresh.lease_renew_time != guard.lease_renew_time {
                return Err(format!(
                    "the kubelet renewed its Lease since the decision ({} -> {}): something on the machine is alive",
                    show_time(guard.lease_renew_time),
                    show_time(fresh.lease_renew_time)
                ));
            }
        }
        GuardPurpose::Unfence => {
            if fresh.readiness != Readiness::Ready {
                return Err("the Node is not Ready on a fresh read".into());
            }
            match &fresh.fence {
                None => return Err("the Node carries no oobfence record any more".into()),
                Some(r) if !r.ours => {
                    return Err(
                        "the fence on the Node was placed by another oobfence (oobfence.io/fenced-by); it is not this daemon's to lift".into(),
                    );
                }
                Some(r) if r.boot_id == fresh.boot_id || fresh.boot_id.is_empty() => {
                    return Err(format!(
                        "the Node's bootID {:?} is the one recorded at fence time",
                        fresh.boot_id
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

fn show_time(t: Option<Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_else(|| "none".into())
}

/// What the daemon should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "step", content = "action", rename_all = "snake_case")]
pub enum Step {
    Idle,
    /// Apply the fence.
    Fence(FenceAction),
    /// Dry run: everything says fence, nothing is written.
    WouldFence(FenceAction),
    /// Remove oobfence's taint and annotations.
    Unfence,
    /// Dry run: everything says unfence, nothing is written.
    WouldUnfence,
    /// oobfence's annotations are on the node but its taint is gone (removed by someone else):
    /// drop the stale record.
    ClearRecord,
}

/// The rule that produced a decision. Its name is stable: it shows in `why`, logs, Events and
/// the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    NodeBeingDeleted,
    NodeReady,
    NoReadyCondition,
    NotReadyGrace,
    ForeignOutOfServiceTaint,
    NoPowerSource,
    RegionMismatch,
    SharedMachine,
    IdentityMismatch,
    IdentityUnverified,
    LeaseRenewedRecently,
    AwaitingPowerRead,
    StalePowerRead,
    PowerOn,
    PowerTransitional,
    PowerSuspended,
    PowerUnknown,
    ConfirmingOff,
    ConfirmedOff,
    ConfirmedGone,
    DryRun,
    FencedAwaitingRecovery,
    FencedByAnother,
    FenceRemovedExternally,
    UntaintDisabled,
    RecoveryNeedsPowerOn,
    RecoveredSameBootId,
    RecoveredNewBoot,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::NodeBeingDeleted => "node-being-deleted",
            Rule::NodeReady => "node-ready",
            Rule::NoReadyCondition => "no-ready-condition",
            Rule::NotReadyGrace => "not-ready-grace",
            Rule::ForeignOutOfServiceTaint => "foreign-out-of-service-taint",
            Rule::NoPowerSource => "no-power-source",
            Rule::RegionMismatch => "region-mismatch",
            Rule::SharedMachine => "shared-machine",
            Rule::IdentityMismatch => "identity-mismatch",
            Rule::IdentityUnverified => "identity-unverified",
            Rule::LeaseRenewedRecently => "lease-renewed-recently",
            Rule::AwaitingPowerRead => "awaiting-power-read",
            Rule::StalePowerRead => "stale-power-read",
            Rule::PowerOn => "power-on",
            Rule::PowerTransitional => "power-transitional",
            Rule::PowerSuspended => "power-suspended",
            Rule::PowerUnknown => "power-unknown",
            Rule::ConfirmingOff => "confirming-off",
            Rule::ConfirmedOff => "confirmed-off",
            Rule::ConfirmedGone => "confirmed-gone",
            Rule::DryRun => "dry-run",
            Rule::FencedAwaitingRecovery => "fenced-awaiting-recovery",
            Rule::FencedByAnother => "fenced-by-another",
            Rule::FenceRemovedExternally => "fence-removed-externally",
            Rule::UntaintDisabled => "untaint-disabled",
            Rule::RecoveryNeedsPowerOn => "recovery-needs-power-on",
            Rule::RecoveredSameBootId => "recovered-same-boot-id",
            Rule::RecoveredNewBoot => "recovered-new-boot",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of [`decide`]: what to do, which rule said so, and a sentence for humans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub state: NodeState,
    pub step: Step,
    pub rule: Rule,
    pub reason: String,
    /// Read the power state at or after this time (none: no read wanted).
    pub next_read_at: Option<Timestamp>,
    /// For [`Step::Fence`] and [`Step::Unfence`]: what the writer must re-check.
    pub guard: Option<WriteGuard>,
}

impl Decision {
    fn new(state: NodeState, step: Step, rule: Rule, reason: impl Into<String>) -> Self {
        Decision {
            state,
            step,
            rule,
            reason: reason.into(),
            next_read_at: None,
            guard: None,
        }
    }

    fn guarded(mut self, guard: WriteGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    fn read_at(mut self, at: Timestamp) -> Self {
        self.next_read_at = Some(at);
        self
    }
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX))
        .unwrap_or(Timestamp::MAX)
}

/// How long from `earlier` to `later`; zero if `later` is not after `earlier` (clock skew).
fn elapsed(earlier: Timestamp, later: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

fn secs(d: Duration) -> String {
    let d = Duration::from_secs(d.as_secs());
    humantime::format_duration(d).to_string()
}

/// Decides what to do about one node. `reads` are this node's power reads in time order, all
/// taken since the node was last seen Ready (the daemon drops them whenever it is).
pub fn decide(
    facts: &NodeFacts,
    reads: &[PowerReading],
    policy: &Policy,
    now: Timestamp,
) -> Decision {
    use NodeState as S;

    if facts.being_deleted {
        return Decision::new(
            S::Healthy,
            Step::Idle,
            Rule::NodeBeingDeleted,
            "the Node is being deleted; nothing to do",
        );
    }

    if let Some(record) = &facts.fence {
        return decide_fenced(facts, record, reads, policy, now);
    }

    let since = match facts.readiness {
        Readiness::Ready => {
            return Decision::new(S::Healthy, Step::Idle, Rule::NodeReady, "node is Ready");
        }
        Readiness::NoCondition => {
            return Decision::new(
                S::Suspect,
                Step::Idle,
                Rule::NoReadyCondition,
                "node has no Ready condition yet; nothing is decided about a node that never reported",
            );
        }
        Readiness::NotReady { since } => since,
    };

    if facts.foreign_out_of_service {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::ForeignOutOfServiceTaint,
            "node already carries an out-of-service taint that oobfence did not place; leaving it alone",
        );
    }

    let not_ready_for = elapsed(since, now);
    if not_ready_for < policy.not_ready_grace {
        return Decision::new(
            S::Suspect,
            Step::Idle,
            Rule::NotReadyGrace,
            format!(
                "NotReady for {} of the {} grace period; no power read yet",
                secs(not_ready_for),
                secs(policy.not_ready_grace)
            ),
        );
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

    if let Some(seen) = facts.lease_renewal_seen {
        let age = elapsed(seen, now);
        if age < policy.not_ready_grace {
            return Decision::new(
                S::Blocked,
                Step::Idle,
                Rule::LeaseRenewedRecently,
                format!(
                    "oobfence saw the kubelet renew its Lease {} ago (less than the {} grace): something on the machine is alive",
                    secs(age),
                    secs(policy.not_ready_grace)
                ),
            );
        }
    }

    // The daemon drops a node's reads whenever it sees it Ready, so every read here was taken
    // during this NotReady period (by oobfence's clock, never compared with the node's).
    let Some(last) = reads.last() else {
        return Decision::new(
            S::Confirming,
            Step::Idle,
            Rule::AwaitingPowerRead,
            format!("NotReady for {}; reading power", secs(not_ready_for)),
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
        PowerState::On => Decision::new(
            S::Blocked,
            Step::Idle,
            Rule::PowerOn,
            "NotReady but the power source says On: likely a partition or a hung OS, not a dead machine; never fenced",
        )
        .read_at(plus(last.at, policy.recheck_interval)),
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
                if let Err(why) = identity_counts(facts, r) {
                    return Decision::new(
                        S::Blocked,
                        Step::Idle,
                        Rule::IdentityUnverified,
                        format!(
                            "the {} read at {} cannot be tied to this node's machine: {why}; set identity = \"unchecked\" on the entry only for machines that cannot report one",
                            r.state,
                            r.at.strftime("%Y-%m-%dT%H:%M:%SZ")
                        ),
                    )
                    .read_at(plus(last.at, policy.recheck_interval));
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
                "NotReady for {}, {confirmed} consecutive {what} reads spaced at least {} apart from the node's machine ({}), newest {} old ({})",
                secs(not_ready_for),
                secs(policy.confirm_interval),
                identity_summary(facts, last),
                secs(age),
                last.state
            );
            if policy.dry_run {
                Decision::new(
                    S::Confirming,
                    Step::WouldFence(action),
                    Rule::DryRun,
                    format!("{evidence}; dry run: would {action}, writing nothing"),
                )
            } else {
                Decision::new(
                    S::Confirming,
                    Step::Fence(action),
                    rule,
                    format!("{evidence}: {action}"),
                )
                .guarded(WriteGuard {
                    purpose: GuardPurpose::Fence,
                    uid: facts.uid.clone(),
                    boot_id: facts.boot_id.clone(),
                    lease_renew_time: facts.lease_renew_time,
                    evidence_at: last.at,
                    read_max_age: policy.read_max_age,
                })
            }
        }
    }
}

/// How a read's machine compares with the node's.
fn identity_of(facts: &NodeFacts, r: &PowerReading) -> Verdict {
    identity::verify(&facts.identity, &r.identity)
}

/// Whether a read may count towards a fence (or an unfence): its machine proved it is the
/// node's; or, for "gone" (an instance that no longer exists reports no addresses), the same
/// power source proved it knew this node's machine earlier; or the entry says
/// `identity = "unchecked"`. A mismatch never counts, checked or not.
fn identity_counts(facts: &NodeFacts, r: &PowerReading) -> Result<(), String> {
    match identity_of(facts, r) {
        Verdict::Match(_) => Ok(()),
        Verdict::Mismatch(d) => Err(d),
        Verdict::Unverifiable(_) if facts.identity_check == IdentityCheck::Unchecked => Ok(()),
        Verdict::Unverifiable(d) => {
            if r.state.is_gone()
                && let Some(b) = &facts.identity_binding
                && b.verdict.is_match()
            {
                return Ok(());
            }
            if r.state.is_gone() {
                Err(format!(
                    "{d}, and this region and account never answered for the node's machine, so \"gone\" may only mean \"not ours\""
                ))
            } else {
                Err(d)
            }
        }
    }
}

fn identity_summary(facts: &NodeFacts, r: &PowerReading) -> String {
    match identity_of(facts, r) {
        Verdict::Match(d) => d,
        _ if facts.identity_check == IdentityCheck::Unchecked => {
            "identity unchecked by configuration".into()
        }
        _ => match &facts.identity_binding {
            Some(b) if b.verdict.is_match() => format!(
                "{}, verified {}",
                b.verdict.detail(),
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
            _ => "identity unverified".into(),
        },
    }
}

/// The reads that confirm the newest one: walking back from the newest, reads of the same kind
/// (Off, or gone: terminated / not found), each at least `interval` older than the previous
/// counted one; a read of that kind closer than that is skipped, and any other read ends the
/// streak.
fn confirming_streak(reads: &[PowerReading], gone: bool, interval: Duration) -> Vec<&PowerReading> {
    let mut streak: Vec<&PowerReading> = Vec::new();
    for r in reads.iter().rev() {
        let same_kind = if gone {
            r.state.is_gone()
        } else {
            r.state == PowerState::Off
        };
        if !same_kind {
            break;
        }
        match streak.last() {
            Some(prev) if elapsed(r.at, prev.at) < interval => continue,
            _ => streak.push(r),
        }
    }
    streak
}

fn decide_fenced(
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
    if !record.taint_present {
        return Decision::new(
            S::Healthy,
            Step::ClearRecord,
            Rule::FenceRemovedExternally,
            "oobfence's out-of-service taint was removed by someone else; dropping its fence record",
        );
    }
    if facts.readiness != Readiness::Ready {
        return Decision::new(
            S::Fenced,
            Step::Idle,
            Rule::FencedAwaitingRecovery,
            format!(
                "fenced at {}; waiting for the node to return Ready",
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
    if let Err(why) = identity_counts(facts, on) {
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
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::MachineIdentity;
    use crate::power::ReadErrorKind;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    const UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";
    const OTHER_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e33";

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
            boot_id: "boot-a".into(),
            being_deleted: false,
            fence: None,
            foreign_out_of_service: false,
            has_power_source: true,
            mapping_conflict: None,
            identity: NodeIdentity {
                system_uuid: UUID.to_uppercase(),
                addresses: vec!["10.0.0.5".into()],
            },
            identity_check: IdentityCheck::Checked,
            identity_binding: None,
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

    fn policy() -> Policy {
        Policy::default() // grace 60s, 2 reads, 5s apart, max age 30s
    }

    #[test]
    fn ready_node_is_healthy_and_never_read() {
        let facts = NodeFacts {
            readiness: Readiness::Ready,
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
        let d = decide(&dead(), &[off(10), off(20)], &policy(), t(59));
        assert_eq!((d.step, d.rule), (Step::Idle, Rule::NotReadyGrace));
        assert_eq!(d.next_read_at, None);
        assert_eq!(d.state, NodeState::Suspect);
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
            ..dead()
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
        assert_eq!(recheck(&g, &fresh_like(&g), t(70)), Ok(()));
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
            let e = recheck(&g, &fresh, now).expect_err(what);
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
        assert_eq!(recheck(&g, &ok, t(160)), Ok(()));
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
            let e = recheck(&g, &fresh, now).expect_err(what);
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
                    for now_offset in [0i64, 10, 31] {
                        let now = t(60 + len.saturating_sub(1) as i64 * gap + now_offset);
                        let d = decide(&dead(), &reads, &p, now);
                        checked += 1;
                        if let Step::Fence(_) = d.step {
                            fences += 1;
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
        assert!(checked > 3000, "{checked}");
        assert!(
            fences > 0,
            "the property never saw a fence: the generator is wrong"
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
                                    run.iter().all(|r| matching(r))
                                        || facts.identity_binding.is_some(),
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
}
