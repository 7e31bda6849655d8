//! All Kubernetes I/O: connecting, reading node facts, writing taints, deleting nodes, Events.
//!
//! Writes follow what upstream controllers do with `spec.taints`, an atomic list: a fresh GET,
//! the full list with every other taint kept, a merge patch carrying `metadata.resourceVersion`
//! (so a concurrent writer makes it fail with 409 instead of being overwritten), and a bounded
//! retry on 409.
//!
//! Longer than 600 lines on purpose: every read and write of the cluster is here, so that each
//! precondition a write carries (uid, resourceVersion, the write-time re-check, fenced-by) is
//! reviewed in one place.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::json;

pub use credentials::Credentials;

use crate::config::KubernetesConfig;
use crate::decision::{
    self, FenceAction, FenceRecord, FreshNode, Holds, NodeFacts, Readiness, WriteGuard,
};
use crate::identity::{IdentityCheck, NodeIdentity};

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

pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

mod guard_record;
pub use guard_record::GuardStore;

/// Event reasons, stable for alerting and `kubectl get events --field-selector reason=...`.
pub mod reasons {
    pub const FENCED: &str = "OobfenceFenced";
    pub const NODE_DELETED: &str = "OobfenceNodeDeleted";
    pub const UNFENCED: &str = "OobfenceUnfenced";
    pub const BLOCKED: &str = "OobfenceBlocked";
    pub const WOULD_FENCE: &str = "OobfenceWouldFence";
    pub const WOULD_UNFENCE: &str = "OobfenceWouldUnfence";
    pub const FENCE_FAILED: &str = "OobfenceFenceFailed";
    pub const RECORD_CLEARED: &str = "OobfenceRecordCleared";
    pub const VOLUMES_RELEASED: &str = "OobfenceVolumesReleased";
    pub const VOLUMES_STILL_ATTACHED: &str = "OobfenceVolumesStillAttached";
    pub const IDENTITY_MISMATCH: &str = "OobfenceIdentityMismatch";
    pub const OFF_WHILE_ALIVE: &str = "OobfencePowerSourceOffWhileAlive";
    pub const GONE_WHILE_ALIVE: &str = "OobfencePowerSourceGoneWhileAlive";
    pub const DUPLICATE_SYSTEM_UUID: &str = "OobfenceDuplicateSystemUUID";
}

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
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("Kubernetes API: {0}")]
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
    /// [`decision::recheck`]): nothing was written, and the node is decided again.
    #[error("write abandoned: {0}")]
    Abandoned(String),
}

impl ClusterError {
    fn is_conflict(&self) -> bool {
        matches!(self, ClusterError::Api(kube::Error::Api(s)) if s.is_conflict())
    }
}

/// What oobfence's requests say they are; the API server records its writes under
/// `oobfence` (the part before the slash) in each object's managedFields.
pub const USER_AGENT: &str = concat!("oobfence/", env!("CARGO_PKG_VERSION"));

/// Builds a client from `[kubernetes]`.
pub async fn connect(cfg: &KubernetesConfig) -> Result<Client, ClusterError> {
    Ok(connect_with_credentials(cfg).await?.0)
}

