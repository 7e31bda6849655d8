//! The fault matrix: what oobfence does when the world misbehaves — a storm, a partition,
//! an operator's pause, a stale view of the cluster, a flapping node, a config file broken
//! under it, the daemon killed mid-fence — each scenario on real parts (the test
//! kube-apiserver, sushy-tools), run concurrently, counting every write to its Nodes at the
//! API server. A false fence is any write a scenario does not expect; the suite ends with
//! `fault matrix: N scenarios, 0 false fences`.
//!
//! Faults of one power source (timeouts, 5xx, garbage, TLS, credentials, PoweringOff, IPMI
//! silent peers and cipher refusals, EC2 throttling and `stopping`) are in that source's suite
//! (`tests/redfish.rs`, `tests/ipmi.rs`, `tests/ec2.rs`), against the same emulators.

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use oobfence::journal;
use support::gate::Gate;
use support::k8s::{FakeNode, RunningDaemon, TEST_LABEL, wait_for};
use support::scenario::{FIRST_BOOT, Scenario};

/// One write to a Node, as seen at the API server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Write {
    Taint(String),
    Untaint(String),
    Delete(String),
}

/// Every out-of-service taint added or removed and every Node deleted in a group, from a
/// watch on the API server: what the daemon actually wrote, whatever it says about itself.
struct WriteRecorder {
    seen: Arc<Mutex<Vec<(Instant, Write)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteRecorder {
    async fn start(client: &Client, group: &str) -> WriteRecorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let api: Api<Node> = Api::all(client.clone());
        let cfg = watcher::Config::default().labels(&format!("{TEST_LABEL}={group}"));
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let s = seen.clone();
        let task = tokio::spawn(async move {
            let mut tainted: BTreeMap<String, bool> = BTreeMap::new();
            let mut ready_tx = Some(ready_tx);
            let stream = watcher(api, cfg);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let note = |w: Write| s.lock().unwrap().push((Instant::now(), w));
                match ev {
                    Ok(watcher::Event::Init) | Err(_) => {}
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let now = FakeNode::has_oos_taint(&n);
                        let before = tainted.insert(n.name_any(), now).unwrap_or(false);
                        match (before, now) {
                            (false, true) => note(Write::Taint(n.name_any())),
                            (true, false) => note(Write::Untaint(n.name_any())),
                            _ => {}
                        }
                    }
                    Ok(watcher::Event::Delete(n)) => {
                        tainted.remove(&n.name_any());
                        note(Write::Delete(n.name_any()));
                    }
                }
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(20), ready_rx).await;
        WriteRecorder { seen, task }
    }

    fn writes(&self) -> Vec<Write> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, w)| w.clone())
            .collect()
    }

    /// When `w` was first seen.
    fn when(&self, w: &Write) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .find(|(_, x)| x == w)
            .map(|(t, _)| *t)
    }
}

impl Drop for WriteRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one scenario saw and expected.
struct Outcome {
    name: &'static str,
    expected: Vec<Write>,
    seen: Vec<Write>,
}

impl Outcome {
    /// Writes seen that the scenario did not expect (each expected write excuses one).
    fn false_writes(&self) -> Vec<Write> {
        let mut left = self.expected.clone();
        let mut extra = Vec::new();
        for w in &self.seen {
            match left.iter().position(|e| e == w) {
                Some(i) => {
                    left.remove(i);
                }
                None => extra.push(w.clone()),
            }
        }
        extra
    }

    fn missing_writes(&self) -> Vec<Write> {
        let mut left = self.expected.clone();
        for w in &self.seen {
            if let Some(i) = left.iter().position(|e| e == w) {
                left.remove(i);
            }
        }
        left
    }
}

type ScenarioFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// Sets label `key=value` on a node.
async fn label(node: &FakeNode, key: &str, value: &str) {
    node.nodes()
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .expect("label the node");
}

/// Machine `i` loses power and its node's kubelet goes silent.
async fn power_cut(s: &Scenario, node: &FakeNode, i: usize) {
    let emu = s.redfish_emulator();
    emu.set_power(i, false).await;
    emu.wait_power(i, "Off", Duration::from_secs(30)).await;
    node.die(FIRST_BOOT).await;
}

async fn wait_taint(node: &FakeNode, limit: Duration) {
    wait_for(
        &format!("the out-of-service taint on {}", node.name),
        limit,
        || async { FakeNode::has_oos_taint(&node.get().await).then_some(()) },
    )
    .await;
}

