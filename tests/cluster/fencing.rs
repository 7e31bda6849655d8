//! The daemon fences a dead node whose BMC reads Off (also once the controller marks it
//! Unknown), acts as configured (taint, delete and the deleted Node's pods, dry run), fences
//! again when its taint is dropped, and unfences only a node that came back with a new boot.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_a_dead_node_whose_bmc_reads_off_and_unfences_it_on_return() {
    let s = Scenario::redfish("fence", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let dead = s.node("a", 0).await;
    s.map("b", 1);
    let healthy = s.node_reporting("b", "boot-9", s.identity(1).await).await;
    let dead_name = dead.name.clone();
    // Live kubelets: a Lease left to go stale would make the node a suspect, not healthy.
    let kubelet = FakeNode::keep_alive(&[&dead], FIRST_BOOT);
    let _healthy_kubelet = FakeNode::keep_alive(&[&healthy], "boot-9");
    let daemon = s.daemon().await;

    // While healthy, oobfence learns that each BMC answers for its node's machine.
    let report = daemon.wait_identity(&dead_name, "match", DECISION).await;
    assert_eq!(report["state"], "healthy");
    assert!(
        report["identity"]["detail"]
            .as_str()
            .unwrap()
            .contains(&emu.uuid(0)),
        "{report}"
    );

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    dead.die("boot-1").await;

    daemon.wait_fenced(&dead_name, DECISION).await;
    let fenced = wait_for("out-of-service taint", POWER_CHANGE, || {
        node_has(&client, &dead_name, FakeNode::has_oos_taint)
    })
    .await;
    let t = taints(&fenced);
    assert!(t.contains(&keep_taint()), "other taints survive: {t:?}");
    let oos = t
        .iter()
        .find(|t| t.key == cluster::OUT_OF_SERVICE_KEY)
        .unwrap();
    assert_eq!(oos.value.as_deref(), Some("nodeshutdown"));
    assert_eq!(oos.effect, "NoExecute");
    assert_eq!(
        annotation(&fenced, cluster::ANNOTATION_FENCED_BOOT_ID).as_deref(),
        Some("boot-1")
    );
    assert!(annotation(&fenced, cluster::ANNOTATION_FENCED_AT).is_some());
    let report = daemon
        .wait_rule(&dead_name, "fenced-awaiting-recovery", DECISION)
        .await;
    assert_eq!(report["state"], "fenced");
    let reads = report["reads"].as_array().unwrap();
    let offs = reads.iter().filter(|r| r["result"] == "off").count();
    assert!(offs >= 2, "fenced on at least two Off reads: {reads:?}");
    let events = events_for(&client, &dead_name).await;
    let fenced_event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceFenced"))
        .expect("an OobfenceFenced event");
    assert!(
        fenced_event.message.as_deref().unwrap().contains("Off"),
        "{fenced_event:?}"
    );
    assert!(!FakeNode::has_oos_taint(&healthy.get().await));

    // Power back on: a new boot, Ready again. The fence comes off, the other taint stays.
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    dead.come_back("boot-2").await;
    // A live kubelet from now on: the unfence must not race the controller marking the node
    // NotReady again for want of renewals.
    let _back_kubelet = FakeNode::keep_alive(&[&dead], "boot-2");
    daemon.wait_unfenced(&dead_name, DECISION).await;
    let back = dead.get().await;
    assert!(!FakeNode::has_oos_taint(&back));
    assert!(taints(&back).contains(&keep_taint()));
    assert_eq!(annotation(&back, cluster::ANNOTATION_FENCED_AT), None);
    assert_eq!(annotation(&back, cluster::ANNOTATION_FENCED_BOOT_ID), None);
    let events = events_for(&client, &dead_name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceUnfenced"))
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_actions_total{action=\"taint\",result=\"success\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("oobfence_actions_total{action=\"untaint\",result=\"success\"} 1"),
        "{metrics}"
    );
    assert!(!FakeNode::has_oos_taint(&healthy.get().await));
    daemon.stop().await;
    dead.delete().await;
    healthy.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_node_action_deletes_the_node_and_keeps_a_backup() {
    let s = Scenario::redfish("delete", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    // Released at attestation (the default): the deleted Node's pod goes too.
    let pod = format!("{name}-db");
    support::k8s::bound_pod(&client, &name, &pod, support::k8s::with_claim).await;
    let daemon = s.daemon_with_policy("action = \"delete-node\"").await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    wait_for("node deleted", DECISION, || async {
        node.try_get().await.is_none().then_some(())
    })
    .await;
    wait_for("the deleted Node's pod gone", DECISION, || async {
        support::k8s::pods_on(&client, &name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    // The record is written once the deletions are done, after the pod is seen gone.
    let released = wait_for("a release record in the journal", DECISION, || async {
        oobfence::journal::tail(&s.journal(), &name, 100)
            .ok()?
            .records
            .into_iter()
            .find(|r| r.action == "release_pods")
    })
    .await;
    assert_eq!(released.result, "success", "{released:?}");
    assert!(released.message.contains(&pod), "{}", released.message);
    let events = events_for(&client, &name).await;
    let backup = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceNodeDeleted"))
        .expect("backup event before the delete");
    let msg = backup.message.as_deref().unwrap();
    assert!(msg.contains(TEST_LABEL) && msg.contains(&s.group), "{msg}");
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_decides_but_writes_nothing() {
    let s = Scenario::redfish("dry", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let before = node.get().await;
    let daemon = s.daemon_with_policy("dry_run = true").await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "dry-run", DECISION).await;
    assert_eq!(report["step"], "would_fence");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = node.get().await;
    // The node lifecycle controller adds its not-ready taints; oobfence adds nothing.
    assert!(!FakeNode::has_oos_taint(&after), "{:?}", taints(&after));
    assert!(taints(&after).contains(&keep_taint()));
    let ours = |n: &Node| -> Vec<String> {
        n.annotations()
            .keys()
            .filter(|k| k.starts_with("oobfence.io/"))
            .cloned()
            .collect()
    };
    assert!(ours(&before).is_empty());
    assert!(ours(&after).is_empty(), "{:?}", after.annotations());
    assert!(
        events_for(&client, &name)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceWouldFence"))
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_would_act_total{action=\"taint\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("oobfence_actions_total{"), "{metrics}");
    // The same decision, re-made as its reads age out and are taken again (read_max_age 10 s),
    // is announced once: one would-fence record, Event and count for the outage, not one per
    // read cycle.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_would_act_total{action=\"taint\"} 1"),
        "one would-fence after 28 s of the same decision: {metrics}"
    );
    let journal = std::fs::read_to_string(s.journal()).unwrap_or_default();
    let records = journal
        .lines()
        .filter(|l| l.contains("\"dry_run\"") && l.contains(&name))
        .count();
    assert_eq!(records, 1, "would-fence records in the journal:\n{journal}");
    let events: i32 = events_for(&client, &name)
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("OobfenceWouldFence"))
        .map(|e| e.count.unwrap_or(1))
        .sum();
    assert_eq!(events, 1, "OobfenceWouldFence Events");
    // `nodes` shows it as would-fence, counts it, and filters on it.
    let out = support::cli::oobfence_async(&["nodes"], &daemon.config_path).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let row = table
        .lines()
        .find(|l| l.starts_with(name.as_str()))
        .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
    assert!(row.contains("would-fence"), "{row}");
    assert!(
        table.contains(&format!("1 node(s) would be fenced now: {name}")),
        "{table}"
    );
    let out =
        support::cli::oobfence_async(&["nodes", "--state", "would-fence"], &daemon.config_path)
            .await;
    let filtered = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && filtered.contains(name.as_str()),
        "{out:?}"
    );
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_with_the_same_boot_id_keeps_its_fence() {
    let s = Scenario::redfish("sameboot", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    wait_for("fenced", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    node.come_back("boot-1").await;
    daemon
        .wait_rule(&name, "recovered-same-boot-id", DECISION)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(FakeNode::has_oos_taint(&node.get().await));
    daemon.stop().await;
    node.delete().await;
}

/// The path a real outage takes without pre-attestation: the kubelet simply stops,
/// kube-controller-manager's node lifecycle controller marks the node Ready=Unknown when its
/// Lease goes stale, and only then does oobfence start counting its grace. (With
/// pre-attestation, the fault matrix's timeline scenario takes the same path.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_controller_marks_unknown_is_fenced() {
    let s = Scenario::redfish("lifecycle", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon_with_policy("pre_attest = false\n").await;
    emu.set_power(0, false).await;
    // The fake driver can lose a reset under load: waited for (and sent again) as elsewhere.
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    // No status post and no Lease renewal from here on: the controller must notice.
    let unknown = wait_for(
        "node lifecycle controller marks the node Ready=Unknown",
        Duration::from_secs(90),
        || async {
            let n = node.get().await;
            let c = support::k8s::ready_condition_of(&n)?;
            (c.status == "Unknown").then_some(n)
        },
    )
    .await;
    assert!(!FakeNode::has_oos_taint(&unknown));
    daemon.wait_fenced(&name, DECISION).await;
    let fenced = wait_for("fenced after Ready=Unknown", POWER_CHANGE, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    let fenced_at: jiff::Timestamp = annotation(&fenced, cluster::ANNOTATION_FENCED_AT)
        .unwrap()
        .parse()
        .unwrap();
    let since = support::k8s::ready_condition_of(&unknown)
        .unwrap()
        .last_transition_time
        .unwrap()
        .0;
    assert!(
        fenced_at.duration_since(since) >= jiff::SignedDuration::from_secs(2),
        "fenced at {fenced_at}, NotReady since {since}: the grace period was not respected"
    );
    daemon.stop().await;
    node.delete().await;
}

/// Kubernetes 1.20's node lifecycle controller writes its `unreachable`/`not-ready` taints with a
/// patch that carries the whole list and no resourceVersion, computed from the API server's
/// cache: a taint written in the same instant (oobfence fences the moment a pre-attested node
/// turns NotReady) can be dropped by it. The node is still NotReady and its machine still Off:
/// oobfence clears its record, says so, and fences again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_dropped_by_another_writer_is_written_again_while_the_machine_is_off() {
    let s = Scenario::redfish("dropped", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    daemon.wait_identity(&name, "match", DECISION).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    let fenced = wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    // The controller's write: its own taint added to a list read before oobfence's landed.
    let unreachable = k8s_openapi::api::core::v1::Taint {
        key: "node.kubernetes.io/unreachable".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let stale: Vec<_> = taints(&fenced)
        .into_iter()
        .filter(|t| t.key != cluster::OUT_OF_SERVICE_KEY)
        .chain([unreachable])
        .collect();
    Api::<Node>::all(client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": stale}})),
        )
        .await
        .expect("the controller-like taint patch");
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    // At least twice: the controller-manager's own taint writes may race oobfence's too.
    let again = wait_for("the fence written again", DECISION, || async {
        let m = daemon.metrics().await;
        let taints = sample(
            &m,
            "oobfence_actions_total{action=\"taint\",result=\"success\"}",
        );
        (taints >= Some(2.0)).then_some(())?;
        node_has(&client, &name, FakeNode::has_oos_taint).await
    })
    .await;
    // The controller's own taints are its to keep or correct (it swaps `unreachable` for
    // `not-ready` on a node that posted NotReady); the other writers' taints stay.
    let t = taints(&again);
    assert!(t.contains(&keep_taint()), "{t:?}");
    assert_eq!(
        taints_owner(&again).as_deref(),
        Some("oobfence"),
        "the API server names oobfence as the taints' last writer"
    );
    let metrics = daemon.metrics().await;
    assert!(
        sample(
            &metrics,
            "oobfence_actions_total{action=\"clear_record\",result=\"success\"}"
        ) >= Some(1.0),
        "{metrics}"
    );
    let events = events_for(&client, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceRecordCleared")),
        "{events:?}"
    );
    daemon.stop().await;
    node.delete().await;
}