/// Reads the kubeconfig `[kubernetes]` names (or the standard one) into kube's config.
pub async fn load_kube_config(cfg: &KubernetesConfig) -> Result<kube::Config, ClusterError> {
    let options = KubeConfigOptions {
        context: cfg.context.clone(),
        ..Default::default()
    };
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClusterError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None if cfg.context.is_some() => {
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: "$KUBECONFIG or ~/.kube/config".into(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(ClusterError::Infer)?,
    };
    Ok(config)
}

/// Builds the daemon's client from `[kubernetes]`, and the [`Credentials`] its requests carry:
/// a reload replaces the kubeconfig's inline token there, for every request from then on.
pub async fn connect_with_credentials(
    cfg: &KubernetesConfig,
) -> Result<(Client, Credentials), ClusterError> {
    let mut config = load_kube_config(cfg).await?;
    let credentials = Credentials::take_from(&mut config).map_err(ClusterError::Credentials)?;
    // The API server names a write's field manager after the User-Agent: without one,
    // oobfence's taints show in managedFields (and audit logs) as written by "unknown".
    config.headers.push((
        reqwest::header::USER_AGENT,
        reqwest::header::HeaderValue::from_static(USER_AGENT),
    ));
    let counted = tower::util::MapRequestLayer::new(|req: http::Request<kube::client::Body>| {
        KUBERNETES_REQUESTS
            .get_or_create(&MethodLabels {
                method: method_label(req.method()),
            })
            .inc();
        req
    });
    let carried = credentials.clone();
    let auth = tower::util::MapRequestLayer::new(move |req| carried.apply(req));
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(ClusterError::Client)?
        .with_layer(&auth)
        .with_layer(&counted)
        .build();
    Ok((client, credentials))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

/// Every request oobfence's clients sent to the API server, by HTTP method (GET counts lists,
/// watches and fresh reads alike): what oobfence costs the control plane. Process-wide, since
/// a client exists before the metrics do; `metrics::Metrics` serves it.
pub static KUBERNETES_REQUESTS: std::sync::LazyLock<
    prometheus_client::metrics::family::Family<
        MethodLabels,
        prometheus_client::metrics::counter::Counter,
    >,
> = std::sync::LazyLock::new(Default::default);

fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        _ => "other",
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

fn time_of(t: &Time) -> Timestamp {
    t.0
}

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
pub fn fence_record(node: &Node, me: &str) -> Option<FenceRecord> {
    let ann = node.metadata.annotations.as_ref()?;
    let at: Timestamp = ann.get(ANNOTATION_FENCED_AT)?.parse().ok()?;
    let boot_id = ann
        .get(ANNOTATION_FENCED_BOOT_ID)
        .cloned()
        .unwrap_or_default();
    let taint_present = taints(node).iter().any(is_out_of_service);
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

/// What the kubelet reported about its machine: `status.nodeInfo.systemUUID` and the
/// InternalIP, Hostname and InternalDNS addresses.
pub fn node_identity(node: &Node) -> NodeIdentity {
    let status = node.status.as_ref();
    let system_uuid = status
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.system_uuid.clone())
        .unwrap_or_default();
    let addresses = status
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .filter(|a| matches!(a.type_.as_str(), "InternalIP" | "Hostname" | "InternalDNS"))
                .map(|a| a.address.clone())
                .collect()
        })
        .unwrap_or_default();
    NodeIdentity {
        system_uuid,
        addresses,
        uuid_shared_with: Vec::new(),
    }
}

pub fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}

pub fn boot_id(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

pub fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => Readiness::NoCondition,
        Some(c) if c.status == "True" => Readiness::Ready,
        Some(c) => Readiness::NotReady {
            // A condition without a transition time is treated as having just changed: the
            // grace period then starts now instead of being skipped.
            since: c
                .last_transition_time
                .as_ref()
                .map(time_of)
                .unwrap_or_else(Timestamp::now),
        },
    }
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
pub fn ready_heartbeat(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(time_of)
}

/// Keeps of a watched Node only what decisions read, before the cache stores it: conditions
/// but Ready, images, capacity, managedFields and foreign annotations are most of a real
/// Node's size, and thousands of them are the daemon's memory. The writer always acts on a
/// fresh GET of the whole object, never on this.
pub fn prune_node(node: &mut Node) {
    let m = &mut node.metadata;
    m.managed_fields = None;
    m.owner_references = None;
    if let Some(a) = &mut m.annotations {
        a.retain(|k, _| k.starts_with("oobfence.io/") || k == ANNOTATION_CAPI_MACHINE);
    }
    if let Some(spec) = &mut node.spec {
        spec.pod_cidr = None;
        spec.pod_cidrs = None;
        spec.config_source = None;
    }
    if let Some(status) = &mut node.status {
        if let Some(cs) = &mut status.conditions {
            cs.retain(|c| c.type_ == "Ready");
        }
        if let Some(info) = &mut status.node_info {
            *info = k8s_openapi::api::core::v1::NodeSystemInfo {
                boot_id: std::mem::take(&mut info.boot_id),
                system_uuid: std::mem::take(&mut info.system_uuid),
                ..Default::default()
            };
        }
        status.images = None;
        status.capacity = None;
        status.allocatable = None;
        status.daemon_endpoints = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
    }
}

/// Keeps of a watched Lease only its name, renewTime and duration.
pub fn prune_lease(lease: &mut Lease) {
    lease.metadata.managed_fields = None;
    lease.metadata.owner_references = None;
    lease.metadata.labels = None;
    lease.metadata.annotations = None;
    if let Some(spec) = &mut lease.spec {
        spec.holder_identity = None;
        spec.acquire_time = None;
    }
}

