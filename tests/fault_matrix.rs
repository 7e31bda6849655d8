//! The fault matrix: what oobfence does when the world misbehaves — a storm, a partition,
//! an operator's pause, a stale view of the cluster, a flapping node, a config file broken
//! under it, the daemon killed mid-fence — each scenario on real parts (the test
//! kube-apiserver, sushy-tools), run concurrently, counting every write to its Nodes at the
//! API server. A false fence is any write a scenario does not expect; the suite ends with
//! `fault matrix: N scenarios, 0 false fences`.
//!
//! The power sources' faults run here as whole daemons over dead nodes (a BMC that times out,
//! answers 500 or 503, garbage, truncated or oversized JSON, a TLS mismatch, an expired
//! certificate, wrong credentials, PoweringOff, Paused; an IPMI peer that never answers and a
//! wrong password; an EC2 node of another region, DescribeInstances throttled, `stopping`,
//! `shutting-down`, an instance missing from one answer), each beside a control node that must be
//! fenced. How each reply is classified is tested read by read in that source's suite
//! (`tests/redfish.rs`, `tests/ipmi.rs`, `tests/ec2.rs`).

mod support;

/// More `[ha]` scenarios, in their own file.
#[path = "fault_matrix/ha.rs"]
mod ha;
#[path = "fault_matrix/trust.rs"]
mod trust;

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
use support::fake_ec2::{FakeEc2, FakeInstance};
use support::gate::Gate;
use support::k8s::{
    FakeNode, KubeletIdentity, RunningDaemon, TEST_LABEL, sample, taints_owner, wait_for,
};
use support::odd_bmc::{self, OddBmc};
use support::scenario::{FIRST_BOOT, Scenario};

/// One write to a Node, as seen at the API server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Write {
    Taint(String),
    Untaint(String),
    Delete(String),
    /// The taint dropped by kube-controller-manager, not by oobfence: 1.20's node lifecycle
    /// controller writes its own taints as a whole list read from the API server's cache, with
    /// no resourceVersion, so a taint written in the same instant can vanish. oobfence must
    /// put it back; that one Taint is no false write.
    DroppedByController(String),
}

