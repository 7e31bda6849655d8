//! A person's word on record (`oobfence confirm-off`, the `oobfence.io/confirmed-off`
//! annotation): refused unless the node is NotReady and silent; a node no source can answer
//! for is fenced on it, with who, why and the boot in the journal, the Event and the Node, and
//! unfenced on its new boot; a confirmation of another boot, a malformed one, or one a
//! renewal came after is never acted on; a pause holds it.

use std::process::Output;

use super::*;
use oobfence::decision::confirmation::ANNOTATION as CONFIRMED_OFF;
use support::cli::oobfence_async;

/// `oobfence confirm-off NODE ARGS...` as a person runs it: their own kubeconfig (the test
/// cluster's admin), by "alice".
async fn confirm_off(config: &std::path::Path, node: &str, args: &[&str]) -> Output {
    let kubeconfig = support::k8s::kubeconfig_path().display().to_string();
    let mut all = vec!["confirm-off", node, "--kubeconfig", &kubeconfig];
    all.extend_from_slice(args);
    oobfence_async(&all, config).await
}

fn said(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `confirm-off` until it is accepted: it is refused while the node's Lease is younger
/// than its duration (20 s for the test kubelets).
async fn confirm_once_silent(config: &std::path::Path, node: &str, reason: &str) -> Output {
    wait_for(
        "confirm-off accepted once the node is silent",
        DECISION,
        || async {
            let o = confirm_off(config, node, &["--reason", reason, "--by", "alice"]).await;
            if o.status.success() {
                return Some(o);
            }
            assert_eq!(o.status.code(), Some(1), "{}", said(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("not silent"),
                "refused for the silence only: {}",
                said(&o)
            );
            None
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_no_source_answers_for_is_fenced_on_a_persons_word_and_unfenced_on_its_new_boot() {
    let s = Scenario::without_machines("confirm").await;
    let client = s.client.clone();
    let node = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    node.die(FIRST_BOOT).await;
    daemon.wait_rule(&name, "no-power-source", DECISION).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    let reason = "rack 12 PDU breaker tripped, machine dark, checked on site";
    let out = confirm_once_silent(&daemon.config_path, &name, reason).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(CONFIRMED_OFF), "{stdout}");
    assert!(stdout.contains(&format!("oobfence why {name}")), "{stdout}");
    let written = annotation(&node.get().await, CONFIRMED_OFF).expect("the annotation");
    let note: serde_json::Value = serde_json::from_str(&written).unwrap();
    assert_eq!(note["bootID"], FIRST_BOOT, "{written}");
    assert_eq!(note["by"], "alice", "{written}");
    assert_eq!(note["reason"], reason, "{written}");

    daemon.wait_fenced(&name, DECISION).await;
    let fenced = wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    assert_eq!(
        annotation(&fenced, cluster::ANNOTATION_FENCED_ON).as_deref(),
        Some("person")
    );
    let record = s.fence_record(&name, DECISION).await;
    assert_eq!(record.rule, "confirmed-off-by-person", "{record:?}");
    assert_eq!(record.event, "OobfenceFencedOnConfirmation", "{record:?}");
    let c = record.inputs.confirmed_off.as_ref().expect("who confirmed");
    assert_eq!(
        (c.by.as_str(), c.reason.as_str(), c.boot_id.as_str()),
        ("alice", reason, FIRST_BOOT)
    );
    let events = events_for(&client, &name).await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceFencedOnConfirmation"))
        .unwrap_or_else(|| panic!("no OobfenceFencedOnConfirmation Event: {events:?}"));
    let message = event.message.as_deref().unwrap_or_default();
    for part in ["alice", reason, FIRST_BOOT] {
        assert!(message.contains(part), "{part} not in {message}");
    }
    let metrics = daemon.metrics().await;
    assert_eq!(
        sample(
            &metrics,
            "oobfence_fences_total{action=\"taint\",basis=\"person\"}"
        ),
        Some(1.0),
        "{metrics}"
    );

    // Back on a new boot: no source to read, the new boot is the proof; the confirmation
    // goes with the fence.
    node.come_back("boot-2").await;
    let _kubelet = FakeNode::keep_alive(&[&node], "boot-2");
    daemon.wait_unfenced(&name, DECISION).await;
    let back = wait_for("the taint and the confirmation gone", DECISION, || {
        node_has(&client, &name, |n| {
            !FakeNode::has_oos_taint(n) && annotation(n, CONFIRMED_OFF).is_none()
        })
    })
    .await;
    assert_eq!(annotation(&back, cluster::ANNOTATION_FENCED_ON), None);
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_off_refuses_a_ready_node_and_one_whose_lease_is_renewed() {
    let s = Scenario::without_machines("confirm-refused").await;
    let node = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let config = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:1");
    let args = ["--reason", "looked at it", "--by", "alice"];

    let o = confirm_off(&config, &name, &args).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("it is Ready"),
        "{}",
        said(&o)
    );
    // NotReady, and its kubelet renewing its Lease: alive, whatever the condition says.
    node.die(FIRST_BOOT).await;
    node.renew_lease().await;
    let o = confirm_off(&config, &name, &args).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("renewed its Lease"),
        "{}",
        said(&o)
    );
    assert_eq!(annotation(&node.get().await, CONFIRMED_OFF), None);
    let o = confirm_off(&config, &format!("{name}-missing"), &args).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not exist"),
        "{}",
        said(&o)
    );

    // --withdraw removes one written by hand.
    node.nodes()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {CONFIRMED_OFF: "{}"}}})),
        )
        .await
        .unwrap();
    let o = confirm_off(&config, &name, &["--withdraw"]).await;
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(annotation(&node.get().await, CONFIRMED_OFF), None);
    node.delete().await;
}

