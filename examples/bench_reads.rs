//! The read-cost benchmark, run by `bench/fence-agents`: what one power status read costs
//! oobfence against the ClusterLabs fence agents, on the same emulated BMCs on 127.0.0.1:
//! OpenIPMI's `ipmi_sim` (RMCP+, cipher suite 3) and sushy-tools (Redfish over HTTPS).
//!
//! Two views:
//! - **One process per read**, as Pacemaker and fence-agents-remediation run a fence agent:
//!   `oobfence probe` against `fence_ipmilan --lanplus -C 3 -o status` and
//!   `fence_redfish --ssl-insecure -o status`, interleaved, `BENCH_RUNS` (15) of each: wall
//!   time, and CPU and peak RSS as the kernel accounts the child (wait4); medians.
//! - **In the daemon**: the daemon's own read path (`read_once` on the source the config
//!   builds), process start-up excluded: wall time and CPU per read one at a time, and reads per
//!   second with 16 in flight (the default `max_concurrent_reads`).
//!
//! Prints one line per figure as `figure<TAB>value<TAB>unit`, for `bench/fence-agents` to
//! tabulate. `OOBFENCE_BIN` is the daemon to probe with; `BENCH_LINGER=SECONDS` keeps the
//! emulators up that long afterwards, to profile a probe against them by hand.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use oobfence::config::Config;
use oobfence::daemon::read_once;
use oobfence::power::{MappedSource, PowerSources};
use support::bench::{cpu_seconds, env_usize, figure, note};
use support::ipmi_sim::{self, IpmiSim};
use support::k8s::FakeNode;
use support::moto::{
    CountingProxy, MotoServer, REGION, ZONE, kubelet_of, provider_id, run_instances,
};
use support::sushy::{self, SushyEmulator};

const NODE: &str = "bench-node";

/// CPU seconds this process has used (user + system).
fn own_cpu() -> f64 {
    cpu_seconds("self")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A command line and what it adds to the environment.
struct Run {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl Run {
    fn new(argv: Vec<String>) -> Run {
        Run { argv, env: vec![] }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..]).envs(self.env.iter().cloned());
        c
    }

    /// The program's file name.
    fn name(&self) -> String {
        Path::new(&self.argv[0])
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string()
    }
}

impl std::fmt::Debug for Run {
    // The command line only: the benchmark's credentials are fake, but an environment is no
    // one's business in a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.argv)
    }
}

/// One process: (wall s, CPU s, peak RSS KiB), its CPU and peak RSS from the kernel's
/// accounting of that child (wait4), to the microsecond. Panics if it fails: a comparison
/// against a read that did not happen means nothing.
// The child is reaped by wait4, for its resource usage, not by Child::wait.
#[allow(clippy::zombie_processes)]
fn timed(cmd: &Run) -> (f64, f64, f64) {
    let started = Instant::now();
    let child = cmd
        .command()
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: wait4 writes only into the two out-parameters, both valid for the call; the
    // child is ours and not waited for elsewhere.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(waited, pid, "wait4 on {cmd:?}");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed (wait status {status})"
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        wall,
        secs(usage.ru_utime) + secs(usage.ru_stime),
        usage.ru_maxrss as f64,
    )
}

/// The whole-process comparison: `ours` and `agent` run alternately `runs` times each.
/// Returns the agent's median wall and CPU seconds.
fn compare(backend: &str, ours: &Run, agent: &Run, runs: usize) -> (f64, f64) {
    // One of each first: caches warm, and a command that cannot read fails here.
    let stdout = ours.command().output().unwrap();
    note(&format!(
        "{backend}: {}",
        String::from_utf8_lossy(&stdout.stdout)
            .lines()
            .next()
            .unwrap_or("")
    ));
    timed(agent);
    let (mut o, mut a) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        o.push(timed(ours));
        a.push(timed(agent));
    }
    let col = |v: &[(f64, f64, f64)], i: usize| {
        median(v.iter().map(|t| [t.0, t.1, t.2][i]).collect::<Vec<f64>>())
    };
    let agent_name = agent.name();
    for (i, what, unit, scale) in [
        (0, "wall", "ms", 1000.0),
        (1, "CPU", "ms", 1000.0),
        (2, "peak RSS", "MiB", 1.0 / 1024.0),
    ] {
        let (ours, theirs) = (col(&o, i) * scale, col(&a, i) * scale);
        figure(
            &format!("{backend}, one process: {what}, oobfence probe / {agent_name}"),
            format!(
                "{ours:.1} / {theirs:.1} ({:.1}×)",
                theirs / ours.max(f64::EPSILON)
            ),
            unit,
        );
    }
    (col(&a, 0), col(&a, 1))
}