/// Every out-of-service taint added or removed and every Node deleted in a group, from a
/// watch on the API server: what the daemon actually wrote, whatever it says about itself.
struct WriteRecorder {
    seen: Arc<Mutex<Vec<(Instant, Write)>>>,
    /// When each node was first seen not Ready, from the same watch.
    not_ready: Arc<Mutex<BTreeMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteRecorder {
    async fn start(client: &Client, group: &str) -> WriteRecorder {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let not_ready = Arc::new(Mutex::new(BTreeMap::new()));
        let nr = not_ready.clone();
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
                        if n.status.is_some() && !is_ready(&n) {
                            nr.lock()
                                .unwrap()
                                .entry(n.name_any())
                                .or_insert_with(Instant::now);
                        }
                        let now = FakeNode::has_oos_taint(&n);
                        let before = tainted.insert(n.name_any(), now).unwrap_or(false);
                        match (before, now) {
                            (false, true) => note(Write::Taint(n.name_any())),
                            (true, false) => note(
                                if taints_owner(&n).as_deref() == Some("kube-controller-manager") {
                                    Write::DroppedByController(n.name_any())
                                } else {
                                    Write::Untaint(n.name_any())
                                },
                            ),
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
        WriteRecorder {
            seen,
            not_ready,
            task,
        }
    }

    /// When `node` was first seen not Ready.
    fn not_ready_at(&self, node: &str) -> Option<Instant> {
        self.not_ready.lock().unwrap().get(node).copied()
    }

    fn writes(&self) -> Vec<Write> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, w)| w.clone())
            .collect()
    }

    /// When `w` was first seen, waiting for it a while: the recorder's watch may deliver a
    /// write a moment after a GET shows it.
    async fn seen(&self, w: &Write) -> Instant {
        wait_for(
            &format!("the recorder sees {w:?}"),
            Duration::from_secs(30),
            || async { self.when(w) },
        )
        .await
    }

    /// The writes seen, once every one of `expected` is among them or 30 s have passed (the
    /// watch may lag the GETs that showed them; a write never made is reported missing).
    async fn writes_once_seen(&self, expected: &[Write]) -> Vec<Write> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30)
            && !expected.iter().all(|w| self.when(w).is_some())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.writes()
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
    /// Writes seen that the scenario did not expect (each expected write excuses one, and a
    /// taint the controller-manager dropped excuses the next taint of that node: the fence put
    /// back).
    fn false_writes(&self) -> Vec<Write> {
        let mut left = self.expected.clone();
        let mut dropped = Vec::new();
        let mut extra = Vec::new();
        for w in &self.seen {
            if let Write::DroppedByController(node) = w {
                dropped.push(node.clone());
                continue;
            }
            if let Some(i) = left.iter().position(|e| e == w) {
                left.remove(i);
                continue;
            }
            match w {
                Write::Taint(node) if dropped.contains(node) => {
                    dropped.retain(|d| d != node);
                }
                _ => extra.push(w.clone()),
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

/// The matrix's own bookkeeping: a taint the controller-manager dropped excuses exactly one
/// re-taint of that node, never an untaint, a delete or a second re-taint.
#[test]
fn a_dropped_taint_excuses_one_retaint_of_its_node() {
    let (t, d) = (
        |n: &str| Write::Taint(n.into()),
        |n: &str| Write::DroppedByController(n.into()),
    );
    let outcome = |seen: Vec<Write>| Outcome {
        name: "bookkeeping",
        expected: vec![t("a")],
        seen,
    };
    assert!(
        outcome(vec![t("a"), d("a"), t("a")])
            .false_writes()
            .is_empty()
    );
    assert_eq!(
        outcome(vec![t("a"), d("a"), t("a"), t("a")]).false_writes(),
        vec![t("a")]
    );
    assert_eq!(
        outcome(vec![t("a"), d("a"), t("b")]).false_writes(),
        vec![t("b")]
    );
    assert_eq!(
        outcome(vec![t("a"), Write::Untaint("a".into())]).false_writes(),
        vec![Write::Untaint("a".into())]
    );
    assert!(outcome(vec![d("a")]).missing_writes() == vec![t("a")]);
}

/// The end of every scenario: its daemon stopped, the writes seen at the API server, its nodes
/// deleted.
async fn conclude(
    name: &'static str,
    expected: Vec<Write>,
    daemon: RunningDaemon,
    rec: &WriteRecorder,
    nodes: &[&FakeNode],
) -> Outcome {
    daemon.stop().await;
    let seen = rec.writes_once_seen(&expected).await;
    for n in nodes {
        n.delete().await;
    }
    Outcome {
        name,
        expected,
        seen,
    }
}

fn nodes_of<'a>(nodes: impl IntoIterator<Item = &'a FakeNode>) -> Vec<&'a FakeNode> {
    nodes.into_iter().collect()
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
        // The API server may be down for a while (a scenario kills it): a failed GET is
        // "not yet".
        || async {
            let n = node.nodes().get_opt(&node.name).await.ok().flatten()?;
            FakeNode::has_oos_taint(&n).then_some(())
        },
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
            sample(
                &m,
                "oobfence_scope_hold{scope=\"domain=r1\",hold=\"storm\"}"
            ),
            Some(1.0),
            "{m}"
        );
        assert_eq!(
            sample(
                &m,
                "oobfence_scope_hold{scope=\"domain=r2\",hold=\"storm\"}"
            ),
            Some(0.0)
        );
        let guards: serde_json::Value = reqwest::get(format!("http://{}/guards", daemon.listen))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let r1 = guards["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["scope"] == "domain=r1")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (r1["nodes"].as_u64(), r1["unhealthy"].as_u64()),
            (Some(2), Some(2)),
            "{guards}"
        );
        assert!(r1["storm_since"].is_string(), "{guards}");
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        conclude(
            "storm above domain_max_unhealthy in one domain, another fences",
            vec![Write::Taint(nodes[2].name.clone())],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
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
        assert!(rec.seen(&taint).await > restored, "fenced before the thaw");
        conclude(
            "60% of BMCs unreachable: freeze, then thaw",
            vec![taint],
            daemon,
            &rec,
            &nodes_of(cut_off.iter().chain([&dead, &fine])),
        )
        .await
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
            sample(&daemon.metrics().await, "oobfence_paused"),
            Some(1.0)
        );
        stays_unfenced(&node, Duration::from_secs(3)).await;
        let resumed = Instant::now();
        assert!(oobfence::pause::remove_file(&s.pause_file()).unwrap());
        wait_taint(&node, Duration::from_secs(30)).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.seen(&taint).await > resumed);
        assert_eq!(
            sample(&daemon.metrics().await, "oobfence_paused"),
            Some(0.0)
        );
        conclude("pause file on and off", vec![taint], daemon, &rec, &[&node]).await
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
        assert!(rec.seen(&taint).await > resumed);
        let outcome = conclude(
            "pause ConfigMap on and off",
            vec![taint],
            daemon,
            &rec,
            &[&node],
        )
        .await;
        let _ = cms.delete(&name, &DeleteParams::default()).await;
        outcome
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
            (sample(&daemon.metrics().await, "oobfence_view_stale") == Some(1.0)).then_some(())
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
        assert!(rec.seen(&taint).await > restored);
        conclude(
            "API unreachable longer than max_view_age",
            vec![taint],
            daemon,
            &rec,
            &[&node],
        )
        .await
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
        // Each NotReady spell must stay shorter than the grace plus a confirmation: with the
        // suite's 2 s grace, a spell of 1.5 s stretched by a slow API call (and by the Ready
        // condition's whole-second lastTransitionTime) was long enough to fence in, as it should
        // be. 10 s leaves no doubt; flaps are counted whatever the grace.
        s.set_policy(
            &s.policy_lines()
                .replace("not_ready_grace = \"2s\"", "not_ready_grace = \"10s\""),
        );
        assert!(s.policy_lines().contains("not_ready_grace = \"10s\""));
        let node = s.node("a", 0).await;
        // Alive until it flaps: a Lease gone stale during the set-up would have the machine
        // read ahead, and an Off read ahead fences at the first NotReady, rightly.
        let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", Duration::from_secs(30)).await;
        drop(kubelet);
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
        conclude("node flapping", vec![], daemon, &rec, &[&node]).await
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
        conclude(
            "config file deleted and corrupted under a running daemon",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// The daemon is killed right after its fence lands and started again: the new one finds its
/// own fence, writes nothing more, and its journal, the Node's annotations and the fence
/// budget all say one fence.
fn daemon_killed_after_its_fence_and_restarted() -> ScenarioFuture {
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
                (sample(&daemon.metrics().await, "oobfence_fence_budget_used") == Some(1.0))
                    .then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let m = daemon.metrics().await;
        assert_eq!(
            sample(
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
        // The Node's record and the journal's tell of the same fence: fenced-at is stamped
        // before the write, the journal's record after it returns (a write may take its 20 s
        // bound on a loaded API server).
        let n = node.get().await;
        let at: jiff::Timestamp = n.annotations()["oobfence.io/fenced-at"].parse().unwrap();
        let gap = records[0].ts.duration_since(at).abs();
        assert!(
            gap < jiff::SignedDuration::from_secs(30),
            "journal {} vs node {at}",
            records[0].ts
        );
        assert!(n.annotations().contains_key("oobfence.io/fenced-by"));
        // Killed before its journal record reached the disk, it would find the fence on the
        // Node alone: the budget still counts it.
        std::fs::rename(s.journal(), s.dir().join("journal.moved")).unwrap();
        let daemon: RunningDaemon = s.daemon().await;
        wait_for(
            "the fence budget restored from the Node",
            Duration::from_secs(15),
            || async {
                (sample(&daemon.metrics().await, "oobfence_fence_budget_used") == Some(1.0))
                    .then_some(())
            },
        )
        .await;
        conclude(
            "daemon killed after its fence and restarted",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// A TCP peer that accepts connections and never says a word.
struct SilentTcpPeer {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl SilentTcpPeer {
    async fn start() -> SilentTcpPeer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            // Bounded: a few hundred connections at most in a test.
            for _ in 0..1000 {
                let Ok((c, _)) = listener.accept().await else {
                    return;
                };
                held.push(c);
            }
        });
        SilentTcpPeer { port, task }
    }
}

impl Drop for SilentTcpPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Dead nodes whose BMCs misbehave in every way a Redfish BMC can: none is fenced, each is
/// refused with the rule that names why; the control node beside them, behind a BMC that
/// answers a clean Off, is fenced.
fn dead_nodes_behind_faulty_redfish_bmcs() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-redfish", 1).await;
        // Each BMC fails on its own here: the freeze (most sources failing at once) would hold
        // the control node too, which is the freeze's scenario, not this one.
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        let odd = OddBmc::start();
        let expired = OddBmc::start_expired();
        let silent = SilentTcpPeer::start().await;
        let (other_ca, _) = support::sushy::self_signed_cert(s.dir(), "other");
        let at = |port: u16| format!("https://127.0.0.1:{port}");
        let pinned = |cert: &std::path::Path, system: &str| {
            format!(
                "system = \"{system}\"\nca_file = \"{}\"\ntimeout = \"2s\"",
                cert.display()
            )
        };
        let emu = s.redfish_emulator();
        let cases: Vec<(&str, String, &str, String, &str)> = vec![
            (
                "control",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/off"),
                "FENCED",
            ),
            (
                "http-500",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/error"),
                "power-unknown",
            ),
            (
                "http-503",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/unavailable"),
                "power-unknown",
            ),
            (
                "garbage",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/html"),
                "power-unknown",
            ),
            (
                "truncated",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/truncated"),
                "power-unknown",
            ),
            (
                "oversized",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/big"),
                "power-unknown",
            ),
            (
                "stalled-body",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/slow-body"),
                "power-unknown",
            ),
            (
                "forbidden",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/forbidden"),
                "power-unknown",
            ),
            (
                "powering-off",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/powering-off"),
                "power-transitional",
            ),
            (
                "paused",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/paused"),
                "power-suspended",
            ),
            (
                "tls-mismatch",
                at(odd.port),
                "pw",
                pinned(&other_ca, "/tls"),
                "power-unknown",
            ),
            (
                "tls-expired",
                at(expired.port),
                "pw",
                pinned(&expired.cert, "/off"),
                "power-unknown",
            ),
            (
                "timeout",
                at(silent.port),
                "pw",
                pinned(&odd.cert, "/off"),
                "power-unknown",
            ),
            (
                "wrong-password",
                emu.base_url(),
                "not-the-password",
                pinned(&emu.cert_pem_path(), &emu.system_path(0)),
                "power-unknown",
            ),
        ];
        let mut nodes = Vec::new();
        for (i, (suffix, address, password, extra, _)) in cases.iter().enumerate() {
            s.map_redfish(suffix, address, password, extra);
            // Each node reports its own machine's UUID: one that two Nodes report proves none
            // of them (duplicate-system-uuid). Those whose BMC never answers get one nothing
            // else reports.
            let identity = match *suffix {
                "wrong-password" => s.identity(0).await,
                "control" => KubeletIdentity::uuid(odd_bmc::UUID),
                "powering-off" => KubeletIdentity::uuid(odd_bmc::POWERING_OFF_UUID),
                "paused" => KubeletIdentity::uuid(odd_bmc::PAUSED_UUID),
                _ => KubeletIdentity::uuid(&format!("4c4c4544-0038-4b10-8052-{i:012x}")),
            };
            nodes.push(s.node_reporting(suffix, FIRST_BOOT, identity).await);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&nodes[0], Duration::from_secs(60)).await;
        for ((suffix, _, _, _, rule), n) in cases.iter().zip(&nodes).skip(1) {
            let r = daemon
                .wait_rule(&n.name, rule, Duration::from_secs(45))
                .await;
            assert!(r["fence"].is_null(), "{suffix}: {r}");
        }
        for n in &nodes[1..] {
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        conclude("Redfish: timeout, 500, 503, garbage, truncated, oversized, stalled, 403, TLS mismatch, expired cert, wrong password, PoweringOff, Paused", vec![Write::Taint(nodes[0].name.clone())], daemon, &rec, &nodes_of(&nodes)).await
    })
}

/// IPMI: a peer that never answers and a BMC that refuses the password fence nothing; the
/// control node, whose simulator reads off, is fenced.
fn dead_nodes_behind_faulty_ipmi_bmcs() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::ipmi("fm-ipmi", 2).await;
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let control = s.node("control", 0).await;
        s.map_ipmi(
            "wrong-password",
            &s.ipmi_sim(1).address(),
            "not-the-password",
            "timeout = \"3s\"",
        );
        let wrong = s
            .node_reporting("wrong-password", FIRST_BOOT, s.identity(1).await)
            .await;
        s.map_ipmi("silent", &silent_addr, "whatever", "timeout = \"2s\"");
        let quiet = s
            .node_reporting("silent", FIRST_BOOT, s.identity(1).await)
            .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        s.ipmi_sim(0).set_power(false);
        for n in [&control, &wrong, &quiet] {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&control, Duration::from_secs(60)).await;
        for n in [&wrong, &quiet] {
            daemon
                .wait_rule(&n.name, "power-unknown", Duration::from_secs(45))
                .await;
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        let expected = vec![Write::Taint(control.name.clone())];
        let nodes = [&control, &wrong, &quiet];
        let outcome = conclude(
            "IPMI: silent peer, wrong password",
            expected,
            daemon,
            &rec,
            &nodes,
        )
        .await;
        drop(silent);
        outcome
    })
}

