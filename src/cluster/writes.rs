//! Every write to the cluster: the fence taint and its record, lifting them, deleting a Node
//! and its VolumeAttachments. Each carries its preconditions: a fresh read of the same object
//! (uid), the decision's guard re-checked at the last moment together with the holds and the
//! pause ConfigMap, `resourceVersion` on the patch, and with `[ha]` this instance's standing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};

use super::NodeView;
use super::events::{EventType, reasons};
use super::fenced_on::FencedOn;
use super::node_facts::{
    boot_id, fence_record, is_out_of_service, lease_renewed, power_record, readiness,
    ready_heartbeat,
};
use super::{
    ANNOTATION_ACTION, ANNOTATION_FENCED_AT, ANNOTATION_FENCED_BOOT_ID, ANNOTATION_FENCED_BY,
    ANNOTATION_FENCED_ON, ANNOTATION_REASON, CONFLICT_ATTEMPTS, Cluster, ClusterError, FenceWrite,
    NODE_LEASE_NAMESPACE, OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE,
    RecordedAttachment, bounded, bounded_by,
};
use crate::decision::confirmation::{self, ConfirmationNote};
use crate::decision::{self, FenceAction, FreshNode, Holds, WriteGuard};

impl Cluster {
    /// The last check before a write that came after other calls: the write holds (pause,
    /// stale view, standby) as they stand now, and with `[ha]` this instance's own deadline
    /// ([`crate::leader::Leadership::may_write`]), read last and here whatever the holds say.
    pub(super) async fn may_still_write(&self, uid: &str) -> Result<(), ClusterError> {
        if let Some(h) = self.holds_at_write(uid).await?.write {
            return Err(ClusterError::Abandoned(h.reason));
        }
        self.still_leading()
    }

    /// [`Self::may_still_write`] without the pause ConfigMap's fresh read: what the daemon
    /// holds as it stands now and this instance's `[ha]` deadline. For each of a batch of
    /// writes whose first was checked in full.
    pub(super) fn may_still_write_now(&self, uid: &str) -> Result<(), ClusterError> {
        if let Some(h) = (self.holds_now)(uid).write {
            return Err(ClusterError::Abandoned(h.reason));
        }
        self.still_leading()
    }

    /// Whether a power command for `uid` may be sent now: the pause ConfigMap read afresh, no
    /// hold on writes, and with `[ha]` this instance still leading by its own deadline.
    /// A switch that cannot be read holds the command, saying which.
    pub async fn may_send(&self, uid: &str) -> Result<(), ClusterError> {
        self.may_still_write(uid).await.map_err(|e| match e {
            ClusterError::Abandoned(_) => e,
            unread => {
                let cm = self
                    .pause_configmap
                    .as_ref()
                    .map_or_else(|| "the pause ConfigMap".to_string(), |cm| format!("the pause ConfigMap {cm}"));
                ClusterError::Abandoned(format!(
                    "{cm} cannot be read right before it ({unread}): nothing is sent on a switch nobody could read"
                ))
            }
        })
    }

