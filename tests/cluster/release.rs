//! Release at attestation on the real API server: a node proven off while it still shows
//! Ready is tainted and its pods force-deleted before the controller-manager marks it
//! NotReady, only its own pods, once; with the setting off the fence waits for NotReady and
//! leaves the pods alone; and the writes themselves: a renewal, a heartbeat, a missing fence
//! or a hold stop the pod deletions.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;

use oobfence::decision::holds::{Hold, HoldKind};
use oobfence::decision::{Holds, Readiness};

use super::*;
use support::k8s::{NAMESPACE, bound_pod, force_delete_pod, pods_on, tolerating, with_claim};

/// Three pods on `node`: one mounting a claim, one tolerating the taint, one already
/// Terminating (deleted gracefully: with no kubelet to finish it, it stays).
async fn three_pods(client: &Client, node: &str) -> Vec<String> {
    bound_pod(client, node, &format!("{node}-db"), with_claim).await;
    bound_pod(client, node, &format!("{node}-agent"), tolerating).await;
    let stuck = bound_pod(client, node, &format!("{node}-evicted"), |_| {}).await;
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(&stuck.name_any(), &DeleteParams::default())
        .await
        .expect("delete gracefully");
    let names = pods_on(client, node).await;
    assert_eq!(names.len(), 3, "{names:?}");
    names
}

async fn delete_pods_of(client: &Client, node: &str) {
    for name in pods_on(client, node).await {
        force_delete_pod(client, &name).await;
    }
}

fn records(s: &Scenario, node: &str) -> Vec<oobfence::journal::Record> {
    oobfence::journal::tail(&s.journal(), node, 100)
        .map(|t| t.records)
        .unwrap_or_default()
}

/// Stale after 1.5 renewals of the test kubelets' 5 s: 7.5 s, well before the test control
/// plane's 20 s node-monitor grace, so that the proof lands while the node shows Ready.
const EARLY_STALE: &str = "lease_stale_after = 1.5\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proven_off_while_ready_is_fenced_and_its_pods_released_before_not_ready() {
    let s = Scenario::redfish("release", 2).await;
    s.set_policy(&format!("{EARLY_STALE}{}", s.policy_lines()));
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let victim = s.node("a", 0).await;
    let bystander = s.node("b", 1).await;
    let kubelet = FakeNode::keep_alive(&[&victim], FIRST_BOOT);
    let _alive = FakeNode::keep_alive(&[&bystander], FIRST_BOOT);
    let pods = three_pods(&client, &victim.name).await;
    bound_pod(
        &client,
        &bystander.name,
        &format!("{}-db", bystander.name),
        with_claim,
    )
    .await;
    let daemon = s.daemon().await;
    daemon.wait_identity(&victim.name, "match", DECISION).await;

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    let cut = std::time::Instant::now();
    wait_for("the victim's pods gone", DECISION, || async {
        pods_on(&client, &victim.name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let gone_after = cut.elapsed();
    let node = victim.get().await;
    let ready = support::k8s::ready_condition_of(&node).map(|c| c.status);
    eprintln!(
        "release at attestation: pods gone {:.1}s after the kubelet stopped; node Ready={ready:?} then",
        gone_after.as_secs_f64()
    );
    assert!(FakeNode::has_oos_taint(&node), "the fence came first");

    // The fence was decided and written on a Ready node, the pods released right after. The
    // release's record is written after its last deletion and its Event, so a loaded machine
    // may see the pods gone a moment before it: wait for the record, not for the pods.
    let recs = wait_for("the release's record", DECISION, || async {
        let recs = records(&s, &victim.name);
        recs.iter()
            .any(|r| r.action == "release_pods")
            .then_some(recs)
    })
    .await;
    let fence = recs
        .iter()
        .find(|r| r.action == "taint" && r.result == "success")
        .expect("a fence record");
    assert_eq!(fence.inputs.ready, "Ready", "{fence:?}");
    assert!(
        fence.message.contains("release_at_attestation"),
        "{}",
        fence.message
    );
    let released: Vec<_> = recs.iter().filter(|r| r.action == "release_pods").collect();
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0].result, "success");
    for p in &pods {
        assert!(
            released[0].message.contains(p.as_str()),
            "{p}: {}",
            released[0].message
        );
    }
    assert!(
        released[0].message.contains("was Terminating"),
        "{}",
        released[0].message
    );
    assert_eq!(
        pods_on(&client, &bystander.name).await.len(),
        1,
        "another node's pod is never touched"
    );
    let events = events_for(&client, &victim.name).await;
    let summary: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OobfencePodsReleased"))
        .collect();
    assert_eq!(summary.len(), 1, "one summarising Event: {summary:?}");
    let metrics = daemon.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "oobfence_actions_total{action=\"delete_pod\",result=\"success\"}"
        ),
        Some(3.0),
        "{metrics}"
    );

    // Never twice: a pod bound to the fenced node afterwards stays.
    let late = bound_pod(
        &client,
        &victim.name,
        &format!("{}-late", victim.name),
        tolerating,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(pods_on(&client, &victim.name).await, vec![late.name_any()]);
    let releases = records(&s, &victim.name)
        .iter()
        .filter(|r| r.action == "release_pods")
        .count();
    assert_eq!(releases, 1);

    // Back with a new boot: untainted as always.
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    victim.come_back("boot-2").await;
    let _back = FakeNode::keep_alive(&[&victim], "boot-2");
    daemon.wait_unfenced(&victim.name, DECISION).await;
    assert!(!FakeNode::has_oos_taint(&victim.get().await));
    daemon.stop().await;
    delete_pods_of(&client, &victim.name).await;
    delete_pods_of(&client, &bystander.name).await;
    victim.delete().await;
    bystander.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_release_off_the_fence_waits_for_not_ready_and_leaves_the_pods() {
    let s = Scenario::redfish("release-off", 1).await;
    s.set_policy(&format!(
        "{EARLY_STALE}release_at_attestation = false\n{}",
        s.policy_lines()
    ));
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let pods = three_pods(&client, &node.name).await;
    let daemon = s.daemon().await;
    daemon.wait_identity(&node.name, "match", DECISION).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    let r = daemon.wait_rule(&node.name, "pre-attested", DECISION).await;
    assert_eq!(r["ready"], "Ready", "{r}");
    assert!(!FakeNode::has_oos_taint(&node.get().await), "{r}");
    wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &node.name, FakeNode::has_oos_taint)
    })
    .await;
    // The record follows the write: wait for it rather than read it the moment the taint shows.
    let fence = wait_for("the fence's record", DECISION, || async {
        records(&s, &node.name)
            .into_iter()
            .find(|r| r.action == "taint" && r.result == "success")
    })
    .await;
    assert_eq!(fence.inputs.ready, "NotReady", "{fence:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(pods_on(&client, &node.name).await, pods, "no pod deleted");
    assert!(
        records(&s, &node.name)
            .iter()
            .all(|r| r.action != "release_pods"),
        "no release"
    );
    daemon.stop().await;
    delete_pods_of(&client, &node.name).await;
    node.delete().await;
}

