//! What the core is told: the policy, and the facts about one node.

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::identity::{IdentityCheck, NodeIdentity, Verdict};

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
    /// A node that went NotReady more than this many times within `flap_window` is held, not
    /// fenced (0: no limit).
    pub flap_limit: u32,
    pub flap_window: Duration,
    /// Pre-attestation: once oobfence has seen no sign of life from a node's kubelet for this
    /// many of its renewal intervals, it reads power while the node still shows Ready, and a
    /// node confirmed Off that way is fenced the moment it turns NotReady, without
    /// `not_ready_grace`. `None`: off.
    pub pre_attest_after: Option<Renewals>,
    /// Release at attestation: the fence is written the moment the power is proven off, even
    /// while the Node still shows Ready (its Lease stale, no sign of life since the reads), and
    /// the node's pods are then force-deleted, so that the attach/detach controller frees its
    /// volumes at once instead of after the controller-manager's NotReady grace and the pod
    /// garbage collector's next tick.
    pub release_at_attestation: bool,
    /// `[actuation]`: power hung machines off and fenced ones back on (`None`: off, the
    /// default).
    pub actuation: Option<super::actuation::ActuationPolicy>,
}

/// A kubelet renews its Lease every quarter of `leaseDurationSeconds` (its
/// `renewIntervalFraction`, 0.25).
pub const RENEWALS_PER_LEASE: u32 = 4;
/// `leaseDurationSeconds` when a Lease does not say (the kubelet's default).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(40);

/// A number of kubelet renewal intervals, in tenths (2.5 is 25): a Lease is stale after this
/// many intervals without a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(into = "f64")]
pub struct Renewals {
    tenths: u32,
}

impl Renewals {
    /// `None` unless `n` is finite and within 1.5..=100 renewals (rounded to a tenth): below
    /// 1.5 every late renewal would start reads.
    pub fn new(n: f64) -> Option<Renewals> {
        if !n.is_finite() || !(1.5..=100.0).contains(&n) {
            return None;
        }
        Some(Renewals {
            tenths: (n * 10.0).round() as u32,
        })
    }

    /// When a Lease counts as late toward a lease storm: one renewal interval before it is
    /// stale, but never under 1.5 intervals (a healthy kubelet is often a moment late), nor
    /// past stale. Kubelets renew at phases spread over one interval, so when the control
    /// plane stops hearing all of them at once, every Lease is late by the time the first one
    /// goes stale: the storm is counted before anything is read ahead.
    pub fn late(self) -> Renewals {
        Renewals {
            tenths: self.tenths.saturating_sub(10).max(15).min(self.tenths),
        }
    }

    /// How long that is for a Lease of `lease_duration`.
    pub fn of(self, lease_duration: Duration) -> Duration {
        lease_duration / RENEWALS_PER_LEASE * self.tenths / 10
    }
}

impl From<Renewals> for f64 {
    fn from(r: Renewals) -> f64 {
        f64::from(r.tenths) / 10.0
    }
}

impl fmt::Display for Renewals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", f64::from(*self))
    }
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
            flap_limit: 3,
            flap_window: Duration::from_secs(600),
            // One missed renewal is a gap of two intervals; half an interval more rides out
            // the kubelet's jitter and oobfence's watch delay. With the defaults (40 s Lease,
            // 40 s controller grace) reads start 25 s after the last renewal seen and two Off
            // reads 5 s apart are done well before the node turns NotReady.
            pre_attest_after: Renewals::new(2.5),
            // The evidence is the pre-attested fence's (identity-matched Off reads, confirmed,
            // on a Lease the write re-reads unrenewed); NotReady only adds the controller's
            // timer over that same Lease. docs/decisions.md, "Release at attestation".
            release_at_attestation: true,
            actuation: None,
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

/// A read of the node's machine said Off while the node was Ready, and the kubelet has shown
/// signs of life since (Lease renewals, Ready heartbeats, seen by oobfence's clock after the
/// read ended): the power source reads another machine, or misreports this one. Its Off can
/// never prove the node dead until a read of it says On again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffWhileAlive {
    /// When the Off read was taken.
    pub read_at: Timestamp,
    /// Signs of life seen after the read, at least a second apart (a watch that lagged and
    /// delivers two updates at once counts once).
    pub signs_of_life_after: u32,
    /// The read said the machine is gone (terminated, not found), not Off: the source asks
    /// another account, endpoint or region than the one that runs the node's instance.
    #[serde(default)]
    pub gone: bool,
}

/// Signs of life after an Off read that prove the power source wrong: one could be a renewal
/// written before the machine lost power and delivered late; a second one, a renewal interval
/// later, cannot.
pub const OFF_WHILE_ALIVE_PROOF: u32 = 2;