/// EC2: a node whose providerID names another region is never fenced nor deleted, even
/// though an instance of that id is terminated in the configured region; the control node,
/// whose instance is stopped, is fenced.
fn ec2_node_of_another_region() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::ec2("fm-ec2", 2).await;
        let control = s.node("control", 0).await;
        let elsewhere = s
            .node_reporting("elsewhere", FIRST_BOOT, s.identity(1).await)
            .await;
        elsewhere
            .set_provider_id(&format!("aws:///us-west-2a/{}", s.instance(1)))
            .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let ec2 = s.moto().client();
        ec2.stop_instances()
            .instance_ids(s.instance(0))
            .send()
            .await
            .unwrap();
        ec2.terminate_instances()
            .instance_ids(s.instance(1))
            .send()
            .await
            .unwrap();
        for n in [&control, &elsewhere] {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&control, Duration::from_secs(60)).await;
        daemon
            .wait_rule(&elsewhere.name, "region-mismatch", Duration::from_secs(30))
            .await;
        stays_unfenced(&elsewhere, Duration::from_secs(3)).await;
        conclude(
            "EC2: a node of another region",
            vec![Write::Taint(control.name.clone())],
            daemon,
            &rec,
            &nodes_of([&control, &elsewhere]),
        )
        .await
    })
}

