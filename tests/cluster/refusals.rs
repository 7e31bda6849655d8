//! Nodes the daemon must not fence or unfence, and says why: a BMC that reads On, cannot be
//! reached, read Off while its node lived, or answers for another machine; a node opted out
//! or under another remediator; another oobfence's fence.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_fences_a_node_whose_bmc_reads_on() {
    let s = Scenario::redfish("on", 1).await;
    let client = s.client.clone();
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;

    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "power-on", DECISION).await;
    assert_eq!(report["state"], "blocked");
    // Keep watching through several more re-reads: still nothing written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let n = node.get().await;
    assert!(!FakeNode::has_oos_taint(&n), "{:?}", taints(&n));
    assert_eq!(annotation(&n, cluster::ANNOTATION_FENCED_AT), None);
    assert!(
        events_for(&client, &name)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceBlocked"))
    );
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_fences_when_the_bmc_is_unreachable_and_why_says_why() {
    let s = Scenario::without_machines("unreach").await;
    s.map_unreachable("a");
    let node = s
        .node_reporting("a", "boot-1", KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    node.die("boot-1").await;
    daemon.wait_rule(&name, "power-unknown", DECISION).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    let out = support::cli::oobfence_async(&["why", &name], &daemon.config_path).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "why failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rule power-unknown"), "{stdout}");
    assert!(stdout.contains("unreachable"), "{stdout}");
    assert!(stdout.contains("NotReady since"), "{stdout}");
    assert!(stdout.contains("power reads (newest last)"), "{stdout}");
    assert!(!stdout.contains(UNREACHABLE_BMC_PASSWORD), "{stdout}");
    assert!(
        stdout.contains("FAILED; no answer since the start"),
        "{stdout}"
    );
    // The table of every watched node, as the operator lists them.
    let out = support::cli::oobfence_async(&["nodes"], &daemon.config_path).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NODE") && header.contains("LAST ANSWER"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("no row for {name}: {table}"));
    for cell in ["blocked", "power-unknown", "redfish", "FAILED", "NotReady"] {
        assert!(row.contains(cell), "{cell} in {row:?}");
    }
    assert!(
        table.trim_end().ends_with("1 node(s): 1 blocked"),
        "{table}"
    );
    let out =
        support::cli::oobfence_async(&["nodes", "--state", "healthy"], &daemon.config_path).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        !table.contains(&name) && table.contains("0 node(s): none"),
        "{table}"
    );
    // A source that never answered: its last success is 0, which the shipped alert catches.
    let metrics = daemon.metrics().await;
    let never = format!(
        "oobfence_power_source_last_success_timestamp_seconds{{node=\"{name}\",backend=\"redfish\"}} 0"
    );
    assert!(metrics.contains(&never), "{metrics}");

    // A name the daemon does not watch: said in those words, not as an HTTP error.
    let ghost = format!("{name}-typo");
    let out = support::cli::oobfence_async(&["why", &ghost], &daemon.config_path).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("unknown node {ghost:?}")),
        "{stderr}"
    );
    assert!(!stderr.contains("404"), "{stderr}");
    daemon.stop().await;
    node.delete().await;
}

/// A BMC that says Off while its node's kubelet goes on living reads another machine or
/// misreports this one: found while the node is healthy (metric, Event, `why`), and its Off
/// never fences the node when it does go NotReady.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_reads_off_while_its_node_lives_is_never_trusted_to_fence() {
    let s = Scenario::redfish("offalive", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    // The BMC says Off from the start; the kubelet is alive all along.
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let daemon = s.daemon().await;

    let problem =
        format!("oobfence_node_identity_problem{{node=\"{name}\",problem=\"off-while-alive\"}} 1");
    let metrics = wait_for("the contradiction in the metrics", DECISION, || async {
        let m = daemon.metrics().await;
        m.contains(&problem).then_some(m)
    })
    .await;
    // The health read answered (Off is an answer): its time is the source's last success.
    let prefix = format!(
        "oobfence_power_source_last_success_timestamp_seconds{{node=\"{name}\",backend=\"redfish\"}} "
    );
    let last_success: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
        .parse()
        .unwrap();
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(
        (now - 120.0..=now + 1.0).contains(&last_success),
        "{last_success} vs now {now}"
    );
    let report = daemon.report(&name).await.unwrap();
    assert_eq!(report["state"], "healthy", "{report}");
    let events = events_for(&client, &name).await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfencePowerSourceOffWhileAlive"))
        .unwrap_or_else(|| panic!("no OobfencePowerSourceOffWhileAlive Event: {events:?}"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let out = support::cli::oobfence_async(&["why", &name], &daemon.config_path).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("UNTRUSTED: the kubelet went on living"),
        "{stdout}"
    );

    // The node dies now: the BMC's Off is no proof, however often it repeats it.
    kubelet.stop().await;
    node.die(FIRST_BOOT).await;
    let report = daemon.wait_rule(&name, "off-while-alive", DECISION).await;
    assert_eq!(report["state"], "blocked");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(&format!(
            "oobfence_node_blocked{{node=\"{name}\",reason=\"off-while-alive\"}} 1"
        )),
        "{metrics}"
    );
    daemon.stop().await;
    node.delete().await;
}

