//! deploy/rbac.yaml on a real kube-apiserver with RBAC on: the token that
//! `oobfence make-kubeconfig` mints for its ServiceAccount lets the daemon do its whole job
//! (watch, fence, report, release a fenced node's pods) and nothing else (no Secrets, no
//! other namespace, nothing of Pods but list and delete); `check-config --probe` names what a
//! kubeconfig lacks (`rbac/probe.rs`); a token shorter than asked is named
//! (`rbac/token_cap.rs`); a guards' record the token may not read holds new fences
//! (`rbac/guard_record.rs`); a whole daemon fences with the minted kubeconfig alone
//! (`rbac/minted_daemon.rs`).

mod support;

#[path = "rbac/guard_record.rs"]
mod guard_record;
#[path = "rbac/minted_daemon.rs"]
mod minted_daemon;
#[path = "rbac/probe.rs"]
mod probe;
#[path = "rbac/token_cap.rs"]
mod token_cap;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Node, ObjectReference, Pod, PodSpec, Secret, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Client, ResourceExt};
use serde_json::json;

use oobfence::kubeconfig::{NEEDED, NOT_NEEDED, allowed};
use support::k8s::{FakeNode, events_for, unique, wait_for};
use support::scenario::Scenario;

const RBAC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml");

/// The documents of deploy/rbac.yaml as JSON, parsed by PyYAML (Debian's python3-yaml).
fn rbac_documents() -> Vec<serde_json::Value> {
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
        ])
        .stdin(std::fs::File::open(RBAC).expect("open deploy/rbac.yaml"))
        .output()
        .expect("run /usr/bin/python3 (scripts/install-deps installs it with python3-yaml)");
    assert!(
        out.status.success(),
        "parsing deploy/rbac.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from python")
}

/// `kubectl apply -f deploy/rbac.yaml`, as a server-side apply of each document.
async fn apply_rbac(admin: &Client) {
    let docs = rbac_documents();
    assert!(
        docs.len() >= 4,
        "deploy/rbac.yaml has {} documents",
        docs.len()
    );
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("a Kubernetes object");
        let types = obj.types.as_ref().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(types).expect("group/version/kind");
        let (resource, caps) = kube::discovery::pinned_kind(admin, &gvk)
            .await
            .unwrap_or_else(|e| panic!("the API server does not serve {gvk:?}: {e}"));
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                admin.clone(),
                obj.namespace()
                    .as_deref()
                    .expect("namespace of a namespaced object"),
                &resource,
            ),
            Scope::Cluster => Api::all_with(admin.clone(), &resource),
        };
        api.patch(
            &obj.name_any(),
            &PatchParams::apply("oobfence-tests").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {}: {e}", gvk.kind, obj.name_any()));
    }
    // The controller-manager fills nothing in here: TokenRequest needs only the account.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "oobfence");
    accounts
        .get("oobfence")
        .await
        .expect("the ServiceAccount exists");
}

/// Runs the real `oobfence make-kubeconfig` with the test cluster's admin kubeconfig.
async fn make_kubeconfig(output: &Path, extra: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .arg("make-kubeconfig")
        .arg("--kubeconfig")
        .arg(support::k8s::kubeconfig_path())
        .arg("--output")
        .arg(output)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run oobfence make-kubeconfig")
}

/// A fresh token kubeconfig for the ServiceAccount, and a client using it.
async fn service_account_client(admin: &Client, dir: &Path) -> (PathBuf, Client) {
    apply_rbac(admin).await;
    let path = dir.join("oobfence.kubeconfig");
    let out = make_kubeconfig(&path, &["--duration", "1h"]).await;
    assert!(
        out.status.success(),
        "make-kubeconfig: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read the minted kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("the minted kubeconfig is usable");
    (path, Client::try_from(cfg).expect("client"))
}

fn assert_forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: wanted 403 Forbidden, got {other:?}"),
    }
}

