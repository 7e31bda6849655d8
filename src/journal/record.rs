//! The record format: one JSON line per action taken or refused, with the inputs it was
//! decided on (the node's facts, its recent power reads, its identity and fence).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::decision::PowerReading;
use crate::decision::{NodeFacts, Readiness, Rule};

/// What kind of entry a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// oobfence wrote to the cluster (or tried to): taint, untaint, delete_node, clear_record.
    Action,
    /// oobfence refused to act on a NotReady node, or kept a fence a human must look at.
    Refusal,
    /// Dry run: everything said act, nothing was written.
    DryRun,
    /// Something oobfence saw after acting: the fenced node's volumes were released.
    Observation,
    /// A change in the daemon's own state, not a decision about a node: a pause, a reload, a
    /// leadership change, a storm or freeze beginning or ending, a budget spent (`change`).
    Daemon,
}

impl RecordKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Action => "action",
            RecordKind::Refusal => "refusal",
            RecordKind::DryRun => "dry_run",
            RecordKind::Observation => "observation",
            RecordKind::Daemon => "daemon",
        }
    }

    /// Whether the writer calls `fsync` after it: actions, and the daemon's changes (few, one
    /// per transition, and what the morning after reconstructs the night from).
    pub fn synced(self) -> bool {
        matches!(self, RecordKind::Action | RecordKind::Daemon)
    }
}

/// One journal line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When the record was made.
    pub ts: Timestamp,
    pub datacenter: String,
    pub node: String,
    /// The Node object's uid the decision was about (a node re-registered under the same name
    /// has another one).
    #[serde(default)]
    pub uid: String,
    pub kind: RecordKind,
    /// The Kubernetes Event reason emitted with it (`OobfenceFenced`, `OobfenceBlocked`...);
    /// empty when no Event goes with the record.
    #[serde(default)]
    pub event: String,
    /// The decision rule (`confirmed-off`, `power-unknown`...).
    pub rule: String,
    /// `taint`, `untaint`, `delete_node`, `clear_record`, or `none` for a refusal.
    pub action: String,
    /// `success`, `failure`, `refused`, `not_written` (dry run) or `observed`.
    pub result: String,
    /// The same human sentence the Event carries.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub inputs: Inputs,
    /// A daemon record's details (kind `daemon`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<super::Change>,
    /// `[ha]`: the Lease term (leaseTransitions) this instance held when it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_term: Option<i32>,
    /// SHA-256 of the config file text the daemon was started with.
    pub config_digest: String,
    /// oobfence version that wrote the record.
    pub version: String,
}

/// What the decision was made on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    /// `Ready`, `NotReady` or `NoCondition`.
    pub ready: String,
    #[serde(default)]
    pub not_ready_since: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the node's Lease renewed.
    #[serde(default)]
    pub lease_renewed: Option<Timestamp>,
    /// The Lease's renewTime as the kubelet wrote it (the kubelet's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_renew_time: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the kubelet post a new Ready heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_seen: Option<Timestamp>,
    /// The node's identity and the last verification of its machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityInput>,
    #[serde(default)]
    pub boot_id: String,
    /// oobfence's fence record on the node at decision time.
    #[serde(default)]
    pub fence: Option<FenceInput>,
    /// `backend address` of the node's power source; none when the config maps none.
    #[serde(default)]
    pub power_source: Option<String>,
    /// The node's recent power reads, oldest first.
    #[serde(default)]
    pub reads: Vec<ReadInput>,
    /// VolumeAttachments pointing at the node (when fencing: at fence time). `None` when the
    /// VolumeAttachment watch was not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_attachments: Option<Vec<String>>,
    /// For a write: when it was decided and started (oobfence's clock); the record's `ts` is
    /// when it landed, so the difference is the API server's part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Timestamp>,
    /// The fencing level whose reads the decision rests on, where it rests on reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<u32>,
    /// What a fence rests on: `attested` reads, `unattested` ones (a level that proves only
    /// the mapping the config wrote), a `person`'s confirmation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// A person's confirmation that the machine is off, on the Node when this was decided:
    /// who, why, for which boot (whether or not the decision rests on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_off: Option<ConfirmationInput>,
}

/// A person's confirmation as the journal keeps it (`oobfence.io/confirmed-off`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmationInput {
    /// As the person gave it; empty when not given (the API server's audit log names who
    /// wrote the annotation).
    #[serde(default)]
    pub by: String,
    pub reason: String,
    pub boot_id: String,
    /// When it was made, as far as oobfence can tell (the writer's time, never after oobfence
    /// first saw it).
    pub at: Timestamp,
    /// When oobfence first saw it.
    pub seen: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityInput {
    /// `status.nodeInfo.systemUUID`.
    pub system_uuid: String,
    pub addresses: Vec<String>,
    /// `checked` or `unchecked`.
    pub check: String,
    /// The last verification: `match: ...`, `mismatch: ...`, `unverifiable: ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Timestamp>,
    /// Who answered the read that verified it (a "gone" answer counts only through it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_through: Option<String>,
    /// Other Nodes that report the same system UUID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uuid_shared_with: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceInput {
    pub at: Timestamp,
    pub boot_id: String,
    pub taint_present: bool,
}

