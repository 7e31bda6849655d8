//! What oobfence tells operators, checked on real parts: a daemon against a real
//! kube-apiserver (OOBFENCE_TEST_KUBECONFIG) and the sushy-tools Redfish emulator.
//!
//! - Every `oobfence_*` metric the alert rules, the Grafana dashboard and the runbook use is
//!   served by a live daemon, with HELP text.
//! - The metrics, the decision journal and `oobfence why` follow a fence, the release of the
//!   node's VolumeAttachment and the recovery; a BMC that cannot be read is one refusal.
//! - Under systemd, log lines carry journald priority prefixes.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};

use oobfence::journal::{self, Record, RecordKind};
use support::k8s::{
    FakeNode, KubeletIdentity, RunningDaemon, events_for, sample, volume_attachment, wait_for,
};
use support::scenario::{DATACENTER, Scenario, UNREACHABLE_BMC_PASSWORD};

// Generous: a loaded 2-core machine has taken over 45 s for a decision expected in seconds.
const DECISION: Duration = Duration::from_secs(90);
const POWER_CHANGE: Duration = Duration::from_secs(30);

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Metric families served, by name, with their type and HELP text.
fn families(exposition: &str) -> BTreeMap<String, (String, String)> {
    let mut help = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in exposition.lines() {
        if let Some((name, text)) = line.strip_prefix("# HELP ").and_then(|l| l.split_once(' ')) {
            help.insert(name.to_string(), text.to_string());
        }
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|l| l.split_once(' ')) {
            let h = help.get(name).cloned().unwrap_or_default();
            out.insert(name.to_string(), (kind.to_string(), h));
        }
    }
    out
}

/// Every series name a family of that type yields in a query (`_total` for counters,
/// `_bucket`/`_sum`/`_count` for histograms...).
fn series_names(families: &BTreeMap<String, (String, String)>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, (kind, _)) in families {
        let suffixes: &[&str] = match kind.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

/// Every `oobfence_*` identifier in a text.
fn oobfence_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("oobfence_") {
        let preceded = rest[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].trim_end_matches('_');
        // "oobfence_*" in prose is a pattern, not a metric; the external label that says
        // where the runbook is served is a label of Prometheus', not a metric.
        if !preceded && name != "oobfence" && name != "oobfence_runbook_url" {
            out.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// Every PromQL expression in a Grafana dashboard (panels, rows' panels, annotations,
/// template variables).
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|x| dashboard_exprs(x, out)),
        _ => {}
    }
}

fn journal_records(path: &Path, node: &str) -> Vec<Record> {
    journal::tail(path, node, 1000)
        .map(|t| t.records)
        .unwrap_or_default()
}