/// The core's view of what the Node object says. What comes from elsewhere is left for the
/// caller to fill in: the power source (from the config, never the node), when the Lease was
/// seen renewed (oobfence's own observation), the mapping's conflicts and the identity binding.
/// An out-of-service taint on the node that this daemon did not place (another oobfence's
/// fence is foreign too: never lifted nor adopted here).
pub fn foreign_out_of_service(node: &Node, fence: Option<&FenceRecord>) -> bool {
    fence.is_none_or(|f| !f.ours) && taints(node).iter().any(is_out_of_service)
}

pub fn node_facts(node: &Node, lease: Option<&Lease>, me: &str) -> NodeFacts {
    let fence = fence_record(node, me);
    let foreign_out_of_service = foreign_out_of_service(node, fence.as_ref());
    NodeFacts {
        uid: node.uid().unwrap_or_default(),
        readiness: readiness(node),
        lease_renewal_seen: None,
        lease_renew_time: lease.and_then(lease_renewed),
        lease_duration: lease.and_then(lease_duration),
        ready_heartbeat: ready_heartbeat(node),
        heartbeat_seen: None,
        boot_id: boot_id(node),
        being_deleted: node.metadata.deletion_timestamp.is_some(),
        fence,
        foreign_out_of_service,
        opted_out: opted_out(node),
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
    }
}

/// Annotate a Node `oobfence.io/exclude=true` to keep oobfence from ever fencing it.
pub const ANNOTATION_EXCLUDE: &str = "oobfence.io/exclude";
/// medik8s' own opt-out label (self-node-remediation `controllers/selfnoderemediation_controller.go`,
/// `excludeRemediationLabel`): a node its operators keep from remediation is kept from
/// oobfence too.
pub const LABEL_MEDIK8S_EXCLUDE: &str = "remediation.medik8s.io/exclude-from-remediation";