/// The daemon's read path: `n` reads one at a time, then 16 at a time for `n` more.
/// `agent` is the fence agent's median (wall, CPU) per read, to compare with.
async fn in_daemon(backend: &str, config: &Path, n: usize, agent: (f64, f64)) {
    let cfg = Arc::new(Config::load(config).expect("the benchmark's config"));
    let sources = PowerSources::new(cfg, Default::default()).await;
    let MappedSource { source, deadline } = sources.for_node(NODE, None).expect("mapped");
    let first = read_once(&source, deadline).await;
    note(&format!("{backend}, in the daemon: {}", first.state));
    let (cpu0, t0) = (own_cpu(), Instant::now());
    for _ in 0..n {
        let r = read_once(&source, deadline).await;
        assert!(
            !matches!(r.state, oobfence::power::PowerState::Error { .. }),
            "{backend}: {}",
            r.state
        );
    }
    let (wall, cpu) = (
        t0.elapsed().as_secs_f64() / n as f64,
        (own_cpu() - cpu0) / n as f64,
    );
    figure(
        &format!("{backend}, in the daemon: wall per read, one at a time (× less than the agent)"),
        format!("{:.2} ({:.0}×)", wall * 1000.0, agent.0 / wall),
        "ms",
    );
    figure(
        &format!("{backend}, in the daemon: CPU per read (× less than the agent)"),
        format!("{:.2} ({:.0}×)", cpu * 1000.0, agent.1 / cpu.max(1e-6)),
        "ms",
    );
    let (cpu0, t0) = (own_cpu(), Instant::now());
    let reads = futures::stream::iter(0..n)
        .map(|_| read_once(&source, deadline))
        .buffer_unordered(16)
        .filter(|r| {
            std::future::ready(!matches!(
                r.state,
                oobfence::power::PowerState::Error { .. }
            ))
        })
        .count()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    figure(
        &format!("{backend}, in the daemon: reads per second, 16 in flight"),
        format!("{:.0}", reads as f64 / secs),
        "/s",
    );
    figure(
        &format!("{backend}, in the daemon: CPU per read, 16 in flight"),
        format!("{:.2}", (own_cpu() - cpu0) / n as f64 * 1000.0),
        "ms",
    );
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `oobfence probe` of `node` under `config`.
fn probe_run(bin: &str, config: &Path, node: &str) -> Run {
    Run::new(vec![
        bin.into(),
        "probe".into(),
        "--config".into(),
        config.display().to_string(),
        node.into(),
    ])
}

/// EC2 on moto, through a proxy that counts the calls: `oobfence probe` against
/// `fence_aws -o status` for one running instance (the probe reads the Node's providerID from
/// the API server first, as it must), then the daemon's batched path: `nodes` instances, half
/// of them stopped, read at once, `rounds` times.
async fn ec2(dir: &Path, bin: &str, runs: usize, nodes: usize, rounds: usize) {
    let python_path = std::env::var("BENCH_FENCE_AWS_PYTHONPATH").expect(
        "BENCH_FENCE_AWS_PYTHONPATH: a directory holding boto3 >= 1.31 for fence_aws (bench/fence-agents installs one)",
    );
    let moto = MotoServer::start().await;
    let proxy = CountingProxy::start(moto.port).await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, nodes as i32).await;
    assert_eq!(ids.len(), nodes, "RunInstances");
    ec2.stop_instances()
        .set_instance_ids(Some(ids[nodes / 2..].to_vec()))
        .send()
        .await
        .expect("StopInstances");

    // The probed instance's Node, with its providerID, on the test control plane.
    let client = support::k8s::client().await;
    let group = support::k8s::unique("bench-ec2");
    let name = format!("bench-ec2-{group}");
    let node = FakeNode::create_as(
        &client,
        &name,
        &group,
        "boot-1",
        kubelet_of(&ec2, &ids[0]).await,
    )
    .await;
    node.set_provider_id(&provider_id(ZONE, &ids[0])).await;
    let config = config_with(
        dir,
        "ec2",
        &format!(
            "[aws]\nregion = \"{REGION}\"\nnodes = [\"bench-ec2-*\"]\nendpoint_url = \"{}\"\n",
            proxy.endpoint()
        ),
    );

    // fence_aws through the same proxy. Its boto3 must honour AWS_ENDPOINT_URL (botocore
    // >= 1.31; Debian's does not, and would go to real AWS): checked before it runs at all.
    let agent_env: Vec<(String, String)> = [
        ("PYTHONPATH", python_path.as_str()),
        ("AWS_ENDPOINT_URL", &proxy.endpoint()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // The interpreter of fence_aws's shebang, not a virtualenv's on PATH.
    let check = Command::new("/usr/bin/python3")
        .args([
            "-c",
            &format!("import boto3; print(boto3.client('ec2', region_name='{REGION}', aws_access_key_id='testing', aws_secret_access_key='testing').meta.endpoint_url)"),
        ])
        .envs(agent_env.iter().cloned())
        .output()
        .expect("run python3");
    let endpoint = String::from_utf8_lossy(&check.stdout).trim().to_string();
    assert_eq!(
        endpoint,
        proxy.endpoint(),
        "fence_aws's boto3 (PYTHONPATH {python_path}) would not use the emulator: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let fence_aws = Run {
        argv: strings(&[
            "/usr/sbin/fence_aws",
            "--region",
            REGION,
            "--access-key",
            "testing",
            "--secret-key",
            "testing",
            "--plug",
            &ids[0],
            "--action",
            "status",
        ]),
        env: agent_env,
    };
    let probe = probe_run(bin, &config, &name);
    let calls = |run: &Run| {
        let before = proxy.describe_instances();
        timed(run);
        proxy.describe_instances() - before
    };
    figure(
        "EC2, one process: DescribeInstances calls per status read, oobfence probe / fence_aws",
        format!("{} / {}", calls(&probe), calls(&fence_aws)),
        "",
    );
    note(&format!("EC2: {runs} interleaved runs each"));
    let agent = compare("EC2", &probe, &fence_aws, runs);

    // The daemon's path: every instance read at once, as in a storm; the batcher folds them
    // into one DescribeInstances per 200 (and DescribeVolumes for the stopped ones' evidence).
    let cfg = Arc::new(Config::load(&config).expect("the benchmark's EC2 config"));
    let sources = PowerSources::new(cfg, Default::default()).await;
    let mapped: Vec<MappedSource> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            sources
                .for_node(&format!("bench-ec2-{i}"), Some(&provider_id(ZONE, id)))
                .expect("mapped")
        })
        .collect();
    let round =
        || futures::future::join_all(mapped.iter().map(|m| read_once(&m.source, m.deadline)));
    let first = round().await;
    let off = first
        .iter()
        .filter(|r| r.state == oobfence::power::PowerState::Off)
        .count();
    assert_eq!(off, nodes - nodes / 2, "stopped instances read Off");
    let (di, dv) = (proxy.describe_instances(), proxy.describe_volumes());
    let (cpu0, t0) = (own_cpu(), Instant::now());
    for _ in 0..rounds {
        for r in round().await {
            assert!(
                !matches!(r.state, oobfence::power::PowerState::Error { .. }),
                "EC2: {}",
                r.state
            );
        }
    }
    let (wall, cpu) = (
        t0.elapsed().as_secs_f64() / rounds as f64,
        (own_cpu() - cpu0) / (rounds * nodes) as f64,
    );
    figure(
        &format!("EC2, in the daemon: {nodes} nodes read at once, wall"),
        format!("{:.0}", wall * 1000.0),
        "ms",
    );
    figure(
        &format!(
            "EC2, in the daemon: {nodes} nodes read at once, DescribeInstances / DescribeVolumes calls"
        ),
        format!(
            "{} / {}",
            (proxy.describe_instances() - di) as f64 / rounds as f64,
            (proxy.describe_volumes() - dv) as f64 / rounds as f64
        ),
        "",
    );
    figure(
        "EC2, in the daemon: CPU per node read (× less than the agent)",
        format!("{:.2} ({:.0}×)", cpu * 1000.0, agent.1 / cpu.max(1e-6)),
        "ms",
    );
    figure(
        &format!(
            "EC2, fence_aws: {nodes} nodes read one process each, wall one after another / CPU"
        ),
        format!(
            "{:.0} / {:.0}",
            agent.0 * nodes as f64 * 1000.0,
            agent.1 * nodes as f64 * 1000.0
        ),
        "ms",
    );
    node.delete().await;
}

