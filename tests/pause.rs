//! The pause switches against a real kube-apiserver: the ConfigMap read again right before a
//! write, and with `[ha]` a pause that holds for the group rather than for one host. Power
//! commands and pod force-deletes read it right before each (`pause/commands.rs`).

mod support;

#[path = "pause/commands.rs"]
mod commands;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use oobfence::cluster::{self, Cluster, ClusterError};
use oobfence::config::ConfigMapRef;
use support::cli::{oobfence, oobfence_async};
use support::k8s::{FakeNode, RunningDaemon, kubeconfig_path, unique};
use support::scenario::{DATACENTER, FIRST_BOOT, Scenario};

async fn create_pause_configmap(client: &Client, cm: &ConfigMapRef) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let obj: ConfigMap = serde_json::from_value(json!({"metadata": {"name": cm.name}})).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create the pause ConfigMap");
}

async fn annotate(client: &Client, cm: &ConfigMapRef, key: &str, value: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    api.patch(
        &cm.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .expect("annotate the pause ConfigMap");
}

async fn delete_configmap(client: &Client, cm: &ConfigMapRef) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let _ = api.delete(&cm.name, &DeleteParams::default()).await;
}

/// A client whose requests reach the real API server, except that right after the first GET of
/// Node `node` has been answered (the writer's fresh read: the decision is made, the write is
/// on its way) an operator pauses through the ConfigMap. `paused` counts it.
fn client_pausing_after_the_fresh_read(
    client: Client,
    node: &str,
    cm: &ConfigMapRef,
) -> (Client, Arc<AtomicUsize>) {
    let path = format!("/api/v1/nodes/{node}");
    let paused = Arc::new(AtomicUsize::new(0));
    let (counter, cm) = (paused.clone(), cm.clone());
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, path, counter, cm) =
            (client.clone(), path.clone(), counter.clone(), cm.clone());
        async move {
            let is_node_get = req.method() == http::Method::GET && req.uri().path() == path;
            let response = client.send(req).await?;
            if is_node_get
                && response.status().is_success()
                && counter.fetch_add(1, Ordering::SeqCst) == 0
            {
                annotate(
                    &client,
                    &cm,
                    oobfence::pause::ANNOTATION_PAUSED,
                    "storm in dc2",
                )
                .await;
            }
            Ok::<_, kube::Error>(response)
        }
    });
    (Client::new(service, "default"), paused)
}

/// A pause set in the ConfigMap after the decision, while the write is on its way, stops the
/// write: the writer reads the ConfigMap again right before it, as it reads the pause file,
/// instead of trusting the last poll (up to 5 s old).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_pause_set_while_a_write_is_on_its_way_stops_it() {
    let client = support::k8s::client().await;
    let name = unique("pause-late");
    let cm = ConfigMapRef {
        namespace: "default".into(),
        name: format!("{name}-switch"),
    };
    create_pause_configmap(&client, &cm).await;
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;

    let (pausing, paused) = client_pausing_after_the_fresh_read(client.clone(), &name, &cm);
    let cluster = Cluster::new(pausing, "test").with_pause_configmap(Some(cm.clone()));
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect_err("a pause placed before the write stops it");
    assert_eq!(
        paused.load(Ordering::SeqCst),
        1,
        "the pause came after the fresh read"
    );
    assert!(
        matches!(&e, ClusterError::Abandoned(why) if why.contains("paused") && why.contains("storm in dc2")),
        "abandoned, saying who paused: {e}"
    );
    assert!(
        !FakeNode::has_oos_taint(&node.get().await),
        "nothing written"
    );

    // Resumed: the same write, through the same path, lands (what stopped it was the pause).
    annotate(&client, &cm, oobfence::pause::ANNOTATION_PAUSED, "false").await;
    let cluster = Cluster::new(client.clone(), "test").with_pause_configmap(Some(cm.clone()));
    cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect("resumed: the fence lands");
    assert!(FakeNode::has_oos_taint(&node.get().await));
    node.delete().await;
    delete_configmap(&client, &cm).await;
}

