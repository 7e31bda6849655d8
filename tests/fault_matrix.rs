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
//! This file is the rig (the write recorder, the helpers every scenario uses) and the one test
//! that runs them all (`OOBFENCE_MATRIX_ONLY=WORD,...` runs those whose name has a word);
//! `outcome.rs` judges what each scenario wrote; the scenarios live by family in
//! `tests/fault_matrix/`:
//! guards, daemon_life, bmc_faults, ec2, ha_handover and ha, leases, trust, agents, levels
//! (fencing levels and a person's word when the BMC goes dark with its machine), hung (opt-in
//! actuation: hung nodes, their power commands counted too), incident (a night told back by
//! `oobfence timeline`).

mod support;

#[path = "fault_matrix/agents.rs"]
mod agents;
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
#[path = "fault_matrix/hung_never.rs"]
mod hung_never;
#[path = "fault_matrix/incident.rs"]
mod incident;
#[path = "fault_matrix/leases.rs"]
mod leases;
#[path = "fault_matrix/levels.rs"]
mod levels;
#[path = "fault_matrix/outcome.rs"]
mod outcome;
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
    FakeNode, KubeletIdentity, RunningDaemon, TEST_LABEL, hang_under_watch, sample, taints_owner,
    wait_for,
};
use support::odd_bmc::{self, OddBmc};
use support::scenario::{FIRST_BOOT, Scenario};
// What more than one family of scenarios uses, from the file of the first.
use ha_handover::{HaInstance, fenced_by, leader_and_standby, lease_namespace, never_two_leaders};
use leases::is_ready;
use outcome::{Failed, Outcome, summary};

/// The bound of a wait on an event that takes a few power reads and API calls: on a loaded
/// 2-core machine one of those may take 10 s (moto took 6 to 11 s an answer beside another
/// build). A wait returns at its event, so the bound costs nothing while things work.
const EVENT_BOUND: Duration = Duration::from_secs(180);

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

/// Writes as a recorder sees them, each with when it was seen.
type Seen = Arc<Mutex<Vec<(Instant, Write)>>>;

tokio::task_local! {
    /// What every recorder the running scenario started has seen: a scenario that panics
    /// before its end says nothing of its writes, and they still count.
    static SCENARIO_WRITES: Arc<Mutex<Vec<Seen>>>;
}

/// Every out-of-service taint added or removed and every Node deleted in a group, from a
/// watch on the API server: what the daemon actually wrote, whatever it says about itself.
struct WriteRecorder {
    seen: Seen,
    /// When each node was first seen not Ready, from the same watch.
    not_ready: Arc<Mutex<BTreeMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteRecorder {
    async fn start(client: &Client, group: &str) -> WriteRecorder {
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let _ = SCENARIO_WRITES.try_with(|all| all.lock().unwrap().push(seen.clone()));
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
        wait_for(&format!("the recorder sees {w:?}"), EVENT_BOUND, || async {
            self.when(w)
        })
        .await
    }

    /// The writes seen, once every one of `expected` is among them or 60 s have passed (the
    /// watch may lag the GETs that showed them; a write never made is reported missing).
    async fn writes_once_seen(&self, expected: &[Write]) -> Vec<Write> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60)
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
    emu.wait_power(i, "Off", EVENT_BOUND).await;
    node.die(FIRST_BOOT).await;
}