/// Writes the annotation by hand, as `kubectl annotate` does.
async fn annotate_by_hand(node: &FakeNode, value: &str) {
    node.nodes()
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {CONFIRMED_OFF: value}}})),
        )
        .await
        .expect("annotate the node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_of_another_boot_or_a_malformed_one_is_never_acted_on() {
    let s = Scenario::without_machines("confirm-void").await;
    let client = s.client.clone();
    let older = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let garbled = s
        .node_reporting("b", FIRST_BOOT, KubeletIdentity::default())
        .await;
    // The control: a confirmation of its current boot, fenced on.
    let control = s
        .node_reporting("c", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let daemon = s.daemon().await;
    older.die(FIRST_BOOT).await;
    garbled.die(FIRST_BOOT).await;
    control.die(FIRST_BOOT).await;
    annotate_by_hand(
        &older,
        r#"{"bootID":"boot-0","reason":"pulled the cord last week"}"#,
    )
    .await;
    annotate_by_hand(&garbled, "the machine is off").await;

    let report = daemon
        .wait_report_where(&older.name, "a void confirmation", DECISION, |r| {
            r["confirmation"]["standing"] == "void" && r["rule"] == "no-power-source"
        })
        .await;
    let problem = report["confirmation"]["problem"].as_str().unwrap();
    assert!(
        problem.contains("boot-0") && problem.contains(FIRST_BOOT),
        "{report}"
    );
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("does not stand"),
        "{report}"
    );
    let report = daemon
        .wait_report_where(&garbled.name, "an invalid confirmation", DECISION, |r| {
            r["confirmation"]["standing"] == "invalid" && r["rule"] == "no-power-source"
        })
        .await;
    assert_eq!(report["rule"], "no-power-source", "{report}");
    let out = oobfence_async(&["why", &older.name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(
        why.contains("VOID, never counts") && why.contains("boot-0"),
        "{why}"
    );
    let out = oobfence_async(&["why", &garbled.name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("INVALID, never acted on"), "{why}");
    wait_for("an OobfenceConfirmationInvalid Event", DECISION, || async {
        events_for(&client, &garbled.name)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceConfirmationInvalid"))
            .then_some(())
    })
    .await;
    // As silent as the control, which a confirmation of its boot gets fenced: these are not.
    confirm_once_silent(&daemon.config_path, &control.name, "cord pulled, checked").await;
    daemon.wait_fenced(&control.name, DECISION).await;
    // Waited for, not read once: the test cluster's controller turns the kubelet's last
    // NotReady into Unknown 20 s after its last renewal, which starts the grace period again.
    for n in [&older, &garbled] {
        let now = n.get().await;
        assert!(!FakeNode::has_oos_taint(&now), "{:?}", taints(&now));
        daemon
            .wait_report_where(&n.name, "still no power source", DECISION, |r| {
                r["rule"] == "no-power-source" && r["fence"].is_null()
            })
            .await;
    }
    daemon.stop().await;
    for n in [&older, &garbled, &control] {
        n.delete().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_a_confirmed_node_and_a_renewal_after_the_confirmation_voids_it() {
    let s = Scenario::without_machines("confirm-held").await;
    let node = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    node.die(FIRST_BOOT).await;
    daemon.wait_rule(&name, "no-power-source", DECISION).await;
    let o = oobfence_async(&["pause", "--reason", "confirm test"], &daemon.config_path).await;
    assert!(o.status.success(), "{}", said(&o));

    confirm_once_silent(&daemon.config_path, &name, "cord pulled, checked").await;
    let report = daemon
        .wait_report_where(&name, "a standing confirmation, held", DECISION, |r| {
            r["confirmation"]["standing"] == "stands" && r["rule"] == "paused"
        })
        .await;
    assert_eq!(report["state"], "blocked", "{report}");
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    // The kubelet renews its Lease after the confirmation: the person was wrong.
    node.renew_lease().await;
    let report = daemon
        .wait_report_where(&name, "the confirmation void", DECISION, |r| {
            r["confirmation"]["standing"] == "void"
        })
        .await;
    assert!(
        report["confirmation"]["problem"]
            .as_str()
            .unwrap()
            .contains("alive"),
        "{report}"
    );
    let o = oobfence_async(&["resume"], &daemon.config_path).await;
    assert!(o.status.success(), "{}", said(&o));
    // Past the grace period that the controller's Unknown may have started again.
    daemon
        .wait_report_where(&name, "decided without the pause", DECISION, |r| {
            r["rule"] == "no-power-source"
        })
        .await;
    // Until the node is silent again for a Lease's duration (the CLI refuses until then), the
    // void confirmation stays on it and is never acted on; a new one, written then, is.
    let args = ["--reason", "cord pulled, checked again", "--by", "alice"];
    wait_for("a new confirmation accepted", DECISION, || async {
        let now = node.get().await;
        assert!(
            !FakeNode::has_oos_taint(&now),
            "fenced on a void confirmation"
        );
        let report = daemon.report(&name).await.expect("a report");
        assert_eq!(report["confirmation"]["standing"], "void", "{report}");
        let o = confirm_off(&daemon.config_path, &name, &args).await;
        o.status.success().then_some(())
    })
    .await;
    daemon.wait_fenced(&name, DECISION).await;
    daemon.stop().await;
    node.delete().await;
}

/// A fence on a person's word is written only while the Node still carries the confirmation
/// the decision rested on: withdrawn or changed since, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_on_a_confirmation_withdrawn_or_changed_before_the_write_is_not_written() {
    let client = support::k8s::client().await;
    let name = unique("confirm-write");
    let node = FakeNode::create(&client, &name, &name, FIRST_BOOT).await;
    node.die(FIRST_BOOT).await;
    let decided = r#"{"bootID":"boot-1","reason":"cord pulled"}"#;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    let cluster = Cluster::new(client.clone(), "test");
    let on = cluster::FencedOn::Person(decided);

    let e = cluster
        .apply_fence_taint_on(&name, &guard, "test", on)
        .await
        .expect_err("no confirmation on the Node");
    assert!(matches!(e, ClusterError::Abandoned(_)), "{e}");
    annotate_by_hand(&node, r#"{"bootID":"boot-1","reason":"changed my mind"}"#).await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    let e = cluster
        .apply_fence_taint_on(&name, &guard, "test", on)
        .await
        .expect_err("another confirmation on the Node");
    assert!(e.to_string().contains("withdrawn or changed"), "{e}");
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    annotate_by_hand(&node, decided).await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    cluster
        .apply_fence_taint_on(&name, &guard, "test", on)
        .await
        .expect("the confirmation the decision rested on");
    let n = node.get().await;
    assert!(FakeNode::has_oos_taint(&n));
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_FENCED_ON).as_deref(),
        Some("person")
    );
    node.delete().await;
}

/// A power cord pulled takes the BMC with the machine: its source cannot answer
/// (`power-unknown`), and a person's word stands in; the journal names the source it could
/// not read and never its password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_bmc_went_dark_with_it_is_fenced_on_a_persons_word() {
    let s = Scenario::without_machines("confirm-dark").await;
    s.map_unreachable("a");
    let node = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    node.die(FIRST_BOOT).await;
    daemon.wait_rule(&name, "power-unknown", DECISION).await;

    confirm_once_silent(
        &daemon.config_path,
        &name,
        "cord pulled with the BMC, seen dark",
    )
    .await;
    daemon.wait_fenced(&name, DECISION).await;
    let record = s.fence_record(&name, DECISION).await;
    assert_eq!(record.rule, "confirmed-off-by-person", "{record:?}");
    assert!(
        record.message.contains("no source can answer"),
        "{record:?}"
    );
    assert!(record.inputs.power_source.is_some(), "{record:?}");
    let line = serde_json::to_string(&record).unwrap();
    assert!(!line.contains(UNREACHABLE_BMC_PASSWORD), "{line}");
    let n = node.get().await;
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_FENCED_ON).as_deref(),
        Some("person")
    );
    daemon.stop().await;
    node.delete().await;
}
