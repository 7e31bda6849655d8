//! Opt-in actuation on the real API server and sushy-tools: a hung node (NotReady, its kubelet
//! silent, its machine On) is powered off after `[actuation] after`, fenced on its Off reads,
//! powered on again, and untainted on its new boot.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_is_powered_off_fenced_powered_on_and_untainted() {
    let s = Scenario::redfish("actuate", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    s.map_redfish(
        "a",
        &emu.base_url(),
        support::sushy::PASSWORD,
        &format!(
            "system = \"{}\"\nca_file = \"{}\"\ntimeout = \"5s\"\nactuate = true",
            emu.system_path(0),
            emu.cert_pem_path().display()
        ),
    );
    let node = s.node_reporting("a", FIRST_BOOT, s.identity(0).await).await;
    let name = node.name.clone();
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    s.set_policy(&format!(
        "{}\n[actuation]\nenabled = true\nafter = \"2m\"\n",
        s.policy_lines()
    ));
    // check-config --probe says what the source can do.
    let config = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:0");
    let probe = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--probe", "--config"])
        .env(
            support::cli::DAEMON_USER_ENV.0,
            support::cli::DAEMON_USER_ENV.1,
        )
        .arg(&config)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&probe.stdout);
    assert!(
        out.contains(&format!(
            "actuation: {name}: power off: yes (ResetType ForceOff at "
        )) && out.contains("power on: yes (ResetType On at "),
        "{out}{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let daemon = s.daemon().await;
    daemon.wait_identity(&name, "match", DECISION).await;

    // Hung: the kubelet stops, the machine runs on.
    daemon
        .wait_lease_watched(&name, Duration::from_secs(120))
        .await;
    kubelet.stop().await;
    node.die(FIRST_BOOT).await;
    let r = daemon
        .wait_rule(&name, "waiting-to-actuate", DECISION)
        .await;
    assert!(
        r["reason"].as_str().unwrap().contains("powered off at"),
        "{r}"
    );
    assert_eq!(emu.power(0).await, "On");
    // Powered off by oobfence after 2 minutes of silence (the test sends no Reset: it only
    // reads), then fenced on its Off reads.
    wait_for(
        "the machine powered off",
        Duration::from_secs(180),
        || async { (emu.power(0).await == "Off").then_some(()) },
    )
    .await;
    let fenced = wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    assert!(annotation(&fenced, cluster::ANNOTATION_POWERED_OFF_AT).is_some());
    // Powered on again once fenced.
    wait_for(
        "the machine powered on again",
        Duration::from_secs(90),
        || async { (emu.power(0).await == "On").then_some(()) },
    )
    .await;
    let events = events_for(&client, &name).await;
    for reason in ["OobfencePoweredOff", "OobfenceFenced", "OobfencePoweredOn"] {
        assert!(
            events.iter().any(|e| e.reason.as_deref() == Some(reason)),
            "no {reason} Event: {events:?}"
        );
    }
    // It boots: the fence and the power record come off.
    node.come_back("boot-2").await;
    let _alive = FakeNode::keep_alive(&[&node], "boot-2");
    let back = wait_for("taint removed", DECISION, || {
        node_has(&client, &name, |n| !FakeNode::has_oos_taint(n))
    })
    .await;
    assert_eq!(annotation(&back, cluster::ANNOTATION_POWERED_OFF_AT), None);
    let journal = oobfence::journal::tail(&s.journal(), &name, 100)
        .unwrap()
        .records;
    let actions: Vec<(&str, &str)> = journal
        .iter()
        .filter(|r| r.kind == oobfence::journal::RecordKind::Action)
        .map(|r| (r.action.as_str(), r.result.as_str()))
        .collect();
    assert_eq!(
        actions
            .iter()
            .filter(|(a, r)| *a == "power_off" && *r == "sent")
            .count(),
        1,
        "{actions:?}"
    );
    assert_eq!(
        actions
            .iter()
            .filter(|(a, r)| *a == "power_on" && *r == "sent")
            .count(),
        1,
        "{actions:?}"
    );
    let metrics = daemon.metrics().await;
    support::k8s::assert_one_power_off_and_on_sent(&metrics, "redfish");
    daemon.stop().await;
    node.delete().await;
}

