//! Release at attestation, the writer's part: once a fence landed, the fenced node's pods
//! force-deleted ([`Cluster::release_pods`]), counted, journaled and reported in one Event.
//! A release that does not happen leaves the pods to the pod garbage collector, which deletes
//! them once the node is NotReady: the fence itself stands either way.

use crate::cluster::{BoundPod, Cluster, ClusterError, EventType, PodRelease, reasons};
use crate::decision::{FenceAction, Rule, WriteGuard};
use crate::journal::{self, Journal, RecordKind};
use crate::status::Shared;

/// The action label of a release in metrics and the journal.
pub(super) const RELEASE_PODS: &str = "release_pods";

/// Releases the pods of `name`, just fenced by `action` under `guard`. After a taint they are
/// listed and the guard re-checked on the fenced Node; after a Node delete (`listed`: taken
/// right before it, the guard re-checked then) the Node is gone and only the write holds are
/// checked again.
pub(super) async fn release(
    cluster: &Cluster,
    shared: &Shared,
    name: &str,
    guard: &WriteGuard,
    action: FenceAction,
    listed: Option<Result<Vec<BoundPod>, ClusterError>>,
) -> Result<PodRelease, ClusterError> {
    let result = match (action, listed) {
        (FenceAction::Taint, _) => cluster.release_pods(name, guard).await,
        (FenceAction::DeleteNode, Some(Ok(pods))) => {
            cluster.force_delete_pods(&guard.uid, &pods).await
        }
        (FenceAction::DeleteNode, Some(Err(e))) => Err(e),
        (FenceAction::DeleteNode, None) => Ok(PodRelease::default()),
    };
    let m = &shared.metrics;
    match &result {
        Ok(r) => {
            for _ in &r.deleted {
                m.action("delete_pod", true);
            }
            for _ in &r.left {
                m.action("delete_pod", false);
            }
            m.action(RELEASE_PODS, r.left.is_empty());
        }
        Err(ClusterError::Abandoned(_)) => m.action_result(RELEASE_PODS, "abandoned"),
        Err(_) => m.action(RELEASE_PODS, false),
    }
    result
}

/// The release in the journal (one record, every pod named), the log and one Event on the
/// Node: `OobfencePodsReleased`, or `OobfencePodsNotReleased` (a warning) for what was left.
pub(super) async fn report(
    cluster: &Cluster,
    journal: &Journal,
    name: &str,
    uid: &str,
    rule: Rule,
    inputs: journal::Inputs,
    result: Result<PodRelease, ClusterError>,
) {
    let mut record = journal.record(name, uid, RecordKind::Action, rule.name(), inputs);
    record.action = RELEASE_PODS.to_string();
    record.lease_term = cluster.term();
    let (kind, reason) = match &result {
        Ok(r) if r.left.is_empty() => {
            record.result = "success".into();
            record.message = format!("pods released: {}", r.summary());
            (EventType::Normal, reasons::PODS_RELEASED)
        }
        Ok(r) => {
            record.result = "failure".into();
            record.message = format!("pods released in part: {}", r.summary());
            record.error = Some(
                r.left
                    .iter()
                    .map(|(p, why)| format!("{p}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
            (EventType::Warning, reasons::PODS_NOT_RELEASED)
        }
        Err(e) => {
            let abandoned = matches!(e, ClusterError::Abandoned(_));
            record.result = if abandoned { "abandoned" } else { "failure" }.into();
            record.error = Some(e.to_string());
            record.message = format!(
                "pods NOT released ({e}); the fence stands, and the pod garbage collector deletes them once the node is NotReady"
            );
            (EventType::Warning, reasons::PODS_NOT_RELEASED)
        }
    };
    record.event = reason.to_string();
    match kind {
        EventType::Normal => {
            tracing::warn!(node = %name, action = RELEASE_PODS, "{}", record.message)
        }
        EventType::Warning => {
            tracing::error!(node = %name, action = RELEASE_PODS, "{}", record.message)
        }
    }
    cluster.event(name, kind, reason, &record.message).await;
    journal.submit_wait(&record).await;
}
