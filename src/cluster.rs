//! All Kubernetes I/O: connecting, reading node facts, writing taints, deleting nodes, Events.
//!
//! Writes follow what upstream controllers do with `spec.taints`, an atomic list: a fresh GET,
//! the full list with every other taint kept, a merge patch carrying `metadata.resourceVersion`
//! (so a concurrent writer makes it fail with 409 instead of being overwritten), and a bounded
//! retry on 409.
//!
//! This file holds the writer ([`Cluster`]), its errors and the names it writes; beside it,
//! `connect` builds the client, `node_facts` reads what a Node and its Lease say, `writes`
//! holds every write with the preconditions it carries (uid, resourceVersion, the write-time
//! re-check, fenced-by) so that they are reviewed in one place, and `events` reports them.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

use crate::decision::Holds;

mod confirm;
mod connect;
pub mod credentials;
mod events;
mod fenced_on;
mod guard_record;
mod node_facts;
mod node_view;
mod pods;
mod power;
#[cfg(test)]
mod tests;
pub mod version;
mod writes;

pub use crate::api_error::{ApiError, WatchError, watch_forbidden};
pub use confirm::{confirm_off, withdraw_confirmation};
pub use connect::{USER_AGENT, connect, connect_with_credentials, load_kube_config};
pub use credentials::Credentials;
pub use events::{EventType, reasons};
pub use fenced_on::FencedOn;
pub use guard_record::{GuardStore, StoredRecord};
pub use node_facts::{
    ANNOTATION_CAPI_MACHINE, ANNOTATION_EXCLUDE, LABEL_MEDIK8S_EXCLUDE, LeaseTimes, actor_name,
    boot_id, confirmation_note, fence_record, foreign_out_of_service, ha_actor_name,
    is_out_of_service, lease_duration, lease_renewed, leases_by_node, node_facts, node_identity,
    opted_out, other_remediator, power_record, provider_id, readiness, ready_heartbeat,
};
pub use node_view::{NodeView, Pairs, ReadyCondition};
pub use pods::{BoundPod, PodRelease};

pub const OUT_OF_SERVICE_KEY: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";

/// When oobfence fenced the node (RFC 3339).
pub const ANNOTATION_FENCED_AT: &str = "oobfence.io/fenced-at";
/// The node's bootID at fence time; it must change before the fence is lifted.
pub const ANNOTATION_FENCED_BOOT_ID: &str = "oobfence.io/fenced-boot-id";
/// What oobfence did (`taint`).
pub const ANNOTATION_ACTION: &str = "oobfence.io/action";
/// Which oobfence placed the fence: `oobfence/DATACENTER@HOST` (see [`actor_name`]).
pub const ANNOTATION_FENCED_BY: &str = "oobfence.io/fenced-by";
/// The rule and evidence summary behind the fence.
pub const ANNOTATION_REASON: &str = "oobfence.io/reason";
/// What the fence rests on: `power` (the machine's power proven off) or `person` (a person's
/// confirmation, `oobfence.io/confirmed-off`, no power source being able to answer).
pub const ANNOTATION_FENCED_ON: &str = "oobfence.io/fenced-on";
/// Opt-in actuation: when oobfence powered the machine off (RFC 3339), written on the Node
/// before the command is sent, so that no restart or other `[ha]` instance sends it twice.
pub const ANNOTATION_POWERED_OFF_AT: &str = "oobfence.io/powered-off-at";
/// The bootID the machine ran when oobfence powered it off.
pub const ANNOTATION_POWERED_OFF_BOOT_ID: &str = "oobfence.io/powered-off-boot-id";
/// Which oobfence powered it off (as [`ANNOTATION_FENCED_BY`]).
pub const ANNOTATION_POWERED_OFF_BY: &str = "oobfence.io/powered-off-by";
/// When oobfence powered it on again.
pub const ANNOTATION_POWERED_ON_AT: &str = "oobfence.io/powered-on-at";
/// Every annotation of a power record: removed with the fence record once the node reports
/// another boot than the one powered off (never while it may still read On in that boot).
pub const POWER_ANNOTATIONS: [&str; 4] = [
    ANNOTATION_POWERED_OFF_AT,
    ANNOTATION_POWERED_OFF_BOOT_ID,
    ANNOTATION_POWERED_OFF_BY,
    ANNOTATION_POWERED_ON_AT,
];

pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// API calls other than watches must finish within this.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts for a write that keeps hitting 409 Conflict.
pub const CONFLICT_ATTEMPTS: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot load kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "cannot find a kubeconfig ($KUBECONFIG, ~/.kube/config) and [kubernetes] kubeconfig is not set: {0}"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("kubeconfig: {0}")]
    Credentials(String),
    #[error("{}", ApiError(.0))]
    Client(#[source] kube::Error),
    #[error("{}", ApiError(.0))]
    Api(#[from] kube::Error),
    #[error("Kubernetes API call timed out after {0:?}")]
    Timeout(Duration),
    /// The node was deleted and re-created under the same name since the decision.
    #[error("node {name} now has uid {found}, not the {expected} the decision was about")]
    NodeReplaced {
        name: String,
        expected: String,
        found: String,
    },
    /// The fresh read no longer supports the write (node Ready again, taint already there...).
    #[error("{0}")]
    Precondition(String),
    /// Something the decision was based on moved between the decision and the write (see
    /// [`crate::decision::recheck`]): nothing was written, and the node is decided again.
    #[error("write abandoned: {0}")]
    Abandoned(String),
}

impl ClusterError {
    fn is_conflict(&self) -> bool {
        matches!(self, ClusterError::Api(kube::Error::Api(s)) if s.is_conflict())
    }
}

async fn bounded<T>(fut: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ClusterError> {
    bounded_by(CALL_TIMEOUT, fut).await
}

async fn bounded_by<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(ClusterError::Api),
        Err(_) => Err(ClusterError::Timeout(limit)),
    }
}

/// A VolumeAttachment as recorded at decision time: only this object (name and uid) may be
/// deleted after a node delete, never one created since for a node re-registered under the
/// same name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RecordedAttachment {
    pub name: String,
    pub uid: String,
}

/// What was written, for Events and the journal.
#[derive(Debug, Clone)]
pub struct FenceWrite {
    pub boot_id: String,
    pub at: Timestamp,
    /// JSON of the node's labels and annotations before a delete, kept as a backup.
    pub backup: Option<String>,
    /// How many read-modify-write rounds it took (more than 1 after a 409 Conflict).
    pub attempts: usize,
}

/// The holds on a node (by uid) as they stand now: asked again right before every write.
pub type HoldsNow = Arc<dyn Fn(&str) -> Holds + Send + Sync>;

/// Writes to the cluster on behalf of one oobfence instance.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    datacenter: String,
    /// This daemon's [`actor_name`], written to and checked in `oobfence.io/fenced-by`.
    actor: String,
    holds_now: HoldsNow,
    /// `[pause] configmap`, read again right before every write.
    pause_configmap: Option<crate::config::ConfigMapRef>,
    /// `[ha]`: this instance's standing; writes are signed with its name and term.
    leadership: Option<crate::leader::LeadershipHandle>,
    /// How long the write itself (the PATCH or DELETE after the last re-check) may take:
    /// with `[ha]` it is part of the leader's safety margin.
    write_timeout: Duration,
}

impl Cluster {
    pub fn new(client: Client, datacenter: &str) -> Self {
        Cluster::with_actor(client, datacenter, &actor_name(datacenter))
    }

    /// A writer that signs its fences as `actor` (tests use it to play a second oobfence).
    pub fn with_actor(client: Client, datacenter: &str, actor: &str) -> Self {
        Cluster {
            client,
            datacenter: datacenter.to_string(),
            actor: actor.to_string(),
            holds_now: Arc::new(|_| Holds::default()),
            pause_configmap: None,
            leadership: None,
            write_timeout: CALL_TIMEOUT,
        }
    }

    /// `[ha]`: the group's actor name, writes signed with this instance and its term, and
    /// each write cut off after `write_timeout` ([`crate::config::HaConfig::safety_margin`]).
    pub fn with_leadership(
        mut self,
        leadership: crate::leader::LeadershipHandle,
        write_timeout: Duration,
    ) -> Self {
        self.actor = ha_actor_name(&self.datacenter);
        self.leadership = Some(leadership);
        self.write_timeout = write_timeout.min(CALL_TIMEOUT);
        // The API server gives up on a write as soon as we do (from when it has it).
        self.client = crate::leader::server_bounded(self.client, self.write_timeout);
        self
    }

    /// What a write records in `oobfence.io/fenced-by`: the actor, and with `[ha]` the
    /// instance and the Lease term it holds (`oobfence/DC@ha/INSTANCE#TERM`).
    pub fn signature(&self) -> String {
        match self.leadership.as_ref().and_then(|l| l.read().ok()) {
            Some(l) => format!("{}/{}#{}", self.actor, l.identity, l.term),
            None => self.actor.clone(),
        }
    }

    /// `[ha]`: the Lease term this instance holds (None without `[ha]`).
    pub fn term(&self) -> Option<i32> {
        self.leadership
            .as_ref()
            .and_then(|l| l.read().ok().map(|l| l.term))
    }

    /// Every write re-checks these holds (pause, stale view, storm, freeze, budget) at the last
    /// moment, as it re-checks the node.
    pub fn with_holds(mut self, holds_now: HoldsNow) -> Self {
        self.holds_now = holds_now;
        self
    }

    /// The pause ConfigMap (`[pause] configmap`), read again right before every write as the
    /// pause file is: a pause set after the daemon's last look (up to 5 s old) still stops
    /// the write.
    pub fn with_pause_configmap(mut self, cm: Option<crate::config::ConfigMapRef>) -> Self {
        self.pause_configmap = cm;
        self
    }

    pub fn actor(&self) -> &str {
        &self.actor
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}