fn assert_allowed<T>(what: &str, result: Result<T, kube::Error>) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn node_event(node: &str, namespace: &str) -> Event {
    Event {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{node}.rbac-test.")),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..Default::default()
        },
        reason: Some("RbacTest".into()),
        message: Some("written by tests/rbac.rs".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_kubeconfig_writes_a_private_expiring_token_kubeconfig() {
    let admin = support::k8s::client().await;
    apply_rbac(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.kubeconfig");

    let out = make_kubeconfig(&path, &["--duration", "2h"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.trim().is_empty(),
        "no warning about the ServiceAccount's permissions: {stderr}"
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is private");

    // The expiry asked for, as the API server granted it.
    let line = stdout
        .lines()
        .find(|l| l.contains("token valid until"))
        .unwrap_or_else(|| panic!("no expiry printed: {stdout}"));
    let expires: jiff::Timestamp = line
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .expect("an RFC 3339 expiry");
    let left = expires.duration_since(jiff::Timestamp::now());
    assert!(
        left > jiff::SignedDuration::from_mins(115) && left < jiff::SignedDuration::from_mins(125),
        "token lifetime {left:?}, asked for 2h"
    );

    // Only the token: nothing of the administrator's certificate or key.
    let text = std::fs::read_to_string(&path).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let user = serde_json::to_value(kc.auth_infos[0].auth_info.as_ref().unwrap()).unwrap();
    assert!(
        user["token"].as_str().is_some_and(|t| t.len() > 100),
        "a JWT"
    );
    assert!(!text.contains("client-key-data") && !text.contains("client-certificate-data"));
    // Same API server, same CA certificates as the administrator's kubeconfig.
    let load = |path: PathBuf| async move {
        let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap()
    };
    let theirs = load(support::k8s::kubeconfig_path()).await;
    let ours = load(path.clone()).await;
    assert_eq!(ours.cluster_url, theirs.cluster_url);
    assert_eq!(
        ours.root_cert, theirs.root_cert,
        "the cluster's CA is carried over"
    );
    assert_eq!(ours.accept_invalid_certs, theirs.accept_invalid_certs);

    // The API server's minimum lifetime, and a missing account.
    let short = make_kubeconfig(&dir.path().join("short"), &["--duration", "5m"]).await;
    assert_eq!(short.status.code(), Some(2), "{short:?}");
    assert!(String::from_utf8_lossy(&short.stderr).contains("at least 10m"));
    let missing = make_kubeconfig(
        &dir.path().join("missing"),
        &["--service-account", "no-such-account"],
    )
    .await;
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let why = String::from_utf8_lossy(&missing.stderr);
    assert!(
        why.contains("oobfence/no-such-account not found") && why.contains("rbac.yaml"),
        "{why}"
    );
    assert!(!dir.path().join("missing").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_may_do_the_daemons_work_and_nothing_more() {
    let admin = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let (_, sa) = service_account_client(&admin, dir.path()).await;

    // What the API server's authorizer says, for the whole list the daemon relies on...
    for p in NEEDED {
        assert_eq!(allowed(&sa, p).await, Ok(true), "the token may {p}");
    }
    for p in NOT_NEEDED {
        assert_eq!(allowed(&sa, p).await, Ok(false), "the token may not {p}");
    }

    // ...and real calls. What the daemon does:
    let nodes: Api<Node> = Api::all(sa.clone());
    assert_allowed("list nodes", nodes.list(&ListParams::default()).await);
    let leases: Api<Lease> = Api::namespaced(sa.clone(), "kube-node-lease");
    assert_allowed(
        "list leases in kube-node-lease",
        leases.list(&ListParams::default()).await,
    );
    let vas: Api<VolumeAttachment> = Api::all(sa.clone());
    assert_allowed(
        "list volumeattachments",
        vas.list(&ListParams::default()).await,
    );
    let group = unique("rbac");
    let scratch = FakeNode::create(&admin, &format!("{group}-x"), &group, "boot-1").await;
    let events: Api<Event> = Api::namespaced(sa.clone(), "default");
    let ev = assert_allowed(
        "create an Event in default",
        events
            .create(
                &PostParams::default(),
                &node_event(&scratch.name, "default"),
            )
            .await,
    );
    let _ = Api::<Event>::namespaced(admin.clone(), "default")
        .delete(&ev.name_any(), &DeleteParams::default())
        .await;
    assert_allowed(
        "patch a node",
        nodes
            .patch(
                &scratch.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"oobfence.test/rbac": "yes"}}})),
            )
            .await,
    );
    assert_allowed(
        "delete a node",
        nodes.delete(&scratch.name, &DeleteParams::default()).await,
    );

    // What it must not do.
    assert_forbidden(
        "list secrets",
        Api::<Secret>::all(sa.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "list secrets in kube-system",
        Api::<Secret>::namespaced(sa.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "get a secret in oobfence's own namespace",
        Api::<Secret>::namespaced(sa.clone(), "oobfence")
            .get("anything")
            .await,
    );
    // Pods: list (a fenced node's, by field selector) and force-delete; nothing else.
    assert_allowed(
        "list the pods bound to a node",
        Api::<Pod>::all(sa.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={group}-x")))
            .await,
    );
    let pod = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{group}-pod")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "c".into(),
                image: Some("registry.invalid/none".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_forbidden(
        "create a pod",
        Api::<Pod>::namespaced(sa.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await,
    );
    let pods_as_admin = Api::<Pod>::namespaced(admin.clone(), "default");
    let created = pods_as_admin
        .create(&PostParams::default(), &pod)
        .await
        .expect("the admin creates a scratch pod");
    let pods_as_sa = Api::<Pod>::namespaced(sa.clone(), "default");
    assert_forbidden("get a pod", pods_as_sa.get(&created.name_any()).await);
    assert_forbidden(
        "patch a pod",
        pods_as_sa
            .patch(
                &created.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"oobfence.test/rbac": "yes"}}})),
            )
            .await,
    );
    assert_allowed(
        "force-delete a pod",
        pods_as_sa
            .delete(
                &created.name_any(),
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await,
    );
    // The pause switch, that ConfigMap only (absent here: allowed to look, 404).
    let pause_cm = Api::<ConfigMap>::namespaced(sa.clone(), "oobfence")
        .get_opt("oobfence-pause")
        .await;
    assert!(
        matches!(pause_cm, Ok(None)),
        "get the pause ConfigMap: {pause_cm:?}"
    );
    // `oobfence pause` under [ha] annotates it with the daemon's kubeconfig (404: allowed).
    let patched = Api::<ConfigMap>::namespaced(sa.clone(), "oobfence")
        .patch(
            "oobfence-pause",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"oobfence.io/paused-dc1": "x"}}})),
        )
        .await;
    assert!(
        matches!(&patched, Err(kube::Error::Api(s)) if s.code == 404),
        "patch the pause ConfigMap: {patched:?}"
    );
    assert_forbidden(
        "get another ConfigMap in oobfence's namespace",
        Api::<ConfigMap>::namespaced(sa.clone(), "oobfence")
            .get("anything-else")
            .await,
    );
    // The guards' record: that ConfigMap only (created by the file), read and patched on
    // a key of its own; never deleted nor replaced.
    let guards = Api::<ConfigMap>::namespaced(sa.clone(), "oobfence");
    assert_allowed(
        "get the guards' record",
        guards.get("oobfence-guards").await,
    );
    let key = format!("{group}.json");
    assert_allowed(
        "patch the guards' record",
        guards
            .patch(
                "oobfence-guards",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {&key: "{}"}})),
            )
            .await,
    );
    assert_forbidden(
        "delete the guards' record",
        guards
            .delete("oobfence-guards", &DeleteParams::default())
            .await,
    );
    assert_forbidden(
        "create another ConfigMap in oobfence's namespace",
        guards
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("{group}-cm")}}))
                    .unwrap(),
            )
            .await,
    );
    let _ = Api::<ConfigMap>::namespaced(admin.clone(), "oobfence")
        .patch(
            "oobfence-guards",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {&key: null}})),
        )
        .await;
    // [ha]: the election Lease in oobfence's namespace: read, create, renew; nothing more.
    let ha_leases = Api::<Lease>::namespaced(sa.clone(), "oobfence");
    let lease_name = format!("{group}-ha");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": lease_name, "namespace": "oobfence"},
        "spec": {"holderIdentity": "rbac-test", "leaseDurationSeconds": 30}
    }))
    .unwrap();
    let mut created = assert_allowed(
        "create the election Lease",
        ha_leases.create(&PostParams::default(), &lease).await,
    );
    created.spec.as_mut().unwrap().lease_transitions = Some(1);
    assert_allowed(
        "renew the election Lease",
        ha_leases
            .replace(&lease_name, &PostParams::default(), &created)
            .await,
    );
    assert_allowed("read the election Lease", ha_leases.get(&lease_name).await);
    assert_forbidden(
        "delete the election Lease",
        ha_leases
            .delete(&lease_name, &DeleteParams::default())
            .await,
    );
    assert_forbidden(
        "update a node's Lease in kube-node-lease",
        Api::<Lease>::namespaced(sa.clone(), "kube-node-lease")
            .patch(
                "anything",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"holderIdentity": "x"}})),
            )
            .await,
    );
    let _ = Api::<Lease>::namespaced(admin.clone(), "oobfence")
        .delete(&lease_name, &DeleteParams::default())
        .await;
    assert_forbidden(
        "list configmaps",
        Api::<ConfigMap>::all(sa.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "list leases in kube-system",
        Api::<Lease>::namespaced(sa.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
    );
    assert_forbidden(
        "create an Event in kube-system",
        Api::<Event>::namespaced(sa.clone(), "kube-system")
            .create(&PostParams::default(), &node_event("x", "kube-system"))
            .await,
    );
    assert_forbidden(
        "create a node",
        nodes
            .create(
                &PostParams::default(),
                &Node {
                    metadata: kube::api::ObjectMeta {
                        name: Some(format!("{group}-new")),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await,
    );
    assert_forbidden(
        "bind itself to cluster-admin",
        Api::<ClusterRoleBinding>::all(sa.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("{group}-escalate")},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": "oobfence",
                                  "namespace": "oobfence"}]
                }))
                .unwrap(),
            )
            .await,
    );
    assert_forbidden(
        "mint itself a new token",
        Api::<ServiceAccount>::namespaced(sa.clone(), "oobfence")
            .create_token_request("oobfence", &PostParams::default(), &Default::default())
            .await,
    );
    scratch.delete().await;
}
