//! Pods bound to the test nodes, as the scheduler leaves them: what a fence releases.

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Toleration, Volume,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

use super::TEST_LABEL;

/// The test pods live in "default", labelled with their node's name.
pub const NAMESPACE: &str = "default";

/// Creates a pod bound to `node` (as the scheduler leaves it), changed by `shape` first.
pub async fn bound_pod(
    client: &Client,
    node: &str,
    name: &str,
    shape: impl FnOnce(&mut Pod),
) -> Pod {
    let mut pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some([(TEST_LABEL.to_string(), node.to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.invalid/none".into()),
                ..Default::default()
            }],
            automount_service_account_token: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    shape(&mut pod);
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"))
}

/// A pod that mounts a claim (what a StatefulSet's replica does).
pub fn with_claim(pod: &mut Pod) {
    pod.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: "data-db-0".into(),
            read_only: None,
        }),
        ..Default::default()
    }]);
}

/// A pod that tolerates the out-of-service taint (the taint manager never evicts it).
pub fn tolerating(pod: &mut Pod) {
    pod.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
        key: Some(oobfence::cluster::OUT_OF_SERVICE_KEY.into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
}

/// The names of the pods bound to `node` now.
pub async fn pods_on(client: &Client, node: &str) -> Vec<String> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut names: Vec<String> = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&lp)
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    names.sort();
    names
}

/// Deletes a test pod at once (grace period 0: there is no kubelet to finish it); gone
/// already is fine.
pub async fn force_delete_pod(client: &Client, name: &str) {
    let _ = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
}
