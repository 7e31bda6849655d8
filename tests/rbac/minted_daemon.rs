//! A whole daemon on the kubeconfig `make-kubeconfig` mints, with deploy/rbac.yaml's grants
//! alone: it watches, fences and reports.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_with_nothing_but_the_minted_kubeconfig() {
    let s = Scenario::redfish("rbac-fence", 1).await;
    let (admin, emu) = (s.client.clone(), s.redfish_emulator());
    let (kubeconfig, _) = service_account_client(&admin, s.dir()).await;
    // The guards' record the file grants: one it may not read holds every new fence.
    s.set_guard_record("oobfence/oobfence-guards");
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    // Ready only once both watches (Nodes, Leases) work with the ServiceAccount's token.
    let daemon = s.daemon_with_kubeconfig(&kubeconfig).await;

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", Duration::from_secs(30)).await;
    node.die("boot-1").await;
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_for(
        "the out-of-service taint",
        Duration::from_secs(45),
        || async {
            let n = nodes.get(&name).await.ok()?;
            FakeNode::has_oos_taint(&n).then_some(())
        },
    )
    .await;
    // The Event is the ServiceAccount's too.
    let events = wait_for(
        "an OobfenceFenced Event",
        Duration::from_secs(15),
        || async {
            let ev = events_for(&admin, &name).await;
            ev.iter()
                .any(|e| e.reason.as_deref() == Some("OobfenceFenced"))
                .then_some(ev)
        },
    )
    .await;
    assert!(
        !events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceFenceFailed")),
        "no failed write on the way: {events:?}"
    );
    let metrics = daemon.metrics().await;
    let failed: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("oobfence_actions") && l.contains("result=\"failure\""))
        .collect();
    assert!(failed.is_empty(), "failed actions: {failed:?}");
    // The minted token's expiry (1h) is exported, for the alert that comes before it.
    let expiry: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("oobfence_kubeconfig_token_expiry_timestamp_seconds "))
        .unwrap_or_else(|| panic!("no token expiry in {metrics}"))
        .parse()
        .unwrap();
    let left = expiry - jiff::Timestamp::now().as_second() as f64;
    assert!(
        (3000.0..=3660.0).contains(&left),
        "token expires in {left}s, minted for 1h"
    );
    daemon.stop().await;
    node.delete().await;
    let _ = Api::<ConfigMap>::namespaced(admin.clone(), "oobfence")
        .patch(
            "oobfence-guards",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"data": {format!("{}.json", support::scenario::DATACENTER): null}}),
            ),
        )
        .await;
}