    /// With `[ha]`, whether this instance may still write by its own deadline.
    fn still_leading(&self) -> Result<(), ClusterError> {
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

    /// A fresh read of the node, the same object the decision was about: the cache the
    /// decision used may be a moment old.
    pub(super) async fn fresh_node(&self, name: &str, uid: &str) -> Result<Node, ClusterError> {
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
    pub(super) async fn recheck(
        &self,
        node: &Node,
        guard: &WriteGuard,
    ) -> Result<(), ClusterError> {
        let lease_renew_time = match guard.purpose {
            decision::GuardPurpose::Fence
            | decision::GuardPurpose::ReleasePods
            | decision::GuardPurpose::PowerOff => {
                self.fresh_lease_renew_time(&node.name_any()).await?
            }
            decision::GuardPurpose::Unfence | decision::GuardPurpose::PowerOn => None,
        };
        let view = NodeView::from(node);
        let fresh = FreshNode {
            uid: view.uid.clone(),
            readiness: readiness(&view),
            boot_id: boot_id(&view),
            lease_renew_time,
            ready_heartbeat: ready_heartbeat(&view),
            fence: fence_record(&view, &self.actor),
        };
        let holds = self.holds_at_write(&fresh.uid).await?;
        decision::recheck(guard, &fresh, &holds, crate::clock::now())
            .map_err(ClusterError::Abandoned)
    }

    /// Retries `op` on 409 Conflict, a few times with jittered backoff; other errors return.
    pub(super) async fn on_conflict_retry<T, F, Fut>(&self, op: F) -> Result<T, ClusterError>
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
        self.apply_fence_taint_on(name, guard, reason, FencedOn::Power)
            .await
    }

    /// [`Self::apply_fence_taint`], resting on `on`: a person's confirmation is checked on the
    /// fresh read too, and the Node records what the fence rests on.
    pub async fn apply_fence_taint_on(
        &self,
        name: &str,
        guard: &WriteGuard,
        reason: &str,
        on: FencedOn<'_>,
    ) -> Result<FenceWrite, ClusterError> {
        let attempts = AtomicUsize::new(0);
        self.on_conflict_retry(|| async {
            let attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            let node = self.fresh_node(name, &guard.uid).await?;
            // Our own fence already in place (a retry after the cache lagged): nothing to do.
            if let Some(record) = fence_record(&NodeView::from(&node), &self.actor)
                .filter(|r| r.ours && r.taint_present)
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
            on.still_stands(&node)?;
            self.recheck(&node, guard).await?;
            let now = crate::clock::now();
            let boot = boot_id(&NodeView::from(&node));
            let patch = fence_taint_patch(&node, now, &self.signature(), reason, on);
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

    /// Drops this daemon's fence record (its taint is already gone); the record of a power-off
    /// of the boot the node still reports stays.
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
            match fence_record(&NodeView::from(&node), &self.actor) {
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
            // The power record goes with the fence record only once the node reports another
            // boot: a person's untaint leaves the machine's boot as it was, and the record is
            // what keeps that boot from a second power-off when it reads On again.
            let view = NodeView::from(&node);
            let other_boot = power_record(&view, &self.actor)
                .is_none_or(|r| r.boot_id != boot_id(&view));
            let power: &[&str] = if other_boot {
                &super::POWER_ANNOTATIONS
            } else {
                &[]
            };
            // A person's confirmation is spent with the fence: by a person's untaint, and by
            // an unfence on a new boot (one it does not name; it never counts there anyway).
            let spent = view
                .annotations
                .get(confirmation::ANNOTATION)
                .is_some_and(|v| {
                    untaint.is_none()
                        || ConfirmationNote::parse(v).is_ok_and(|n| n.boot_id != boot_id(&view))
                });
            let confirmed: &[&str] = if spent {
                &[confirmation::ANNOTATION]
            } else {
                &[]
            };
            let annotations: serde_json::Map<String, serde_json::Value> = [
                ANNOTATION_FENCED_AT,
                ANNOTATION_FENCED_BOOT_ID,
                ANNOTATION_ACTION,
                ANNOTATION_FENCED_BY,
                ANNOTATION_REASON,
                ANNOTATION_FENCED_ON,
            ]
            .iter()
            .chain(power)
            .chain(confirmed)
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
        self.delete_node_on(name, guard, FencedOn::Power).await
    }

    /// [`Self::delete_node`], resting on `on` (a person's confirmation is checked on the fresh
    /// read too).
    pub async fn delete_node_on(
        &self,
        name: &str,
        guard: &WriteGuard,
        on: FencedOn<'_>,
    ) -> Result<FenceWrite, ClusterError> {
        let uid = guard.uid.as_str();
        let attempts = AtomicUsize::new(0);
        self.on_conflict_retry(|| async {
            let attempt = attempts.fetch_add(1, Ordering::Relaxed) + 1;
            let node = self.fresh_node(name, uid).await?;
            on.still_stands(&node)?;
            self.recheck(&node, guard).await?;
            let backup = json!({
                "labels": node.metadata.labels.clone().unwrap_or_default(),
                "annotations": node.metadata.annotations.clone().unwrap_or_default(),
                "taints": taints(&node),
            })
            .to_string();
            self.event(
                &node.name_any(),
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
                boot_id: boot_id(&NodeView::from(&node)),
                at: crate::clock::now(),
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
}

/// The taints of a Node as read afresh: the whole list, which a write replaces.
/// The fence: every taint the node has plus the out-of-service one, oobfence's annotations,
/// and the node's resourceVersion as the precondition (the list is atomic: see the header).
fn fence_taint_patch(
    node: &Node,
    now: Timestamp,
    signature: &str,
    reason: &str,
    on: FencedOn<'_>,
) -> Value {
    let mut list: Vec<Taint> = taints(node).to_vec();
    list.push(Taint {
        key: OUT_OF_SERVICE_KEY.into(),
        value: Some(OUT_OF_SERVICE_VALUE.into()),
        effect: OUT_OF_SERVICE_EFFECT.into(),
        time_added: Some(Time(now)),
    });
    json!({
        "metadata": {
            "resourceVersion": node.resource_version(),
            "annotations": {
                ANNOTATION_FENCED_AT: now.to_string(),
                ANNOTATION_FENCED_BOOT_ID: boot_id(&NodeView::from(node)),
                ANNOTATION_ACTION: FenceAction::Taint.to_string(),
                ANNOTATION_FENCED_BY: signature,
                ANNOTATION_REASON: reason,
                ANNOTATION_FENCED_ON: on.label(),
            }
        },
        "spec": { "taints": list }
    })
}

impl Cluster {
    /// The fence write `action` would make on the node now, sent as a server-side dry run
    /// (`dryRun=All`): the API server authorizes, admits and validates the exact request
    /// (the taint patch with its resourceVersion precondition, or the delete with its uid
    /// precondition) and stores nothing. For `oobfence drill`.
    pub async fn rehearse_fence(
        &self,
        name: &str,
        action: FenceAction,
    ) -> Result<(), ClusterError> {
        let node = bounded(self.nodes().get(name)).await?;
        match action {
            FenceAction::Taint => {
                if taints(&node).iter().any(is_out_of_service) {
                    return Err(ClusterError::Precondition(format!(
                        "node {name} already has an out-of-service taint"
                    )));
                }
                let patch = fence_taint_patch(
                    &node,
                    crate::clock::now(),
                    &self.signature(),
                    "oobfence drill: a server-side dry run, nothing stored",
                    FencedOn::Power,
                );
                let params = PatchParams {
                    dry_run: true,
                    ..Default::default()
                };
                bounded(self.nodes().patch(name, &params, &Patch::Merge(&patch))).await?;
            }
            FenceAction::DeleteNode => {
                let params = DeleteParams {
                    dry_run: true,
                    preconditions: Some(Preconditions {
                        uid: node.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                bounded(self.nodes().delete(name, &params)).await?;
            }
        }
        Ok(())
    }
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[])
}