/// [`wait_taint`] for a node the daemon on `listen` must fence: a timeout shows what the
/// daemon made of the node (its last report), not only that no taint came.
async fn wait_fenced_by(listen: &str, node: &FakeNode, limit: Duration) {
    support::k8s::wait_node_report(
        listen,
        &node.name,
        "its fence",
        limit,
        |r| !r["fence"].is_null(),
        String::new,
    )
    .await;
    wait_taint(node, EVENT_BOUND).await;
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

/// Waits until the scenario's journal tells each of `story` (the datacenter's events, by
/// their `what`: `storm began`), in that order.
async fn wait_journal_tells(s: &Scenario, story: &[&str]) {
    wait_for(
        &format!("the journal to tell {story:?} in order"),
        EVENT_BOUND,
        || async {
            let t = journal::timeline(&s.journal(), &journal::Filter::default()).ok()?;
            let mut told = t.events.iter().filter(|e| e.node.is_none());
            story
                .iter()
                .all(|what| told.any(|e| e.what == *what))
                .then_some(())
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

/// A scenario of the matrix, named by the call that makes it.
macro_rules! scenario {
    ($($call:tt)+) => {
        (stringify!($($call)+), $($call)+)
    };
}

/// Whether a scenario runs: all of them, or with `OOBFENCE_MATRIX_ONLY=WORD,...` those whose
/// name contains one of the words (to run one scenario while working on it).
fn selected(name: &str) -> bool {
    match std::env::var("OOBFENCE_MATRIX_ONLY") {
        Ok(only) if !only.trim().is_empty() => only
            .split(',')
            .any(|w| !w.trim().is_empty() && name.contains(w.trim())),
        _ => true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fault_matrix() {
    let scenarios: Vec<(&'static str, ScenarioFuture)> = vec![
        scenario!(guards::storm_in_one_domain_while_another_fences()),
        scenario!(guards::a_node_proven_off_ahead_that_makes_its_rack_a_storm()),
        scenario!(guards::most_bmcs_unreachable_freezes_then_thaws()),
        scenario!(guards::pause_file_on_and_off()),
        scenario!(guards::pause_configmap_on_and_off()),
        scenario!(incident::an_incident_reconstructed_by_the_timeline()),
        scenario!(guards::api_unreachable_longer_than_the_staleness_limit()),
        scenario!(guards::flapping_node_is_held()),
        scenario!(daemon_life::config_broken_under_a_running_daemon()),
        scenario!(daemon_life::daemon_killed_after_its_fence_and_restarted()),
        scenario!(bmc_faults::dead_nodes_behind_faulty_redfish_bmcs()),
        scenario!(bmc_faults::dead_nodes_behind_faulty_ipmi_bmcs()),
        scenario!(ec2::ec2_node_of_another_region()),
        scenario!(ec2::ec2_throttling_intermediate_states_and_a_one_off_not_found()),
        scenario!(daemon_life::apiserver_killed_before_the_write()),
        scenario!(ha_handover::two_hosts_one_actor()),
        scenario!(trust::new_aws_endpoint_by_a_reload()),
        scenario!(trust::new_aws_credentials_by_a_reload()),
        scenario!(trust::new_aws_credentials_read_while_the_node_runs()),
        scenario!(trust::a_cloned_system_uuid_proves_no_machine()),
        scenario!(ha::two_hosts_one_identity()),
        scenario!(ha::a_standby_with_slow_lease_gets()),
        scenario!(hung::hung_nodes_whose_bmcs_refuse_or_ignore_the_power_off()),
        scenario!(hung::a_kubelet_back_before_the_power_off_restarts_the_silence()),
        scenario!(hung::hung_nodes_beyond_the_power_budget_wait()),
        scenario!(hung::a_rack_of_hung_nodes_is_a_storm_not_a_power_off()),
        scenario!(hung::two_hosts_one_power_off()),
        scenario!(hung_never::abandoned_or_maintained_nodes_are_never_powered_off()),
        scenario!(hung_never::a_persons_untaint_after_a_power_off_brings_no_second_power_off()),
        scenario!(hung_never::a_takeover_after_a_power_cycle_keeps_the_power_budget()),
        scenario!(agents::a_suspended_vm_behind_a_real_agent_is_never_fenced()),
        scenario!(levels::a_dark_bmc_and_an_outlet_drawing_nothing_fence_through_level_2()),
        scenario!(levels::a_dual_fed_machine_with_one_feed_drawing_is_never_fenced()),
        scenario!(levels::a_bmc_that_answers_on_outweighs_an_outlet_that_reads_off()),
        scenario!(levels::a_persons_word_fences_a_dark_node_until_its_new_boot()),
        scenario!(levels::a_confirmation_of_an_older_boot_is_refused()),
        scenario!(levels::a_dark_rack_is_never_fenced_from_reads()),
    ];
    // The Lease scenarios time kubelet silences against the controller-manager's 20 s grace,
    // and the timeline is a measurement: on a machine the first wave leaves less loaded.
    let lease_wave: Vec<(&'static str, ScenarioFuture)> = vec![
        scenario!(leases::power_cut_timeline(true)),
        scenario!(leases::power_cut_timeline(false)),
        scenario!(leases::a_kubelet_stall_with_a_lying_bmc_is_discarded_by_its_renewal()),
        scenario!(leases::a_stall_that_renews_before_the_proof_is_never_released()),
        scenario!(guards::a_rack_gone_silent_while_ready_is_a_storm_with_the_release()),
        scenario!(leases::most_leases_stale_at_once_reads_nothing_ahead()),
    ];
    // The 409 scenario writes to the API server as fast as it can: alone, after the others,
    // so that it slows nobody's Lease renewals but its own.
    let alone: Vec<(&'static str, ScenarioFuture)> = vec![scenario!(
        daemon_life::conflicts_on_every_write_for_a_while()
    )];
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut failed = Vec::new();
    for wave in [scenarios, lease_wave, alone] {
        // Each scenario on its own task, so that one's panic names it and the others finish;
        // its recorders' writes kept beside it, so that a panic does not hide them.
        let handles: Vec<_> = wave
            .into_iter()
            .filter(|(name, _)| selected(name))
            .map(|(name, future)| {
                let writes: Arc<Mutex<Vec<Seen>>> = Arc::default();
                let task = tokio::spawn(SCENARIO_WRITES.scope(writes.clone(), future));
                (name, writes, task)
            })
            .collect();
        for (name, writes, task) in handles {
            match task.await {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    let seen = writes
                        .lock()
                        .unwrap()
                        .iter()
                        .flat_map(|s| s.lock().unwrap().clone())
                        .map(|(_, w)| w)
                        .collect();
                    failed.push(Failed {
                        name,
                        why: e.to_string(),
                        seen,
                    });
                }
            }
        }
    }
    let (lines, false_fences) = summary(&outcomes, &failed);
    for line in &lines {
        report(line);
    }
    report(&format!(
        "fault matrix: ran in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    let mut problems: Vec<String> = failed
        .iter()
        .map(|f| format!("{}: {}", f.name, f.why))
        .collect();
    for o in &outcomes {
        let missing = o.missing_writes();
        if !missing.is_empty() {
            problems.push(format!("{}: expected writes missing: {missing:?}", o.name));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(false_fences, 0);
}
