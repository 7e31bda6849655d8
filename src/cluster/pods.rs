//! Releasing a fenced node's pods (`release_at_attestation`): every pod bound to the node
//! (`spec.nodeName`) force-deleted, grace period 0 and a uid precondition each.
//!
//! Why oobfence deletes them itself: on a node carrying the out-of-service taint the
//! attach/detach controller detaches a volume as soon as its pod has left, but the pod garbage
//! collector force-deletes such pods only once the node is NotReady and only on its 20 s tick.
//! Deleting them right after the fence frees the volumes about a tenth of a second later.
//! Pods that tolerate the taint and pods already Terminating are deleted too: either would keep
//! the volume attached until the pod garbage collector came by.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};

use super::{Cluster, ClusterError, bounded, bounded_by};
use crate::decision::WriteGuard;

/// Pod deletions under way at once (in rounds): a node's hundred pods go in well under a
/// second on a nearby API server, without a burst that competes with everything it serves.
const CONCURRENT_DELETES: usize = 8;

/// A pod bound to a node, by name and uid: only this object is deleted, never one created
/// since under the same name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Whether it mounts a PersistentVolumeClaim: those go first.
    pub holds_claims: bool,
    /// Already Terminating (a deletionTimestamp), e.g. evicted by the taint manager.
    pub terminating: bool,
}

impl std::fmt::Display for BoundPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a release did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRelease {
    /// Deleted by this release (`namespace/name`).
    pub deleted: Vec<String>,
    /// Gone, or another object under that name, by the time its delete came.
    pub already_gone: Vec<String>,
    /// Left for the pod garbage collector, with why (a hold started, a delete failed).
    pub left: Vec<(String, String)>,
}

impl PodRelease {
    /// One sentence for the Event and the journal.
    pub fn summary(&self) -> String {
        let mut s = match self.deleted.len() {
            0 => "no pod to force-delete".to_string(),
            n => format!(
                "{n} pod(s) force-deleted (grace period 0): {}",
                self.deleted.join(", ")
            ),
        };
        if !self.already_gone.is_empty() {
            s.push_str(&format!("; already gone: {}", self.already_gone.join(", ")));
        }
        if !self.left.is_empty() {
            let left: Vec<String> = self
                .left
                .iter()
                .map(|(p, why)| format!("{p} ({why})"))
                .collect();
            s.push_str(&format!(
                "; NOT deleted, left to the pod garbage collector once the node is NotReady: {}",
                left.join(", ")
            ));
        }
        s
    }
}

impl Cluster {
    /// The pods bound to `node` now, those that mount a PersistentVolumeClaim first.
    pub async fn pods_on(&self, node: &str) -> Result<Vec<BoundPod>, ClusterError> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = bounded(api.list(&lp)).await?;
        let mut pods: Vec<BoundPod> = list
            .items
            .into_iter()
            // The field selector is the server's; the name is checked here all the same.
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| BoundPod {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                uid: p.uid().unwrap_or_default(),
                holds_claims: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some())),
                terminating: p.metadata.deletion_timestamp.is_some(),
            })
            .collect();
        pods.sort_by_key(|p| !p.holds_claims);
        Ok(pods)
    }

    /// Force-deletes the pods of `name` right after this daemon's fence of it landed: the
    /// pods listed, then the fence's guard re-checked on a fresh Node and Lease GET as
    /// [`crate::decision::GuardPurpose::ReleasePods`] (the fence still in place, same uid and
    /// bootID, Lease unrenewed, no hold), then each pod deleted.
    pub async fn release_pods(
        &self,
        name: &str,
        guard: &WriteGuard,
    ) -> Result<PodRelease, ClusterError> {
        let guard = guard.for_release();
        let pods = self.pods_on(name).await?;
        let node = self.fresh_node(name, &guard.uid).await?;
        self.recheck(&node, &guard).await?;
        self.force_delete_pods(&guard.uid, &pods).await
    }

    /// Deletes `pods` (grace period 0, uid precondition) on behalf of node `node_uid`. Before
    /// each batch the pause ConfigMap is read afresh (the daemon's holds are a pass old), and
    /// before each delete the write holds and, with `[ha]`, this instance's standing are checked
    /// again: once one holds, or the switch cannot be read, the rest are left to the pod
    /// garbage collector.
    pub async fn force_delete_pods(
        &self,
        node_uid: &str,
        pods: &[BoundPod],
    ) -> Result<PodRelease, ClusterError> {
        let mut outcomes: Vec<(String, Result<bool, String>)> = Vec::with_capacity(pods.len());
        for chunk in pods.chunks(CONCURRENT_DELETES) {
            if let Err(e) = self.may_send(node_uid).await {
                let why = e.to_string();
                outcomes.extend(chunk.iter().map(|p| (label(p), Err(why.clone()))));
                continue;
            }
            let deletes = chunk.iter().map(|p| self.force_delete_checked(node_uid, p));
            outcomes.extend(futures::future::join_all(deletes).await);
        }
        let mut release = PodRelease::default();
        for (pod, outcome) in outcomes {
            match outcome {
                Ok(true) => release.deleted.push(pod),
                Ok(false) => release.already_gone.push(pod),
                Err(why) => release.left.push((pod, why)),
            }
        }
        Ok(release)
    }

    /// One pod's delete, after the write holds are checked again: its label and whether it
    /// was deleted (`Err`: why it was left).
    async fn force_delete_checked(
        &self,
        node_uid: &str,
        p: &BoundPod,
    ) -> (String, Result<bool, String>) {
        let result = match self.may_still_write_now(node_uid) {
            Err(e) => Err(e.to_string()),
            Ok(()) => self.force_delete_pod(p).await.map_err(|e| e.to_string()),
        };
        (label(p), result)
    }

    /// `true`: deleted; `false`: gone already, or another object under its name now.
    async fn force_delete_pod(&self, pod: &BoundPod) -> Result<bool, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match bounded_by(self.write_timeout, api.delete(&pod.name, &dp)).await {
            Ok(_) => Ok(true),
            Err(ClusterError::Api(kube::Error::Api(s))) if s.is_not_found() || s.is_conflict() => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// A pod as a release names it.
fn label(p: &BoundPod) -> String {
    match p.terminating {
        true => format!("{p} (was Terminating)"),
        false => p.to_string(),
    }
}
