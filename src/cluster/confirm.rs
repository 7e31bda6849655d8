//! A person's confirmation written on the Node (`oobfence confirm-off`) and withdrawn: read
//! fresh, refused unless the node is NotReady and silent, naming its current boot, written
//! with the Node's resourceVersion as the precondition (a 409 reads and checks again).

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::node_facts::{boot_id, lease_duration, lease_renewed, readiness};
use super::{CONFLICT_ATTEMPTS, ClusterError, NODE_LEASE_NAMESPACE, NodeView, bounded};
use crate::decision::DEFAULT_LEASE_DURATION;
use crate::decision::confirmation::{ANNOTATION, ConfirmationNote, may_confirm};

/// Writes a person's confirmation that node `name`'s machine is off, for the boot it reports
/// now; `now` dates it. Refused ([`ClusterError::Precondition`], naming why) unless the node
/// is NotReady and its Lease unrenewed for at least its duration. Returns what was written.
pub async fn confirm_off(
    client: &Client,
    name: &str,
    reason: &str,
    by: &str,
    now: impl Fn() -> Timestamp,
) -> Result<ConfirmationNote, ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let mut last = None;
    for _ in 0..CONFLICT_ATTEMPTS {
        let node = fresh(&nodes, name).await?;
        let lease = bounded(leases.get_opt(name)).await?;
        let view = NodeView::from(&node);
        let duration = lease
            .as_ref()
            .and_then(lease_duration)
            .unwrap_or(DEFAULT_LEASE_DURATION);
        let at = now();
        let boot = boot_id(&view);
        may_confirm(
            &readiness(&view),
            &boot,
            lease.as_ref().and_then(lease_renewed),
            duration,
            at,
        )
        .map_err(|why| {
            ClusterError::Precondition(format!("node {name} is not confirmed off: {why}"))
        })?;
        let note = ConfirmationNote {
            boot_id: boot,
            reason: reason.to_string(),
            by: by.to_string(),
            at: Some(at),
        };
        let value = serde_json::to_string(&note).expect("a note serializes");
        let patch = json!({
            "metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": { ANNOTATION: value },
            }
        });
        match bounded(nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await {
            Ok(_) => return Ok(note),
            Err(e) if e.is_conflict() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Removes the confirmation from node `name`; whether there was one.
pub async fn withdraw_confirmation(client: &Client, name: &str) -> Result<bool, ClusterError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = fresh(&nodes, name).await?;
    if !node.annotations().contains_key(ANNOTATION) {
        return Ok(false);
    }
    let patch = json!({ "metadata": { "annotations": { ANNOTATION: null } } });
    bounded(nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await?;
    Ok(true)
}

async fn fresh(nodes: &Api<Node>, name: &str) -> Result<Node, ClusterError> {
    bounded(nodes.get_opt(name)).await?.ok_or_else(|| {
        ClusterError::Precondition(format!(
            "node {name} does not exist (`kubectl get nodes` lists the names)"
        ))
    })
}
