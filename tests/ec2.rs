//! The EC2 power source against moto's EC2 emulator (real AWS wire format), a counting proxy
//! for the batching, recorded EC2 replies for what moto cannot produce (stopping,
//! shutting-down, hibernation, throttling, auth failure), and end to end with a real
//! kube-apiserver.

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use oobfence::config::{AwsConfig, Config};
use oobfence::identity::{MachineIdentity, NodeIdentity, verify};
use oobfence::power::ec2::{Ec2Reader, Ec2Source, volume_ids};
use oobfence::power::{PowerSource, PowerSources, PowerState, ReadErrorKind, Reply};
use support::k8s::{FakeNode, RunningDaemon, TEST_LABEL, events_for, unique, wait_for};
use support::moto::{
    CountingProxy, MotoServer, attach_data_volume, client_in, run_instances, run_instances_in,
};

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

fn ec2_config(group: &str, endpoint: &str, nodes: &[&str]) -> String {
    let globs: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
    format!(
        r#"
datacenter = "test"
[kubernetes]
kubeconfig = "{{kubeconfig}}"
node_selector = "{TEST_LABEL}={group}"
[policy]
not_ready_grace = "2s"
confirm_reads = 2
confirm_interval = "1s"
read_max_age = "10s"
recheck_interval = "2s"
[server]
listen = "{{listen}}"
[aws]
region = "us-east-1"
nodes = [{}]
endpoint_url = "{endpoint}"
"#,
        globs.join(", ")
    )
}

async fn set_provider_id(node: &FakeNode, instance: &str) {
    node.nodes()
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": format!("aws:///us-east-1a/{instance}")}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_instance_is_tainted_and_terminated_one_is_deleted_with_its_attachments() {
    support::moto::require_test_aws_env();
    let client = support::k8s::client().await;
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 3).await;
    let group = unique("ec2");
    let (stopped_name, terminated_name, running_name) = (
        format!("{group}-stopped"),
        format!("{group}-terminated"),
        format!("{group}-running"),
    );
    let stopped = FakeNode::create(&client, &stopped_name, &group, "b1").await;
    let terminated = FakeNode::create(&client, &terminated_name, &group, "b1").await;
    let running = FakeNode::create(&client, &running_name, &group, "b1").await;
    set_provider_id(&stopped, &ids[0]).await;
    set_provider_id(&terminated, &ids[1]).await;
    set_provider_id(&running, &ids[2]).await;
    let data = attach_data_volume(&ec2, &ids[0]).await;

    // A VolumeAttachment for the node that will be terminated.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = format!("{group}-va");
    vas.create(
        &PostParams::default(),
        &VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(va_name.clone()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "ebs.csi.aws.com".into(),
                node_name: terminated_name.clone(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some("pv-test".into()),
                    ..Default::default()
                },
            },
            status: None,
        },
    )
    .await
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let daemon = RunningDaemon::start(
        &ec2_config(
            &group,
            &moto.endpoint(),
            &[&stopped_name, &terminated_name, &running_name],
        ),
        dir,
    )
    .await;
    ec2.stop_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    ec2.terminate_instances()
        .instance_ids(&ids[1])
        .send()
        .await
        .unwrap();
    stopped.die("b1").await;
    terminated.die("b1").await;
    running.die("b1").await;

    let limit = Duration::from_secs(45);
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
    daemon.stop().await;
    stopped.delete().await;
    running.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_prints_state_and_held_volumes() {
    support::moto::require_test_aws_env();
    let client = support::k8s::client().await;
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 1).await;
    let data = attach_data_volume(&ec2, &ids[0]).await;
    ec2.stop_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .unwrap();
    let group = unique("ec2probe");
    let name = format!("{group}-a");
    let node = FakeNode::create(&client, &name, &group, "b1").await;
    set_provider_id(&node, &ids[0]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc.toml");
    let text = ec2_config(&group, &moto.endpoint(), &[&name])
        .replace(
            "{kubeconfig}",
            &support::k8s::kubeconfig_path().display().to_string(),
        )
        .replace("{listen}", "127.0.0.1:0");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["probe", "--config"])
        .arg(&path)
        .arg(&name)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("{name}: Off (ec2 us-east-1/{}", ids[0])),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("volumes: {data} on /dev/sdf")),
        "{stdout}"
    );
    node.delete().await;
}