/// A fence placed by another oobfence (another datacenter, or another host) is never lifted
/// nor its record cleared here, even with a guard that would otherwise pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_oobfences_fence_is_never_lifted() {
    let client = support::k8s::client().await;
    let group = unique("foreign");
    let name = format!("{group}-a");
    let me = Cluster::with_actor(client.clone(), "test", "oobfence/test@mgmt1");
    let other = Cluster::with_actor(client.clone(), "test", "oobfence/test@mgmt2");
    let node = FakeNode::create(&client, &name, &group, "boot-1").await;
    node.die("boot-1").await;
    other
        .apply_fence_taint(
            &name,
            &support::k8s::fence_guard_for(&client, &node.get().await).await,
            "test",
        )
        .await
        .expect("the other host fences");
    node.come_back("boot-2").await;
    let n = node.get().await;
    let unfence = WriteGuard {
        purpose: GuardPurpose::Unfence,
        lease_renew_time: None,
        ..support::k8s::fence_guard_for(&client, &n).await
    };
    let e = me.remove_fence_taint(&name, &unfence).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Precondition(m) if m.contains("another oobfence")),
        "{e}"
    );
    let e = me
        .clear_fence_record(&name, &n.uid().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::Precondition(_)), "{e}");
    let n = node.get().await;
    assert!(FakeNode::has_oos_taint(&n));
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_FENCED_BY).as_deref(),
        Some("oobfence/test@mgmt2")
    );
    // Its own daemon lifts it, once the re-check passes.
    other
        .remove_fence_taint(&name, &unfence)
        .await
        .expect("untaint");
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    node.delete().await;
}

/// A BMC entry that reads another machine: its Off never fences the node, and the mismatch
/// is known while the node is still healthy (metric, Event, `/nodes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_answers_for_another_machine_never_fences() {
    let s = Scenario::redfish("mismatch", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    // The node's kubelet reports machine 1; the entry (a copy-paste slip) reads machine 0.
    s.map("a", 0);
    let node = s.node_reporting("a", "boot-1", s.identity(1).await).await;
    let name = node.name.clone();
    let kubelet = FakeNode::keep_alive(&[&node], "boot-1");
    let daemon = s.daemon().await;
    let report = daemon.wait_identity(&name, "mismatch", DECISION).await;
    assert_eq!(report["state"], "healthy");
    // The metrics follow on the next decision pass.
    let problem = format!(
        "oobfence_node_identity_problem{{node=\"{name}\",problem=\"identity-mismatch\"}} 1"
    );
    let metrics = wait_for("the mismatch in the metrics", DECISION, || async {
        let m = daemon.metrics().await;
        m.contains(&problem).then_some(m)
    })
    .await;
    assert!(
        metrics.contains("oobfence_identity_nodes{verdict=\"mismatch\"} 1"),
        "{metrics}"
    );
    // Machine 0 powers off and the node dies: Off from the wrong machine is no proof.
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "identity-mismatch", DECISION).await;
    assert_eq!(report["state"], "blocked");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    let events = events_for(&client, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceIdentityMismatch")),
        "{events:?}"
    );
    daemon.stop().await;
    node.delete().await;
}

/// A node excluded by its annotation, and a node another remediator (medik8s
/// self-node-remediation) has tainted: both machines read Off, neither is ever fenced, and each
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_out_node_and_one_under_another_remediator_are_left_alone() {
    let s = Scenario::redfish("optout", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let excluded = s.node("a", 0).await;
    let remediated = s.node("b", 1).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &excluded.name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {cluster::ANNOTATION_EXCLUDE: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let mut t = taints(&remediated.get().await);
    t.push(k8s_openapi::api::core::v1::Taint {
        key: "medik8s.io/remediation".into(),
        value: Some("self-node-remediation".into()),
        effect: "NoExecute".into(),
        time_added: None,
    });
    nodes
        .patch(
            &remediated.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": t}})),
        )
        .await
        .unwrap();
    let daemon = s.daemon().await;
    for i in [0, 1] {
        emu.set_power(i, false).await;
    }
    for i in [0, 1] {
        emu.wait_power(i, "Off", POWER_CHANGE).await;
    }
    excluded.die("boot-1").await;
    remediated.die("boot-1").await;
    let r = daemon
        .wait_rule(&excluded.name, "opted-out", DECISION)
        .await;
    assert_eq!(r["state"], "blocked");
    let r = daemon
        .wait_rule(&remediated.name, "other-remediator", DECISION)
        .await;
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("medik8s.io/remediation"),
        "{r}"
    );
    // Well past the grace period and two confirmations: still nothing written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for n in [&excluded, &remediated] {
        let node = n.get().await;
        assert!(
            !FakeNode::has_oos_taint(&node),
            "{}: {:?}",
            n.name,
            taints(&node)
        );
        assert_eq!(annotation(&node, cluster::ANNOTATION_FENCED_AT), None);
    }
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(&format!(
            "oobfence_node_blocked{{node=\"{}\",reason=\"opted-out\"}} 1",
            excluded.name
        )),
        "{metrics}"
    );
    daemon.stop().await;
    excluded.delete().await;
    remediated.delete().await;
}
