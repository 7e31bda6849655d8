//! The label sets of oobfence's metrics, and the values a label takes where they are a fixed
//! list (every one of them listed from the start, so that a series exists at 0).

use prometheus_client::encoding::EncodeLabelSet;

use crate::decision::{NodeState, Rule};

pub(super) const SCOPE_HOLDS: [&str; 3] = ["storm", "storm-cooldown", "self-partition"];
pub(super) const SCOPE_COUNTS: [&str; 4] =
    ["nodes", "unhealthy", "sources_read", "sources_failing"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    pub node: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeBackendLabels {
    pub node: String,
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeReasonLabels {
    pub node: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeActionLabels {
    pub node: String,
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: &'static str,
    pub result: &'static str,
}

/// A fence that landed: `taint` or `delete_node`; what it rests on: `attested` (power reads
/// of a source that proves whose machine it read), `unattested` (one that cannot: the mapping
/// the config wrote), `person` (a person's confirmation, no source able to answer).
/// The `basis` values of `oobfence_fences_total` (as [`crate::decision::levels::Basis::label`]
/// names them).
pub(super) const FENCE_BASES: [&str; 3] = ["attested", "unattested", "person"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FenceLabels {
    pub action: &'static str,
    pub basis: &'static str,
}

/// A power action (opt-in actuation): `power_off` or `power_on`; `sent`, `refused`, `failure`
/// or `abandoned`; the backend that carried it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PowerActionLabels {
    pub action: &'static str,
    pub result: &'static str,
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WouldActLabels {
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    pub backend: &'static str,
    pub result: &'static str,
    pub error_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentReadLabels {
    pub agent: String,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FailingLabels {
    pub backend: &'static str,
    pub error_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockedLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadyLabels {
    pub ready: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JournalLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeDomainLabels {
    pub node: String,
    /// The value of the node's failure_domain_label.
    pub domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeProblemLabels {
    pub node: String,
    pub problem: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigLabels {
    pub datacenter: String,
    pub action: String,
    pub dry_run: String,
    pub pre_attest: String,
    pub ha: String,
    /// The first 12 hex digits of the config file's SHA-256 (as in the journal).
    pub config_sha256: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatacenterLabels {
    pub datacenter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ScopeHoldLabels {
    /// `datacenter` or `domain=VALUE`.
    pub scope: String,
    /// `storm`, `storm-cooldown`, `self-partition`.
    pub hold: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ScopeCountLabels {
    pub scope: String,
    /// `nodes`, `unhealthy`, `sources_read`, `sources_failing`.
    pub count: &'static str,
}

/// `identity_nodes{verdict}` values: the last identity read's verdict, or `unknown`.
pub const IDENTITY_VERDICTS: [&str; 4] = ["match", "mismatch", "unverifiable", "unknown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

pub const ALL_STATES: [NodeState; 6] = [
    NodeState::Healthy,
    NodeState::Suspect,
    NodeState::Confirming,
    NodeState::Blocked,
    NodeState::Fenced,
    NodeState::Recovering,
];

/// The reasons a NotReady node's fencing can be refused for, as `blocked{reason}` and
/// `node_blocked{reason}` label values (the decision rules' names).
pub const BLOCKED_REASONS: [&str; 21] = [
    "power-on",
    "power-unknown",
    "power-transitional",
    "power-suspended",
    "no-power-source",
    "lease-renewed-recently",
    "identity-mismatch",
    "off-while-alive",
    "identity-unverified",
    "off-uncorroborated",
    "region-mismatch",
    "shared-machine",
    "opted-out",
    "other-remediator",
    "flapping",
    "paused",
    "stale-view",
    "self-partition",
    "storm",
    "storm-cooldown",
    "fence-budget",
];

/// The `blocked{reason}` value for a refusal rule, if it is one of [`BLOCKED_REASONS`].
pub fn blocked_reason(rule: Rule) -> Option<&'static str> {
    let name = rule.name();
    BLOCKED_REASONS.iter().copied().find(|r| *r == name)
}

/// The HTTP method of a request to the API server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}