/// The writes as the daemon makes them, on a node whose kubelet is played by the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_a_heartbeat_a_missing_fence_or_a_hold_stops_the_pod_deletions() {
    let client = support::k8s::client().await;
    let group = unique("release-w");
    let node = FakeNode::create(&client, &format!("{group}-a"), &group, "boot-1").await;
    let other = FakeNode::create(&client, &format!("{group}-b"), &group, "boot-1").await;
    let pods = three_pods(&client, &node.name).await;
    bound_pod(
        &client,
        &other.name,
        &format!("{}-db", other.name),
        with_claim,
    )
    .await;
    let cluster = Cluster::new(client.clone(), "test");
    let n = node.get().await;
    let guard = WriteGuard {
        while_ready: true,
        ready_heartbeat: support::k8s::ready_condition_of(&n)
            .and_then(|c| c.last_heartbeat_time.map(|t| t.0)),
        release_pods: true,
        ..support::k8s::fence_guard_for(&client, &n).await
    };
    assert!(matches!(
        oobfence::cluster::readiness(&oobfence::cluster::NodeView::from(&n)),
        Readiness::Ready
    ));

    // No fence on the node yet: the pods are not released.
    let e = cluster.release_pods(&node.name, &guard).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("fence")),
        "{e}"
    );

    // A new Ready heartbeat before the taint: the kubelet is alive, nothing is written.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    node.heartbeat("boot-1").await;
    let e = cluster
        .apply_fence_taint(&node.name, &guard, "test")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("heartbeat")),
        "{e}"
    );
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    // On the node as it is now: the fence lands while it shows Ready.
    let n = node.get().await;
    let guard = WriteGuard {
        ready_heartbeat: support::k8s::ready_condition_of(&n)
            .and_then(|c| c.last_heartbeat_time.map(|t| t.0)),
        ..guard
    };
    cluster
        .apply_fence_taint(&node.name, &guard, "test")
        .await
        .expect("the fence while Ready");

    // Under a hold (a pause, here as the daemon would hold it): nothing is deleted.
    let paused = cluster.clone().with_holds(Arc::new(|_: &str| Holds {
        write: Some(Hold {
            kind: HoldKind::Paused,
            reason: "writes are paused by an operator (test)".into(),
        }),
        ..Holds::default()
    }));
    let e = paused.release_pods(&node.name, &guard).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("paused")),
        "{e}"
    );
    assert_eq!(pods_on(&client, &node.name).await, pods);

    // The kubelet renews its Lease after the fence: the pods stay.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    node.renew_lease().await;
    let e = cluster.release_pods(&node.name, &guard).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("renewed")),
        "{e}"
    );
    assert_eq!(pods_on(&client, &node.name).await, pods);

    // On the evidence as it stands: exactly this node's pods go.
    let guard = WriteGuard {
        lease_renew_time: node.lease_renew_time().await,
        ..guard
    };
    let released = cluster
        .release_pods(&node.name, &guard)
        .await
        .expect("the release");
    assert_eq!(released.deleted.len(), 3, "{released:?}");
    assert!(released.left.is_empty(), "{released:?}");
    assert!(pods_on(&client, &node.name).await.is_empty());
    assert_eq!(pods_on(&client, &other.name).await.len(), 1);
    // The pod mounting a claim went first.
    assert!(
        released.deleted[0].starts_with(&format!("{NAMESPACE}/{}-db", node.name)),
        "{released:?}"
    );
    delete_pods_of(&client, &other.name).await;
    node.delete().await;
    other.delete().await;
}