fn config_with(dir: &Path, stem: &str, entry: &str) -> PathBuf {
    let path = dir.join(format!("{stem}.toml"));
    std::fs::write(
        &path,
        format!(
            "datacenter = \"bench\"\n[kubernetes]\nkubeconfig = \"{}\"\n[journal]\npath = \"{}\"\n{entry}",
            support::k8s::kubeconfig_path().display(),
            dir.join("journal.jsonl").display()
        ),
    )
    .unwrap();
    path
}

#[tokio::main]
async fn main() {
    let runs = env_usize("BENCH_RUNS", 15);
    let reads = env_usize("BENCH_READS", 200);
    let bin = std::env::var("OOBFENCE_BIN").unwrap_or_else(|_| "target/release/oobfence".into());
    let dir = tempfile::tempdir().unwrap();

    let sim = IpmiSim::start();
    let ipmi_pw = dir.path().join("ipmi.password");
    std::fs::write(&ipmi_pw, ipmi_sim::PASSWORD).unwrap();
    let ipmi = config_with(
        dir.path(),
        "ipmi",
        &format!(
            "[[bmc]]\nnodes = [\"{NODE}\"]\nprotocol = \"ipmi\"\naddress = \"{}\"\nusername = \"{}\"\npassword_file = \"{}\"\ncipher_suite = 3\nprivilege = \"administrator\"\n",
            sim.address(),
            ipmi_sim::USERNAME,
            ipmi_pw.display()
        ),
    );
    let emu = SushyEmulator::start(1).await;
    let redfish_pw = dir.path().join("redfish.password");
    std::fs::write(&redfish_pw, sushy::PASSWORD).unwrap();
    let redfish = config_with(
        dir.path(),
        "redfish",
        &format!(
            "[[bmc]]\nnodes = [\"{NODE}\"]\nprotocol = \"redfish\"\naddress = \"{}\"\nsystem = \"{}\"\nusername = \"{}\"\npassword_file = \"{}\"\nca_file = \"{}\"\n",
            emu.base_url(),
            emu.system_path(0),
            sushy::USERNAME,
            redfish_pw.display(),
            emu.cert_pem_path().display()
        ),
    );

    let probe = |config: &Path| probe_run(&bin, config, NODE);
    let ipmi_port = sim.port().to_string();
    let fence_ipmilan = Run::new(strings(&[
        "/usr/sbin/fence_ipmilan",
        "--ip",
        "127.0.0.1",
        "--ipport",
        &ipmi_port,
        "--username",
        ipmi_sim::USERNAME,
        "--password",
        ipmi_sim::PASSWORD,
        "--lanplus",
        "--cipher",
        "3",
        "--action",
        "status",
    ]));
    let redfish_port = emu.port().to_string();
    let system = emu.system_path(0);
    let fence_redfish = Run::new(strings(&[
        "/usr/sbin/fence_redfish",
        "--ip",
        "127.0.0.1",
        "--ipport",
        &redfish_port,
        "--ssl-insecure",
        "--username",
        sushy::USERNAME,
        "--password",
        sushy::PASSWORD,
        "--systems-uri",
        &system,
        "--action",
        "status",
    ]));

    note(&format!("IPMI: {runs} interleaved runs each"));
    let ipmi_agent = compare("IPMI", &probe(&ipmi), &fence_ipmilan, runs);
    note(&format!("Redfish: {runs} interleaved runs each"));
    let redfish_agent = compare("Redfish", &probe(&redfish), &fence_redfish, runs);
    // What the emulator itself takes per GET, over one kept-alive connection: the floor under
    // any client's wall time against it.
    let url = format!("{}{}", emu.base_url(), emu.system_path(0));
    let mut curl = strings(&[
        "-sk",
        "-u",
        &format!("{}:{}", sushy::USERNAME, sushy::PASSWORD),
    ]);
    curl.extend(strings(&["-w", "%{time_total}\\n"]));
    for _ in 0..21 {
        curl.extend([String::from("-o"), "/dev/null".into(), url.clone()]);
    }
    let out = Command::new("curl").args(&curl).output().expect("run curl");
    let times: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1) // the first carries the TLS handshake
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    figure(
        "Redfish: sushy-tools' own time per GET (curl, one kept-alive connection)",
        format!("{:.1}", median(times) * 1000.0),
        "ms",
    );
    note(&format!("in the daemon: {reads} reads each way"));
    in_daemon("IPMI", &ipmi, reads, ipmi_agent).await;
    in_daemon("Redfish", &redfish, reads, redfish_agent).await;
    ec2(
        dir.path(),
        &bin,
        runs,
        env_usize("BENCH_EC2_NODES", 100),
        env_usize("BENCH_EC2_ROUNDS", 20),
    )
    .await;

    // For profiling by hand: the emulators stay up, e.g. for
    // `perf record -g -- oobfence probe --config CONFIG bench-node`.
    if let Some(secs) = std::env::var("BENCH_LINGER")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        note(&format!(
            "emulators up for {secs} s more: {} {}",
            ipmi.display(),
            redfish.display()
        ));
        tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    }
}