/// With `[ha]`, `oobfence pause` given the datacenter's config pauses the group: it writes the
/// datacenter's annotation on the pause ConfigMap, which every instance reads, so an instance
/// that becomes leader later (another host, after a failover) holds every write too; `oobfence
/// resume` lifts it for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ha_oobfence_pause_holds_the_whole_group_and_resume_lifts_it() {
    let s = Scenario::redfish("ha-pause", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": s.group}})).unwrap(),
        )
        .await
        .expect("create the group's namespace");
    let cm = ConfigMapRef {
        namespace: s.group.clone(),
        name: "oobfence-pause".into(),
    };
    create_pause_configmap(&client, &cm).await;
    s.set_pause_configmap(&cm.to_string());
    let node = s.node("a", 0).await;
    let ha = |identity: &str| {
        format!(
            "[ha]\nenabled = true\nnamespace = \"{}\"\nidentity = \"{identity}\"\nlease_duration = \"9s\"\nrenew_interval = \"1s\"\n",
            s.group
        )
    };
    // The operator, on host A: the config host A runs.
    let config_a = s.dir().join("host-a.toml");
    std::fs::write(
        &config_a,
        s.config_text(&kubeconfig_path(), "127.0.0.1:1", &ha("host-a")),
    )
    .unwrap();
    let o = oobfence_async(&["pause", "--reason", "rewiring rack 7"], &config_a).await;
    assert!(
        o.status.success(),
        "oobfence pause: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let key = format!("{}-{}", oobfence::pause::ANNOTATION_PAUSED, DATACENTER);
    let annotations = |c: ConfigMap| c.metadata.annotations.unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let said = annotations(cms.get(&cm.name).await.unwrap());
    assert!(
        said.get(&key)
            .is_some_and(|v| v.contains("rewiring rack 7")),
        "the group's pause is in the ConfigMap under {key}: {said:?}"
    );
    assert!(
        !said.contains_key(oobfence::pause::ANNOTATION_PAUSED),
        "other datacenters are not paused: {said:?}"
    );

    // Host B takes over (host A is gone): it holds every write.
    let text_b = s.config_text(Path::new("{kubeconfig}"), "{listen}", &ha("host-b"));
    let daemon = RunningDaemon::start(&text_b, tempfile::tempdir().unwrap()).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", Duration::from_secs(30)).await;
    node.die(FIRST_BOOT).await;
    let r = daemon
        .wait_rule(&node.name, "paused", Duration::from_secs(90))
        .await;
    assert!(
        r.to_string().contains("rewiring rack 7"),
        "the hold says who paused: {r}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !FakeNode::has_oos_taint(&node.get().await),
        "nothing written"
    );

    // Resumed from host A's config: host B fences.
    let o = oobfence_async(&["resume"], &config_a).await;
    assert!(
        o.status.success(),
        "oobfence resume: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!annotations(cms.get(&cm.name).await.unwrap()).contains_key(&key));
    daemon
        .wait_fenced(&node.name, Duration::from_secs(90))
        .await;
    daemon.stop().await;
    node.delete().await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&s.group, &DeleteParams::default())
        .await;
}

/// A pause file with `[ha]` would hold only the host it is on: a failover would resume every
/// write on the other. Such a config is refused, by `check-config` and `run` alike, saying so.
#[test]
fn with_ha_a_pause_file_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc.toml");
    let base = format!(
        "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = \"{}\"\n[ha]\nenabled = true\nidentity = \"mgmt-a\"\n",
        kubeconfig_path().display()
    );
    std::fs::write(
        &path,
        format!("{base}[pause]\nfile = \"/etc/oobfence/dc1.paused\"\n"),
    )
    .unwrap();
    for command in ["check-config", "run"] {
        let o = oobfence(&[command], &path);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{command}: {err}");
        assert!(
            err.contains("pause.file") && err.contains("failover") && err.contains("ConfigMap"),
            "{command}: {err}"
        );
    }
}

/// The ConfigMap's read right before the write must not eat into what the daemon's own holds
/// guard: they are asked after it, at the last moment. Here the read takes 2 s and a hold (as
/// `[ha]` leadership running out would) begins during it: the write is abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_holds_are_asked_after_the_configmap_read() {
    use oobfence::decision::{Hold, HoldKind, Holds};
    let client = support::k8s::client().await;
    let name = unique("pause-slow");
    let cm = ConfigMapRef {
        namespace: "default".into(),
        name: format!("{name}-switch"),
    };
    create_pause_configmap(&client, &cm).await;
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;

    let cm_path = format!("/api/v1/namespaces/{}/configmaps/{}", cm.namespace, cm.name);
    let inner = client.clone();
    let slow = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, cm_path) = (inner.clone(), cm_path.clone());
        async move {
            let is_cm = req.uri().path() == cm_path;
            let response = client.send(req).await?;
            if is_cm {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok::<_, kube::Error>(response)
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let holds: cluster::HoldsNow = Arc::new(move |_| Holds {
        write: (std::time::Instant::now() > deadline).then(|| Hold {
            kind: HoldKind::Standby,
            reason: "standby: the Lease ran out".into(),
        }),
        ..Default::default()
    });
    let cluster = Cluster::new(Client::new(slow, "default"), "test")
        .with_holds(holds)
        .with_pause_configmap(Some(cm.clone()));
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect_err("the hold that began during the read stops the write");
    assert!(
        matches!(&e, ClusterError::Abandoned(why) if why.contains("standby")),
        "{e}"
    );
    assert!(
        !FakeNode::has_oos_taint(&node.get().await),
        "nothing written"
    );
    node.delete().await;
    delete_configmap(&client, &cm).await;
}
