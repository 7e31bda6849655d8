//! Scenarios of EC2: a node of another region; throttling, intermediate states and a
//! one-off not-found.

use super::*;

/// EC2: a node whose providerID names another region is never fenced nor deleted, even
/// though an instance of that id is terminated in the configured region; the control node,
/// whose instance is stopped, is fenced.
pub(super) fn ec2_node_of_another_region() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::ec2("fm-ec2", 2).await;
        let control = s.node("control", 0).await;
        let elsewhere = s
            .node_reporting("elsewhere", FIRST_BOOT, s.identity(1).await)
            .await;
        elsewhere
            .set_provider_id(&format!("aws:///us-west-2a/{}", s.instance(1)))
            .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let ec2 = s.moto().client();
        ec2.stop_instances()
            .instance_ids(s.instance(0))
            .send()
            .await
            .unwrap();
        ec2.terminate_instances()
            .instance_ids(s.instance(1))
            .send()
            .await
            .unwrap();
        for n in [&control, &elsewhere] {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&control, EVENT_BOUND).await;
        daemon
            .wait_rule(&elsewhere.name, "region-mismatch", EVENT_BOUND)
            .await;
        stays_unfenced(&elsewhere, Duration::from_secs(3)).await;
        conclude(
            "EC2: a node of another region",
            vec![Write::Taint(control.name.clone())],
            daemon,
            &rec,
            &nodes_of([&control, &elsewhere]),
        )
        .await
    })
}

/// EC2 answers moto cannot hold still, from a fake endpoint: while DescribeInstances is
/// throttled (503 RequestLimitExceeded) nothing is fenced, not even a stopped instance's node;
/// once it answers, that node is fenced; `stopping` and `shutting-down` are never Off; an
/// instance missing from one answer and running in the next is never deleted.
pub(super) fn ec2_throttling_intermediate_states_and_a_one_off_not_found() -> ScenarioFuture {
    Box::pin(async {
        let fake = FakeEc2::start().await;
        let s = Scenario::without_machines("fm-ec2fake").await;
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        s.set_aws_endpoint(&fake.endpoint());
        let mut nodes = Vec::new();
        let mut ids = Vec::new();
        for (k, suffix) in ["control", "stopping", "shutting", "flaky"]
            .into_iter()
            .enumerate()
        {
            let id = format!("i-0fa4e{k:012}");
            let (ip, dns) = (
                format!("10.1.0.{}", k + 1),
                format!("ip-10-1-0-{}.ec2.internal", k + 1),
            );
            fake.set(
                &id,
                FakeInstance {
                    state: "running".into(),
                    private_ip: ip.clone(),
                    private_dns: dns.clone(),
                    absent_for: 0,
                },
            );
            let n = s
                .node_reporting(suffix, FIRST_BOOT, KubeletIdentity::instance(&ip, &dns))
                .await;
            n.set_provider_id(&format!("aws:///us-east-1a/{id}")).await;
            nodes.push(n);
            ids.push(id);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon.wait_identity(&n.name, "match", EVENT_BOUND).await;
        }
        fake.throttle(true);
        fake.set_state(&ids[0], "stopped");
        fake.set_state(&ids[1], "stopping");
        fake.set_state(&ids[2], "shutting-down");
        fake.hide(&ids[3], 1);
        for n in &nodes {
            n.die(FIRST_BOOT).await;
        }
        let r = daemon
            .wait_rule(&nodes[0].name, "power-unknown", EVENT_BOUND)
            .await;
        assert!(
            r["reason"].to_string().contains("RequestLimitExceeded"),
            "{r}"
        );
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        let answered = Instant::now();
        fake.throttle(false);
        wait_taint(&nodes[0], EVENT_BOUND).await;
        let taint = Write::Taint(nodes[0].name.clone());
        assert!(rec.seen(&taint).await > answered);
        for n in &nodes[1..3] {
            daemon
                .wait_rule(&n.name, "power-transitional", EVENT_BOUND)
                .await;
        }
        // The event the rest is about: the daemon read the one answer without the instance
        // (each DescribeInstances may take seconds on a loaded machine, and the report shows
        // only the reads behind its latest decision).
        wait_for(
            "the daemon reads the one-off NotFound",
            EVENT_BOUND,
            || async {
                let m = daemon.metrics().await;
                (support::k8s::sum_of(
                    &m,
                    "oobfence_power_reads_total{backend=\"ec2\",result=\"not_found\",",
                ) >= 1.0)
                    .then_some(())
            },
        )
        .await;
        assert_eq!(fake.hidden_left(&ids[3]), Some(0));
        // Then the instance answers running again: On, never fenced nor deleted.
        daemon
            .wait_rule(&nodes[3].name, "power-on", EVENT_BOUND)
            .await;
        for n in &nodes[1..] {
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        report(&format!(
            "fault matrix: fake EC2 answered {} requests",
            fake.requests()
        ));
        conclude(
            "EC2: throttled, stopping, shutting-down, NotFound once",
            vec![taint],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}
