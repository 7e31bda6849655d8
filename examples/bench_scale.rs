//! The scale benchmark, run by `bench/scale`: what `oobfence run` costs watching many nodes.
//!
//! On the API server `OOBFENCE_TEST_KUBECONFIG` points at (with no controller-manager: nothing
//! but this benchmark changes the nodes), it registers `BENCH_NODES` Ready nodes with Leases,
//! all mapped by one `[[bmc]]` entry to a Redfish farm ([`support::redfish_farm`]) whose
//! machines report the nodes' system UUIDs, and renews every Lease every 10 s as kubelets on
//! the default 40 s Lease do. It starts the daemon (`OOBFENCE_BIN`, the release build in
//! `bench/scale`) and, once every node's identity is read, measures it idle for
//! `BENCH_IDLE_SECONDS`: resident memory, CPU seconds per minute, the size of `/metrics`.
//!
//! Prints one line per figure as `figure<TAB>value<TAB>unit`, for `bench/scale` to tabulate.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use support::k8s::{FakeNode, KubeletIdentity, free_port};
use support::redfish_farm::{RedfishFarm, uuid_of};

/// API calls in flight while registering nodes and renewing Leases.
const API_CONCURRENCY: usize = 32;
/// A kubelet on the default 40 s Lease renews every 10 s.
const RENEW_EVERY: Duration = Duration::from_secs(10);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn figure(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("{name}\t{value}\t{unit}");
}

fn note(what: &str) {
    eprintln!("bench: {what}");
}

/// Resident memory now and at its peak (KiB), and CPU seconds used so far, of process `pid`.
fn usage(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 14th field overall.
    let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // USER_HZ is 100 on every Linux this runs on (sysconf would need libc).
    let cpu = (ticks(11) + ticks(12)) as f64 / 100.0;
    (kib("VmRSS:"), kib("VmHWM:"), cpu)
}

async fn renew(leases: &Api<Lease>, name: &str) -> bool {
    let patch = serde_json::json!({"spec": {
        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()),
        "leaseDurationSeconds": 40,
    }});
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok()
}

