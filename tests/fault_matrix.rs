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
//!
//! This file is the rig (the write recorder, the outcome, the helpers every scenario uses) and
//! the one test that runs them all; the scenarios live by family in `tests/fault_matrix/`:
//! guards, daemon_life, bmc_faults, ec2, ha_handover and ha, leases, trust, hung (opt-in
//! actuation: hung nodes, their power commands counted too).

mod support;

#[path = "fault_matrix/bmc_faults.rs"]
mod bmc_faults;
#[path = "fault_matrix/daemon_life.rs"]
mod daemon_life;
#[path = "fault_matrix/ec2.rs"]
mod ec2;
#[path = "fault_matrix/guards.rs"]
mod guards;
#[path = "fault_matrix/ha.rs"]
mod ha;
#[path = "fault_matrix/ha_handover.rs"]
mod ha_handover;
#[path = "fault_matrix/hung.rs"]
mod hung;
#[path = "fault_matrix/leases.rs"]
mod leases;
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
use support::gate::{Gate, gated_kubeconfig};
use support::k8s::{
    FakeNode, KubeletIdentity, RunningDaemon, TEST_LABEL, sample, taints_owner, wait_for,
};
use support::odd_bmc::{self, OddBmc};
use support::scenario::{FIRST_BOOT, Scenario};
// What more than one family of scenarios uses, from the file of the first.
use ha_handover::{HaInstance, fenced_by, never_two_leaders};
use leases::is_ready;

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
        guards::storm_in_one_domain_while_another_fences(),
        guards::most_bmcs_unreachable_freezes_then_thaws(),
        guards::pause_file_on_and_off(),
        guards::pause_configmap_on_and_off(),
        guards::api_unreachable_longer_than_the_staleness_limit(),
        guards::flapping_node_is_held(),
        daemon_life::config_broken_under_a_running_daemon(),
        daemon_life::daemon_killed_after_its_fence_and_restarted(),
        bmc_faults::dead_nodes_behind_faulty_redfish_bmcs(),
        bmc_faults::dead_nodes_behind_faulty_ipmi_bmcs(),
        ec2::ec2_node_of_another_region(),
        ec2::ec2_throttling_intermediate_states_and_a_one_off_not_found(),
        daemon_life::apiserver_killed_before_the_write(),
        ha_handover::two_hosts_one_actor(),
        trust::new_aws_endpoint_by_a_reload(),
        trust::new_aws_credentials_by_a_reload(),
        trust::new_aws_credentials_read_while_the_node_runs(),
        trust::a_cloned_system_uuid_proves_no_machine(),
        ha::two_hosts_one_identity(),
        ha::a_standby_with_slow_lease_gets(),
        hung::hung_nodes_whose_bmcs_refuse_or_ignore_the_power_off(),
        hung::a_kubelet_back_before_the_power_off_restarts_the_silence(),
        hung::hung_nodes_beyond_the_power_budget_wait(),
        hung::a_rack_of_hung_nodes_is_a_storm_not_a_power_off(),
        hung::two_hosts_one_power_off(),
    ];
    // The Lease scenarios time kubelet silences against the controller-manager's 20 s grace,
    // and the timeline is a measurement: on a machine the first wave leaves less loaded.
    let lease_wave: Vec<ScenarioFuture> = vec![
        leases::power_cut_timeline(true),
        leases::power_cut_timeline(false),
        leases::a_kubelet_stall_with_a_lying_bmc_is_discarded_by_its_renewal(),
        leases::a_stall_that_renews_before_the_proof_is_never_released(),
        guards::a_rack_gone_silent_while_ready_is_a_storm_with_the_release(),
        leases::most_leases_stale_at_once_reads_nothing_ahead(),
    ];
    // The 409 scenario writes to the API server as fast as it can: alone, after the others,
    // so that it slows nobody's Lease renewals but its own.
    let alone: Vec<ScenarioFuture> = vec![daemon_life::conflicts_on_every_write_for_a_while()];
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    let mut i = 0;
    for wave in [scenarios, lease_wave, alone] {
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
