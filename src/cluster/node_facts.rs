//! Reading the cluster: what a Node ([`NodeView`]) and its Lease say (readiness, boot,
//! identity, oobfence's fence record, opt-outs, other remediators at work).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;

use super::NodeView;
use super::{
    ANNOTATION_FENCED_AT, ANNOTATION_FENCED_BOOT_ID, ANNOTATION_FENCED_BY,
    ANNOTATION_POWERED_OFF_AT, ANNOTATION_POWERED_OFF_BOOT_ID, ANNOTATION_POWERED_OFF_BY,
    ANNOTATION_POWERED_ON_AT, OUT_OF_SERVICE_KEY,
};
use crate::decision::actuation::PowerRecord;
use crate::decision::{FenceRecord, NodeFacts, Readiness};
use crate::identity::{IdentityCheck, NodeIdentity};

/// True for an out-of-service taint, whoever placed it.
pub fn is_out_of_service(t: &Taint) -> bool {
    t.key == OUT_OF_SERVICE_KEY
}

/// Who this daemon is in `oobfence.io/fenced-by`: its datacenter and the host it runs on. A
/// fence whose record names anyone else is never lifted nor adopted.
pub fn actor_name(datacenter: &str) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("oobfence/{datacenter}@{host}")
}

/// The actor name the instances of one datacenter's `[ha]` group share: a fence any of them
/// wrote (signed `oobfence/DC@ha/INSTANCE#TERM`) is the group's, so the one that takes over
/// lifts it.
pub fn ha_actor_name(datacenter: &str) -> String {
    format!("oobfence/{datacenter}@ha")
}

/// An oobfence record on this node, if its annotations are there; `me` is this daemon's
/// [`actor_name`], or with `[ha]` its group's ([`ha_actor_name`]): then a fence signed
/// `GROUP/INSTANCE#TERM` by any instance of the group is ours.
pub fn fence_record(node: &NodeView, me: &str) -> Option<FenceRecord> {
    let ann = &node.annotations;
    let at: Timestamp = ann.get(ANNOTATION_FENCED_AT)?.parse().ok()?;
    let boot_id = ann
        .get(ANNOTATION_FENCED_BOOT_ID)
        .cloned()
        .unwrap_or_default();
    let taint_present = node.taints.iter().any(is_out_of_service);
    let ours = ann
        .get(ANNOTATION_FENCED_BY)
        .is_some_and(|by| by == me || by.starts_with(&format!("{me}/")));
    Some(FenceRecord {
        at,
        boot_id,
        taint_present,
        ours,
    })
}

/// oobfence's record of its power actions on the node (opt-in actuation), if any.
pub fn power_record(node: &NodeView, me: &str) -> Option<PowerRecord> {
    let ann = &node.annotations;
    let off_at: Timestamp = ann.get(ANNOTATION_POWERED_OFF_AT)?.parse().ok()?;
    Some(PowerRecord {
        off_at,
        boot_id: ann
            .get(ANNOTATION_POWERED_OFF_BOOT_ID)
            .cloned()
            .unwrap_or_default(),
        on_at: ann
            .get(ANNOTATION_POWERED_ON_AT)
            .and_then(|t| t.parse().ok()),
        ours: ann
            .get(ANNOTATION_POWERED_OFF_BY)
            .is_some_and(|by| by == me || by.starts_with(&format!("{me}/"))),
    })
}

/// What the kubelet reported about its machine: `status.nodeInfo.systemUUID` and the
/// InternalIP, Hostname and InternalDNS addresses.
pub fn node_identity(node: &NodeView) -> NodeIdentity {
    NodeIdentity {
        system_uuid: node.system_uuid.clone(),
        addresses: node.addresses.clone(),
        uuid_shared_with: Vec::new(),
    }
}

pub fn provider_id(node: &NodeView) -> Option<&str> {
    node.provider_id.as_deref()
}

pub fn boot_id(node: &NodeView) -> String {
    node.boot_id.clone()
}

pub fn readiness(node: &NodeView) -> Readiness {
    match &node.ready {
        None => Readiness::NoCondition,
        Some(c) if c.ready => Readiness::Ready,
        Some(c) => Readiness::NotReady {
            // A condition without a transition time is treated as having just changed: the
            // grace period then starts now instead of being skipped.
            since: c.last_transition.unwrap_or_else(Timestamp::now),
        },
    }
}

/// What oobfence reads of a node's Lease: when it was last renewed, and for how long. All the
/// daemon keeps of a Lease (a cached `Lease` object is about a kilobyte).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseTimes {
    pub renewed: Option<Timestamp>,
    pub duration: Option<std::time::Duration>,
    /// A fingerprint of its `resourceVersion`: what moves on every write of the Lease.
    pub version: u64,
}