/// The same on EC2 (moto): a hung instance's node is stopped with Force after
/// `[actuation] after`, fenced once DescribeInstances says `stopped`, started again, and
/// untainted on its new boot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_ec2_instance_is_stopped_fenced_started_and_untainted() {
    support::moto::require_test_aws_env();
    let s = Scenario::ec2("actuate-ec2", 1).await;
    let client = s.client.clone();
    s.set_aws_extra("actuate = true\n");
    s.set_policy(&format!(
        "{}\n[actuation]\nenabled = true\nafter = \"2m\"\n",
        s.policy_lines()
    ));
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let instance = s.instance(0).to_string();
    let ec2 = s.moto().client();
    let state = async || {
        support::moto::describe_instance(&ec2, &instance)
            .await
            .state
            .and_then(|s| s.name)
            .map(|n| n.as_str().to_string())
            .unwrap_or_default()
    };
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let daemon = s.daemon().await;
    daemon.wait_identity(&name, "match", DECISION).await;
    daemon
        .wait_lease_watched(&name, Duration::from_secs(120))
        .await;
    kubelet.stop().await;
    node.die(FIRST_BOOT).await;
    daemon
        .wait_rule(&name, "waiting-to-actuate", DECISION)
        .await;
    assert_eq!(state().await, "running");
    wait_for("the instance stopped", Duration::from_secs(180), || async {
        (state().await == "stopped").then_some(())
    })
    .await;
    let fenced = wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    assert!(annotation(&fenced, cluster::ANNOTATION_POWERED_OFF_AT).is_some());
    wait_for(
        "the instance started again",
        Duration::from_secs(90),
        || async { matches!(state().await.as_str(), "pending" | "running").then_some(()) },
    )
    .await;
    node.come_back("boot-2").await;
    let _alive = FakeNode::keep_alive(&[&node], "boot-2");
    daemon.wait_unfenced(&name, DECISION).await;
    let metrics = daemon.metrics().await;
    support::k8s::assert_one_power_off_and_on_sent(&metrics, "ec2");
    daemon.stop().await;
    node.delete().await;
}

/// Writes the power record a power-off of the node's boot `boot_id` leaves, as `cluster`
/// signs it (the test stands in for the daemon's power-off: no BMC is involved in what the
/// record's removal decides).
async fn record_power_off(client: &Client, cluster: &Cluster, name: &str, boot_id: &str) {
    let patch = json!({"metadata": {"annotations": {
        cluster::ANNOTATION_POWERED_OFF_AT: jiff::Timestamp::now().to_string(),
        cluster::ANNOTATION_POWERED_OFF_BOOT_ID: boot_id,
        cluster::ANNOTATION_POWERED_OFF_BY: cluster.actor(),
    }}});
    Api::<Node>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the power record");
}

/// A fenced node whose machine oobfence powered off, and whose taint a person removes: the
/// fence record is cleared (`Step::ClearRecord`), the power-off record stays for as long as the
/// node reports the boot it was made in, so that the machine is never powered off twice in one
/// boot when it reads On again before its kubelet registers. Once the node reports another
/// boot, unfencing drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_untaint_keeps_the_power_off_of_the_boot() {
    let client = support::k8s::client().await;
    let name = unique("untaint-power");
    let cluster = Cluster::new(client.clone(), "test");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    record_power_off(&client, &cluster, &name, "boot-1").await;
    cluster
        .apply_fence_taint(
            &name,
            &support::k8s::fence_guard_for(&client, &node.get().await).await,
            "test",
        )
        .await
        .expect("fenced");
    // A person removes the taint; oobfence clears its fence record.
    let n = node.get().await;
    let kept: Vec<_> = taints(&n)
        .into_iter()
        .filter(|t| t.key != cluster::OUT_OF_SERVICE_KEY)
        .collect();
    node.nodes()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": kept}})),
        )
        .await
        .expect("untainted by hand");
    cluster
        .clear_fence_record(&name, &n.uid().unwrap())
        .await
        .expect("record cleared");
    let n = node.get().await;
    assert_eq!(annotation(&n, cluster::ANNOTATION_FENCED_AT), None);
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_POWERED_OFF_BOOT_ID).as_deref(),
        Some("boot-1"),
        "the power-off of boot-1 was forgotten while the node still reports boot-1: {:?}",
        n.annotations()
    );
    let record =
        cluster::power_record(&cluster::NodeView::from(&n), cluster.actor()).expect("kept");
    assert!(record.ours);

    // Fenced again, then back on a new boot: the unfence drops the old boot's power record.
    cluster
        .apply_fence_taint(
            &name,
            &support::k8s::fence_guard_for(&client, &n).await,
            "test",
        )
        .await
        .expect("fenced again");
    node.come_back("boot-2").await;
    // The node lifecycle controller writes the whole taint list as it lifts its NotReady
    // taints: unfenced once it has, so that its write from an older read cannot restore ours.
    let n = wait_for("the NotReady taints lifted", DECISION, || {
        node_has(&client, &name, |n| {
            !taints(n).iter().any(|t| {
                t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
            })
        })
    })
    .await;
    let unfence = WriteGuard {
        purpose: GuardPurpose::Unfence,
        lease_renew_time: None,
        ..support::k8s::fence_guard_for(&client, &n).await
    };
    cluster
        .remove_fence_taint(&name, &unfence)
        .await
        .expect("unfenced");
    let n = node.get().await;
    assert!(!FakeNode::has_oos_taint(&n));
    for key in cluster::POWER_ANNOTATIONS {
        assert_eq!(annotation(&n, key), None, "{key} of boot-1 left on boot-2");
    }
    node.delete().await;
}
