//! Debian's `fence_kubevirt` against KubeVirt's own objects on the test API server: the
//! VirtualMachine and VirtualMachineInstance CRDs installed there, a VMI whose phase the test
//! sets. A Running VMI reads On; a VMI in another phase is no answer (never Off); a VM without a
//! VMI (stopped) reads Off; no VM at all is an error.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

use super::support::k8s;
use super::{entry, source};
use oobfence::power::{PowerSource, PowerState};

/// KubeVirt's two kinds, as CRDs that keep whatever they are given.
async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (kind, plural, short) in [
        ("VirtualMachine", "virtualmachines", "vm"),
        ("VirtualMachineInstance", "virtualmachineinstances", "vmi"),
    ] {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.kubevirt.io")},
            "spec": {
                "group": "kubevirt.io",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "shortNames": [short]},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
                }]
            }
        });
        crds.patch(
            &format!("{plural}.kubevirt.io"),
            &PatchParams::apply("oobfence-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("install the {kind} CRD: {e}"));
    }
}

fn resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_lowercase());
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubevirt.io", "v1", kind), &plural)
}

async fn create(api: &Api<DynamicObject>, doc: serde_json::Value) {
    let obj: DynamicObject = serde_json::from_value(doc).unwrap();
    // Served once the CRD is established: retried for a while.
    k8s::wait_for(
        "the KubeVirt object created",
        Duration::from_secs(30),
        || async {
            api.create(&PostParams::default(), &obj)
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_kubevirt_reads_a_vmi_running_as_on_a_stopped_vm_as_off_and_nothing_else_as_off() {
    let client = k8s::client().await;
    install_crds(&client).await;
    let ns = k8s::unique("kv");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let vms: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &resource("VirtualMachine"));
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &resource("VirtualMachineInstance"));
    let vmi = |phase: &str| {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "db-0", "namespace": ns},
            "spec": {}, "status": {"phase": phase}
        })
    };
    create(
        &vms,
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "db-0", "namespace": ns},
            "spec": {"running": true}
        }),
    )
    .await;
    create(&vmis, vmi("Running")).await;

    let dir = tempfile::tempdir().unwrap();
    let lines = |plug: &str| {
        format!(
            "agent = \"fence_kubevirt\"\ntimeout = \"60s\"\nplug = \"{plug}\"\noptions = {{ kubeconfig = \"{}\", namespace = \"{ns}\" }}\n",
            k8s::kubeconfig_path().display()
        )
    };
    let e = entry(dir.path(), &lines("db-0"), None).unwrap();
    let src = source(&e);
    assert_eq!(src.read().await, PowerState::On);

    // Scheduling, paused, migrating...: the agent answers "unknown", never Off.
    vmis.delete("db-0", &DeleteParams::default()).await.unwrap();
    create(&vmis, vmi("Scheduling")).await;
    let state = src.read().await;
    assert!(
        matches!(state, PowerState::Error { .. }),
        "a Scheduling VMI read {state:?}"
    );

    // Stopped: the VM without its instance.
    vmis.delete("db-0", &DeleteParams::default()).await.unwrap();
    k8s::wait_for("the VMI gone", Duration::from_secs(30), || async {
        vmis.get_opt("db-0")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(src.read().await, PowerState::Off);

    // No such VM: an error, never Off.
    let e = entry(dir.path(), &lines("no-such-vm"), None).unwrap();
    let state = source(&e).read().await;
    assert!(
        matches!(state, PowerState::Error { .. }),
        "a VM that does not exist read {state:?}"
    );
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
