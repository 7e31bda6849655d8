//! The built-in demo datacenter, run by `scripts/demo`.
//!
//! Three Nodes (no kubelets: Node objects and Leases kept alive here) on a real kube-apiserver
//! and kube-controller-manager, three BMCs in the sushy-tools Redfish emulator, and the real
//! `oobfence run` daemon. One machine loses power; the demo shows, as it happens, the node
//! going NotReady, oobfence reading its BMC, the out-of-service taint, then the machine
//! powering on with a new boot and the taint coming off.
//!
//! Needs OOBFENCE_TEST_KUBECONFIG (scripts/demo starts the cluster) and the emulator venv
//! (scripts/install-deps).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::k8s::{FakeNode, free_port, taints};
use support::sushy::SushyEmulator;
use tokio::sync::Mutex;

const NODES: [&str; 3] = ["rack1-01", "rack1-02", "rack1-03"];
const VICTIM: usize = 1;

struct Clock(Instant);

impl Clock {
    fn say(&self, what: &str) {
        println!("[+{:6.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

#[tokio::main]
async fn main() {
    let clock = Clock(Instant::now());
    let client = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let group = support::k8s::unique("demo");

    clock.say("starting the Redfish emulator (sushy-tools) with 3 BMCs on 127.0.0.1");
    let emu = SushyEmulator::start(NODES.len()).await;

    // Leftovers from an interrupted run would confuse the story.
    for name in NODES {
        let n = FakeNode {
            client: client.clone(),
            name: name.to_string(),
        };
        if n.try_get().await.is_some() {
            n.delete().await;
            support::k8s::wait_for("old demo node gone", Duration::from_secs(20), || async {
                n.try_get().await.is_none().then_some(())
            })
            .await;
        }
    }
    let mut nodes = Vec::new();
    for name in NODES {
        nodes.push(FakeNode::create(&client, name, &group, "boot-1").await);
    }
    clock.say("registered Nodes rack1-01..03 (Ready, bootID boot-1), each with a Lease");

    // The stand-in kubelets: renew Leases and post Ready for every node still "alive".
    let alive: Arc<Mutex<HashSet<usize>>> = Arc::new(Mutex::new((0..NODES.len()).collect()));
    let boots: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec!["boot-1".into(); NODES.len()]));
    {
        let alive = alive.clone();
        let boots = boots.clone();
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                let now_alive: Vec<usize> = alive.lock().await.iter().copied().collect();
                for i in now_alive {
                    let n = FakeNode {
                        client: client.clone(),
                        name: NODES[i].to_string(),
                    };
                    let boot = boots.lock().await[i].clone();
                    n.renew_lease().await;
                    n.heartbeat(&boot).await;
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        });
    }

    // The datacenter's config, as an operator would write it.
    let pw = dir.path().join("rack1.password");
    std::fs::write(&pw, "password\n").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut config = format!(
        r#"datacenter = "demo"
[kubernetes]
kubeconfig = "{}"
node_selector = "{}={group}"
[policy]
not_ready_grace = "10s"
confirm_reads = 2
confirm_interval = "5s"
[server]
listen = "{listen}"
"#,
        support::k8s::kubeconfig_path().display(),
        support::k8s::TEST_LABEL,
    );
    for (i, name) in NODES.iter().enumerate() {
        config.push_str(&format!(
            r#"
[[bmc]]
nodes = ["{name}"]
protocol = "redfish"
address = "{}"
system = "{}"
username = "admin"
password_file = "{}"
ca_file = "{}"
"#,
            emu.base_url(),
            emu.system_path(i),
            pw.display(),
            emu.cert_pem_path().display()
        ));
    }
    let config_path = dir.path().join("demo.toml");
    std::fs::write(&config_path, &config).unwrap();
    let bin = std::env::var("OOBFENCE_BIN").unwrap_or_else(|_| "target/debug/oobfence".into());
    let log_path = dir.path().join("oobfence.log");
    clock.say(&format!(
        "starting `oobfence run --config demo.toml` (log: {})",
        log_path.display()
    ));
    let mut daemon = tokio::process::Command::new(&bin)
        .args(["run", "--config"])
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start oobfence (build it first: cargo build)");
    let http = reqwest::Client::new();
    support::k8s::wait_for("oobfence ready", Duration::from_secs(30), || async {
        let r = http
            .get(format!("http://{listen}/readyz"))
            .send()
            .await
            .ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    clock.say("oobfence is watching 3 nodes");

    let victim = &nodes[VICTIM];
    clock.say(&format!(
        "=== {}: power cut (Redfish ForceOff) ===",
        victim.name
    ));
    emu.set_power(VICTIM, false).await;
    alive.lock().await.remove(&VICTIM);
    clock.say(&format!(
        "{}: kubelet silent: no more Lease renewals or status updates",
        victim.name
    ));

    let mut seen = String::new();
    let fenced = follow(
        &http,
        &listen,
        &client,
        &victim.name,
        "fenced-awaiting-recovery",
        Duration::from_secs(120),
    )
    .await
    .expect("the node was not fenced within 2 minutes: see the oobfence log");
    let t: Vec<String> = taints(&fenced)
        .iter()
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.clone().unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    clock.say(&format!(
        "{}: FENCED — taints now: {}",
        victim.name,
        t.join(", ")
    ));
    seen.push_str("fenced ");

    println!("\n$ oobfence why --config demo.toml {}", victim.name);
    let why = std::process::Command::new(&bin)
        .args(["why", "--config"])
        .arg(&config_path)
        .arg(&victim.name)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&why.stdout));
    println!();

