//! Batching: the reads in flight fold into one DescribeInstances (or a few), also for a storm
//! read through the daemon's read slots, counted by a proxy and by the daemon's metrics.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_reads_make_one_or_a_few_calls() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 200).await;
    assert_eq!(ids.len(), 200);
    ec2.stop_instances()
        .set_instance_ids(Some(ids[..100].to_vec()))
        .send()
        .await
        .unwrap();
    let proxy = CountingProxy::start(moto.port).await;
    let r = reader(&proxy.endpoint()).await;
    let started = std::time::Instant::now();
    let reads = futures::future::join_all(ids.iter().map(|id| {
        let r = r.clone();
        async move { read(&r, id).await.0 }
    }))
    .await;
    assert_eq!(
        reads.iter().filter(|s| **s == PowerState::Off).count(),
        100,
        "first reads: {:?}",
        &reads[..3]
    );
    assert_eq!(reads.iter().filter(|s| **s == PowerState::On).count(), 100);
    let (di, dv) = (proxy.describe_instances(), proxy.describe_volumes());
    println!(
        "200 concurrent reads in {:.2}s: {di} DescribeInstances, {dv} DescribeVolumes",
        started.elapsed().as_secs_f64()
    );
    assert!(
        (1..=2).contains(&di),
        "{di} DescribeInstances calls for 200 reads"
    );
    assert!(dv <= 2, "{dv} DescribeVolumes calls for 200 reads");
}

/// `oobfence_power_reads_total` of the EC2 backend, every result, as scraped.
fn ec2_reads(metrics: &str) -> u64 {
    support::k8s::sum_of(metrics, "oobfence_power_reads_total{backend=\"ec2\",") as u64
}

/// The EC2 source folds the reads in flight into one DescribeInstances; the daemon's read
/// slots (`max_concurrent_reads`, a bound on BMC sessions) must not cut a storm's batches
/// down to the slot count, a call per two nodes here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_stopped_instances_is_read_in_a_few_calls_not_one_per_read_slot() {
    const N: usize = 24;
    let s = Scenario::ec2("ec2-storm", N).await;
    s.set_policy(&format!("{}max_concurrent_reads = 2\n", s.policy_lines()));
    let ec2 = s.moto().client();
    let mut nodes = Vec::new();
    for i in 0..N {
        nodes.push(s.node(&format!("n{i}"), i).await);
    }
    let alive = FakeNode::keep_alive(&nodes.iter().collect::<Vec<_>>(), FIRST_BOOT);
    let daemon = s.daemon().await;
    let limit = Duration::from_secs(90);
    for n in &nodes {
        daemon.wait_identity(&n.name, "match", limit).await;
    }
    drop(alive);
    // A renewal the keep-alive had in flight lands before the nodes die.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m = daemon.metrics().await;
    let (before, reads_before) = (describe_instances_calls(&m), ec2_reads(&m));
    let ids: Vec<String> = (0..N).map(|i| s.instance(i).to_string()).collect();
    ec2.stop_instances()
        .set_instance_ids(Some(ids))
        .send()
        .await
        .expect("StopInstances");
    futures::future::join_all(nodes.iter().map(|n| n.die(FIRST_BOOT))).await;
    for n in &nodes {
        wait_for(&format!("{} tainted", n.name), limit, || async {
            FakeNode::has_oos_taint(&n.get().await).then_some(())
        })
        .await;
    }
    let m = daemon.metrics().await;
    let calls = describe_instances_calls(&m) - before;
    let reads = ec2_reads(&m) - reads_before;
    println!("{N} stopped instances fenced after {reads} reads in {calls} DescribeInstances calls");
    // Through 2 read slots, a call would serve 2 reads; batched, a call serves every read of a
    // pass. Counted per read, since a loaded machine's stragglers add passes and reads alike.
    assert!(
        reads >= 2 * N as u64,
        "{reads} reads: two confirming reads a node"
    );
    assert!(
        calls * 4 <= reads,
        "{calls} DescribeInstances calls for {reads} reads to fence {N} nodes: the reads were not batched"
    );
    daemon.stop().await;
    for n in &nodes {
        n.delete().await;
    }
}
