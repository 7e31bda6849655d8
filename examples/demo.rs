//! The built-in demo datacenter, run by `scripts/demo`.
//!
//! Three Nodes (no kubelets: Node objects and Leases kept alive here, renewed every 5 s on a
//! 20 s Lease) on a real kube-apiserver and kube-controller-manager, three BMCs in the
//! sushy-tools Redfish emulator, two EC2 instances in moto, and the real `oobfence run` daemon
//! with the example config's defaults. One machine loses power; the demo shows, as it
//! happens, its Lease going stale, oobfence reading its BMC ahead of NotReady, proving it off
//! while the node still shows Ready, the out-of-service taint and the node's pod force-deleted
//! at once (release at attestation), then prints the timeline with each step's time from the
//! power cut. An operator pauses oobfence, the machine powers on with a new boot, the untaint
//! waits for `oobfence resume`. A reload turns the release off and a second machine loses
//! power: the taint waits for NotReady and the pod for the pod garbage collector. A reload
//! turns opt-in actuation on for a third machine, and its kernel hangs: its kubelet goes
//! silent while the machine stays On; oobfence powers it off after `[actuation] after`, fences
//! it, powers it on and lifts the fence on its new boot. Then an EC2 instance is stopped and
//! another terminated. Last, a power cord is pulled: the machine's BMC goes dark with it, and
//! oobfence fences it through the Redfish PDU outlet that feeds it (level 2), switched On but
//! drawing 0 W.
//!
//! Needs OOBFENCE_TEST_KUBECONFIG (scripts/demo starts the cluster) and the emulator venv
//! (scripts/install-deps).

#[path = "demo/cord_pulled.rs"]
mod cord_pulled;
#[path = "demo/hung.rs"]
mod hung;
#[path = "demo/power_cut.rs"]
mod power_cut;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use power_cut::{PowerCut, db_pod, follow};
use support::gate::Gate;
use support::k8s::{FakeNode, KubeletIdentity, free_port};
use support::redfish_pdu::RedfishPdu;
use support::sushy::SushyEmulator;
use tokio::sync::Mutex;