    clock.say(&format!(
        "=== {}: power restored, machine boots (bootID boot-2) ===",
        victim.name
    ));
    emu.set_power(VICTIM, true).await;
    emu.wait_power(VICTIM, "On", Duration::from_secs(30)).await;
    boots.lock().await[VICTIM] = "boot-2".into();
    alive.lock().await.insert(VICTIM);
    let back = follow(
        &http,
        &listen,
        &client,
        &victim.name,
        "node-ready",
        Duration::from_secs(60),
    )
    .await
    .expect("the fence was not lifted within a minute: see the oobfence log");
    let still_oos = FakeNode::has_oos_taint(&back);
    clock.say(&format!(
        "{}: UNFENCED — out-of-service taint {}",
        victim.name,
        if still_oos {
            "STILL PRESENT"
        } else {
            "removed"
        }
    ));
    seen.push_str("unfenced");

    let metrics = http
        .get(format!("http://{listen}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    println!("\nmetrics (excerpt):");
    for l in metrics.lines().filter(|l| {
        l.starts_with("oobfence_actions_total") || l.starts_with("oobfence_power_reads_total")
    }) {
        println!("  {l}");
    }
    let _ = daemon.kill().await;
    for n in &nodes {
        n.delete().await;
    }
    if still_oos || seen != "fenced unfenced" {
        eprintln!("demo did not complete: {seen}");
        std::process::exit(1);
    }
    println!("\ndemo complete: node fenced on proven power-off, unfenced after a new boot");
}

/// Prints each change in oobfence's view of `name` (rule, or a new power read) until its
/// rule is `until`; returns the Node as it is then.
async fn follow(
    http: &reqwest::Client,
    listen: &str,
    client: &kube::Client,
    name: &str,
    until: &str,
    limit: Duration,
) -> Option<k8s_openapi::api::core::v1::Node> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        let report = async {
            let r = http
                .get(format!("http://{listen}/nodes/{name}"))
                .send()
                .await
                .ok()?;
            r.json::<serde_json::Value>().await.ok()
        };
        if let Some(v) = report.await {
            let reads = v["reads"].as_array().cloned().unwrap_or_default();
            let key = format!("{}/{}", v["rule"], reads.len());
            if key != last {
                last = key;
                println!(
                    "           {name}: Ready={} state={} rule={}: {}",
                    v["ready"].as_str().unwrap_or("?"),
                    v["state"].as_str().unwrap_or("?"),
                    v["rule"].as_str().unwrap_or("?"),
                    v["reason"].as_str().unwrap_or("")
                );
                if let Some(r) = reads.last() {
                    println!(
                        "           {name}:   newest power read: {} ({:.3}s)",
                        r["value"].as_str().unwrap_or("?"),
                        r["latency_seconds"].as_f64().unwrap_or(0.0)
                    );
                }
            }
            if v["rule"] == until {
                let api: kube::Api<k8s_openapi::api::core::v1::Node> =
                    kube::Api::all(client.clone());
                return api.get(name).await.ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}