impl OffWhileAlive {
    /// Whether the kubelet has shown enough life since the Off read to prove the source wrong.
    pub fn proven(&self) -> bool {
        self.signs_of_life_after >= OFF_WHILE_ALIVE_PROOF
    }
}

/// The last identity verification of the node's machine from a read, made while it was healthy
/// or since: proof that the power source knows this node's machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdentityBinding {
    pub at: Timestamp,
    pub verdict: Verdict,
    /// Who answered the read that gave it ([`super::PowerReading::reader`]): a binding is
    /// proof about that reader alone. New credentials, a new endpoint or a new account start
    /// again.
    pub reader: String,
}

/// Everything the core knows about one node, read from the cluster and the config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeFacts {
    pub uid: String,
    pub readiness: Readiness,
    /// When oobfence (by its own clock) last saw the node's Lease renewTime change; the first
    /// sighting counts as a renewal, as in the node lifecycle controller. `None`: no Lease.
    pub lease_renewal_seen: Option<Timestamp>,
    /// `lease_renewal_seen` is when oobfence first saw the Lease (it started, or the Lease
    /// appeared), not a renewal it watched happen: how long the kubelet had been silent before
    /// is unknown, and the words must say so.
    pub lease_first_sight: bool,
    /// The Lease's renewTime as the kubelet wrote it (the kubelet's clock): only ever compared
    /// for equality, at write time.
    pub lease_renew_time: Option<Timestamp>,
    /// A fingerprint of the Lease's `resourceVersion`, only ever compared for equality: any
    /// change of the Lease is a sign of life, even one that keeps its renewTime (a kubelet whose
    /// clock stands still writes the same renewTime again).
    pub lease_version: Option<u64>,
    /// The Lease's `leaseDurationSeconds` (None: not set; the kubelet's default applies).
    pub lease_duration: Option<Duration>,
    /// The Ready condition's `lastHeartbeatTime` (the kubelet's clock): only ever compared for
    /// equality, to see the kubelet post its status.
    pub ready_heartbeat: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw that heartbeat change while the node was
    /// Ready: the kubelet posting Ready is alive, whatever its Lease says.
    pub heartbeat_seen: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the node Ready. A silence that began after
    /// it is one oobfence watched begin; one that began before it first looked (a restart, a
    /// node long NotReady) is not.
    pub ready_seen: Option<Timestamp>,
    pub boot_id: String,
    pub being_deleted: bool,
    /// oobfence's fence record, if an oobfence fenced this node.
    pub fence: Option<FenceRecord>,
    /// An out-of-service taint that no oobfence placed.
    pub foreign_out_of_service: bool,
    /// Why the node is excluded from fencing by its own labels or annotations, if it is. This
    /// can only ever block a fence, never cause one.
    pub opted_out: Option<String>,
    /// Why the node is under maintenance (cordoned, a NodeMaintenance taint, a
    /// `MaintenanceInProgress` condition), if it is: a stopped kubelet is then expected, and
    /// its machine is never powered off nor on by oobfence. It never blocks a fence.
    pub maintenance: Option<String>,
    /// When (oobfence's clock) the node was seen going NotReady, newest last: the recent ones
    /// tell a flapping node from a dead one.
    pub not_ready_seen: Vec<Timestamp>,
    /// Another remediator at work on the node (its taint), if any: it owns the node now.
    pub other_remediator: Option<String>,
    /// The config file maps this node to a power source.
    pub has_power_source: bool,
    pub mapping_conflict: Option<MappingConflict>,
    /// What the kubelet reported about its machine (system UUID, addresses).
    pub identity: NodeIdentity,
    pub identity_check: IdentityCheck,
    /// What the entry asks of an Off read besides the state (`corroborate`), if anything.
    pub off_witness: Option<super::witness::OffWitness>,
    /// The last identity verification from a read, if any.
    pub identity_binding: Option<IdentityBinding>,
    /// The node's power source said Off while its kubelet was alive, if it did since its last
    /// On.
    pub off_while_alive: Option<OffWhileAlive>,
    /// What holds back writes from outside the node: a pause, a stale view, a storm, a freeze,
    /// the fence budget ([`super::holds`]).
    pub holds: super::holds::Holds,
    /// A person's confirmation that the machine is off (`oobfence confirm-off`), if one is on
    /// the Node: it stands in for the proof only where no power source can answer
    /// ([`super::confirmation`]).
    pub confirmation: Option<super::confirmation::Confirmation>,
    /// Whether its power source may act, and what oobfence recorded of its power actions
    /// ([`super::actuation`]).
    pub actuation: super::actuation::ActuationFacts,
}