/// Another writer changes the Node without pause while oobfence fences it: the fence lands
/// once, with every other change kept. Whether a given write of the daemon's meets 409 Conflict
/// here is a race, so this reports the 409s it met; `tests/cluster.rs` makes them happen on
/// every write (`client_racing_a_writer`) and asserts the retry and the giving up.
fn conflicts_on_every_write_for_a_while() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-409", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hammer = {
            let (api, name, stop) = (node.nodes(), node.name.clone(), stop.clone());
            tokio::spawn(async move {
                let mut writes = 0u64;
                // Bounded: at most 60 s or 100,000 writes.
                let started = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(60)
                    && writes < 100_000
                {
                    let patch = json!({"metadata": {"labels": {"oobfence.test/churn": writes.to_string()}}});
                    if api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_ok()
                    {
                        writes += 1;
                    }
                }
                writes
            })
        };
        power_cut(&s, &node, 0).await;
        // The churn goes on until the fence has landed or a fence write has given up on it
        // (5 conflicts in a row), at most 30 s.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let m = daemon.metrics().await;
            let gave_up = sample(
                &m,
                "oobfence_actions_total{action=\"taint\",result=\"failure\"}",
            )
            .is_some();
            if gave_up || FakeNode::has_oos_taint(&node.get().await) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let churn = hammer.await.unwrap();
        wait_taint(&node, Duration::from_secs(60)).await;
        let n = node.get().await;
        assert_eq!(
            n.labels().get("oobfence.test/churn").map(String::as_str),
            Some((churn - 1).to_string().as_str()),
            "the other writer's last change was lost"
        );
        let m = daemon.metrics().await;
        let failures = sample(
            &m,
            "oobfence_actions_total{action=\"taint\",result=\"failure\"}",
        );
        daemon.stop().await;
        // What the race gave: a taint write that gave up after its retries, or the one that
        // landed saying how many 409s it met.
        let records = journal::tail(&s.journal(), &node.name, 100)
            .unwrap()
            .records;
        let retried = records
            .iter()
            .filter(|r| r.action == "taint" && r.result == "success")
            .any(|r| r.message.contains("409 Conflict"));
        report(&format!(
            "fault matrix: 409 scenario: {churn} competing writes; taint writes that gave up: {failures:?}; the landed one met 409s: {retried}"
        ));
        let expected = vec![Write::Taint(node.name.clone())];
        let seen = rec.writes_once_seen(&expected).await;
        node.delete().await;
        Outcome {
            name: "409 Conflict on the writes for a while",
            expected,
            seen,
        }
    })
}

/// A control plane of the scenario's own (the shared one must not go down under the other
/// scenarios): `scripts/test-cluster` in a directory, stopped on drop.
struct OwnCluster {
    dir: tempfile::TempDir,
    /// An API server started again by the test: its child, waited for on drop.
    restarted: Mutex<Option<std::process::Child>>,
}

impl OwnCluster {
    async fn start() -> OwnCluster {
        let dir = tempfile::tempdir().unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster");
        let out = tokio::process::Command::new(&script)
            .arg("start")
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run scripts/test-cluster");
        assert!(
            out.status.success(),
            "scripts/test-cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        OwnCluster {
            dir,
            restarted: Mutex::new(None),
        }
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }

    async fn client(&self) -> Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Client::try_from(cfg).unwrap()
    }

    fn apiserver_pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// SIGKILLs the API server and returns its command line, to start it again.
    fn kill_apiserver(&self) -> Vec<String> {
        let pid = self.apiserver_pid();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        args
    }

    /// Starts the API server again with the same arguments (same port, same etcd).
    fn restart_apiserver(&self, args: &[String]) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("kube-apiserver.log"))
            .unwrap();
        let child = std::process::Command::new(&args[0])
            .args(&args[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver again");
        std::fs::write(
            self.dir.path().join("kube-apiserver.pid"),
            child.id().to_string(),
        )
        .unwrap();
        *self.restarted.lock().unwrap() = Some(child);
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster");
        // Seconds of waiting for processes to exit, aside from the other scenarios' tasks.
        support::blocking(|| {
            let _ = std::process::Command::new(script)
                .arg("stop")
                .arg(self.dir.path())
                .stdin(std::process::Stdio::null())
                .output();
            if let Some(mut child) = self.restarted.lock().unwrap().take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        });
    }
}

