//! The EC2 power source against moto's EC2 emulator (real AWS wire format), a counting proxy
//! for the batching, recorded EC2 replies for what moto cannot produce (stopping,
//! shutting-down, hibernation, throttling, auth failure), and end to end with a real
//! kube-apiserver.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, PostParams};

use oobfence::config::{AwsConfig, Config};
use oobfence::identity::{MachineIdentity, NodeIdentity, verify};
use oobfence::power::ec2::{Ec2Reader, Ec2Source, volume_ids};
use oobfence::power::{PowerSource, PowerSources, PowerState, ReadErrorKind, Reply};
use support::k8s::{FakeNode, KubeletIdentity, events_for, volume_attachment, wait_for};
use support::moto::{
    CountingProxy, MotoServer, ZONE, attach_data_volume, client_in, describe_instance, kubelet_of,
    provider_id, run_instances, run_instances_in,
};
use support::scenario::{FIRST_BOOT, Scenario};

fn config(endpoint: &str, timeout: &str) -> Config {
    let text = format!(
        "datacenter = \"t\"\n[aws]\nregion = \"us-east-1\"\nnodes = [\"*\"]\nendpoint_url = \"{endpoint}\"\ntimeout = \"{timeout}\"\n"
    );
    Config::parse(&text, std::path::Path::new("t.toml")).unwrap()
}

fn aws_config(endpoint: &str, timeout: &str) -> AwsConfig {
    config(endpoint, timeout).aws.unwrap()
}

async fn reader(endpoint: &str) -> Arc<Ec2Reader> {
    support::moto::require_test_aws_env();
    Ec2Reader::new(&aws_config(endpoint, "5s"), Default::default()).await
}

async fn read_reply(reader: &Arc<Ec2Reader>, id: &str) -> Reply {
    Ec2Source::new(reader.clone(), id.to_string())
        .read_reply()
        .await
}