impl LeaseTimes {
    pub fn of(lease: &Lease) -> LeaseTimes {
        LeaseTimes {
            renewed: lease_renewed(lease),
            duration: lease_duration(lease),
            version: lease_version(lease),
        }
    }
}

/// A fingerprint of the Lease's `resourceVersion` (an opaque string the API server changes on
/// every write), kept as a number so that [`LeaseTimes`] stays small and `Copy`.
pub fn lease_version(lease: &Lease) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    lease.metadata.resource_version.hash(&mut h);
    h.finish()
}

pub fn lease_renewed(lease: &Lease) -> Option<Timestamp> {
    lease
        .spec
        .as_ref()?
        .renew_time
        .as_ref()
        .map(|t: &MicroTime| t.0)
}

/// The Lease's `leaseDurationSeconds`; `None` when unset or not positive (the kubelet's
/// default then applies).
pub fn lease_duration(lease: &Lease) -> Option<std::time::Duration> {
    let s = lease.spec.as_ref()?.lease_duration_seconds?;
    u64::try_from(s)
        .ok()
        .filter(|s| *s > 0)
        .map(std::time::Duration::from_secs)
}

/// The Ready condition's `lastHeartbeatTime`.
pub fn ready_heartbeat(node: &NodeView) -> Option<Timestamp> {
    node.ready.as_ref()?.last_heartbeat
}

/// The core's view of what the Node object says. What comes from elsewhere is left for the
/// caller to fill in: the power source (from the config, never the node), when the Lease was
/// seen renewed (oobfence's own observation), the mapping's conflicts and the identity binding.
/// An out-of-service taint on the node that this daemon did not place (another oobfence's
/// fence is foreign too: never lifted nor adopted here).
pub fn foreign_out_of_service(node: &NodeView, fence: Option<&FenceRecord>) -> bool {
    fence.is_none_or(|f| !f.ours) && node.taints.iter().any(is_out_of_service)
}

pub fn node_facts(node: &NodeView, lease: Option<LeaseTimes>, me: &str) -> NodeFacts {
    let fence = fence_record(node, me);
    let foreign_out_of_service = foreign_out_of_service(node, fence.as_ref());
    NodeFacts {
        uid: node.uid.clone(),
        readiness: readiness(node),
        lease_renewal_seen: None,
        lease_first_sight: false,
        lease_renew_time: lease.and_then(|l| l.renewed),
        lease_version: lease.map(|l| l.version),
        lease_duration: lease.and_then(|l| l.duration),
        ready_heartbeat: ready_heartbeat(node),
        heartbeat_seen: None,
        ready_seen: None,
        boot_id: boot_id(node),
        being_deleted: node.being_deleted,
        fence,
        foreign_out_of_service,
        opted_out: opted_out(node),
        maintenance: maintenance(node),
        not_ready_seen: Vec::new(),
        other_remediator: other_remediator(node),
        has_power_source: false,
        mapping_conflict: None,
        off_while_alive: None,
        identity: node_identity(node),
        identity_check: IdentityCheck::Checked,
        off_witness: None,
        identity_binding: None,
        holds: Default::default(),
        // When it was first seen is the daemon's to say ([`confirmation_note`]).
        confirmation: None,
        actuation: crate::decision::actuation::ActuationFacts {
            source_refuses: None,
            record: power_record(node, me),
        },
    }
}

/// A person's confirmation that the machine is off, as the Node's annotation gives it: `None`
/// without one, an error naming what is wrong with a malformed one.
#[allow(dead_code)] // the daemon's reading of it lands on its own branch
pub fn confirmation_note(
    node: &NodeView,
) -> Option<Result<crate::decision::confirmation::ConfirmationNote, String>> {
    use crate::decision::confirmation::{ANNOTATION, ConfirmationNote};
    node.annotations
        .get(ANNOTATION)
        .map(|v| ConfirmationNote::parse(v))
}

/// Annotate a Node `oobfence.io/exclude=true` to keep oobfence from ever fencing it.
pub const ANNOTATION_EXCLUDE: &str = "oobfence.io/exclude";
/// medik8s' own opt-out label (self-node-remediation `controllers/selfnoderemediation_controller.go`,
/// `excludeRemediationLabel`): a node its operators keep from remediation is kept from
/// oobfence too.
pub const LABEL_MEDIK8S_EXCLUDE: &str = "remediation.medik8s.io/exclude-from-remediation";