async fn wait_metric(daemon: &RunningDaemon, what: &str, check: impl Fn(&str) -> bool) -> String {
    wait_for(what, DECISION, || async {
        let m = daemon.metrics().await;
        check(&m).then_some(m)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_dashboard_and_runbook_use_is_served() {
    let s = Scenario::without_machines("obsnames").await;
    let daemon = s.daemon().await;
    let exposition = daemon.metrics().await;
    daemon.stop().await;

    let fams = families(&exposition);
    for (name, (_, help)) in &fams {
        assert!(name.starts_with("oobfence_"), "{name}");
        assert!(
            help.split_whitespace().count() >= 8,
            "{name}: HELP does not tell an operator what it means: {help:?}"
        );
    }
    // A family's own name counts too: the runbook documents histograms by it.
    let mut served = series_names(&fams);
    served.extend(fams.keys().cloned());

    let rules = std::fs::read_to_string(repo("deploy/prometheus/oobfence-rules.yaml")).unwrap();
    let runbook = std::fs::read_to_string(repo("docs/runbook.md")).unwrap();
    let mut used: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    used.insert(
        "deploy/prometheus/oobfence-rules.yaml",
        oobfence_names(&rules),
    );
    used.insert("docs/runbook.md", oobfence_names(&runbook));
    let dashboards: Vec<PathBuf> = std::fs::read_dir(repo("deploy/grafana"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert!(!dashboards.is_empty(), "no dashboard in deploy/grafana");
    let mut dashboard_names = BTreeSet::new();
    for d in &dashboards {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d).unwrap())
            .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", d.display()));
        let mut exprs = Vec::new();
        dashboard_exprs(&v, &mut exprs);
        assert!(
            exprs.len() >= 10,
            "{}: only {} queries",
            d.display(),
            exprs.len()
        );
        for e in &exprs {
            dashboard_names.extend(oobfence_names(e));
        }
    }
    used.insert("deploy/grafana/*.json", dashboard_names);

    let mut missing = Vec::new();
    for (file, names) in &used {
        assert!(names.len() >= 5, "{file}: found only {names:?}");
        for n in names {
            if !served.contains(n) {
                missing.push(format!("{file}: {n}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "used but not served by the daemon:\n  {}\nserved families: {:?}",
        missing.join("\n  "),
        fams.keys().collect::<Vec<_>>()
    );
    // The metrics the brief to operators promises are all there.
    for name in [
        "oobfence_node_state",
        "oobfence_actions_total",
        "oobfence_would_act_total",
        "oobfence_power_reads_total",
        "oobfence_power_read_duration_seconds_bucket",
        "oobfence_notready_to_fence_seconds_bucket",
        "oobfence_fence_to_volumes_released_seconds_bucket",
        "oobfence_fence_to_recovery_seconds_bucket",
        "oobfence_out_of_service_taint_age_seconds",
        "oobfence_foreign_out_of_service_taints",
        "oobfence_blocked",
        "oobfence_last_successful_sync_timestamp_seconds",
        "oobfence_build_info",
    ] {
        assert!(served.contains(name), "{name} not served:\n{exposition}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_journal_and_why_follow_a_fence_its_volumes_and_the_recovery() {
    let s = Scenario::redfish("obs", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    // The journal outlives the daemon, in the scenario's directory.
    let journal_path = s.journal();
    let dead = s.node("a", 0).await;
    // Alive until it dies: a Lease gone stale during the set-up would have its machine read
    // ahead and fenced the moment it turns NotReady, without the grace this test measures.
    let kubelet = FakeNode::keep_alive(&[&dead], "boot-1");
    s.map_unreachable("b");
    let dark = s
        .node_reporting("b", "boot-7", KubeletIdentity::default())
        .await;
    let (dead_name, dark_name) = (dead.name.clone(), dark.name.clone());
    // A volume attached to the machine that is about to die.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = s.name("va");
    let pv = s.name("pv");
    vas.create(
        &PostParams::default(),
        &volume_attachment(&va_name, &dead_name, "csi.oobfence.test", &pv),
    )
    .await
    .expect("create VolumeAttachment");

    let daemon = s.daemon().await;
    let digest = journal::sha256_hex(
        std::fs::read_to_string(&daemon.config_path)
            .unwrap()
            .as_bytes(),
    );
    let before = daemon.metrics().await;
    assert_eq!(
        sample(&before, "oobfence_notready_to_fence_seconds_count"),
        Some(0.0),
        "{before}"
    );
    // The VolumeAttachment watch lists on its own task: up shortly after /readyz, not with it.
    wait_metric(&daemon, "the VolumeAttachment watch up", |m| {
        sample(m, "oobfence_volume_attachment_watch_up") == Some(1.0)
    })
    .await;

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    drop(kubelet);
    dead.die("boot-1").await;
    dark.die("boot-7").await;

    // Fenced: every per-node series of a fence is there.
    let a = &dead_name;
    let m = wait_metric(&daemon, "the fence in /metrics", |m| {
        sample(m, "oobfence_notready_to_fence_seconds_count") == Some(1.0)
            && sample(
                m,
                &format!("oobfence_fenced_volume_attachments{{node=\"{a}\"}}"),
            )
            .is_some()
    })
    .await;
    assert_eq!(
        sample(
            &m,
            &format!("oobfence_node_state{{node=\"{a}\",state=\"fenced\"}}")
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "oobfence_actions_total{action=\"taint\",result=\"success\"}"
        ),
        Some(1.0)
    );
    let fenced_since = sample(
        &m,
        &format!("oobfence_fenced_since_timestamp_seconds{{node=\"{a}\",action=\"taint\"}}"),
    )
    .expect("fenced_since series");
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!((now - fenced_since).abs() < 60.0, "{fenced_since} vs {now}");
    let age = sample(
        &m,
        &format!("oobfence_out_of_service_taint_age_seconds{{node=\"{a}\"}}"),
    )
    .expect("taint age series");
    assert!((0.0..60.0).contains(&age), "{age}");
    let to_fence = sample(&m, "oobfence_notready_to_fence_seconds_sum").unwrap();
    assert!(
        (2.0..45.0).contains(&to_fence),
        "NotReady to fence took {to_fence}s; the grace period is 2s"
    );
    assert_eq!(
        sample(
            &m,
            &format!("oobfence_fenced_volume_attachments{{node=\"{a}\"}}")
        ),
        Some(1.0)
    );

    // The unreadable node: blocked once, with a reason that does not flap between re-reads.
    let b = &dark_name;
    let blocked_series = format!("oobfence_node_blocked{{node=\"{b}\",reason=\"power-unknown\"}}");
    let m = wait_metric(&daemon, "the unreadable node blocked", |m| {
        sample(m, &blocked_series) == Some(1.0)
    })
    .await;
    assert!(
        sample(&m, "oobfence_blocked{reason=\"power-unknown\"}") >= Some(1.0),
        "{m}"
    );
    // Re-read every 2s for a while: the series stays, one refusal record, one Event.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let m = daemon.metrics().await;
        assert_eq!(sample(&m, &blocked_series), Some(1.0), "flapped:\n{m}");
        assert_eq!(
            sample(
                &m,
                "oobfence_power_sources_failing{backend=\"redfish\",error_kind=\"unreachable\"}"
            ),
            Some(1.0),
            "{m}"
        );
    }
    let refusals: Vec<Record> = journal_records(&journal_path, b)
        .into_iter()
        .filter(|r| r.kind == RecordKind::Refusal)
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:#?}");
    let r = &refusals[0];
    assert_eq!(
        (r.rule.as_str(), r.event.as_str()),
        ("power-unknown", "OobfenceBlocked")
    );
    assert_eq!(r.result, "refused");
    assert!(r.inputs.reads.iter().all(|x| x.value == "error"), "{r:?}");
    assert!(r.inputs.reads[0].raw.contains("unreachable"), "{r:?}");
    let blocked_events = events_for(&client, b)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("OobfenceBlocked"))
        .count();
    assert_eq!(blocked_events, 1, "one Event per refusal episode");

    // The fence's journal record: inputs, evidence, the volume, the config it ran with.
    let fence = journal_records(&journal_path, a)
        .into_iter()
        .find(|r| r.kind == RecordKind::Action && r.action == "taint")
        .expect("a journal record of the fence");
    assert_eq!(fence.result, "success");
    assert_eq!(fence.event, "OobfenceFenced");
    assert_eq!(fence.rule, "confirmed-off");
    assert_eq!(fence.datacenter, DATACENTER);
    assert_eq!(fence.config_digest, digest);
    assert_eq!(fence.inputs.ready, "NotReady");
    assert!(fence.inputs.not_ready_since.is_some());
    assert!(fence.inputs.lease_renewed.is_some());
    assert_eq!(fence.inputs.boot_id, "boot-1");
    assert_eq!(fence.inputs.volume_attachments, Some(vec![va_name.clone()]));
    let offs: Vec<_> = fence
        .inputs
        .reads
        .iter()
        .filter(|r| r.value == "off" && r.raw == "Off")
        .collect();
    assert!(offs.len() >= 2, "{:?}", fence.inputs.reads);
    assert!(offs.iter().all(|r| r.latency_seconds > 0.0));
    assert!(
        fence.message.contains("out-of-service taint added"),
        "{}",
        fence.message
    );
    let raw = std::fs::read_to_string(&journal_path).unwrap();
    assert!(
        !raw.contains(UNREACHABLE_BMC_PASSWORD),
        "a secret in the journal"
    );
    assert!(!raw.contains("password\""), "a secret in the journal");

    // Kubernetes releases the volume: the wait is measured and recorded.
    vas.delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    let m = wait_metric(&daemon, "the volume release in /metrics", |m| {
        sample(m, "oobfence_fence_to_volumes_released_seconds_count") == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(
            &m,
            &format!("oobfence_fenced_volume_attachments{{node=\"{a}\"}}")
        ),
        None,
        "{m}"
    );
    let released = sample(&m, "oobfence_fence_to_volumes_released_seconds_sum").unwrap();
    assert!((0.0..60.0).contains(&released), "{released}");
    assert!(
        journal_records(&journal_path, a)
            .iter()
            .any(|r| r.kind == RecordKind::Observation && r.rule == "volumes-released")
    );

    // The machine comes back with a new boot: the fence is lifted, its series go.
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    dead.come_back("boot-2").await;
    // A live kubelet from now on: the recovery must not race the controller marking the node
    // NotReady again for want of renewals.
    let _kubelet = FakeNode::keep_alive(&[&dead], "boot-2");
    let m = wait_metric(&daemon, "the recovery in /metrics", |m| {
        sample(m, "oobfence_fence_to_recovery_seconds_count") == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(
            &m,
            "oobfence_actions_total{action=\"untaint\",result=\"success\"}"
        ),
        Some(1.0)
    );
    // The node cache sees the taint gone a moment after the write.
    let gone = [
        format!("oobfence_out_of_service_taint_age_seconds{{node=\"{a}\"}}"),
        format!("oobfence_fenced_since_timestamp_seconds{{node=\"{a}\",action=\"taint\"}}"),
    ];
    // Healthy again (on the pass after the one that saw the taint gone): no series of its
    // own, counted among the healthy.
    let own = format!("oobfence_node_state{{node=\"{a}\"");
    let m = wait_metric(&daemon, "the fence's series gone", |m| {
        gone.iter().all(|g| sample(m, g).is_none())
            && !m.contains(&own)
            && sample(m, "oobfence_nodes{state=\"healthy\"}").is_some_and(|n| n >= 1.0)
    })
    .await;
    let written = sample(&m, "oobfence_journal_records_total{result=\"written\"}").unwrap();
    assert!(written >= 4.0, "{m}");
    assert_eq!(
        sample(&m, "oobfence_journal_records_total{result=\"failed\"}"),
        Some(0.0)
    );

    // With the daemon gone, `why` still tells the story from the journal.
    let listen = daemon.listen.clone();
    daemon.stop().await;
    let why_config = s.dir().join("why.toml");
    std::fs::write(
        &why_config,
        format!(
            "datacenter = \"{DATACENTER}\"\n[server]\nlisten = \"{listen}\"\n[journal]\npath = \"{}\"\n",
            journal_path.display()
        ),
    )
    .unwrap();
    let out = support::cli::oobfence_async(&["why", a], &why_config).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("no oobfence daemon answers"), "{stderr}");
    assert!(
        stdout.contains("no live report from the daemon"),
        "{stdout}"
    );
    assert!(stdout.contains("taint success"), "{stdout}");
    assert!(stdout.contains("untaint success"), "{stdout}");
    assert!(
        stdout.contains("rule confirmed-off (OobfenceFenced)"),
        "{stdout}"
    );
    assert!(stdout.contains("Off ("), "the reads are shown: {stdout}");
    assert!(stdout.contains("volumes-released"), "{stdout}");

    dead.delete().await;
    dark.delete().await;
}

/// Under systemd (stderr is the journal stream named by JOURNAL_STREAM), every log line starts
/// with its syslog priority, and a fatal error is logged at error priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_carry_journald_priorities_under_systemd() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "secret-for-the-log-test\n").unwrap();
    // The listen port is taken: the daemon logs its start-up, then exits 2 (a config problem).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config_path = dir.path().join("dc.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"datacenter = "logs"
[kubernetes]
kubeconfig = "{}"
[server]
listen = "{}"
[journal]
path = "{}"
[[bmc]]
nodes = ["n1"]
protocol = "redfish"
address = "https://127.0.0.1:1"
username = "admin"
password_file = "{}"
tls_insecure = true
"#,
            support::k8s::kubeconfig_path().display(),
            taken.local_addr().unwrap(),
            dir.path().join("j.jsonl").display(),
            pw.display()
        ),
    )
    .unwrap();
    let run = |journal_stream: Option<String>, log: PathBuf| {
        let config_path = config_path.clone();
        async move {
            let stderr = std::fs::File::create(&log).unwrap();
            let meta = stderr.metadata().unwrap();
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
            cmd.args(["run", "--config"])
                .arg(&config_path)
                .env_remove("OOBFENCE_LOG")
                .stdout(std::process::Stdio::null())
                .stderr(stderr);
            match journal_stream {
                Some(v) if v.is_empty() => {
                    cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
                }
                Some(v) => {
                    cmd.env("JOURNAL_STREAM", v);
                }
                None => {
                    cmd.env_remove("JOURNAL_STREAM");
                }
            }
            let status = tokio::time::timeout(Duration::from_secs(30), cmd.status())
                .await
                .expect("oobfence run exits when it cannot listen")
                .unwrap();
            (status, std::fs::read_to_string(&log).unwrap())
        }
    };

    // Stderr is the journal stream.
    let (status, text) = run(Some(String::new()), dir.path().join("journal.log")).await;
    assert_eq!(status.code(), Some(2), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    for l in &lines {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| l.starts_with(p)),
            "line without a priority: {l:?}\n{text}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<6>") && l.contains("starting")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<4>") && l.contains("TLS certificate verification is off")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("<3>oobfence: ") && l.contains("cannot listen on")),
        "{text}"
    );
    assert!(!text.contains("secret-for-the-log-test"), "{text}");

    // JOURNAL_STREAM inherited but naming another file (a child of a service whose stderr
    // was redirected): plain lines.
    let (_, text) = run(Some("1:1".into()), dir.path().join("other.log")).await;
    assert!(!text.lines().any(|l| l.starts_with('<')), "{text}");
    assert!(text.contains("cannot listen on"), "{text}");

    // No systemd at all: plain lines with timestamps.
    let (_, text) = run(None, dir.path().join("plain.log")).await;
    assert!(!text.lines().any(|l| l.starts_with('<')), "{text}");
    assert!(text.contains(" INFO "), "{text}");
    drop(taken);
}