async fn read(reader: &Arc<Ec2Reader>, id: &str) -> (PowerState, Vec<oobfence::power::ReadDetail>) {
    let r = read_reply(reader, id).await;
    (r.state, r.details)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_states_map_to_power_states_with_volumes_as_evidence() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 3).await;
    let (running, stopped, terminated) = (&ids[0], &ids[1], &ids[2]);
    let data = attach_data_volume(&ec2, stopped).await;
    ec2.stop_instances()
        .instance_ids(stopped)
        .send()
        .await
        .unwrap();
    ec2.terminate_instances()
        .instance_ids(terminated)
        .send()
        .await
        .unwrap();

    let r = reader(&moto.endpoint()).await;
    assert_eq!(read(&r, running).await.0, PowerState::On);
    let (state, details) = read(&r, stopped).await;
    assert_eq!(state, PowerState::Off);
    // The data volume is evidence; moto's auto-created root volume is not.
    assert_eq!(volume_ids(&details), vec![data.clone()], "{details:?}");
    assert_eq!(read(&r, terminated).await.0, PowerState::Terminated);
    assert_eq!(
        read(&r, "i-0123456789abcdef0").await.0,
        PowerState::NotFound
    );
    // The stopped instance keeps its volume attached until something detaches it.
    let held = r
        .still_attached(stopped, std::slice::from_ref(&data))
        .await
        .unwrap();
    assert_eq!(held, vec![data.clone()]);
    ec2.detach_volume()
        .volume_id(&data)
        .instance_id(stopped)
        .send()
        .await
        .unwrap();
    assert!(r.still_attached(stopped, &[data]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_report_the_instance_addresses_describe_instances_shows() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 2).await;
    let (running, stopped) = (&ids[0], &ids[1]);
    ec2.stop_instances()
        .instance_ids(stopped)
        .send()
        .await
        .unwrap();
    let r = reader(&moto.endpoint()).await;

    for (id, want_state) in [(running, PowerState::On), (stopped, PowerState::Off)] {
        let truth = describe_instance(&ec2, id).await;
        let ip = truth.private_ip_address().expect("moto gives a private IP");
        let dns = truth
            .private_dns_name()
            .expect("moto gives a private DNS name");
        assert!(!ip.is_empty() && !dns.is_empty(), "{truth:?}");
        let reply = read_reply(&r, id).await;
        assert_eq!(reply.state, want_state);
        let MachineIdentity::Instance {
            id: got_id,
            private_ips,
            private_dns_names,
        } = &reply.identity
        else {
            panic!("{id}: {:?}", reply.identity);
        };
        assert_eq!(got_id, id);
        assert!(
            private_ips.iter().any(|a| a == ip),
            "{ip} not in {private_ips:?}"
        );
        assert!(
            private_dns_names.iter().any(|n| n == dns),
            "{dns} not in {private_dns_names:?}"
        );
        // Every address the read reports is one DescribeInstances has for this instance.
        let nic_ips: Vec<&str> = truth
            .network_interfaces()
            .iter()
            .flat_map(|n| n.private_ip_addresses())
            .filter_map(|a| a.private_ip_address())
            .chain([ip])
            .collect();
        for a in private_ips {
            assert!(
                nic_ips.contains(&a.as_str()),
                "{a} is not {id}'s: {nic_ips:?}"
            );
        }
        // The core's check: a Node reporting that address is this instance's, another is not.
        let node = |addresses: &[&str]| NodeIdentity {
            system_uuid: String::new(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            uuid_shared_with: Vec::new(),
        };
        assert!(verify(&node(&[ip]), &reply.identity).is_match());
        assert!(verify(&node(&["host-a", dns]), &reply.identity).is_match());
        assert_eq!(
            verify(&node(&["10.255.255.254"]), &reply.identity).label(),
            "mismatch"
        );
    }

    // Absent from the answer: NotFound, and no identity, with the reason.
    let gone = read_reply(&r, "i-0123456789abcdef0").await;
    assert_eq!(gone.state, PowerState::NotFound);
    match &gone.identity {
        MachineIdentity::Unreported { reason } => {
            assert!(reason.contains("i-0123456789abcdef0"), "{reason}");
        }
        other => panic!("an absent instance reported {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_id_of_another_region_is_a_config_error_never_not_found() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    // An instance in moto's us-east-1 (the configured region), addressed with a zone of
    // us-west-2.
    let here = run_instances(&ec2, 1).await.remove(0);
    // The failure this guards against: an instance of us-west-2 read in us-east-1 is absent
    // from the answer, which reads as NotFound, as if it were gone.
    let west = client_in(&moto.endpoint(), "us-west-2");
    let there = run_instances_in(&west, 1, "us-west-2a").await.remove(0);
    let r = reader(&moto.endpoint()).await;
    assert_eq!(
        read(&r, &there).await.0,
        PowerState::NotFound,
        "moto no longer keeps regions apart: this test proves nothing"
    );

    let sources =
        PowerSources::new(Arc::new(config(&moto.endpoint(), "5s")), Default::default()).await;
    for id in [&here, &there] {
        let pid = format!("aws:///us-west-2a/{id}");
        let refused = match Ec2Source::for_provider_id(r.clone(), &pid) {
            Ok(_) => panic!("{pid} was accepted for region us-east-1"),
            Err(e) => e,
        };
        assert!(
            refused.contains("us-west-2a") && refused.contains("us-east-1"),
            "{refused}"
        );
        // The node's source, as the daemon builds it: every read is a Config error naming the
        // zone and the region, however often it is read.
        let mapped = sources
            .for_node("n1", Some(&pid))
            .expect("[aws] maps every node");
        for _ in 0..3 {
            let reply = mapped.source.read_reply().await;
            match &reply.state {
                PowerState::Error { kind, detail } => {
                    assert_eq!(*kind, ReadErrorKind::Config, "{detail}");
                    assert!(
                        detail.contains("us-west-2a") && detail.contains("us-east-1"),
                        "{detail}"
                    );
                }
                other => panic!("{pid} read as {other:?}"),
            }
            assert!(!reply.state.is_down());
        }
    }
    // The same instance with its own zone reads normally.
    let ok = Ec2Source::for_provider_id(r.clone(), &format!("aws:///us-east-1a/{here}"))
        .expect("a zone of us-east-1");
    assert_eq!(ok.instance_id(), here);
    assert_eq!(ok.read_reply().await.state, PowerState::On);
    let mapped = sources
        .for_node("n1", Some(&format!("aws:///us-east-1a/{here}")))
        .unwrap();
    assert_eq!(mapped.source.read().await, PowerState::On);
    // Without a zone the region cannot be checked: refused too, and the message says why.
    let no_zone = match Ec2Source::for_provider_id(r.clone(), &format!("aws:///{here}")) {
        Ok(_) => panic!("a providerID without a zone was accepted"),
        Err(e) => e,
    };
    assert!(no_zone.contains("no availability zone"), "{no_zone}");
}

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

/// `oobfence_ec2_describe_instances_calls_total` as scraped.
fn describe_instances_calls(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("oobfence_ec2_describe_instances_calls_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no DescribeInstances count in {metrics}"))
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

/// A one-shot HTTP responder replaying a recorded EC2 reply, counting requests.
async fn recorded_ec2(
    status: u16,
    body: &'static str,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                // Read the whole request (headers + Content-Length body), bounded.
                for _ in 0..64 {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let l = l.to_ascii_lowercase();
                                l.strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let reason = if status == 200 { "OK" } else { "Error" };
                let resp = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: text/xml;charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

fn describe_reply(state: &str, code: u8) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
  <reservationSet><item><reservationId>r-1234567890abcdef0</reservationId><ownerId>123456789012</ownerId><groupSet/>
    <instancesSet><item>
      <instanceId>i-1234567890abcdef0</instanceId><imageId>ami-0abcdef1234567890</imageId>
      <instanceState><code>{code}</code><name>{state}</name></instanceState>
      <rootDeviceName>/dev/xvda</rootDeviceName><blockDeviceMapping/>
    </item></instancesSet>
  </item></reservationSet>
</DescribeInstancesResponse>"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intermediate_states_from_recorded_replies_are_not_off() {
    for (state, code) in [("stopping", 64u8), ("shutting-down", 32), ("pending", 0)] {
        let body: &'static str = Box::leak(describe_reply(state, code).into_boxed_str());
        let (endpoint, _) = recorded_ec2(200, body).await;
        let r = reader(&endpoint).await;
        let got = read(&r, "i-1234567890abcdef0").await.0;
        assert_eq!(
            got,
            PowerState::Transitional {
                detail: state.to_string()
            }
        );
    }
    // A recorded stopped reply is Off. The responder answers DescribeVolumes with the same
    // (wrong) document: missing evidence must not turn Off into anything else, and says so.
    let body: &'static str = Box::leak(describe_reply("stopped", 80).into_boxed_str());
    let (endpoint, _) = recorded_ec2(200, body).await;
    let r = reader(&endpoint).await;
    let (state, details) = read(&r, "i-1234567890abcdef0").await;
    assert_eq!(state, PowerState::Off);
    assert!(details[0].value.starts_with("unknown"), "{details:?}");
}

/// A DescribeInstances answer for an on-demand instance stopped with `StopInstances
/// Hibernate=true`, as EC2 reports it once the RAM is on the root volume: state `stopped`
/// (code 80) like a plain stop, but the state reason `Client.UserInitiatedHibernate`. moto
/// cannot produce it: its StopInstances ignores `Hibernate` and always records
/// `Client.UserInitiatedShutdown`.
const HIBERNATED: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>4c6b1c2e-8d7a-4f3b-9c51-example</requestId>
  <reservationSet><item><reservationId>r-0a1b2c3d4e5f60718</reservationId><ownerId>123456789012</ownerId><groupSet/>
    <instancesSet><item>
      <instanceId>i-0a1b2c3d4e5f60718</instanceId><imageId>ami-0abcdef1234567890</imageId>
      <instanceState><code>80</code><name>stopped</name></instanceState>
      <privateDnsName>ip-10-0-12-34.us-west-2.compute.internal</privateDnsName>
      <dnsName/>
      <reason>User initiated (2024-05-02 09:14:07 GMT)</reason>
      <amiLaunchIndex>0</amiLaunchIndex><productCodes/>
      <instanceType>m5.large</instanceType>
      <launchTime>2024-05-01T07:02:11.000Z</launchTime>
      <placement><availabilityZone>us-west-2a</availabilityZone><groupName/><tenancy>default</tenancy></placement>
      <monitoring><state>disabled</state></monitoring>
      <subnetId>subnet-0123456789abcdef0</subnetId><vpcId>vpc-0123456789abcdef0</vpcId>
      <privateIpAddress>10.0.12.34</privateIpAddress>
      <stateReason><code>Client.UserInitiatedHibernate</code><message>Client.UserInitiatedHibernate: User initiated hibernate</message></stateReason>
      <architecture>x86_64</architecture>
      <rootDeviceType>ebs</rootDeviceType><rootDeviceName>/dev/xvda</rootDeviceName>
      <blockDeviceMapping><item><deviceName>/dev/xvda</deviceName><ebs><volumeId>vol-0a1b2c3d4e5f60718</volumeId><status>attached</status><attachTime>2024-05-01T07:02:12.000Z</attachTime><deleteOnTermination>true</deleteOnTermination></ebs></item></blockDeviceMapping>
      <virtualizationType>hvm</virtualizationType><hypervisor>xen</hypervisor>
      <networkInterfaceSet><item>
        <networkInterfaceId>eni-0a1b2c3d4e5f60718</networkInterfaceId><subnetId>subnet-0123456789abcdef0</subnetId><vpcId>vpc-0123456789abcdef0</vpcId>
        <ownerId>123456789012</ownerId><status>in-use</status><macAddress>02:1a:2b:3c:4d:5e</macAddress>
        <privateIpAddress>10.0.12.34</privateIpAddress><privateDnsName>ip-10-0-12-34.us-west-2.compute.internal</privateDnsName>
        <sourceDestCheck>true</sourceDestCheck><groupSet/>
        <attachment><attachmentId>eni-attach-0a1b2c3d4e5f60718</attachmentId><deviceIndex>0</deviceIndex><status>attached</status><deleteOnTermination>true</deleteOnTermination></attachment>
        <privateIpAddressesSet><item><privateIpAddress>10.0.12.34</privateIpAddress><privateDnsName>ip-10-0-12-34.us-west-2.compute.internal</privateDnsName><primary>true</primary></item></privateIpAddressesSet>
        <ipv6AddressesSet/><interfaceType>interface</interfaceType>
      </item></networkInterfaceSet>
      <ebsOptimized>false</ebsOptimized><enaSupport>true</enaSupport>
      <hibernationOptions><configured>true</configured></hibernationOptions>
    </item></instancesSet>
  </item></reservationSet>
</DescribeInstancesResponse>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_instance_is_suspended_not_off() {
    let (endpoint, hits) = recorded_ec2(200, HIBERNATED).await;
    let r = reader(&endpoint).await;
    let reply = read_reply(&r, "i-0a1b2c3d4e5f60718").await;
    match &reply.state {
        PowerState::Suspended { detail } => {
            assert!(detail.contains("Client.UserInitiatedHibernate"), "{detail}");
        }
        other => panic!("a hibernated instance read as {other:?}"),
    }
    assert!(!reply.state.is_down());
    assert_eq!(
        reply.identity,
        MachineIdentity::Instance {
            id: "i-0a1b2c3d4e5f60718".into(),
            private_ips: vec!["10.0.12.34".into()],
            private_dns_names: vec!["ip-10-0-12-34.us-west-2.compute.internal".into()],
        }
    );
    // Not down, so no DescribeVolumes: one call in all.
    assert_eq!(hits.load(std::sync::atomic::Ordering::Relaxed), 1);

    // The same answer for a plain stop (only the state reason differs) is Off, although the
    // instance is configured for hibernation.
    let plain: &'static str = Box::leak(
        HIBERNATED
            .replace(
                "<code>Client.UserInitiatedHibernate</code><message>Client.UserInitiatedHibernate: User initiated hibernate</message>",
                "<code>Client.UserInitiatedShutdown</code><message>Client.UserInitiatedShutdown: User initiated shutdown</message>",
            )
            .into_boxed_str(),
    );
    assert_ne!(plain, HIBERNATED);
    let (endpoint, _) = recorded_ec2(200, plain).await;
    let r = reader(&endpoint).await;
    assert_eq!(read(&r, "i-0a1b2c3d4e5f60718").await.0, PowerState::Off);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_auth_failures_are_error_reads_and_counted() {
    support::moto::require_test_aws_env();
    const THROTTLE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>1</RequestID></Response>"#;
    const AUTH: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>AuthFailure</Code><Message>AWS was not able to validate the provided access credentials</Message></Error></Errors><RequestID>2</RequestID></Response>"#;

    let (endpoint, hits) = recorded_ec2(503, THROTTLE).await;
    // Long enough for the SDK's throttling backoff to run out of attempts first.
    let r = Ec2Reader::new(&aws_config(&endpoint, "30s"), Default::default()).await;
    let (state, _) = read(&r, "i-1234567890abcdef0").await;
    match &state {
        PowerState::Error { kind, detail } => {
            assert_eq!(*kind, ReadErrorKind::Protocol, "{detail}");
            assert!(detail.contains("RequestLimitExceeded"), "{detail}");
        }
        other => panic!(
            "throttled read became {other:?} after {} attempts",
            hits.load(std::sync::atomic::Ordering::Relaxed)
        ),
    }
    let attempts = hits.load(std::sync::atomic::Ordering::Relaxed);
    let throttled = r.stats.throttled.get();
    println!("throttled read: {attempts} attempts, {throttled} counted as throttled");
    assert!(
        attempts >= 2,
        "the SDK retried a throttled call: {attempts}"
    );
    assert_eq!(throttled as usize, attempts);

    let (endpoint, _) = recorded_ec2(401, AUTH).await;
    let r = reader(&endpoint).await;
    match read(&r, "i-1234567890abcdef0").await.0 {
        PowerState::Error { kind, detail } => {
            assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
        }
        other => panic!("auth failure became {other:?}"),
    }

    // Nothing listening: unreachable, within the deadline.
    let port = support::k8s::free_port();
    let r = Ec2Reader::new(
        &aws_config(&format!("http://127.0.0.1:{port}"), "2s"),
        Default::default(),
    )
    .await;
    let start = std::time::Instant::now();
    let (state, _) = read(&r, "i-1234567890abcdef0").await;
    assert!(matches!(state, PowerState::Error { .. }), "{state:?}");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

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
