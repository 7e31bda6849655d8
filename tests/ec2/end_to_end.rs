//! End to end with a real kube-apiserver: the daemon taints a stopped instance's node and
//! deletes a terminated one's with its attachments; `probe` prints the state and the volumes
//! still held.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_instance_is_tainted_and_terminated_one_is_deleted_with_its_attachments() {
    let s = Scenario::ec2("ec2", 4).await;
    let (client, ec2) = (s.client.clone(), s.moto().client());
    let ids: Vec<String> = (0..4).map(|i| s.instance(i).to_string()).collect();
    // An instance of another region, and a node whose providerID claims us-west-2a for it.
    let west = client_in(&s.moto().endpoint(), "us-west-2");
    let west_id = run_instances_in(&west, 1, "us-west-2a").await;
    let stopped = s.node("stopped", 0).await;
    let terminated = s.node("terminated", 1).await;
    let running = s.node("running", 2).await;
    // Its providerID points at instance 3 (a slip), but its kubelet is another machine.
    let impostor = s
        .node_reporting(
            "impostor",
            FIRST_BOOT,
            KubeletIdentity::instance("10.99.99.99", "ip-10-99-99-99.ec2.internal"),
        )
        .await;
    impostor.set_provider_id(&provider_id(ZONE, &ids[3])).await;
    let west_node = s
        .node_reporting("west", FIRST_BOOT, kubelet_of(&west, &west_id[0]).await)
        .await;
    west_node
        .set_provider_id(&provider_id("us-west-2a", &west_id[0]))
        .await;
    let (stopped_name, terminated_name, running_name, impostor_name, west_name) = (
        stopped.name.clone(),
        terminated.name.clone(),
        running.name.clone(),
        impostor.name.clone(),
        west_node.name.clone(),
    );
    let data = attach_data_volume(&ec2, &ids[0]).await;

    // A VolumeAttachment for the node that will be terminated.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = s.name("va");
    vas.create(
        &PostParams::default(),
        &volume_attachment(&va_name, &terminated_name, "ebs.csi.aws.com", "pv-test"),
    )
    .await
    .unwrap();

    let daemon = s.daemon().await;
    // While the nodes are healthy, oobfence learns that us-east-1 answers for each instance
    // (the binding a terminated instance's "gone" answers rely on), and finds the impostor.
    let limit = Duration::from_secs(90);
    for (name, verdict) in [
        (&stopped_name, "match"),
        (&terminated_name, "match"),
        (&impostor_name, "mismatch"),
    ] {
        daemon.wait_identity(name, verdict, limit).await;
    }
    let west_report = daemon.report(&west_name).await.unwrap();
    assert!(
        west_report["identity"]["mapping_conflict"]
            .as_str()
            .is_some_and(|c| c.contains("us-west-2a")),
        "{west_report}"
    );
    ec2.stop_instances()
        .instance_ids(&ids[0])
        .instance_ids(&ids[3])
        .send()
        .await
        .unwrap();
    west.stop_instances()
        .instance_ids(&west_id[0])
        .send()
        .await
        .unwrap();
    ec2.terminate_instances()
        .instance_ids(&ids[1])
        .send()
        .await
        .unwrap();
    stopped.die(FIRST_BOOT).await;
    terminated.die(FIRST_BOOT).await;
    running.die(FIRST_BOOT).await;
    impostor.die(FIRST_BOOT).await;
    west_node.die(FIRST_BOOT).await;

    wait_for("stopped instance's node tainted", limit, || async {
        let n: Node = stopped.get().await;
        FakeNode::has_oos_taint(&n).then_some(())
    })
    .await;
    wait_for("terminated instance's node deleted", limit, || async {
        terminated.try_get().await.is_none().then_some(())
    })
    .await;
    wait_for("its VolumeAttachment deleted", limit, || async {
        vas.get_opt(&va_name).await.unwrap().is_none().then_some(())
    })
    .await;
    let report = daemon.wait_rule(&running_name, "power-on", limit).await;
    assert_eq!(report["state"], "blocked");
    assert!(!FakeNode::has_oos_taint(&running.get().await));
    // A stopped instance that is not the node's machine, and a node of another region: never
    // fenced, never deleted, each with its rule.
    daemon
        .wait_rule(&impostor_name, "identity-mismatch", limit)
        .await;
    daemon.wait_rule(&west_name, "region-mismatch", limit).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    for n in [&impostor, &west_node] {
        let node = n.try_get().await.expect("never deleted");
        assert!(!FakeNode::has_oos_taint(&node), "{}", n.name);
    }

    // The fence Event names the EBS volume the instance held.
    let events = events_for(&client, &stopped_name).await;
    let fenced = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceFenced"))
        .expect("fenced event");
    assert!(
        fenced.message.as_deref().unwrap().contains(&data),
        "{fenced:?}"
    );
    let events = events_for(&client, &terminated_name).await;
    let deleted = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceFenced"))
        .expect("fenced event for the deleted node");
    assert!(
        deleted.message.as_deref().unwrap().contains(&va_name),
        "{deleted:?}"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(
            "oobfence_actions_total{action=\"delete_volumeattachment\",result=\"success\"} 1"
        ),
        "{metrics}"
    );
    let calls: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("oobfence_ec2_describe_instances_calls_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(calls >= 2, "{calls}");

    // The CSI driver detaches the stopped instance's volume: oobfence reports the release.
    ec2.detach_volume()
        .volume_id(&data)
        .instance_id(&ids[0])
        .send()
        .await
        .unwrap();
    let released = wait_for(
        "OobfenceVolumesReleased event",
        Duration::from_secs(40),
        || async {
            events_for(&client, &stopped_name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("OobfenceVolumesReleased"))
        },
    )
    .await;
    assert!(
        released.message.as_deref().unwrap().contains(&data),
        "{released:?}"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_ec2_fence_to_volumes_detached_seconds_count 1"),
        "{metrics}"
    );
    let metrics = daemon.metrics().await;
    for (node, problem) in [
        (&impostor_name, "identity-mismatch"),
        (&west_name, "region-mismatch"),
    ] {
        assert!(
            metrics.contains(&format!(
                "oobfence_node_identity_problem{{node=\"{node}\",problem=\"{problem}\"}} 1"
            )),
            "{metrics}"
        );
    }
    daemon.stop().await;
    for n in [&stopped, &running, &impostor, &west_node] {
        n.delete().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_prints_state_and_held_volumes() {
    let s = Scenario::ec2("ec2probe", 1).await;
    let (ec2, id) = (s.moto().client(), s.instance(0));
    let data = attach_data_volume(&ec2, id).await;
    ec2.stop_instances().instance_ids(id).send().await.unwrap();
    let node = s.node("a", 0).await;
    let name = &node.name;
    let path = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:0");
    let out = support::cli::oobfence(&["probe", name], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("{name}: Off (ec2 us-east-1/{id}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("volumes: {data} on /dev/sdf")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("identity: instance {id}, private IP")),
        "{stdout}"
    );
    node.delete().await;
}