/// Why the node is excluded from fencing, from its own annotations and labels. A value other
/// than `"true"` excludes nothing (as medik8s reads its label).
pub fn opted_out(node: &NodeView) -> Option<String> {
    if node.annotations.get(ANNOTATION_EXCLUDE).map(String::as_str) == Some("true") {
        return Some(format!("annotation {ANNOTATION_EXCLUDE}=true"));
    }
    if node.labels.get(LABEL_MEDIK8S_EXCLUDE).map(String::as_str) == Some("true") {
        return Some(format!("label {LABEL_MEDIK8S_EXCLUDE}=true"));
    }
    None
}

/// Taints that mark a node under maintenance:
/// - `medik8s.io/drain`: the medik8s node-maintenance-operator's NoSchedule taint while a
///   NodeMaintenance is in effect (it cordons the node too);
/// - `kubevirt.io/drain`: the same operator's taint in its KubeVirt-era releases.
const MAINTENANCE_TAINT_KEYS: [&str; 2] = ["medik8s.io/drain", "kubevirt.io/drain"];

/// Why the node is under maintenance, if it is: cordoned (`spec.unschedulable`), a
/// NodeMaintenance taint, or a `MaintenanceInProgress` condition. A kubelet stopped for
/// maintenance (a BIOS flash, a drained node) is silent on purpose: its machine is never
/// powered off by oobfence. This never blocks a fence of a machine proven off.
pub fn maintenance(node: &NodeView) -> Option<String> {
    if let Some(t) = node
        .taints
        .iter()
        .find(|t| MAINTENANCE_TAINT_KEYS.contains(&t.key.as_str()))
    {
        return Some(format!("taint {}:{} (NodeMaintenance)", t.key, t.effect));
    }
    if let Some(reason) = &node.maintenance_condition {
        return Some(format!(
            "condition {}=True{}",
            super::node_view::CONDITION_MAINTENANCE,
            if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            }
        ));
    }
    node.unschedulable
        .then(|| "cordoned (spec.unschedulable = true)".to_string())
}

/// Taint keys other remediators put on a node they are remediating:
/// - `medik8s.io/remediation`: self-node-remediation's NoExecute taint (value
///   `self-node-remediation`, `NodeNoExecuteTaint` in `controllers/selfnoderemediation_controller.go`),
///   which fence-agents-remediation also uses (value `fence-agents-remediation`,
///   `pkg/utils/taints.go`);
/// - `medik8s.io/fence-agents-remediation`: fence-agents-remediation's own NoExecute taint
///   (`FARNoExecuteTaintKey`);
/// - `remediation.medik8s.io/fence-agents-remediation`: fence-agents-remediation's NoSchedule
///   taint in its earlier releases.
///
/// NodeHealthCheck itself marks nothing on the Node (it creates the remediation CRs whose
/// controllers place these taints).
const REMEDIATOR_TAINT_KEYS: [&str; 3] = [
    "medik8s.io/remediation",
    "medik8s.io/fence-agents-remediation",
    "remediation.medik8s.io/fence-agents-remediation",
];

/// Cluster API writes the Node's Machine into this annotation (`MachineAnnotation`,
/// `api/v1beta1/common_types.go`, set by the Machine controller's `patchNode`).
pub const ANNOTATION_CAPI_MACHINE: &str = "cluster.x-k8s.io/machine";

/// Another remediator at work on the node: a medik8s taint, or Cluster API deleting the
/// node's Machine. A MachineHealthCheck marks only the Machine (in the management cluster,
/// out of oobfence's sight); what reaches the Node is the Machine controller's drain, which
/// cordons it (`drain.Helper.CordonNode` in `reconcileDelete`). So a cordoned Node that
/// Cluster API manages is taken as Cluster API's: it replaces the machine itself, and two
/// remediators on one node undo each other's work. It can only ever block a fence.
pub fn other_remediator(node: &NodeView) -> Option<String> {
    if let Some(t) = node
        .taints
        .iter()
        .find(|t| REMEDIATOR_TAINT_KEYS.contains(&t.key.as_str()))
    {
        return Some(format!(
            "taint {}={}:{}",
            t.key,
            t.value.as_deref().unwrap_or_default(),
            t.effect
        ));
    }
    let cordoned = node.unschedulable;
    match node.annotations.get(ANNOTATION_CAPI_MACHINE) {
        Some(machine) if cordoned => Some(format!(
            "Cluster API Machine {machine} (annotation {ANNOTATION_CAPI_MACHINE}) and the Node is cordoned: a MachineHealthCheck remediation or a Machine deletion is draining it"
        )),
        _ => None,
    }
}

/// Leases by node name, from the kube-node-lease namespace.
pub fn leases_by_node(leases: &[std::sync::Arc<Lease>]) -> BTreeMap<String, std::sync::Arc<Lease>> {
    leases.iter().map(|l| (l.name_any(), l.clone())).collect()
}
