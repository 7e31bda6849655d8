//! What tests read off a Node and around it: its taints and whose they are, its Ready
//! condition, an annotation, its Events, the guard a fence decision about it would carry; and
//! a VolumeAttachment to create for it.

use super::*;

/// The field manager that owns a Node's `spec.taints` (an atomic list: its last writer), from
/// the object's managedFields; the API server names it after the writer's User-Agent.
pub fn taints_owner(n: &Node) -> Option<String> {
    n.managed_fields().iter().find_map(|m| {
        let fields = &m.fields_v1.as_ref()?.0;
        fields.get("f:spec")?.get("f:taints").and(m.manager.clone())
    })
}

pub fn ready_condition_of(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
}

pub fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

pub fn annotation(node: &Node, key: &str) -> Option<String> {
    node.annotations().get(key).cloned()
}

/// A VolumeAttachment of persistent volume `pv` to `node`, by `attacher` (a CSI driver).
pub fn volume_attachment(name: &str, node: &str, attacher: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: attacher.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

/// Events oobfence emitted about a node, by reason.
pub async fn events_for(client: &Client, node: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("oobfence"))
        .collect()
}

/// What a fence decision about `node`, as it is now, would carry: its uid, bootID and Lease
/// renewTime, and an Off read taken just now.
pub async fn fence_guard_for(client: &Client, node: &Node) -> oobfence::decision::WriteGuard {
    let leases: Api<Lease> =
        Api::namespaced(client.clone(), oobfence::cluster::NODE_LEASE_NAMESPACE);
    let lease = leases.get_opt(&node.name_any()).await.unwrap();
    oobfence::decision::WriteGuard {
        purpose: oobfence::decision::GuardPurpose::Fence,
        uid: node.uid().unwrap(),
        boot_id: oobfence::cluster::boot_id(&oobfence::cluster::NodeView::from(node)),
        lease_renew_time: lease.as_ref().and_then(oobfence::cluster::lease_renewed),
        evidence_at: jiff::Timestamp::now(),
        read_max_age: Duration::from_secs(30),
        while_ready: false,
        ready_heartbeat: None,
        release_pods: false,
        on_word: false,
    }
}
