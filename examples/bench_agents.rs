//! What a fence agent costs as oobfence's power source, run by `bench/agent-sources`: one read
//! through oobfence's fence-agent source against the same agent run by hand (Debian's
//! `fence_ipmilan` against `ipmi_sim`), and 1,000 plugs of one endpoint read at once through
//! one `list-status` call against one `status` process per plug (an agent built on
//! ClusterLabs' own fencing library, its plugs in a file). Prints `figure<TAB>value<TAB>unit`
//! lines.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use oobfence::config::{BmcEntry, Config};
use oobfence::power::fence_agent::{FenceAgentSource, Lister, agent_for};
use oobfence::power::{PowerSource, PowerState};
use support::ipmi_sim::{self, IpmiSim};

fn figure(name: &str, value: impl std::fmt::Display, unit: &str) {
    println!("{name}\t{value}\t{unit}");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn parse_entry(text: &str) -> BmcEntry {
    Config::parse(
        &format!("datacenter = \"bench\"\n{text}"),
        Path::new("bench.toml"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .bmc
    .remove(0)
}

/// An agent on ClusterLabs' fencing library (as every agent in fence-agents is) whose device
/// is a file of plugs and their states.
const PLUGS_AGENT: &str = r#"#!/usr/bin/python3
import sys, json, atexit, os
sys.path.append("/usr/share/fence")
from fencing import *

STATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugs.json")

def states():
    with open(STATE) as f:
        return json.load(f)

def get_power_status(conn, options):
    return states().get(options["--plug"], "unknown")

def set_power_status(conn, options):
    pass

def get_list(conn, options):
    return {p: ("", s) for p, s in states().items()}

def main():
    device_opt = ["port", "no_password", "no_login"]
    atexit.register(atexit_handler)
    options = check_input(device_opt, process_input(device_opt))
    show_docs(options, {"shortdesc": "A bench device", "longdesc": "plugs from a file", "vendorurl": ""})
    sys.exit(fence_action(None, options, set_power_status, get_power_status, get_list))

main()
"#;

async fn one_read(dir: &Path, reads: usize) {
    let sim = IpmiSim::start();
    let pw = dir.join("ipmi-password");
    std::fs::write(&pw, format!("{}\n", ipmi_sim::PASSWORD)).unwrap();
    let e = parse_entry(&format!(
        "[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"fence_ipmilan\"\nusername = \"{}\"\npassword_file = \"{}\"\ntimeout = \"30s\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\", lanplus = \"1\", cipher = \"3\", privlvl = \"administrator\" }}\n",
        ipmi_sim::USERNAME,
        pw.display(),
        sim.port()
    ));
    let src = FenceAgentSource::new(&e, "n1").unwrap();
    assert_eq!(
        src.read().await,
        PowerState::On,
        "the source reads the simulator"
    );
    let agent = e.fence_agent.as_ref().unwrap().agent.clone();
    let by_hand = || {
        std::process::Command::new(&agent)
            .args(["--ip", "127.0.0.1", "--ipport", &sim.port().to_string()])
            .args(["--lanplus", "--cipher", "3", "--privlvl", "administrator"])
            .args([
                "--username",
                ipmi_sim::USERNAME,
                "--password",
                ipmi_sim::PASSWORD,
            ])
            .args(["--action", "status"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
    };
    let (mut through, mut hand) = (Vec::new(), Vec::new());
    // Interleaved, so that both see the same machine.
    for _ in 0..reads {
        let t = Instant::now();
        assert_eq!(src.read().await, PowerState::On);
        through.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        assert_eq!(by_hand().code(), Some(0));
        hand.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (through, hand) = (median(through), median(hand));
    figure(
        "fence_ipmilan: one status read by hand (the agent's command line), median",
        format!("{hand:.1}"),
        "ms",
    );
    figure(
        "fence_ipmilan: one status read through oobfence's fence-agent source, median",
        format!("{through:.1}"),
        "ms",
    );
    figure(
        "fence_ipmilan: what the source adds (stdin, process group, capture)",
        format!("{:+.1}", through - hand),
        "ms",
    );
}

async fn many_plugs(dir: &Path, plugs: usize) {
    let agent = dir.join("fence_bench_plugs");
    std::fs::write(&agent, PLUGS_AGENT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let states: serde_json::Map<String, serde_json::Value> = (0..plugs)
        .map(|i| {
            let s = if i.is_multiple_of(10) { "off" } else { "on" };
            (format!("vm-n{i}"), serde_json::Value::from(s))
        })
        .collect();
    std::fs::write(
        dir.join("plugs.json"),
        serde_json::to_string(&states).unwrap(),
    )
    .unwrap();
    let e = parse_entry(&format!(
        "[[bmc]]\nnodes = [\"n*\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"{}\"\nunlisted_agent_off_means = \"no power and no saved state\"\nplug = \"vm-{{node}}\"\ntimeout = \"120s\"\n",
        agent.display()
    ));
    let want = |i: usize| {
        if i.is_multiple_of(10) {
            PowerState::Off
        } else {
            PowerState::On
        }
    };

    let lister = Arc::new(Lister::new(agent_for(&e, "n0").unwrap()));
    let batched: Vec<FenceAgentSource> = (0..plugs)
        .map(|i| FenceAgentSource::with_lister(&e, &format!("n{i}"), Some(lister.clone())).unwrap())
        .collect();
    let t = Instant::now();
    let states = futures::future::join_all(batched.iter().map(|s| s.read())).await;
    let batched_wall = t.elapsed();
    for (i, s) in states.iter().enumerate() {
        assert_eq!(*s, want(i), "plug {i} through list-status");
    }

    let single: Vec<FenceAgentSource> = (0..plugs)
        .map(|i| FenceAgentSource::new(&e, &format!("n{i}")).unwrap())
        .collect();
    // One process per plug, as many at once as the daemon's read slots allow by default.
    let slots = Arc::new(tokio::sync::Semaphore::new(16));
    let t = Instant::now();
    let states = futures::future::join_all(single.iter().map(|s| {
        let slots = slots.clone();
        async move {
            let _slot = slots.acquire().await;
            s.read().await
        }
    }))
    .await;
    let single_wall = t.elapsed();
    for (i, s) in states.iter().enumerate() {
        assert_eq!(*s, want(i), "plug {i} through status");
    }
    figure(
        &format!("{plugs} plugs read at once through list-status: wall"),
        format!("{:.2}", batched_wall.as_secs_f64()),
        "s",
    );
    figure(
        &format!("{plugs} plugs read at once through list-status: agent processes"),
        lister.calls(),
        "",
    );
    figure(
        &format!("{plugs} plugs, one status process each (16 at a time): wall"),
        format!("{:.2}", single_wall.as_secs_f64()),
        "s",
    );
    figure(
        &format!("{plugs} plugs, one status process each: agent processes"),
        plugs,
        "",
    );
    figure(
        "list-status against a process per plug, wall",
        format!(
            "{:.0}×",
            single_wall.as_secs_f64() / batched_wall.as_secs_f64().max(1e-9)
        ),
        "less",
    );
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let reads = env_usize("BENCH_AGENT_READS", 20);
    let plugs = env_usize("BENCH_PLUGS", 1000);
    one_read(dir.path(), reads).await;
    many_plugs(dir.path(), plugs).await;
}
