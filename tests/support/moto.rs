//! moto's EC2 emulator on 127.0.0.1, and a counting proxy in front of it.
//!
//! No test may reach real AWS or an instance metadata service: [`require_test_aws_env`] checks
//! that the process runs with the fake credentials and the metadata service disabled (as
//! scripts/test sets them) before any AWS client is built.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::{Instance, InstanceType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const REGION: &str = "us-east-1";
pub const ZONE: &str = "us-east-1a";

/// Panics unless the environment pins fake AWS credentials and disables the metadata service.
pub fn require_test_aws_env() {
    let want = [
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ];
    for (k, v) in want {
        if std::env::var(k).as_deref() != Ok(v) {
            panic!(
                "{k} must be {v:?} for the EC2 tests (they must never reach real AWS or the \
                 instance metadata service): run them through scripts/test, which sets it"
            );
        }
    }
    for k in ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"] {
        if std::env::var_os(k).is_some() {
            panic!("{k} is set: unset it for the EC2 tests (scripts/test does)");
        }
    }
}

pub struct MotoServer {
    child: Child,
    pub port: u16,
}

impl MotoServer {
    pub async fn start() -> MotoServer {
        require_test_aws_env();
        let bin = super::venv_bin("moto_server");
        let port = super::k8s::free_port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let server = MotoServer { child, port };
        let url = format!("{}/moto-api/", server.endpoint());
        let start = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                break;
            }
            if start.elapsed() > super::SERVER_START_BOUND {
                panic!(
                    "moto_server did not answer on {url} within {:?}",
                    super::SERVER_START_BOUND
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An EC2 client with explicit fake credentials, region and endpoint.
    pub fn client(&self) -> aws_sdk_ec2::Client {
        client_for(&self.endpoint())
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client_for(endpoint: &str) -> aws_sdk_ec2::Client {
    client_in(endpoint, REGION)
}

/// An EC2 client for another of moto's regions (moto keeps one set of instances per region,
/// chosen by the request's signature, like EC2).
pub fn client_in(endpoint: &str, region: &str) -> aws_sdk_ec2::Client {
    let conf = aws_sdk_ec2::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_string()))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

/// What the instance's kubelet reports about its machine: its private IP and private DNS
/// name, as DescribeInstances shows them.
pub async fn kubelet_of(ec2: &aws_sdk_ec2::Client, instance: &str) -> super::k8s::KubeletIdentity {
    let i = describe_instance(ec2, instance).await;
    super::k8s::KubeletIdentity::instance(
        i.private_ip_address().expect("a private IP"),
        i.private_dns_name().expect("a private DNS name"),
    )
}

/// What DescribeInstances itself says about `id`, fetched with the SDK client.
pub async fn describe_instance(ec2: &aws_sdk_ec2::Client, id: &str) -> Instance {
    let out = ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances");
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(id))
        .unwrap_or_else(|| panic!("{id} is not in {out:?}"))
        .clone()
}

/// The providerID of a node on `instance` in `zone`: `aws:///ZONE/ID`.
pub fn provider_id(zone: &str, instance: &str) -> String {
    format!("aws:///{zone}/{instance}")
}

/// Launches `n` instances and returns their ids.
pub async fn run_instances(ec2: &aws_sdk_ec2::Client, n: i32) -> Vec<String> {
    run_instances_in(ec2, n, ZONE).await
}

/// Launches `n` instances in `zone` (of the client's region) and returns their ids.
pub async fn run_instances_in(ec2: &aws_sdk_ec2::Client, n: i32, zone: &str) -> Vec<String> {
    let out = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::T2Micro)
        .min_count(n)
        .max_count(n)
        .placement(
            aws_sdk_ec2::types::Placement::builder()
                .availability_zone(zone)
                .build(),
        )
        .send()
        .await
        .expect("RunInstances");
    out.instances()
        .iter()
        .map(|i| i.instance_id().unwrap().to_string())
        .collect()
}

/// Creates a data volume and attaches it to `instance` at `/dev/sdf`.
pub async fn attach_data_volume(ec2: &aws_sdk_ec2::Client, instance: &str) -> String {
    let vol = ec2
        .create_volume()
        .availability_zone(ZONE)
        .size(10)
        .send()
        .await
        .expect("CreateVolume");
    let id = vol.volume_id().unwrap().to_string();
    ec2.attach_volume()
        .volume_id(&id)
        .instance_id(instance)
        .device("/dev/sdf")
        .send()
        .await
        .expect("AttachVolume");
    id
}

/// A TCP proxy to `upstream` that counts the EC2 actions passing through it, so a test can
/// check how many DescribeInstances calls a batch of reads really made.
pub struct CountingProxy {
    pub port: u16,
    describe_instances: Arc<AtomicUsize>,
    describe_volumes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(upstream_port: u16) -> CountingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let di = Arc::new(AtomicUsize::new(0));
        let dv = Arc::new(AtomicUsize::new(0));
        let (di2, dv2) = (di.clone(), dv.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                let (di, dv) = (di2.clone(), dv2.clone());
                tokio::spawn(async move {
                    let Ok(mut up) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                    else {
                        return;
                    };
                    let (mut dr, mut dw) = down.split();
                    let (mut ur, mut uw) = up.split();
                    let client_to_server = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match dr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let chunk = String::from_utf8_lossy(&buf[..n]);
                            di.fetch_add(
                                chunk.matches("Action=DescribeInstances").count(),
                                Ordering::Relaxed,
                            );
                            dv.fetch_add(
                                chunk.matches("Action=DescribeVolumes").count(),
                                Ordering::Relaxed,
                            );
                            if uw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = uw.shutdown().await;
                    };
                    let server_to_client = async {
                        let _ = tokio::io::copy(&mut ur, &mut dw).await;
                        let _ = dw.shutdown().await;
                    };
                    tokio::join!(client_to_server, server_to_client);
                });
            }
        });
        CountingProxy {
            port,
            describe_instances: di,
            describe_volumes: dv,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn describe_instances(&self) -> usize {
        self.describe_instances.load(Ordering::Relaxed)
    }

    pub fn describe_volumes(&self) -> usize {
        self.describe_volumes.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
