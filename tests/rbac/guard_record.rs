//! The guards' record fails closed with the minted token: one it may not read is not taken
//! as empty.

use super::*;

/// A guards' record the daemon may not read (the scenario's own ConfigMap, on which
/// deploy/rbac.yaml grants nothing: 403) is not taken as an empty one: a dead node proven off
/// is held (`fence-budget`) and not fenced, and the hold and the metrics say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guards_record_the_daemon_cannot_read_holds_new_fences() {
    let s = Scenario::redfish("rbac-unread", 1).await;
    let (admin, emu) = (s.client.clone(), s.redfish_emulator());
    let (kubeconfig, _) = service_account_client(&admin, s.dir()).await;
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon_with_kubeconfig(&kubeconfig).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", Duration::from_secs(30)).await;
    node.die("boot-1").await;
    let r = daemon
        .wait_rule(&name, "fence-budget", Duration::from_secs(60))
        .await;
    assert!(r["reason"].to_string().contains("cannot be read"), "{r}");
    // Longer than the minted-kubeconfig test's fence takes once the node is NotReady; still
    // held then (the controller-manager's Unknown restarts the grace on the way).
    tokio::time::sleep(Duration::from_secs(20)).await;
    daemon
        .wait_rule(&name, "fence-budget", Duration::from_secs(30))
        .await;
    assert!(!FakeNode::has_oos_taint(&node.get().await), "fenced");
    let metrics = daemon.metrics().await;
    assert_eq!(
        support::k8s::sample(&metrics, "oobfence_guard_record_pending"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        support::k8s::sample(&metrics, "oobfence_guard_record_ok"),
        Some(0.0),
        "{metrics}"
    );
    daemon.stop().await;
    node.delete().await;
}
