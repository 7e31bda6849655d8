//! Recorded EC2 replies for what moto cannot produce: stopping and shutting-down, an instance
//! hibernated, throttling and auth failures.

use super::*;

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
