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
//! Then the storm: `BENCH_STORM` nodes (default a fifth) lose power at once (their machines
//! read Off, their Leases stop, their status turns NotReady) with `BENCH_DECOYS` more (default
//! 50) that go NotReady but whose machines stay On. It reports when each was tainted against
//! when it became eligible (NotReady + `not_ready_grace` + the confirmation interval), the
//! decision latency from the journal (the confirming read's answer → the taint written), API
//! requests, power reads, reads in flight and peak memory; a decoy tainted, or a storm node
//! left untainted, fails the benchmark.
//!
//! Prints one line per figure as `figure<TAB>value<TAB>unit`, for `bench/scale` to tabulate.

#[path = "bench_scale/storm.rs"]
mod storm;
#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use support::bench::{cpu_seconds, env_usize, figure, note};
use support::k8s::{FakeNode, KubeletIdentity, free_port};
use support::redfish_farm::{RedfishFarm, uuid_of};

/// API calls in flight while registering nodes and renewing Leases.
const API_CONCURRENCY: usize = 32;
/// A kubelet on the default 40 s Lease renews every 10 s.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// The storm's policy: waits kept short so that a run stays short; what is measured comes after
/// them.
const NOT_READY_GRACE: Duration = Duration::from_secs(10);
const CONFIRM_INTERVAL: Duration = Duration::from_secs(5);
/// How long the daemon watching no node is measured.
const EMPTY_IDLE: Duration = Duration::from_secs(10);

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
    (kib("VmRSS:"), kib("VmHWM:"), cpu_seconds(&pid.to_string()))
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
    let storm_nodes = env_usize("BENCH_STORM", nodes / 5);
    let decoys = env_usize("BENCH_DECOYS", 50);
    assert!(
        storm_nodes + decoys <= nodes / 2,
        "BENCH_STORM + BENCH_DECOYS must stay within max_unhealthy (50% of BENCH_NODES)"
    );
    let client = support::k8s::client().await;
    let group = support::k8s::unique("bench");
    let dir = tempfile::tempdir().unwrap();
    let mut farm = RedfishFarm::start();

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
    // Nodes below this index have lost power: their kubelets renew nothing.
    let silenced = Arc::new(AtomicUsize::new(0));
    let kubelets = {
        let names = names.clone();
        let leases = leases.clone();
        let renewals = renewals.clone();
        let silenced = silenced.clone();
        tokio::spawn(async move {
            loop {
                let round = Instant::now();
                let skip = silenced.load(Ordering::Relaxed);
                futures::stream::iter(&names[skip..])
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
[policy]
not_ready_grace = "{grace}s"
confirm_interval = "{confirm}s"
pre_attest = false
[guards]
fence_budget = {budget}
# A record of this run's own: another run's fences on the same control plane would spend
# this one's budget.
record = "{record}"
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
        grace = NOT_READY_GRACE.as_secs(),
        confirm = CONFIRM_INTERVAL.as_secs(),
        budget = storm_nodes + decoys,
        // BENCH_GUARD_RECORD=0: no record (to see what writing it as each fence starts costs).
        record = if std::env::var("BENCH_GUARD_RECORD").as_deref() == Ok("0") {
            String::new()
        } else {
            format!("default/{group}-guards")
        },
    );
    let config_path = dir.path().join("bench.toml");
    std::fs::write(&config_path, config).unwrap();
    let bin = std::env::var("OOBFENCE_BIN").unwrap_or_else(|_| "target/release/oobfence".into());
    // The same daemon watching no node: what the growth per node is measured above.
    let empty = {
        let empty_listen = format!("127.0.0.1:{}", free_port());
        let empty_config = std::fs::read_to_string(&config_path)
            .unwrap()
            .replace(
                &format!("node_selector = \"{}={group}\"", support::k8s::TEST_LABEL),
                &format!(
                    "node_selector = \"{}={group}-none\"",
                    support::k8s::TEST_LABEL
                ),
            )
            .replace(&listen, &empty_listen)
            .replace("journal.jsonl", "empty-journal.jsonl")
            .replace(&format!("{group}-guards"), &format!("{group}-none-guards"));
        let path = dir.path().join("empty.toml");
        std::fs::write(&path, empty_config).unwrap();
        empty_daemon(&bin, &path, &empty_listen).await
    };
    let mut daemon = tokio::process::Command::new(&bin)
        // As the systemd unit runs it.
        .env("MALLOC_ARENA_MAX", "2")
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
    figure(
        "idle RSS of the same daemon watching no node",
        empty.0 / 1024,
        "MiB",
    );
    figure(
        "idle RSS per node watched, above that",
        format!("{:.1}", (rss.saturating_sub(empty.0)) as f64 / nodes as f64),
        "KiB",
    );
    figure("idle RSS, highest while idle", rss_max / 1024, "MiB");
    figure("RSS peak since start", hwm / 1024, "MiB");
    figure(
        "idle CPU",
        format!("{:.2}", (cpu_after - cpu_before) / minutes),
        "s/min",
    );
    figure(
        "idle CPU per 1,000 nodes watched, above a daemon watching none",
        format!(
            "{:.3}",
            ((cpu_after - cpu_before) / minutes - empty.1) * 1000.0 / nodes as f64
        ),
        "s/min",
    );
    let idle_reads = farm.requests().await - reads_before;
    figure("power reads while idle", idle_reads, "");
    figure("/metrics size", metrics.len() / 1024, "KiB");
    figure("/metrics series", series, "");

    // Healthy nodes whose kubelets renew are read once at start and then every 10 minutes:
    // a read while idle is a bug, whatever the figures say.
    let mut broken = Vec::new();
    if idle_reads > 0 {
        broken.push(format!(
            "{idle_reads} power reads of healthy nodes while idle (expected none)"
        ));
    }

    let storm = storm::Storm {
        client: &client,
        group: &group,
        names: &names,
        storm_nodes,
        decoys,
        listen: &listen,
        pid,
        journal: dir.path().join("journal.jsonl"),
    };
    broken.extend(storm.run(&mut farm, &silenced).await);

    kubelets.abort();
    let _ = daemon.kill().await;
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
    if !broken.is_empty() {
        for why in &broken {
            eprintln!("bench: FAILED: {why}");
        }
        eprintln!(
            "bench: the daemon's log: {}",
            dir.keep().join("oobfence.log").display()
        );
        std::process::exit(1);
    }
}

/// Resident memory (KiB) and CPU (s/min) of the daemon watching no node, after its start,
/// over [`EMPTY_IDLE`].
async fn empty_daemon(bin: &str, config: &std::path::Path, listen: &str) -> (u64, f64) {
    let mut daemon = tokio::process::Command::new(bin)
        .env("MALLOC_ARENA_MAX", "2")
        .args(["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start oobfence");
    let pid = daemon.id().unwrap();
    support::k8s::wait_ready(listen, Duration::from_secs(60)).await;
    let (_, _, cpu_before) = usage(pid);
    tokio::time::sleep(EMPTY_IDLE).await;
    let (rss, _, cpu_after) = usage(pid);
    let _ = daemon.kill().await;
    (
        rss,
        (cpu_after - cpu_before) / (EMPTY_IDLE.as_secs_f64() / 60.0),
    )
}

/// The sum of every series of a metric family in a /metrics text.
fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `a - b` in seconds, negative when `a` is earlier.
fn signed_secs(a: Instant, b: Instant) -> f64 {
    a.saturating_duration_since(b).as_secs_f64() - b.saturating_duration_since(a).as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
