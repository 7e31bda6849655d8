//! The Node side of opt-in actuation: a power action recorded on the Node right before it is
//! sent (the guard re-checked on a fresh read, a `resourceVersion` precondition, retried on
//! 409), and taken back when it was never sent. The record is what keeps a restart, or another
//! `[ha]` instance, from powering one boot off twice.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::node_facts::{boot_id, power_record};
use super::{
    ANNOTATION_POWERED_OFF_AT, ANNOTATION_POWERED_OFF_BOOT_ID, ANNOTATION_POWERED_OFF_BY,
    ANNOTATION_POWERED_ON_AT, Cluster, ClusterError, NodeView, bounded_by,
};
use crate::decision::WriteGuard;
use crate::power::{PowerAction, Reply};

impl Cluster {
    /// Records `action` on the Node, after re-checking `guard` on a fresh read. Returns when.
    pub async fn record_power_action(
        &self,
        name: &str,
        guard: &WriteGuard,
        action: PowerAction,
    ) -> Result<Timestamp, ClusterError> {
        let attempts = AtomicUsize::new(0);
        self.on_conflict_retry(|| async {
            attempts.fetch_add(1, Ordering::Relaxed);
            let node = self.fresh_node(name, &guard.uid).await?;
            self.recheck(&node, guard).await?;
            let view = NodeView::from(&node);
            let record = power_record(&view, &self.actor);
            let now = crate::clock::now();
            let annotations = match action {
                PowerAction::Off => {
                    if record
                        .as_ref()
                        .is_some_and(|r| r.boot_id == boot_id(&view))
                    {
                        return Err(ClusterError::Precondition(format!(
                            "node {name}'s machine was already powered off once in this boot; never twice"
                        )));
                    }
                    json!({
                        ANNOTATION_POWERED_OFF_AT: now.to_string(),
                        ANNOTATION_POWERED_OFF_BOOT_ID: boot_id(&view),
                        ANNOTATION_POWERED_OFF_BY: self.signature(),
                        ANNOTATION_POWERED_ON_AT: serde_json::Value::Null,
                    })
                }
                PowerAction::On => {
                    match &record {
                        Some(r) if r.ours && r.on_at.is_none() => {}
                        _ => {
                            return Err(ClusterError::Precondition(format!(
                                "node {name} carries no power-off of this daemon's still to be undone"
                            )));
                        }
                    }
                    json!({ ANNOTATION_POWERED_ON_AT: now.to_string() })
                }
            };
            let patch = json!({
                "metadata": {
                    "resourceVersion": node.resource_version(),
                    "annotations": annotations,
                }
            });
            // The fresh read and the re-check took calls: the holds and leadership once more.
            self.may_still_write_now(&guard.uid)?;
            bounded_by(
                self.write_timeout,
                self.nodes()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            Ok(now)
        })
        .await
    }

    /// The check a power source runs right before its command, on its own read: `machine`
    /// (the node's machine, in the state the action expects), then the pause ConfigMap read
    /// now (bounded; one that cannot be read refuses), the write holds as they stand now and,
    /// last, with `[ha]` this instance's leadership. The holds the daemon passes are a pass
    /// old: an operator's pause set since must still stop the command.
    pub fn command_check<M>(
        &self,
        uid: &str,
        machine: M,
    ) -> impl Fn(&Reply) -> BoxFuture<'static, Result<(), String>> + Send + Sync + use<M>
    where
        M: Fn(&Reply) -> Result<(), String> + Send + Sync,
    {
        let (cluster, uid) = (self.clone(), uid.to_string());
        move |reply: &Reply| {
            let machine = machine(reply);
            let (cluster, uid) = (cluster.clone(), uid.clone());
            Box::pin(async move {
                machine?;
                cluster
                    .may_send(&uid)
                    .await
                    .map_err(|e| format!("not sent: {e}"))
            })
        }
    }

    /// Takes back the record of `action` that was never sent (its source refused or failed),
    /// so that the next decision may send it again, after its backoff. Not while a hold is on
    /// writes or, with `[ha]`, past this instance's deadline.
    pub async fn forget_power_action(
        &self,
        name: &str,
        uid: &str,
        action: PowerAction,
    ) -> Result<(), ClusterError> {
        let keys: &[&str] = match action {
            PowerAction::Off => &[
                ANNOTATION_POWERED_OFF_AT,
                ANNOTATION_POWERED_OFF_BOOT_ID,
                ANNOTATION_POWERED_OFF_BY,
            ],
            PowerAction::On => &[ANNOTATION_POWERED_ON_AT],
        };
        let annotations: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .map(|k| (k.to_string(), serde_json::Value::Null))
            .collect();
        self.on_conflict_retry(|| async {
            let node = self.fresh_node(name, uid).await?;
            let patch = json!({
                "metadata": {
                    "resourceVersion": node.resource_version(),
                    "annotations": annotations,
                }
            });
            // A write like any other: the holds and leadership as they stand after the read.
            // Left in place, the record only keeps this boot from a second power-off.
            self.may_still_write_now(uid)?;
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
}