/// Three bare-metal nodes with Redfish BMCs, two EC2 instances, and a bare-metal node fed by
/// a Redfish PDU outlet besides its BMC.
const NODES: [&str; 6] = [
    "rack1-01",
    "rack1-02",
    "rack1-03",
    "ip-10-0-1-17",
    "ip-10-0-1-18",
    "rack1-04",
];
const BMC_NODES: usize = 3;
const VICTIM: usize = 1;
/// Cut with release_at_attestation off.
const SECOND_VICTIM: usize = 2;
/// Hangs (kubelet silent, machine On) once opt-in actuation is turned on by a reload.
const HUNG: usize = 0;
const EC2_STOPPED: usize = 3;
const EC2_TERMINATED: usize = 4;
/// Its power cord is pulled: its BMC goes dark with it, its PDU outlet (level 2) draws 0 W.
const CORD: usize = 5;
/// The Redfish system of [`CORD`]'s machine.
const CORD_SYSTEM: usize = BMC_NODES;

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

    clock.say("starting the Redfish emulator (sushy-tools) with 4 BMCs on 127.0.0.1");
    let emu = SushyEmulator::start(BMC_NODES + 1).await;
    clock.say("starting a Redfish rack PDU (the project's test server) on 127.0.0.1, outlet A4 feeding rack1-04");
    let pdu = RedfishPdu::start(&[(cord_pulled::OUTLET, "On", Some(212.0))]);
    // rack1-04's BMC, reached through a relay the pulled cord closes.
    let cord_bmc = Gate::start(emu.port(), true).await;
    clock.say("starting the EC2 emulator (moto) with 2 instances, one with a data volume");
    let moto = support::moto::MotoServer::start().await;
    let ec2 = moto.client();
    let instances = support::moto::run_instances(&ec2, 2).await;
    let data_volume = support::moto::attach_data_volume(&ec2, &instances[0]).await;

    // Leftovers from an interrupted run would confuse the story.
    for name in NODES {
        let n = FakeNode {
            client: client.clone(),
            name: name.to_string(),
            identity: KubeletIdentity::default(),
        };
        if n.try_get().await.is_some() {
            n.delete().await;
            support::k8s::wait_for("old demo node gone", Duration::from_secs(20), || async {
                n.try_get().await.is_none().then_some(())
            })
            .await;
        }
    }
    // Each stand-in kubelet reports its machine's identity, as a real one does: the Redfish
    // system's UUID, the EC2 instance's private IP and DNS name. oobfence checks every read
    // against it.
    let mut identities: Vec<KubeletIdentity> = (0..BMC_NODES)
        .map(|i| KubeletIdentity::uuid(&emu.uuid(i)))
        .collect();
    for instance in &instances {
        identities.push(support::moto::kubelet_of(&ec2, instance).await);
    }
    identities.push(KubeletIdentity::uuid(&emu.uuid(CORD_SYSTEM)));
    let mut nodes = Vec::new();
    for (name, identity) in NODES.iter().zip(&identities) {
        nodes.push(FakeNode::create_as(&client, name, &group, "boot-1", identity.clone()).await);
    }
    for (node, instance) in [
        (EC2_STOPPED, &instances[0]),
        (EC2_TERMINATED, &instances[1]),
    ] {
        nodes[node]
            .nodes()
            .patch(
                NODES[node],
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({
                    "spec": {"providerID": format!("aws:///us-east-1a/{instance}")}
                })),
            )
            .await
            .unwrap();
    }
    // The CSI driver's record that the terminated instance's node has a volume attached.
    let va_name = format!("csi-{}", NODES[EC2_TERMINATED]);
    let vas: kube::Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
        kube::Api::all(client.clone());
    let _ = vas.delete(&va_name, &Default::default()).await;
    vas.create(
        &Default::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": va_name},
            "spec": {
                "attacher": "ebs.csi.aws.com",
                "nodeName": NODES[EC2_TERMINATED],
                "source": {"persistentVolumeName": "pv-demo"}
            }
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    // A StatefulSet's replica on each of rack1-02 and rack1-03, mounting its claim: what
    // waits for the volume when the machine dies.
    for i in [VICTIM, SECOND_VICTIM] {
        let pod = db_pod(i);
        support::k8s::force_delete_pod(&client, &pod).await;
        support::k8s::bound_pod(&client, NODES[i], &pod, support::k8s::with_claim).await;
    }
    clock.say(
        "registered Nodes rack1-01..04 and ip-10-0-1-17/18 (EC2 providerIDs), Ready, each with a Lease; pods db-1 on rack1-02 and db-2 on rack1-03, each mounting its claim",
    );

    // The stand-in kubelets: renew Leases and post Ready for every node still "alive".
    let alive: Arc<Mutex<HashSet<usize>>> = Arc::new(Mutex::new((0..NODES.len()).collect()));
    let boots: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec!["boot-1".into(); NODES.len()]));
    let kubelets = {
        let alive = alive.clone();
        let boots = boots.clone();
        let client = client.clone();
        let identities = identities.clone();
        tokio::spawn(async move {
            loop {
                let now_alive: Vec<usize> = alive.lock().await.iter().copied().collect();
                for i in now_alive {
                    let n = FakeNode {
                        client: client.clone(),
                        name: NODES[i].to_string(),
                        identity: identities[i].clone(),
                    };
                    let boot = boots.lock().await[i].clone();
                    n.renew_lease().await;
                    n.heartbeat(&boot).await;
                }
                // A kubelet renews every quarter of its Lease's duration.
                tokio::time::sleep(Duration::from_secs(
                    support::k8s::LEASE_DURATION_SECONDS as u64 / 4,
                ))
                .await;
            }
        })
    };

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
# The example config's defaults: not_ready_grace 60s, two Off reads 5s apart,
# pre-attestation after 2.5 missed renewals.
[server]
listen = "{listen}"
[journal]
path = "{}"
[pause]
file = "{}"
"#,
        support::k8s::kubeconfig_path().display(),
        support::k8s::TEST_LABEL,
        dir.path().join("journal.jsonl").display(),
        dir.path().join("demo.paused").display(),
    );
    config.push_str(&format!(
        "\n[aws]\nregion = \"us-east-1\"\nnodes = [\"ip-10-*\"]\nendpoint_url = \"{}\"\n",
        moto.endpoint()
    ));
    for (i, name) in NODES[..BMC_NODES].iter().enumerate() {
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
    let pdu_pw = dir.path().join("pdu.password");
    std::fs::write(&pdu_pw, format!("{}\n", support::redfish_pdu::PASSWORD)).unwrap();
    config.push_str(&cord_pulled::config_entries(
        NODES[CORD],
        &cord_bmc,
        &emu.system_path(CORD_SYSTEM),
        &emu.cert_pem_path(),
        &pdu,
        &pw,
        &pdu_pw,
    ));
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
    support::k8s::wait_ready(&listen, Duration::from_secs(30)).await;
    clock.say("oobfence is watching 6 nodes");

    let victim = &nodes[VICTIM];
    let cut = PowerCut {
        clock: &clock,
        http: &http,
        listen: &listen,
        client: &client,
        emu: &emu,
        alive: &alive,
    };
    let released = cut
        .run(victim, VICTIM, "release_at_attestation = true, the default")
        .await;
    let mut seen = String::from(if released {
        "fenced released "
    } else {
        "fenced "
    });

    println!("\n$ oobfence why --config demo.toml {}", victim.name);
    let why = std::process::Command::new(&bin)
        .args(["why", "--config"])
        .arg(&config_path)
        .arg(&victim.name)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&why.stdout));

    println!("\n$ oobfence pause --config demo.toml --reason \"demo: checking rack 1 first\"");
    let paused = std::process::Command::new(&bin)
        .args(["pause", "--config"])
        .arg(&config_path)
        .args(["--reason", "demo: checking rack 1 first"])
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&paused.stdout));
    clock.say(&format!(
        "=== {}: power restored, machine boots (bootID boot-2) ===",
        victim.name
    ));
    emu.set_power(VICTIM, true).await;
    emu.wait_power(VICTIM, "On", Duration::from_secs(30)).await;
    boots.lock().await[VICTIM] = "boot-2".into();
    alive.lock().await.insert(VICTIM);
    follow(
        &clock,
        &http,
        &listen,
        &client,
        &victim.name,
        "paused",
        Duration::from_secs(60),
        None,
    )
    .await
    .expect("the pause did not hold the untaint: see the oobfence log");
    clock.say(&format!(
        "{}: Ready, On, new boot — but the untaint is HELD: writes are paused",
        victim.name
    ));
    println!("\n$ oobfence resume --config demo.toml");
    let resumed = std::process::Command::new(&bin)
        .args(["resume", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&resumed.stdout));
    let back = follow(
        &clock,
        &http,
        &listen,
        &client,
        &victim.name,
        "node-ready",
        Duration::from_secs(60),
        None,
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

    // The same power cut with release_at_attestation off, applied by a reload.
    println!(
        "\n$ sed -i 's/^\\[policy\\]$/&\\nrelease_at_attestation = false/' demo.toml && systemctl reload oobfence@demo"
    );
    std::fs::write(
        &config_path,
        config.replace("[policy]\n", "[policy]\nrelease_at_attestation = false\n"),
    )
    .unwrap();
    reload(&daemon, &log_path).await;
    clock.say("config reloaded: release_at_attestation = false");
    let second = &nodes[SECOND_VICTIM];
    let released_off = cut
        .run(second, SECOND_VICTIM, "release_at_attestation = false")
        .await;
    if !released_off {
        seen.push_str(" fenced-at-not-ready");
    }
    // Back with a new boot, so that the EC2 part counts one silent Lease less.
    emu.set_power(SECOND_VICTIM, true).await;
    emu.wait_power(SECOND_VICTIM, "On", Duration::from_secs(30))
        .await;
    boots.lock().await[SECOND_VICTIM] = "boot-2".into();
    alive.lock().await.insert(SECOND_VICTIM);
    follow(
        &clock,
        &http,
        &listen,
        &client,
        &second.name,
        "node-ready",
        Duration::from_secs(60),
        None,
    )
    .await
    .expect("rack1-03's fence was not lifted within a minute: see the oobfence log");
    clock.say(&format!("{}: UNFENCED", second.name));

    // Opt-in actuation, turned on by a reload for rack1-01's BMC: a hung node.
    println!(
        "\n$ cat >> demo.toml  # [actuation] enabled = true, after = \"2m\"; actuate = true on rack1-01's entry; systemctl reload oobfence@demo"
    );
    let after = Duration::from_secs(120);
    let actuated = format!(
        "{}\n[actuation]\nenabled = true\nafter = \"2m\"\n",
        config.replace(
            &format!("nodes = [\"{}\"]\n", NODES[HUNG]),
            &format!("nodes = [\"{}\"]\nactuate = true\n", NODES[HUNG]),
        )
    );
    std::fs::write(&config_path, &actuated).unwrap();
    reload(&daemon, &log_path).await;
    clock.say("config reloaded: opt-in actuation on for rack1-01 (release_at_attestation back to its default)");
    let hang = hung::Hang {
        clock: &clock,
        http: &http,
        listen: &listen,
        emu: &emu,
        alive: &alive,
        boots: &boots,
    };
    if hang.run(&nodes[HUNG], HUNG, after).await {
        seen.push_str(" hung");
    }

    clock.say(&format!(
        "=== EC2: {} stopped (instance {}), {} terminated (instance {}) ===",
        NODES[EC2_STOPPED], instances[0], NODES[EC2_TERMINATED], instances[1]
    ));
    ec2.stop_instances()
        .instance_ids(&instances[0])
        .send()
        .await
        .unwrap();
    ec2.terminate_instances()
        .instance_ids(&instances[1])
        .send()
        .await
        .unwrap();
    alive.lock().await.remove(&EC2_STOPPED);
    alive.lock().await.remove(&EC2_TERMINATED);
    let stopped = follow(
        &clock,
        &http,
        &listen,
        &client,
        NODES[EC2_STOPPED],
        "fenced-awaiting-recovery",
        Duration::from_secs(120),
        None,
    )
    .await
    .expect("the stopped instance's node was not fenced within 2 minutes");
    clock.say(&format!(
        "{}: FENCED (out-of-service taint: {}); EBS volume {data_volume} recorded as evidence",
        NODES[EC2_STOPPED],
        FakeNode::has_oos_taint(&stopped)
    ));
    let terminated = &nodes[EC2_TERMINATED];
    support::k8s::wait_for(
        "terminated node deleted",
        Duration::from_secs(60),
        || async { terminated.try_get().await.is_none().then_some(()) },
    )
    .await;
    let va_left = vas.get_opt(&va_name).await.unwrap().is_some();
    clock.say(&format!(
        "{}: Node DELETED (instance terminated); VolumeAttachment {va_name} {}",
        NODES[EC2_TERMINATED],
        if va_left { "STILL PRESENT" } else { "deleted" }
    ));
    if !va_left && FakeNode::has_oos_taint(&stopped) {
        seen.push_str(" ec2");
    }

    let cord = cord_pulled::CordPulled {
        clock: &clock,
        http: &http,
        listen: &listen,
        client: &client,
        alive: &alive,
        bin: &bin,
        config_path: &config_path,
    };
    if cord.run(&nodes[CORD], CORD, cord_bmc, &pdu).await {
        seen.push_str(" cord");
    }

    let metrics = support::k8s::scrape(&listen).await;
    println!("\nmetrics (excerpt):");
    for l in metrics.lines().filter(|l| {
        l.starts_with("oobfence_actions_total")
            || l.starts_with("oobfence_power_reads_total")
            || l.starts_with("oobfence_notready_to_fence_seconds_count")
            || l.starts_with("oobfence_power_cut_to_fence_seconds_count")
            || l.starts_with("oobfence_fence_to_recovery_seconds_count")
            || l.starts_with("oobfence_power_actions_total")
            || l.starts_with("oobfence_notready_to_power_off_seconds_sum")
            || l.starts_with("oobfence_out_of_service_taint_age_seconds{")
            || l.starts_with("oobfence_ec2_describe_instances_calls_total")
            || l.starts_with("oobfence_identity_nodes{") && !l.ends_with(" 0")
            || l.starts_with("oobfence_node_state{") && l.ends_with(" 1")
    }) {
        println!("  {l}");
    }
    kubelets.abort();
    let _ = kubelets.await;
    let _ = daemon.kill().await;
    for n in &nodes {
        n.delete().await;
    }
    if still_oos || seen != "fenced released unfenced fenced-at-not-ready hung ec2 cord" {
        eprintln!("demo did not complete: {seen}");
        std::process::exit(1);
    }
    println!(
        "\ndemo complete: a bare-metal node fenced on proven power-off, its pod released at once, and unfenced after a new boot; \
         with release_at_attestation off, another fenced at NotReady; \
         a hung node powered off, fenced, powered on and unfenced (opt-in actuation); \
         a stopped EC2 instance's node fenced; a terminated one's Node and VolumeAttachment deleted; \
         a node whose cord was pulled (its BMC dark with it) fenced through its PDU outlet at level 2"
    );
}

/// `systemctl reload`: SIGHUP to the daemon, then waits for its log to say it reloaded.
async fn reload(daemon: &tokio::process::Child, log_path: &std::path::Path) {
    let reloads = || {
        std::fs::read_to_string(log_path)
            .unwrap_or_default()
            .matches(" reloaded ")
            .count()
    };
    let before = reloads();
    std::process::Command::new("kill")
        .args(["-HUP", &daemon.id().expect("the daemon runs").to_string()])
        .status()
        .expect("send SIGHUP");
    support::k8s::wait_for("the reload", Duration::from_secs(30), || async {
        (reloads() > before).then_some(())
    })
    .await;
}