/// One power read as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadInput {
    /// When the read started (what it says was true no later than that); the answer came
    /// `latency_seconds` later.
    pub at: Timestamp,
    /// `on`, `off`, `transitional` or `error`.
    pub value: String,
    /// The full answer as oobfence understood it (`Off`, `transitional (PoweringOff)`,
    /// `error: timeout: no answer within 7s`).
    pub raw: String,
    pub latency_seconds: f64,
    /// Extra evidence the power source reported with the state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// What the machine that answered says it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// Who answered: the source, where it asked and as whom.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reader: String,
    /// The system's power draw read beside an Off, where the entry asks for that witness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_draw: Option<String>,
}

impl From<&PowerReading> for ReadInput {
    fn from(r: &PowerReading) -> Self {
        ReadInput {
            at: r.at,
            value: r.state.label().to_string(),
            raw: r.state.to_string(),
            latency_seconds: r.latency.as_secs_f64(),
            details: r.details.iter().map(ToString::to_string).collect(),
            identity: r.identity.to_string(),
            reader: r.reader.clone(),
            power_draw: r.power_draw.as_ref().map(ToString::to_string),
        }
    }
}

/// Power reads a record keeps, newest last: enough for any confirmation run.
const READS_RECORDED: usize = 8;

impl Inputs {
    /// The inputs of a decision about one node.
    pub fn new(
        facts: &NodeFacts,
        reads: &[PowerReading],
        power_source: Option<String>,
        volume_attachments: Option<Vec<String>>,
    ) -> Inputs {
        let (ready, not_ready_since) = match facts.readiness {
            Readiness::Ready => ("Ready", None),
            Readiness::NotReady { since } => ("NotReady", Some(since)),
            Readiness::NoCondition => ("NoCondition", None),
        };
        Inputs {
            ready: ready.to_string(),
            not_ready_since,
            lease_renewed: facts.lease_renewal_seen,
            lease_renew_time: facts.lease_renew_time,
            heartbeat_seen: facts.heartbeat_seen,
            identity: Some(IdentityInput {
                system_uuid: facts.identity.system_uuid.clone(),
                addresses: facts.identity.addresses.clone(),
                check: match facts.identity_check {
                    crate::identity::IdentityCheck::Checked => "checked",
                    crate::identity::IdentityCheck::Unchecked => "unchecked",
                }
                .into(),
                verdict: facts
                    .identity_binding
                    .as_ref()
                    .map(|b| b.verdict.to_string()),
                verified_at: facts.identity_binding.as_ref().map(|b| b.at),
                verified_through: facts.identity_binding.as_ref().map(|b| b.reader.clone()),
                uuid_shared_with: facts.identity.uuid_shared_with.clone(),
            }),
            boot_id: facts.boot_id.clone(),
            fence: facts.fence.as_ref().map(|f| FenceInput {
                at: f.at,
                boot_id: f.boot_id.clone(),
                taint_present: f.taint_present,
            }),
            power_source,
            reads: reads
                .iter()
                .skip(reads.len().saturating_sub(READS_RECORDED))
                .map(ReadInput::from)
                .collect(),
            volume_attachments,
            decided_at: None,
            confirmed_off: facts.confirmation.as_ref().map(|c| ConfirmationInput {
                by: c.note.by.clone(),
                reason: c.note.reason.clone(),
                boot_id: c.note.boot_id.clone(),
                at: c.made_at(),
                seen: c.seen,
            }),
            level: None,
            basis: None,
        }
    }
}

/// The refusal a node is in after a decision with `rule`, given the one it was in: a refusal
/// (power on, unknown or transitional, no power source, a live kubelet, a same-bootID return)
/// holds while the daemon only waits for its next read, so that one episode is one journal
/// record and one Event, and the blocked metrics do not flap between re-reads.
pub fn refusal(rule: Rule, previous: Option<Rule>) -> Option<Rule> {
    match rule {
        Rule::PowerOn
        | Rule::PowerUnknown
        | Rule::PowerTransitional
        | Rule::PowerSuspended
        | Rule::NoPowerSource
        | Rule::OptedOut
        | Rule::Flapping
        | Rule::OtherRemediator
        | Rule::RegionMismatch
        | Rule::SharedMachine
        | Rule::IdentityMismatch
        | Rule::OffWhileAlive
        | Rule::GoneWhileAlive
        | Rule::IdentityUnverified
        | Rule::ReaderChanged
        | Rule::DuplicateSystemUuid
        | Rule::OffUncorroborated
        | Rule::LeaseRenewedRecently
        | Rule::RecoveredSameBootId
        | Rule::Paused
        | Rule::StaleView
        | Rule::SelfPartition
        | Rule::Storm
        | Rule::StormCooldown
        | Rule::FenceBudget => Some(rule),
        Rule::StalePowerRead | Rule::AwaitingPowerRead | Rule::RecoveryNeedsPowerOn => previous,
        _ => None,
    }
}