/// Waits `for_at_least` more and checks that `node` carries no out-of-service taint then.
async fn stays_unfenced(node: &FakeNode, for_at_least: Duration) {
    tokio::time::sleep(for_at_least).await;
    assert!(
        !FakeNode::has_oos_taint(&node.get().await),
        "{} was fenced while it must not be",
        node.name
    );
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

const RACK: &str = "oobfence.test/rack";

/// A storm in one failure domain (both nodes of rack r1 dead, domain_max_unhealthy 50%)
/// holds r1; a node of rack r2 that dies at the same time is fenced as usual.
fn storm_in_one_domain_while_another_fences() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-storm", 4).await;
        s.set_guards(&format!(
            "max_unhealthy = \"100%\"\nfailure_domain_label = \"{RACK}\"\ndomain_max_unhealthy = \"50%\"\n"
        ));
        let mut nodes = Vec::new();
        for (i, (suffix, rack)) in [
            ("r1-a", "r1"),
            ("r1-b", "r1"),
            ("r2-a", "r2"),
            ("r2-b", "r2"),
        ]
        .into_iter()
        .enumerate()
        {
            let n = s.node(suffix, i).await;
            label(&n, RACK, rack).await;
            nodes.push(n);
        }
        let _alive = FakeNode::keep_alive(&[&nodes[3]], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        // Three machines lose power at once (a PDU, say), and their kubelets go silent
        // together, within the grace period.
        let emu = s.redfish_emulator();
        for i in 0..3 {
            emu.set_power(i, false).await;
        }
        for i in 0..3 {
            emu.wait_power(i, "Off", Duration::from_secs(30)).await;
        }
        for n in &nodes[..3] {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&nodes[2], Duration::from_secs(60)).await;
        for n in &nodes[..2] {
            let r = daemon
                .wait_rule(&n.name, "storm", Duration::from_secs(30))
                .await;
            let reason = r["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("failure domain r1"), "{reason}");
        }
        let m = daemon.metrics().await;
        assert_eq!(
            metric(
                &m,
                "oobfence_scope_hold{scope=\"domain=r1\",hold=\"storm\"}"
            ),
            Some(1.0),
            "{m}"
        );
        assert_eq!(
            metric(
                &m,
                "oobfence_scope_hold{scope=\"domain=r2\",hold=\"storm\"}"
            ),
            Some(0.0)
        );
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        daemon.stop().await;
        let seen = rec.writes();
        for n in &nodes {
            n.delete().await;
        }
        Outcome {
            name: "storm above domain_max_unhealthy in one domain, another fences",
            expected: vec![Write::Taint(nodes[2].name.clone())],
            seen,
        }
    })
}

/// 3 of 5 power sources (60 %) cannot be reached: oobfence is the one cut off, so it fences
/// nothing, not even a node whose own BMC answers Off. When they answer again it thaws by
/// itself and fences on reads taken after the thaw.
fn most_bmcs_unreachable_freezes_then_thaws() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-freeze", 5).await;
        let gate = Gate::start(s.redfish_emulator().port(), false).await;
        let dead = s.node("a", 0).await;
        let mut cut_off = Vec::new();
        for (i, suffix) in [(1, "b"), (2, "c"), (3, "d")] {
            cut_off.push(s.node_through(suffix, i, &gate.base_url()).await);
        }
        let fine = s.node("e", 4).await;
        let _alive =
            FakeNode::keep_alive(&[&cut_off[0], &cut_off[1], &cut_off[2], &fine], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &dead, 0).await;
        let r = daemon
            .wait_rule(&dead.name, "self-partition", Duration::from_secs(60))
            .await;
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("3 of 5 power sources"), "{reason}");
        stays_unfenced(&dead, Duration::from_secs(3)).await;
        let restored = Instant::now();
        gate.restore();
        // Failed sources of healthy nodes are read again within 15 s.
        wait_taint(&dead, Duration::from_secs(60)).await;
        let taint = Write::Taint(dead.name.clone());
        assert!(
            rec.when(&taint).unwrap() > restored,
            "fenced before the thaw"
        );
        daemon.stop().await;
        let seen = rec.writes();
        for n in cut_off.iter().chain([&dead, &fine]) {
            n.delete().await;
        }
        Outcome {
            name: "60% of BMCs unreachable: freeze, then thaw",
            expected: vec![taint],
            seen,
        }
    })
}