#[tokio::main]
async fn main() {
    let nodes = env_usize("BENCH_NODES", 5000);
    let idle_secs = env_usize("BENCH_IDLE_SECONDS", 60) as u64;
    let client = support::k8s::client().await;
    let group = support::k8s::unique("bench");
    let dir = tempfile::tempdir().unwrap();
    let farm = RedfishFarm::start();

    let names: Vec<String> = (0..nodes).map(|i| format!("{group}-{i:05}")).collect();
    let started = Instant::now();
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(API_CONCURRENCY, |(i, name)| {
            let client = client.clone();
            let group = group.clone();
            async move {
                FakeNode::create_as(
                    &client,
                    name,
                    &group,
                    "boot-1",
                    KubeletIdentity::uuid(&uuid_of(i)),
                )
                .await;
            }
        })
        .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    futures::stream::iter(&names)
        .for_each_concurrent(API_CONCURRENCY, |name| {
            let leases = leases.clone();
            async move {
                renew(&leases, name).await;
            }
        })
        .await;
    note(&format!(
        "registered {nodes} nodes with Leases in {:.0} s",
        started.elapsed().as_secs_f64()
    ));

    // The kubelets: every Lease renewed every 10 s, spread over the period.
    let renewals = Arc::new(AtomicU64::new(0));
    let kubelets = {
        let names = names.clone();
        let leases = leases.clone();
        let renewals = renewals.clone();
        tokio::spawn(async move {
            loop {
                let round = Instant::now();
                futures::stream::iter(&names)
                    .for_each_concurrent(API_CONCURRENCY, |name| {
                        let leases = leases.clone();
                        let renewals = renewals.clone();
                        async move {
                            if renew(&leases, name).await {
                                renewals.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                    .await;
                tokio::time::sleep(RENEW_EVERY.saturating_sub(round.elapsed())).await;
            }
        })
    };

    let pw = dir.path().join("bmc.password");
    std::fs::write(&pw, "password\n").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let config = format!(
        r#"datacenter = "bench"
[kubernetes]
kubeconfig = "{kubeconfig}"
node_selector = "{label}={group}"
[server]
listen = "{listen}"
[journal]
path = "{journal}"
[pause]
file = "{paused}"
configmap = ""
[[bmc]]
nodes = ["{group}-*"]
protocol = "redfish"
address = "{farm}"
system = "/redfish/v1/Systems/{{node}}"
username = "admin"
password_file = "{pw}"
ca_file = "{ca}"
"#,
        kubeconfig = support::k8s::kubeconfig_path().display(),
        label = support::k8s::TEST_LABEL,
        journal = dir.path().join("journal.jsonl").display(),
        paused = dir.path().join("paused").display(),
        farm = farm.base_url(),
        pw = pw.display(),
        ca = farm.cert.display(),
    );
    let config_path = dir.path().join("bench.toml");
    std::fs::write(&config_path, config).unwrap();
    let bin = std::env::var("OOBFENCE_BIN").unwrap_or_else(|_| "target/release/oobfence".into());
    let mut daemon = tokio::process::Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("oobfence.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start oobfence");
    let pid = daemon.id().unwrap();
    let http = reqwest::Client::new();
    let started = Instant::now();
    support::k8s::wait_ready(&listen, Duration::from_secs(300)).await;
    figure(
        "startup: list and first pass",
        format!("{:.1}", started.elapsed().as_secs_f64()),
        "s",
    );
    // Idle means every node's machine has been read once (the identity check at start).
    support::k8s::wait_for("every identity read", Duration::from_secs(600), || async {
        let m = http
            .get(format!("http://{listen}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let matched = m
            .lines()
            .find(|l| l.starts_with("oobfence_identity_nodes{verdict=\"match\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        (matched as usize >= nodes).then_some(())
    })
    .await;
    figure(
        "startup: every machine's identity read",
        format!("{:.1}", started.elapsed().as_secs_f64()),
        "s",
    );
    let reads_before = farm.requests().await;
    let renewals_before = renewals.load(Ordering::Relaxed);
    let (_, _, cpu_before) = usage(pid);
    let idle = Instant::now();
    let mut rss_max = 0;
    while idle.elapsed() < Duration::from_secs(idle_secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_max = rss_max.max(usage(pid).0);
    }
    let (rss, hwm, cpu_after) = usage(pid);
    let minutes = idle.elapsed().as_secs_f64() / 60.0;
    let metrics = support::k8s::scrape(&listen).await;
    let series = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    figure("nodes watched", nodes, "");
    figure(
        "Lease renewals watched while idle",
        format!(
            "{:.0}",
            (renewals.load(Ordering::Relaxed) - renewals_before) as f64 / (minutes * 60.0)
        ),
        "/s",
    );
    figure("idle RSS", rss / 1024, "MiB");
    figure("idle RSS, highest while idle", rss_max / 1024, "MiB");
    figure("RSS peak since start", hwm / 1024, "MiB");
    figure(
        "idle CPU",
        format!("{:.2}", (cpu_after - cpu_before) / minutes),
        "s/min",
    );
    let idle_reads = farm.requests().await - reads_before;
    figure("power reads while idle", idle_reads, "");
    figure("/metrics size", metrics.len() / 1024, "KiB");
    figure("/metrics series", series, "");

    kubelets.abort();
    let _ = daemon.kill().await;
    // Healthy nodes whose kubelets renew are read once at start and then every 10 minutes:
    // a read while idle is a bug, whatever the figures say.
    let broken = (idle_reads > 0)
        .then(|| format!("{idle_reads} power reads of healthy nodes while idle (expected none)"));
    note("deleting the benchmark's nodes");
    futures::stream::iter(&names)
        .for_each_concurrent(API_CONCURRENCY, |name| {
            let client = client.clone();
            async move {
                FakeNode {
                    client,
                    name: name.clone(),
                    identity: KubeletIdentity::default(),
                }
                .delete()
                .await;
            }
        })
        .await;
    if let Some(why) = broken {
        eprintln!("bench: FAILED: {why}");
        std::process::exit(1);
    }
}
