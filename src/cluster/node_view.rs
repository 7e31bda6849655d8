//! What oobfence reads of a Node. The daemon's Node cache keeps this of each watched Node, and
//! a Node read afresh before a write is turned into it too, so that both are judged by the same
//! functions. A `k8s-openapi` `Node` is about 1.5 KiB before any of its fields is filled, and
//! thousands of them were most of the daemon's memory; this keeps a few hundred bytes.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};

use super::ANNOTATION_CAPI_MACHINE;

/// The Node condition that declares maintenance under way, where node lifecycle tooling sets
/// one.
pub const CONDITION_MAINTENANCE: &str = "MaintenanceInProgress";

/// A Node, as far as oobfence reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// `metadata.deletionTimestamp` is set.
    pub being_deleted: bool,
    pub labels: Pairs,
    /// oobfence's own annotations (`oobfence.io/…`) and Cluster API's Machine annotation; no
    /// other annotation is read.
    pub annotations: Pairs,
    pub provider_id: Option<String>,
    /// `spec.unschedulable`: cordoned.
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
    /// The Ready condition, if the Node has one.
    pub ready: Option<ReadyCondition>,
    /// A `MaintenanceInProgress` condition whose status is "True" (node lifecycle tooling that
    /// declares maintenance on the Node), with its reason.
    pub maintenance_condition: Option<String>,
    /// `status.nodeInfo.bootID` and `systemUUID`.
    pub boot_id: String,
    pub system_uuid: String,
    /// The InternalIP, Hostname and InternalDNS addresses: what identifies the machine.
    pub addresses: Vec<String>,
}

/// Labels or annotations, sorted by key, in one allocation of just their size (a `BTreeMap`
/// takes half a kilobyte for its first key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs(Box<[(String, String)]>);

impl Pairs {
    pub fn get(&self, key: &str) -> Option<&String> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, String)> for Pairs {
    /// From a map's entries (sorted, each key once).
    fn from_iter<I: IntoIterator<Item = (String, String)>>(pairs: I) -> Pairs {
        let mut v: Vec<(String, String)> = pairs.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.dedup_by(|a, b| a.0 == b.0);
        Pairs(v.into_boxed_slice())
    }
}

/// A Node's Ready condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadyCondition {
    /// `status` is "True".
    pub ready: bool,
    pub last_transition: Option<Timestamp>,
    pub last_heartbeat: Option<Timestamp>,
}

impl From<Node> for NodeView {
    fn from(node: Node) -> NodeView {
        let m = node.metadata;
        let (spec, status) = (
            node.spec.unwrap_or_default(),
            node.status.unwrap_or_default(),
        );
        let annotations = m
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("oobfence.io/") || k == ANNOTATION_CAPI_MACHINE)
            .collect();
        let info = status.node_info.unwrap_or_default();
        let mut addresses: Vec<String> = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .filter(|a| matches!(a.type_.as_str(), "InternalIP" | "Hostname" | "InternalDNS"))
            .map(|a| a.address)
            .collect();
        addresses.shrink_to_fit();
        let conditions = status.conditions.unwrap_or_default();
        let maintenance_condition = conditions
            .iter()
            .find(|c| c.type_ == CONDITION_MAINTENANCE && c.status == "True")
            .map(|c| c.reason.clone().unwrap_or_default());
        let ready = conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| ReadyCondition {
                ready: c.status == "True",
                last_transition: c.last_transition_time.map(|t| t.0),
                last_heartbeat: c.last_heartbeat_time.map(|t| t.0),
            });
        NodeView {
            name: m.name.unwrap_or_default(),
            uid: m.uid.unwrap_or_default(),
            resource_version: m.resource_version.unwrap_or_default(),
            being_deleted: m.deletion_timestamp.is_some(),
            labels: m.labels.unwrap_or_default().into_iter().collect(),
            annotations,
            provider_id: spec.provider_id,
            unschedulable: spec.unschedulable.unwrap_or(false),
            taints: spec.taints.unwrap_or_default(),
            ready,
            maintenance_condition,
            boot_id: info.boot_id,
            system_uuid: info.system_uuid,
            addresses,
        }
    }
}

impl From<&Node> for NodeView {
    fn from(node: &Node) -> NodeView {
        NodeView::from(node.clone())
    }
}