/// The pause file holds every write; removing it lets the fence through.
fn pause_file_on_and_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-pause", 1).await;
        let node = s.node("a", 0).await;
        oobfence::pause::write_file(&s.pause_file(), "rewiring rack 7", "test").unwrap();
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &node, 0).await;
        let r = daemon
            .wait_rule(&node.name, "paused", Duration::from_secs(60))
            .await;
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("rewiring rack 7"),
            "{r}"
        );
        assert_eq!(
            metric(&daemon.metrics().await, "oobfence_paused"),
            Some(1.0)
        );
        stays_unfenced(&node, Duration::from_secs(3)).await;
        let resumed = Instant::now();
        assert!(oobfence::pause::remove_file(&s.pause_file()).unwrap());
        wait_taint(&node, Duration::from_secs(30)).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.when(&taint).unwrap() > resumed);
        assert_eq!(
            metric(&daemon.metrics().await, "oobfence_paused"),
            Some(0.0)
        );
        daemon.stop().await;
        let seen = rec.writes();
        node.delete().await;
        Outcome {
            name: "pause file on and off",
            expected: vec![taint],
            seen,
        }
    })
}

/// The pause ConfigMap's annotation holds every write, from the cluster's side.
fn pause_configmap_on_and_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-pausecm", 1).await;
        let ns = "oobfence";
        let namespaces: Api<Namespace> = Api::all(s.client.clone());
        let _ = namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await;
        let name = format!("{}-pause", s.group);
        let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), ns);
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": {"oobfence.io/paused": "storm in dc2"}}
            }))
            .unwrap(),
        )
        .await
        .expect("create the pause ConfigMap");
        s.set_pause_configmap(&format!("{ns}/{name}"));
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &node, 0).await;
        let r = daemon
            .wait_rule(&node.name, "paused", Duration::from_secs(60))
            .await;
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("storm in dc2"),
            "{r}"
        );
        stays_unfenced(&node, Duration::from_secs(3)).await;
        let resumed = Instant::now();
        cms.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"oobfence.io/paused": "false"}}})),
        )
        .await
        .unwrap();
        wait_taint(&node, Duration::from_secs(30)).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.when(&taint).unwrap() > resumed);
        daemon.stop().await;
        let seen = rec.writes();
        node.delete().await;
        let _ = cms.delete(&name, &DeleteParams::default()).await;
        Outcome {
            name: "pause ConfigMap on and off",
            expected: vec![taint],
            seen,
        }
    })
}

/// The API server becomes unreachable from oobfence (watches broken, no round trip) for
/// longer than max_view_age while a node dies: nothing is decided on the stale cache; when
/// the API answers again, the node is fenced on fresh reads.
fn api_unreachable_longer_than_the_staleness_limit() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-stale", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\nmax_view_age = \"4s\"\n");
        let (gate, kubeconfig) = gated_kubeconfig(s.dir()).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon_with_kubeconfig(&kubeconfig).await;
        gate.cut();
        power_cut(&s, &node, 0).await;
        wait_for("oobfence_view_stale 1", Duration::from_secs(30), || async {
            (metric(&daemon.metrics().await, "oobfence_view_stale") == Some(1.0)).then_some(())
        })
        .await;
        let report = daemon.report(&node.name).await.unwrap();
        let holds = report["holds"].to_string();
        assert!(holds.contains("stale-view"), "{report}");
        stays_unfenced(&node, Duration::from_secs(5)).await;
        let restored = Instant::now();
        gate.restore();
        wait_taint(&node, Duration::from_secs(90)).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.when(&taint).unwrap() > restored);
        daemon.stop().await;
        let seen = rec.writes();
        node.delete().await;
        Outcome {
            name: "API unreachable longer than max_view_age",
            expected: vec![taint],
            seen,
        }
    })
}

/// A copy of the test cluster's kubeconfig that reaches the API server through a [`Gate`].
async fn gated_kubeconfig(dir: &std::path::Path) -> (Gate, std::path::PathBuf) {
    let path = support::k8s::kubeconfig_path();
    let mut kc = kube::config::Kubeconfig::read_from(&path).expect("read the test kubeconfig");
    let cluster = kc.clusters[0].cluster.as_mut().expect("a cluster");
    let server = cluster.server.clone().expect("a server");
    let port: u16 = server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let gate = Gate::start(port, true).await;
    cluster.server = Some(server.replace(&format!(":{port}"), &format!(":{}", gate.port)));
    let out = dir.join("gated.kubeconfig");
    // JSON is YAML: the daemon reads it as a kubeconfig.
    std::fs::write(&out, serde_json::to_string(&kc).unwrap()).unwrap();
    (gate, out)
}