/// Why the node is excluded from fencing, from its own annotations and labels. A value other
/// than `"true"` excludes nothing (as medik8s reads its label).
pub fn opted_out(node: &Node) -> Option<String> {
    if node
        .annotations()
        .get(ANNOTATION_EXCLUDE)
        .map(String::as_str)
        == Some("true")
    {
        return Some(format!("annotation {ANNOTATION_EXCLUDE}=true"));
    }
    if node.labels().get(LABEL_MEDIK8S_EXCLUDE).map(String::as_str) == Some("true") {
        return Some(format!("label {LABEL_MEDIK8S_EXCLUDE}=true"));
    }
    None
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
pub fn other_remediator(node: &Node) -> Option<String> {
    if let Some(t) = taints(node)
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
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    match node.annotations().get(ANNOTATION_CAPI_MACHINE) {
        Some(machine) if cordoned => Some(format!(
            "Cluster API Machine {machine} (annotation {ANNOTATION_CAPI_MACHINE}) and the Node is cordoned: a MachineHealthCheck remediation or a Machine deletion is draining it"
        )),
        _ => None,
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

    /// The last check before a write that came after other calls: the write holds (pause,
    /// stale view, standby) as they stand now, and with `[ha]` this instance's own deadline
    /// ([`crate::leader::Leadership::may_write`]), read last and here whatever the holds say.
    async fn may_still_write(&self, uid: &str) -> Result<(), ClusterError> {
        if let Some(h) = self.holds_at_write(uid).await?.write {
            return Err(ClusterError::Abandoned(h.reason));
        }
        if let Some(l) = &self.leadership {
            let why = match l.read() {
                Ok(l) => l.standby_reason(),
                Err(_) => Some("this instance's leadership cannot be read".to_string()),
            };
            if let Some(why) = why {
                return Err(ClusterError::Abandoned(why));
            }
        }
        Ok(())
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

    /// The holds on `uid` right before a write: the pause ConfigMap read now, then what the
    /// daemon holds as it stands now — last, since with `[ha]` leadership is a deadline that
    /// the read must not eat into. A ConfigMap that cannot be read fails the write (it is
    /// retried), as a fresh read of the Node that fails does: nothing is written on a switch
    /// nobody could read.
    async fn holds_at_write(&self, uid: &str) -> Result<Holds, ClusterError> {
        let paused = match &self.pause_configmap {
            Some(cm) => {
                bounded(crate::pause::read_configmap(
                    &self.client,
                    cm,
                    &self.datacenter,
                ))
                .await?
            }
            None => None,
        };
        let mut holds = (self.holds_now)(uid);
        if holds.write.is_none()
            && let Some(reason) = paused
        {
            holds.write = Some(decision::holds::Hold {
                kind: decision::holds::HoldKind::Paused,
                reason: format!("writes are paused by an operator ({reason})"),
            });
        }
        Ok(holds)
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

    /// A fresh read of the node, the same object the decision was about: the cache the
    /// decision used may be a moment old.
    async fn fresh_node(&self, name: &str, uid: &str) -> Result<Node, ClusterError> {
        let node = bounded(self.nodes().get(name)).await?;
        let found = node.uid().unwrap_or_default();
        if found != uid {
            return Err(ClusterError::NodeReplaced {
                name: name.into(),
                expected: uid.into(),
                found,
            });
        }
        Ok(node)
    }

    /// The node's Lease renewTime on a fresh read (`None`: no Lease).
    async fn fresh_lease_renew_time(&self, name: &str) -> Result<Option<Timestamp>, ClusterError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        match bounded(api.get_opt(name)).await? {
            Some(lease) => Ok(lease_renewed(&lease)),
            None => Ok(None),
        }
    }

    /// Checks `guard` against the node as just read (and its Lease, for a fence), at the last
    /// moment before the write.
    async fn recheck(&self, node: &Node, guard: &WriteGuard) -> Result<(), ClusterError> {
        let lease_renew_time = match guard.purpose {
            decision::GuardPurpose::Fence => self.fresh_lease_renew_time(&node.name_any()).await?,
            decision::GuardPurpose::Unfence => None,
        };
        let fresh = FreshNode {
            uid: node.uid().unwrap_or_default(),
            readiness: readiness(node),
            boot_id: boot_id(node),
            lease_renew_time,
            fence: fence_record(node, &self.actor),
        };
        let holds = self.holds_at_write(&fresh.uid).await?;
        decision::recheck(guard, &fresh, &holds, Timestamp::now()).map_err(ClusterError::Abandoned)
    }

    /// Retries `op` on 409 Conflict, a few times with jittered backoff; other errors return.
    async fn on_conflict_retry<T, F, Fut>(&self, op: F) -> Result<T, ClusterError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClusterError>>,
    {
        op.retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(1))
                .with_max_times(CONFLICT_ATTEMPTS - 1)
                .with_jitter(),
        )
        .sleep(tokio::time::sleep)
        .when(ClusterError::is_conflict)
        .await
    }

    /// Adds the out-of-service taint and oobfence's annotations in one preconditioned patch,
    /// after re-checking on a fresh read everything the decision was based on (`guard`).
    pub async fn apply_fence_taint(
        &self,
        name: &str,
        guard: &WriteGuard,
        reason: &str,
    ) -> Result<FenceWrite, ClusterError> {
        let attempts = AtomicUsize::new(0);
        self.on_conflict_retry(|| async {
            let attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            let node = self.fresh_node(name, &guard.uid).await?;
            // Our own fence already in place (a retry after the cache lagged): nothing to do.
            if let Some(record) =
                fence_record(&node, &self.actor).filter(|r| r.ours && r.taint_present)
            {
                return Ok(FenceWrite {
                    boot_id: record.boot_id,
                    at: record.at,
                    backup: None,
                    attempts: attempt,
                });
            }
            if taints(&node).iter().any(is_out_of_service) {
                return Err(ClusterError::Precondition(format!(
                    "node {name} already has an out-of-service taint; not adding another"
                )));
            }
            self.recheck(&node, guard).await?;
            let now = Timestamp::now();
            let mut list: Vec<Taint> = taints(&node).to_vec();
            list.push(Taint {
                key: OUT_OF_SERVICE_KEY.into(),
                value: Some(OUT_OF_SERVICE_VALUE.into()),
                effect: OUT_OF_SERVICE_EFFECT.into(),
                time_added: Some(Time(now)),
            });
            let boot = boot_id(&node);
            let patch = json!({
                "metadata": {
                    "resourceVersion": node.resource_version(),
                    "annotations": {
                        ANNOTATION_FENCED_AT: now.to_string(),
                        ANNOTATION_FENCED_BOOT_ID: boot,
                        ANNOTATION_ACTION: FenceAction::Taint.to_string(),
                        ANNOTATION_FENCED_BY: self.signature(),
                        ANNOTATION_REASON: reason,
                    }
                },
                "spec": { "taints": list }
            });
            bounded_by(
                self.write_timeout,
                self.nodes()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            Ok(FenceWrite {
                boot_id: boot,
                at: now,
                backup: None,
                attempts: attempt,
            })
        })
        .await
    }

    /// Removes oobfence's taint (only an out-of-service taint with oobfence's value on a node
    /// carrying this daemon's record) and its annotations, after re-checking on a fresh read
    /// what the decision was based on (Ready, the new bootID, a fresh On read); every other
    /// taint stays.
    pub async fn remove_fence_taint(
        &self,
        name: &str,
        guard: &WriteGuard,
    ) -> Result<(), ClusterError> {
        self.remove_record(name, &guard.uid, Some(guard)).await
    }

    /// Drops this daemon's annotations (its taint is already gone).
    pub async fn clear_fence_record(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        self.remove_record(name, uid, None).await
    }

    async fn remove_record(
        &self,
        name: &str,
        uid: &str,
        untaint: Option<&WriteGuard>,
    ) -> Result<(), ClusterError> {
        self.on_conflict_retry(|| async {
            let node = self.fresh_node(name, uid).await?;
            match fence_record(&node, &self.actor) {
                None => {
                    return Err(ClusterError::Precondition(format!(
                        "node {name} carries no oobfence record; its taints are not oobfence's to remove"
                    )));
                }
                Some(r) if !r.ours => {
                    return Err(ClusterError::Precondition(format!(
                        "node {name}'s fence was placed by another oobfence ({ANNOTATION_FENCED_BY} is not {}); it is not this daemon's to remove",
                        self.actor
                    )));
                }
                Some(_) => {}
            }
            match untaint {
                Some(guard) => self.recheck(&node, guard).await?,
                // Clearing a record writes too: a pause or a stale view holds it.
                None => {
                    if let Some(h) = self.holds_at_write(uid).await?.write {
                        return Err(ClusterError::Abandoned(h.reason));
                    }
                }
            }
            let annotations: serde_json::Map<String, serde_json::Value> = [
                ANNOTATION_FENCED_AT,
                ANNOTATION_FENCED_BOOT_ID,
                ANNOTATION_ACTION,
                ANNOTATION_FENCED_BY,
                ANNOTATION_REASON,
            ]
            .iter()
            .map(|k| (k.to_string(), serde_json::Value::Null))
            .collect();
            let mut patch = json!({
                "metadata": {
                    "resourceVersion": node.resource_version(),
                    "annotations": annotations,
                }
            });
            if untaint.is_some() {
                let list: Vec<&Taint> = taints(&node)
                    .iter()
                    .filter(|t| {
                        !(is_out_of_service(t) && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE))
                    })
                    .collect();
                patch["spec"] = json!({ "taints": list });
            }
            bounded_by(
                self.write_timeout,
                self.nodes()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Deletes the Node with uid and resourceVersion preconditions, so a node re-registered
    /// under the same name is never deleted. Its labels and annotations are returned (and go
    /// into an Event before the delete) so they can be restored by hand.
    /// `guard` is re-checked on the fresh read first, as for a taint.
    pub async fn delete_node(
        &self,
        name: &str,
        guard: &WriteGuard,
    ) -> Result<FenceWrite, ClusterError> {
        let uid = guard.uid.as_str();
        let attempts = AtomicUsize::new(0);
        self.on_conflict_retry(|| async {
            let attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            let node = self.fresh_node(name, uid).await?;
            self.recheck(&node, guard).await?;
            let backup = json!({
                "labels": node.metadata.labels.clone().unwrap_or_default(),
                "annotations": node.metadata.annotations.clone().unwrap_or_default(),
                "taints": taints(&node),
            })
            .to_string();
            self.event(
                &node,
                EventType::Normal,
                reasons::NODE_DELETED,
                &format!("deleting Node; its labels, annotations and taints were: {backup}"),
            )
            .await;
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.into()),
                    resource_version: node.resource_version(),
                }),
                ..Default::default()
            };
            // The backup Event took a call: check once more, then the write alone.
            self.may_still_write(uid).await?;
            bounded_by(self.write_timeout, self.nodes().delete(name, &dp)).await?;
            Ok(FenceWrite {
                boot_id: boot_id(&node),
                at: Timestamp::now(),
                backup: Some(backup),
                attempts: attempt,
            })
        })
        .await
    }

    /// The VolumeAttachments whose `spec.nodeName` is `node` now, by name and uid: recorded
    /// before a node delete so that only these are deleted after it.
    pub async fn volume_attachments_of(
        &self,
        node: &str,
    ) -> Result<Vec<RecordedAttachment>, ClusterError> {
        use k8s_openapi::api::storage::v1::VolumeAttachment;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let list = bounded(api.list(&kube::api::ListParams::default())).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|va| va.spec.node_name == node && va.metadata.deletion_timestamp.is_none())
            .map(|va| RecordedAttachment {
                name: va.name_any(),
                uid: va.uid().unwrap_or_default(),
            })
            .collect())
    }

    /// Deletes the VolumeAttachments recorded as pointing at a node when it was decided gone,
    /// so that the volumes are detached now rather than after the attach/detach controller's
    /// 6-minute timeout. Only those objects (name and uid precondition): a node re-registered
    /// under the same name since (EC2 re-uses private DNS names) keeps its new attachments.
    /// Returns the names deleted. Only call this once the Node object (uid `node_uid`) is
    /// deleted.
    ///
    /// Each delete is a write like the Node's: right before it, the write holds (pause, stale
    /// view) and the leadership are checked again; once one holds, the rest are left to the
    /// attach/detach controller and the error ([`ClusterError::Abandoned`]) says why.
    pub async fn delete_volume_attachments(
        &self,
        node_uid: &str,
        recorded: &[RecordedAttachment],
    ) -> Result<Vec<String>, ClusterError> {
        use k8s_openapi::api::storage::v1::VolumeAttachment;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut deleted = Vec::new();
        for va in recorded {
            if let Err(e) = self.may_still_write(node_uid).await {
                return Err(match deleted.is_empty() {
                    true => e,
                    false => ClusterError::Abandoned(format!(
                        "{e} (after deleting {})",
                        deleted.join(", ")
                    )),
                });
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(va.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match bounded_by(self.write_timeout, api.delete(&va.name, &dp)).await {
                Ok(_) => deleted.push(va.name.clone()),
                // Gone already, or another object under that name now: not ours to delete.
                Err(ClusterError::Api(kube::Error::Api(s)))
                    if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    /// Emits a core/v1 Event about a node. Failures are logged, never fatal: an Event is a
    /// report, not part of the fence.
    pub async fn event(&self, node: &Node, kind: EventType, reason: &str, message: &str) {
        // [ha]: Events are writes too; the standby's would double the leader's.
        if let Some(l) = &self.leadership
            && !l.read().map(|l| l.may_write()).unwrap_or(false)
        {
            tracing::debug!(node = %node.name_any(), reason, "standby: Event not emitted");
            return;
        }
        if let Err(e) = self.try_event(node, kind, reason, message).await {
            tracing::warn!(node = %node.name_any(), reason, error = %e, "could not emit Event");
        }
    }

    async fn try_event(
        &self,
        node: &Node,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let name = node.name_any();
        let now = Timestamp::now();
        // core/v1 Events: every server version accepts them for cluster-scoped objects in
        // "default" (1.20 rejects events.k8s.io/v1 ones there). The uid is the node name, as
        // the kubelet does, because that is what `kubectl describe node` looks up.
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.oobfence.")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.clone()),
                uid: Some(name.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(truncate(message, 4000)),
            type_: Some(kind.as_str().into()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            source: Some(EventSource {
                component: Some("oobfence".into()),
                host: None,
            }),
            reporting_component: Some("oobfence".into()),
            reporting_instance: Some(format!("oobfence-{}", self.datacenter)),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), "default");
        bounded(api.create(&PostParams::default(), &ev)).await?;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Leases by node name, from the kube-node-lease namespace.
pub fn leases_by_node(leases: &[std::sync::Arc<Lease>]) -> BTreeMap<String, std::sync::Arc<Lease>> {
    leases.iter().map(|l| (l.name_any(), l.clone())).collect()
}

#[cfg(test)]
mod tests;

pub mod credentials;