/// The API server is killed (SIGKILL) as a node dies, before oobfence can write, and started
/// again 8 s later: nothing is written while it is gone, and the node is fenced once it is
/// back, on reads taken after the view is fresh again.
fn apiserver_killed_before_the_write() -> ScenarioFuture {
    Box::pin(async {
        let cluster = OwnCluster::start().await;
        let mut s = Scenario::redfish("fm-apikill", 1).await;
        s.client = cluster.client().await;
        s.set_guards("max_unhealthy = \"100%\"\nmax_view_age = \"5s\"\n");
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon_with_kubeconfig(&cluster.kubeconfig()).await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", Duration::from_secs(30)).await;
        node.die(FIRST_BOOT).await;
        let args = cluster.kill_apiserver();
        wait_for("oobfence_view_stale 1", Duration::from_secs(30), || async {
            (sample(&daemon.metrics().await, "oobfence_view_stale") == Some(1.0)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let restarted = Instant::now();
        cluster.restart_apiserver(&args);
        wait_taint(&node, Duration::from_secs(120)).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.seen(&taint).await > restarted);
        let outcome = conclude(
            "API server killed before the write, then restarted",
            vec![taint],
            daemon,
            &rec,
            &[&node],
        )
        .await;
        drop(cluster);
        outcome
    })
}

/// EC2 answers moto cannot hold still, from a fake endpoint: while DescribeInstances is
/// throttled (503 RequestLimitExceeded) nothing is fenced, not even a stopped instance's node;
/// once it answers, that node is fenced; `stopping` and `shutting-down` are never Off; an
/// instance missing from one answer and running in the next is never deleted.
fn ec2_throttling_intermediate_states_and_a_one_off_not_found() -> ScenarioFuture {
    Box::pin(async {
        let fake = FakeEc2::start().await;
        let s = Scenario::without_machines("fm-ec2fake").await;
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        s.set_aws_endpoint(&fake.endpoint());
        let mut nodes = Vec::new();
        let mut ids = Vec::new();
        for (k, suffix) in ["control", "stopping", "shutting", "flaky"]
            .into_iter()
            .enumerate()
        {
            let id = format!("i-0fa4e{k:012}");
            let (ip, dns) = (
                format!("10.1.0.{}", k + 1),
                format!("ip-10-1-0-{}.ec2.internal", k + 1),
            );
            fake.set(
                &id,
                FakeInstance {
                    state: "running".into(),
                    private_ip: ip.clone(),
                    private_dns: dns.clone(),
                    absent_for: 0,
                },
            );
            let n = s
                .node_reporting(suffix, FIRST_BOOT, KubeletIdentity::instance(&ip, &dns))
                .await;
            n.set_provider_id(&format!("aws:///us-east-1a/{id}")).await;
            nodes.push(n);
            ids.push(id);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon
                .wait_identity(&n.name, "match", Duration::from_secs(30))
                .await;
        }
        fake.throttle(true);
        fake.set_state(&ids[0], "stopped");
        fake.set_state(&ids[1], "stopping");
        fake.set_state(&ids[2], "shutting-down");
        fake.hide(&ids[3], 1);
        for n in &nodes {
            n.die(FIRST_BOOT).await;
        }
        let r = daemon
            .wait_rule(&nodes[0].name, "power-unknown", Duration::from_secs(45))
            .await;
        assert!(
            r["reason"].to_string().contains("RequestLimitExceeded"),
            "{r}"
        );
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        let answered = Instant::now();
        fake.throttle(false);
        wait_taint(&nodes[0], Duration::from_secs(60)).await;
        let taint = Write::Taint(nodes[0].name.clone());
        assert!(rec.seen(&taint).await > answered);
        for n in &nodes[1..3] {
            daemon
                .wait_rule(&n.name, "power-transitional", Duration::from_secs(30))
                .await;
        }
        let r = daemon
            .wait_rule(&nodes[3].name, "power-on", Duration::from_secs(30))
            .await;
        let reads = r["reads"].to_string();
        assert!(
            reads.contains("not_found"),
            "the one-off NotFound was never read: {r}"
        );
        for n in &nodes[1..] {
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        report(&format!(
            "fault matrix: fake EC2 answered {} requests",
            fake.requests()
        ));
        conclude(
            "EC2: throttled, stopping, shutting-down, NotFound once",
            vec![taint],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// One `oobfence run` of an `[ha]` pair, as its own process (so that it can be SIGKILLed),
/// reaching the API server through its own [`Gate`] (so that it can be cut off).
struct HaInstance {
    identity: &'static str,
    listen: String,
    gate: Gate,
    config: std::path::PathBuf,
    child: Option<tokio::process::Child>,
    log: std::path::PathBuf,
}

impl HaInstance {
    async fn new(s: &Scenario, identity: &'static str, namespace: &str) -> HaInstance {
        HaInstance::named(s, identity, identity, namespace).await
    }

    /// An instance whose files live in `dir` (two hosts may share one identity).
    async fn named(s: &Scenario, dir: &str, identity: &'static str, namespace: &str) -> HaInstance {
        let dir = s.dir().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (gate, kubeconfig) = gated_kubeconfig(&dir).await;
        let listen = format!("127.0.0.1:{}", support::k8s::free_port());
        let ha = format!(
            "[ha]\nenabled = true\nnamespace = \"{namespace}\"\nidentity = \"{identity}\"\nlease_duration = \"9s\"\nrenew_interval = \"1s\"\n"
        );
        let config = dir.join("dc.toml");
        std::fs::write(&config, s.config_text(&kubeconfig, &listen, &ha)).unwrap();
        HaInstance {
            identity,
            listen,
            gate,
            config,
            child: None,
            log: dir.join("oobfence.log"),
        }
    }

    async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
                .args(["run", "--config"])
                .arg(&self.config)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .expect("start oobfence run"),
        );
        let url = format!("http://{}/readyz", self.listen);
        wait_for(
            &format!("{} ready", self.identity),
            Duration::from_secs(30),
            || async {
                reqwest::get(&url)
                    .await
                    .ok()?
                    .status()
                    .is_success()
                    .then_some(())
            },
        )
        .await;
    }

    /// SIGKILL: no shutdown, no Lease released.
    async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    async fn leader(&self) -> Option<f64> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let m = match client
            .get(format!("http://{}/metrics", self.listen))
            .send()
            .await
        {
            Ok(r) => r.text().await.ok()?,
            Err(e) => {
                report(&format!(
                    "fault matrix: [ha] {} /metrics: {e}",
                    self.identity
                ));
                return None;
            }
        };
        sample(&m, "oobfence_leader{datacenter=\"test\"}")
    }

    async fn report(&self, node: &str) -> Option<serde_json::Value> {
        reqwest::get(format!("http://{}/nodes/{node}", self.listen))
            .await
            .ok()?
            .json()
            .await
            .ok()
    }

    async fn wait_leader(&self, want: f64, limit: Duration) -> Instant {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.leader().await == Some(want) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "{} never reached leader = {want} within {limit:?}; its log ends:\n{}",
            self.identity,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// Samples both instances for `during`: never both writing at once.
async fn never_two_leaders(a: &HaInstance, b: &HaInstance, during: Duration) {
    let start = Instant::now();
    while start.elapsed() < during {
        let (la, lb) = (a.leader().await, b.leader().await);
        assert!(!(la == Some(1.0) && lb == Some(1.0)), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn fenced_by(n: &Node) -> String {
    n.annotations()
        .get("oobfence.io/fenced-by")
        .cloned()
        .unwrap_or_default()
}

/// Two management hosts, one actor. Host a leads; a storm of three dead nodes begins and a
/// is SIGKILLed after its first fence: b takes over within the lease and the margin, fences
/// the rest, and no node is written twice. Then a comes back (standby, and `why` answers
/// there); b is cut off from the API server: b stops writing by its own clock before a can
/// take the Lease, a takes over and fences the next dead node, and lifts b's and its own
/// earlier fence when that node comes back: no fence is orphaned.
fn two_hosts_one_actor() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-ha", 5).await;
        let namespaces: Api<Namespace> = Api::all(s.client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": s.group}})).unwrap(),
            )
            .await
            .expect("create the Lease's namespace");
        let mut nodes = Vec::new();
        let mut alive = Vec::new();
        for (i, suffix) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let n = s.node(suffix, i).await;
            alive.push(Some(FakeNode::keep_alive(&[&n], FIRST_BOOT)));
            nodes.push(n);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let mut host_a = HaInstance::new(&s, "host-a", &s.group).await;
        let mut host_b = HaInstance::new(&s, "host-b", &s.group).await;
        host_a.start().await;
        host_a.wait_leader(1.0, Duration::from_secs(20)).await;
        host_b.start().await;
        never_two_leaders(&host_a, &host_b, Duration::from_secs(3)).await;
        // The standby answers `why`: the node, and that it does not write.
        let r = host_b.report(&nodes[4].name).await.unwrap();
        assert!(
            r["holds"]
                .to_string()
                .contains("standby: host-a holds the Lease"),
            "{r}"
        );

        // The storm: machines 0-2 lose power; a is killed after its first fence.
        let emu = s.redfish_emulator();
        for i in 0..3 {
            emu.set_power(i, false).await;
        }
        for i in 0..3 {
            emu.wait_power(i, "Off", Duration::from_secs(30)).await;
        }
        for i in 0..3 {
            alive[i] = None;
            nodes[i].die(FIRST_BOOT).await;
        }
        let first = wait_for("a first fence", Duration::from_secs(60), || async {
            for n in &nodes[..3] {
                let node = n.get().await;
                if FakeNode::has_oos_taint(&node) {
                    return Some(node);
                }
            }
            None
        })
        .await;
        assert!(
            fenced_by(&first).starts_with("oobfence/test@ha/host-a#"),
            "{}",
            fenced_by(&first)
        );
        let killed = Instant::now();
        host_a.kill().await;
        // Lease duration (9 s) plus the time to observe it: ~10 s on an idle machine; the
        // bound leaves room for a loaded one.
        let took_over = host_b.wait_leader(1.0, Duration::from_secs(60)).await;
        let takeover = took_over - killed;
        for n in &nodes[..3] {
            wait_taint(n, Duration::from_secs(60)).await;
        }
        // The new leader's fence budget counts its predecessor's fences too.
        wait_for(
            "b's budget counts all three fences",
            Duration::from_secs(15),
            || async {
                let m = reqwest::get(format!("http://{}/metrics", host_b.listen))
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                (sample(&m, "oobfence_fence_budget_used") == Some(3.0)).then_some(())
            },
        )
        .await;

        // a comes back as standby; b is cut off from the API server.
        host_a.start().await;
        never_two_leaders(&host_a, &host_b, Duration::from_secs(3)).await;
        // Under load the leader may miss a renewal and stand by for a moment: it is the
        // leader again once it renews. (A loaded test API server has been seen to answer
        // nothing for 20 s: the bound is for liveness, the safety is asserted below.)
        host_b.wait_leader(1.0, Duration::from_secs(90)).await;
        let cut = Instant::now();
        host_b.gate.cut();
        let b_stopped = host_b.wait_leader(0.0, Duration::from_secs(30)).await;
        let a_took_over = host_a.wait_leader(1.0, Duration::from_secs(40)).await;
        assert!(
            b_stopped < a_took_over,
            "b still believed it could write when a took the Lease"
        );
        emu.set_power(3, false).await;
        emu.wait_power(3, "Off", Duration::from_secs(30)).await;
        alive[3] = None;
        nodes[3].die(FIRST_BOOT).await;
        wait_taint(&nodes[3], Duration::from_secs(60)).await;
        let by = fenced_by(&nodes[3].get().await);
        assert!(by.starts_with("oobfence/test@ha/host-a#"), "{by}");
        // Node b (fenced by host-a or host-b in the first term) comes back: host-a lifts it.
        emu.set_power(1, true).await;
        emu.wait_power(1, "On", Duration::from_secs(30)).await;
        nodes[1].come_back("boot-2").await;
        alive[1] = Some(FakeNode::keep_alive(&[&nodes[1]], "boot-2"));
        wait_for("node b unfenced", Duration::from_secs(60), || async {
            (!FakeNode::has_oos_taint(&nodes[1].get().await)).then_some(())
        })
        .await;
        report(&format!(
            "fault matrix: [ha] takeover after SIGKILL {:.1}s; after a partition the cut-off leader stopped {:.1}s after the cut and {:.1}s before the other took over",
            takeover.as_secs_f64(),
            (b_stopped - cut).as_secs_f64(),
            (a_took_over - b_stopped).as_secs_f64()
        ));
        host_b.gate.restore();
        host_a.kill().await;
        host_b.kill().await;
        drop(alive);
        let expected: Vec<Write> = [0, 1, 2, 3]
            .iter()
            .map(|i| Write::Taint(nodes[*i].name.clone()))
            .chain([Write::Untaint(nodes[1].name.clone())])
            .collect();
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "[ha] two hosts: leader SIGKILLed mid-storm, then partitioned",
            expected,
            seen,
        }
    })
}

fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The whole chain with the example config's defaults (not_ready_grace 60 s, two Off reads
/// 5 s apart, the default guards): a machine loses power and its kubelet goes silent; its
/// Lease goes stale, oobfence reads power ahead of NotReady, the controller-manager marks the
/// node NotReady, and the taint follows at once. The timeline is printed with each step's
/// time from the power cut; what is asserted is the logic, not the clock: the fence waived
/// `not_ready_grace` because the power was attested on a stale Lease.
fn power_cut_timeline_with_the_example_defaults() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-timeline", 3).await;
        s.set_policy("");
        s.set_guards("");
        let mut nodes = Vec::new();
        for i in 0..3 {
            nodes.push(s.node(&format!("n{i}"), i).await);
        }
        let victim = &nodes[0];
        let others = FakeNode::keep_alive(&[&nodes[1], &nodes[2]], FIRST_BOOT);
        let kubelet = FakeNode::keep_alive(&[victim], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        daemon
            .wait_identity(&victim.name, "match", Duration::from_secs(60))
            .await;
        // Let the kubelet settle into its rhythm, then cut the power.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let cut_wall = jiff::Timestamp::now();
        let cut = Instant::now();
        drop(kubelet);
        s.redfish_emulator().set_power(0, false).await;
        let since_cut = |t: Instant| t.duration_since(cut).as_secs_f64();
        let (mut ahead, mut attested) = (None, None);
        let deadline = cut + Duration::from_secs(120);
        while rec.when(&Write::Taint(victim.name.clone())).is_none() {
            assert!(
                Instant::now() < deadline,
                "no fence within 120 s of the cut"
            );
            let now = Instant::now();
            if let Some(r) = daemon.report(&victim.name).await
                && r["ready"] == "Ready"
            {
                let rule = r["rule"].as_str().unwrap_or_default();
                if ahead.is_none() && rule != "node-ready" {
                    ahead = Some(now);
                }
                if attested.is_none() && rule == "pre-attested" {
                    attested = Some(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let tainted = rec.when(&Write::Taint(victim.name.clone())).unwrap();
        let not_ready = rec.not_ready_at(&victim.name);
        let renewed = victim
            .lease_renew_time()
            .await
            .map(|t| t.duration_since(cut_wall).as_secs_f64());
        let fmt = |t: Option<f64>| t.map_or("     -".to_string(), |t| format!("{t:+6.1}"));
        let mut lines = vec![
            "fault matrix: power-cut timeline, example config defaults (node-monitor grace 20 s, Lease 20 s):"
                .to_string(),
            format!("  {}s  last Lease renewal by the kubelet", fmt(renewed)),
            format!("  {}s  power cut (Redfish ForceOff), kubelet silent", fmt(Some(0.0))),
            format!(
                "  {}s  Lease stale: oobfence reads power ahead of NotReady",
                fmt(ahead.map(since_cut))
            ),
            format!(
                "  {}s  power attested Off, node still Ready",
                fmt(attested.map(since_cut))
            ),
            format!(
                "  {}s  NotReady (kube-controller-manager)",
                fmt(not_ready.map(since_cut))
            ),
            format!(
                "  {}s  out-of-service taint written",
                fmt(Some(since_cut(tainted)))
            ),
        ];
        lines.push(format!(
            "  power cut -> taint {:.1} s; NotReady -> taint {}",
            since_cut(tainted),
            not_ready.map_or("-".into(), |n| format!(
                "{:.1} s",
                tainted.saturating_duration_since(n).as_secs_f64()
            ))
        ));
        report(&lines.join("\n"));
        // The metric is observed once the daemon hears its write landed.
        wait_for("the power-cut metric", Duration::from_secs(15), || async {
            (sample(
                &daemon.metrics().await,
                "oobfence_power_cut_to_fence_seconds_count",
            ) == Some(1.0))
            .then_some(())
        })
        .await;
        daemon.stop().await;
        let fence = journal::tail(&s.journal(), &victim.name, 100)
            .unwrap()
            .records
            .into_iter()
            .find(|r| r.action == "taint" && r.result == "success")
            .expect("a fence record");
        assert_eq!(fence.rule, "confirmed-off");
        assert!(
            fence.message.contains("pre-attested") && fence.message.contains("not_ready_grace"),
            "the fence did not come from a pre-attestation: {}",
            fence.message
        );
        drop(others);
        Outcome {
            name: "power cut with the example defaults: attested ahead, fenced at NotReady",
            expected: vec![Write::Taint(victim.name.clone())],
            seen: {
                let seen = rec
                    .writes_once_seen(&[Write::Taint(victim.name.clone())])
                    .await;
                for n in &nodes {
                    n.delete().await;
                }
                seen
            },
        }
    })
}

/// A kubelet stalls for a while (a long GC pause, a saturated link to the API server) while
/// its BMC wrongly says Off: oobfence reads ahead and attests Off, then the kubelet renews its
/// Lease before the controller-manager's grace runs out. The renewal discards the reads:
/// nothing is written, and the node is healthy again.
fn a_kubelet_stall_with_a_lying_bmc_is_discarded_by_its_renewal() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-stall", 1).await;
        // Stale after 1.5 renewals of 5 s: 7.5 s, well inside the 20 s node-monitor grace.
        s.set_policy(&format!("lease_stale_after = 1.5\n{}", s.policy_lines()));
        let node = s.node("a", 0).await;
        let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        daemon
            .wait_identity(&node.name, "match", Duration::from_secs(60))
            .await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", Duration::from_secs(30)).await;
        // The kubelet renews once more, then stalls.
        drop(kubelet);
        node.renew_lease().await;
        let stalled = Instant::now();
        let r = daemon
            .wait_rule(&node.name, "pre-attested", Duration::from_secs(17))
            .await;
        assert_eq!(r["ready"], "Ready", "{r}");
        assert!(
            stalled.elapsed() < Duration::from_secs(17),
            "the stall ran too long to stay inside the grace"
        );
        // Alive again: a renewal, as the kubelet catches up.
        let renewed = jiff::Timestamp::now();
        node.renew_lease().await;
        let _alive = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        let r = daemon
            .wait_rule(&node.name, "node-ready", Duration::from_secs(10))
            .await;
        // The reads ahead are gone; one that was in flight at the renewal may still be listed,
        // but none was started after it.
        let reads = r["reads"].as_array().cloned().unwrap_or_default();
        assert!(reads.len() <= 1, "{r}");
        for read in &reads {
            let at: jiff::Timestamp = read["at"].as_str().unwrap().parse().unwrap();
            assert!(at < renewed, "a read after the renewal: {r}");
        }
        stays_unfenced(&node, Duration::from_secs(5)).await;
        conclude(
            "kubelet stall, lying BMC: the renewal discards the reads ahead",
            vec![],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// Every kubelet of the datacenter goes silent at once (the control plane, or the path to
/// it, is what broke): a lease storm. The kubelets last renewed at phases spread over half a
/// renewal interval, as real ones do, so their Leases go stale one after another; the storm
/// is counted on late Leases, before the first is stale, and oobfence reads no BMC ahead of
/// NotReady and says why.
fn most_leases_stale_at_once_reads_nothing_ahead() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-leasestorm", 4).await;
        // The example's lease_stale_after (2.5 renewals: late after 7.5 s, stale after 12.5 s
        // of a 20 s Lease), and a grace long enough that no read at NotReady (20 s and more
        // after the silence) falls in the window watched.
        let policy = s
            .policy_lines()
            .replace("not_ready_grace = \"2s\"", "not_ready_grace = \"30s\"");
        assert!(policy.contains("30s"), "{policy}");
        s.set_policy(&format!("lease_stale_after = 2.5\n{policy}"));
        let mut nodes = Vec::new();
        for i in 0..4 {
            nodes.push(s.node(&format!("n{i}"), i).await);
        }
        let kubelets = FakeNode::keep_alive(&nodes_of(&nodes), FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon
                .wait_identity(&n.name, "match", Duration::from_secs(60))
                .await;
        }
        drop(kubelets);
        let reads_total = |m: &str| support::k8s::sum_of(m, "oobfence_power_reads_total{");
        let silent = Instant::now();
        let before = reads_total(&daemon.metrics().await);
        // The last renewals, 0.8 s apart.
        for (i, n) in nodes.iter().enumerate() {
            tokio::time::sleep_until((silent + Duration::from_millis(800) * i as u32).into()).await;
            n.renew_lease().await;
        }
        wait_for("the lease storm", Duration::from_secs(20), || async {
            (sample(&daemon.metrics().await, "oobfence_lease_storm") == Some(1.0)).then_some(())
        })
        .await;
        // Past the moment the last Lease went stale (2.4 + 12.5 s, and a pass), before any
        // NotReady node's grace has run: not one read.
        wait_for("every Lease stale", Duration::from_secs(30), || async {
            let m = daemon.metrics().await;
            (sample(&m, "oobfence_leases_stale") == Some(4.0)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = reads_total(&daemon.metrics().await);
        assert!(
            silent.elapsed() < Duration::from_secs(45),
            "the check ran too late: reads at NotReady may have begun"
        );
        assert_eq!(after, before, "BMCs were read during a lease storm");
        // A stale node says why it is not read.
        let r = daemon.report(&nodes[0].name).await.unwrap();
        assert_eq!(r["rule"], "node-ready", "{r}");
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("Leases went unrenewed at once") && reason.contains("control plane"),
            "{reason}"
        );
        let _alive = FakeNode::keep_alive(&nodes_of(&nodes), FIRST_BOOT);
        wait_for("the lease storm over", Duration::from_secs(15), || async {
            (sample(&daemon.metrics().await, "oobfence_lease_storm") == Some(0.0)).then_some(())
        })
        .await;
        conclude(
            "most Leases stale at once: nothing read ahead",
            vec![],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// A line of the suite's report, written past the test harness's capture, so that it shows in
/// `scripts/test`'s output even when the suite passes.
fn report(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
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
        daemon_killed_after_its_fence_and_restarted(),
        dead_nodes_behind_faulty_redfish_bmcs(),
        dead_nodes_behind_faulty_ipmi_bmcs(),
        ec2_node_of_another_region(),
        ec2_throttling_intermediate_states_and_a_one_off_not_found(),
        apiserver_killed_before_the_write(),
        two_hosts_one_actor(),
        trust::new_aws_endpoint_by_a_reload(),
        trust::new_aws_credentials_by_a_reload(),
        trust::new_aws_credentials_read_while_the_node_runs(),
        trust::a_cloned_system_uuid_proves_no_machine(),
        ha::two_hosts_one_identity(),
        ha::a_standby_with_slow_lease_gets(),
    ];
    // The Lease scenarios time kubelet silences against the controller-manager's 20 s grace,
    // and the timeline is a measurement: on a machine the first wave leaves less loaded.
    let leases: Vec<ScenarioFuture> = vec![
        power_cut_timeline_with_the_example_defaults(),
        a_kubelet_stall_with_a_lying_bmc_is_discarded_by_its_renewal(),
        most_leases_stale_at_once_reads_nothing_ahead(),
    ];
    // The 409 scenario writes to the API server as fast as it can: alone, after the others,
    // so that it slows nobody's Lease renewals but its own.
    let alone: Vec<ScenarioFuture> = vec![conflicts_on_every_write_for_a_while()];
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    let mut i = 0;
    for wave in [scenarios, leases, alone] {
        // Each scenario on its own task, so that one's panic names it and the others finish.
        let handles: Vec<_> = wave.into_iter().map(tokio::spawn).collect();
        for h in handles {
            match h.await {
                Ok(o) => outcomes.push(o),
                Err(e) => failed.push(format!("scenario #{i}: {e}")),
            }
            i += 1;
        }
    }
    let mut false_fences = 0;
    for o in &outcomes {
        let extra = o.false_writes();
        let missing = o.missing_writes();
        false_fences += extra.len();
        report(&format!(
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
        ));
        if !missing.is_empty() {
            failed.push(format!("{}: expected writes missing: {missing:?}", o.name));
        }
    }
    report(&format!(
        "fault matrix: {} scenarios, {false_fences} false fences",
        outcomes.len()
            + failed
                .iter()
                .filter(|f| f.starts_with("scenario #"))
                .count()
    ));
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(false_fences, 0);
}