/// A node that keeps going NotReady and Ready is held, not fenced, though its machine is off
/// whenever it is read.
fn flapping_node_is_held() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-flap", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", Duration::from_secs(30)).await;
        for _ in 0..4 {
            node.die(FIRST_BOOT).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            node.come_back(FIRST_BOOT).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        node.die(FIRST_BOOT).await;
        daemon
            .wait_rule(&node.name, "flapping", Duration::from_secs(30))
            .await;
        stays_unfenced(&node, Duration::from_secs(5)).await;
        daemon.stop().await;
        let seen = rec.writes();
        node.delete().await;
        Outcome {
            name: "node flapping",
            expected: vec![],
            seen,
        }
    })
}

/// The config file deleted, then replaced by garbage, under a running daemon: it keeps the
/// config it started with and goes on fencing by it.
fn config_broken_under_a_running_daemon() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-config", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        std::fs::remove_file(&daemon.config_path).unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        std::fs::write(&daemon.config_path, "datacenter = [[[\n").unwrap();
        power_cut(&s, &node, 0).await;
        wait_taint(&node, Duration::from_secs(60)).await;
        daemon.stop().await;
        let seen = rec.writes();
        node.delete().await;
        Outcome {
            name: "config file deleted and corrupted under a running daemon",
            expected: vec![Write::Taint(node.name.clone())],
            seen,
        }
    })
}

/// The daemon is killed right after its fence lands and started again: the new one finds its
/// own fence, writes nothing more, and its journal, the Node's annotations and the fence
/// budget all say one fence.
fn daemon_killed_mid_fence_and_restarted() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-kill", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &node, 0).await;
        wait_taint(&node, Duration::from_secs(60)).await;
        // Killed: no shutdown, no journal flush beyond what was already synced.
        drop(daemon);
        let daemon: RunningDaemon = s.daemon().await;
        daemon
            .wait_rule(
                &node.name,
                "fenced-awaiting-recovery",
                Duration::from_secs(30),
            )
            .await;
        wait_for(
            "the fence budget restored",
            Duration::from_secs(15),
            || async {
                (metric(&daemon.metrics().await, "oobfence_fence_budget_used") == Some(1.0))
                    .then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let m = daemon.metrics().await;
        assert_eq!(
            metric(
                &m,
                "oobfence_actions_total{action=\"taint\",result=\"success\"}"
            ),
            None,
            "the restarted daemon wrote a fence again: {m}"
        );
        daemon.stop().await;
        let records: Vec<_> = journal::tail(&s.journal(), &node.name, 100)
            .unwrap()
            .records
            .into_iter()
            .filter(|r| r.action == "taint" && r.result == "success")
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        // The Node's record and the journal's tell of the same fence.
        let n = node.get().await;
        let at: jiff::Timestamp = n.annotations()["oobfence.io/fenced-at"].parse().unwrap();
        let gap = records[0].ts.duration_since(at).abs();
        assert!(
            gap < jiff::SignedDuration::from_secs(5),
            "journal {} vs node {at}",
            records[0].ts
        );
        assert!(n.annotations().contains_key("oobfence.io/fenced-by"));
        let seen = rec.writes();
        node.delete().await;
        Outcome {
            name: "daemon killed after its fence and restarted",
            expected: vec![Write::Taint(node.name.clone())],
            seen,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fault_matrix() {
    let scenarios: Vec<ScenarioFuture> = vec![
        storm_in_one_domain_while_another_fences(),
        most_bmcs_unreachable_freezes_then_thaws(),
        pause_file_on_and_off(),
        pause_configmap_on_and_off(),
        api_unreachable_longer_than_the_staleness_limit(),
        flapping_node_is_held(),
        config_broken_under_a_running_daemon(),
        daemon_killed_mid_fence_and_restarted(),
    ];
    // Each scenario on its own task, so that one's panic names it and the others finish.
    let handles: Vec<_> = scenarios.into_iter().map(tokio::spawn).collect();
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        match h.await {
            Ok(o) => outcomes.push(o),
            Err(e) => failed.push(format!("scenario #{i}: {e}")),
        }
    }
    let mut false_fences = 0;
    for o in &outcomes {
        let extra = o.false_writes();
        let missing = o.missing_writes();
        false_fences += extra.len();
        println!(
            "fault matrix: {:<65} writes {:?}{}{}",
            o.name,
            o.seen,
            if extra.is_empty() {
                String::new()
            } else {
                format!("  FALSE: {extra:?}")
            },
            if missing.is_empty() {
                String::new()
            } else {
                format!("  MISSING: {missing:?}")
            },
        );
        if !missing.is_empty() {
            failed.push(format!("{}: expected writes missing: {missing:?}", o.name));
        }
    }
    println!(
        "fault matrix: {} scenarios, {false_fences} false fences",
        outcomes.len()
            + failed
                .iter()
                .filter(|f| f.starts_with("scenario #"))
                .count()
    );
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(false_fences, 0);
}
