//! What [`decide`](super::decide) answers: the node's state, the step to take, the rule that
//! said so (its name shows in `why`, logs, Events and the journal), and the decision carrying them.

use super::*;

/// Where a node stands, for `why`, `/nodes` and the `node_state` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Healthy,
    /// NotReady, still within the grace period; or Ready with a stale Lease, its power read
    /// ahead of NotReady (pre-attestation).
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
    /// Opt-in actuation: power off a hung node's machine (it reads On, its kubelet silent for
    /// `[actuation] after`); the fence follows on the Off reads, by the rules above.
    PowerOff,
    /// Dry run: everything says power off, nothing is sent.
    WouldPowerOff,
    /// Opt-in actuation: power on again the machine oobfence powered off, once fenced.
    PowerOn,
    /// Dry run: everything says power on, nothing is sent.
    WouldPowerOn,
}

impl Step {
    /// Whether carrying it out writes: to a Node (a fence, which may release its pods; an
    /// unfence; a record cleared) or to a machine's power.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Step::Fence(_) | Step::Unfence | Step::ClearRecord | Step::PowerOff | Step::PowerOn
        )
    }
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
    OtherRemediator,
    OptedOut,
    Flapping,
    NoPowerSource,
    RegionMismatch,
    SharedMachine,
    IdentityMismatch,
    OffWhileAlive,
    GoneWhileAlive,
    IdentityUnverified,
    ReaderChanged,
    DuplicateSystemUuid,
    OffUncorroborated,
    LeaseRenewedRecently,
    PreAttested,
    AwaitingPowerRead,
    StalePowerRead,
    PowerOn,
    PowerTransitional,
    PowerSuspended,
    PowerUnknown,
    ConfirmingOff,
    ConfirmedOff,
    ConfirmedGone,
    ConfirmedOffByPerson,
    DryRun,
    FencedAwaitingRecovery,
    FencedByAnother,
    FenceRemovedExternally,
    UntaintDisabled,
    RecoveryNeedsPowerOn,
    RecoveredSameBootId,
    RecoveredNewBoot,
    Paused,
    StaleView,
    SelfPartition,
    Storm,
    StormCooldown,
    FenceBudget,
    Standby,
    WaitingToActuate,
    PoweringOff,
    PoweredOffConfirming,
    PowerOffIgnored,
    PoweringOn,
    PowerBudget,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::NodeBeingDeleted => "node-being-deleted",
            Rule::NodeReady => "node-ready",
            Rule::NoReadyCondition => "no-ready-condition",
            Rule::NotReadyGrace => "not-ready-grace",
            Rule::ForeignOutOfServiceTaint => "foreign-out-of-service-taint",
            Rule::OtherRemediator => "other-remediator",
            Rule::OptedOut => "opted-out",
            Rule::Flapping => "flapping",
            Rule::NoPowerSource => "no-power-source",
            Rule::RegionMismatch => "region-mismatch",
            Rule::SharedMachine => "shared-machine",
            Rule::IdentityMismatch => "identity-mismatch",
            Rule::OffWhileAlive => "off-while-alive",
            Rule::GoneWhileAlive => "gone-while-alive",
            Rule::IdentityUnverified => "identity-unverified",
            Rule::ReaderChanged => "reader-changed",
            Rule::DuplicateSystemUuid => "duplicate-system-uuid",
            Rule::OffUncorroborated => "off-uncorroborated",
            Rule::LeaseRenewedRecently => "lease-renewed-recently",
            Rule::PreAttested => "pre-attested",
            Rule::AwaitingPowerRead => "awaiting-power-read",
            Rule::StalePowerRead => "stale-power-read",
            Rule::PowerOn => "power-on",
            Rule::PowerTransitional => "power-transitional",
            Rule::PowerSuspended => "power-suspended",
            Rule::PowerUnknown => "power-unknown",
            Rule::ConfirmingOff => "confirming-off",
            Rule::ConfirmedOff => "confirmed-off",
            Rule::ConfirmedGone => "confirmed-gone",
            Rule::ConfirmedOffByPerson => "confirmed-off-by-person",
            Rule::DryRun => "dry-run",
            Rule::FencedAwaitingRecovery => "fenced-awaiting-recovery",
            Rule::FencedByAnother => "fenced-by-another",
            Rule::FenceRemovedExternally => "fence-removed-externally",
            Rule::UntaintDisabled => "untaint-disabled",
            Rule::RecoveryNeedsPowerOn => "recovery-needs-power-on",
            Rule::RecoveredSameBootId => "recovered-same-boot-id",
            Rule::RecoveredNewBoot => "recovered-new-boot",
            Rule::Paused => "paused",
            Rule::StaleView => "stale-view",
            Rule::SelfPartition => "self-partition",
            Rule::Storm => "storm",
            Rule::StormCooldown => "storm-cooldown",
            Rule::FenceBudget => "fence-budget",
            Rule::Standby => "standby",
            Rule::WaitingToActuate => "waiting-to-actuate",
            Rule::PoweringOff => "powering-off",
            Rule::PoweredOffConfirming => "powered-off-confirming",
            Rule::PowerOffIgnored => "power-off-ignored",
            Rule::PoweringOn => "powering-on",
            Rule::PowerBudget => "power-budget",
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
    /// When this decision runs out by the clock alone (a grace period ends): decide again then,
    /// not at some later pass. Reads wanted are in `next_read_at`.
    pub decide_again_at: Option<Timestamp>,
    /// For [`Step::Fence`] and [`Step::Unfence`]: what the writer must re-check.
    pub guard: Option<WriteGuard>,
}

impl Decision {
    pub(super) fn new(state: NodeState, step: Step, rule: Rule, reason: impl Into<String>) -> Self {
        Decision {
            state,
            step,
            rule,
            reason: reason.into(),
            next_read_at: None,
            decide_again_at: None,
            guard: None,
        }
    }

    pub(super) fn guarded(mut self, guard: WriteGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    pub(super) fn read_at(mut self, at: Timestamp) -> Self {
        self.next_read_at = Some(at);
        self
    }

    pub(super) fn again_at(mut self, at: Timestamp) -> Self {
        self.decide_again_at = Some(at);
        self
    }
}
