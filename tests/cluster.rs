//! End to end against a real kube-apiserver (OOBFENCE_TEST_KUBECONFIG) and a real Redfish
//! emulator (sushy-tools): Nodes go NotReady, BMCs say Off or On, and oobfence must fence,
//! refuse, or unfence exactly as its rules say.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use oobfence::cluster::{self, Cluster, ClusterError, RecordedAttachment};
use oobfence::decision::{GuardPurpose, WriteGuard};
use support::k8s::{
    FakeNode, KubeletIdentity, TEST_LABEL, annotation, events_for, keep_taint, sample, taints,
    taints_owner, unique, volume_attachment, wait_for,
};
use support::scenario::{FIRST_BOOT, Scenario, UNREACHABLE_BMC_PASSWORD};

const POWER_CHANGE: Duration = Duration::from_secs(30);
// Generous: a loaded 2-core machine has been seen to take over 45 s for a decision these tests
// expect in seconds; a wait that times out shows the daemon's last report (wait_fenced).
const DECISION: Duration = Duration::from_secs(90);

async fn node_has(client: &Client, name: &str, pred: impl Fn(&Node) -> bool) -> Option<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let n = api.get(name).await.ok()?;
    pred(&n).then_some(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_a_dead_node_whose_bmc_reads_off_and_unfences_it_on_return() {
    let s = Scenario::redfish("fence", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let dead = s.node("a", 0).await;
    s.map("b", 1);
    let healthy = s.node_reporting("b", "boot-9", s.identity(1).await).await;
    let dead_name = dead.name.clone();
    // Live kubelets: a Lease left to go stale would make the node a suspect, not healthy.
    let kubelet = FakeNode::keep_alive(&[&dead], FIRST_BOOT);
    let _healthy_kubelet = FakeNode::keep_alive(&[&healthy], "boot-9");
    let daemon = s.daemon().await;

    // While healthy, oobfence learns that each BMC answers for its node's machine.
    let report = daemon.wait_identity(&dead_name, "match", DECISION).await;
    assert_eq!(report["state"], "healthy");
    assert!(
        report["identity"]["detail"]
            .as_str()
            .unwrap()
            .contains(&emu.uuid(0)),
        "{report}"
    );

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    dead.die("boot-1").await;

    daemon.wait_fenced(&dead_name, DECISION).await;
    let fenced = wait_for("out-of-service taint", POWER_CHANGE, || {
        node_has(&client, &dead_name, FakeNode::has_oos_taint)
    })
    .await;
    let t = taints(&fenced);
    assert!(t.contains(&keep_taint()), "other taints survive: {t:?}");
    let oos = t
        .iter()
        .find(|t| t.key == cluster::OUT_OF_SERVICE_KEY)
        .unwrap();
    assert_eq!(oos.value.as_deref(), Some("nodeshutdown"));
    assert_eq!(oos.effect, "NoExecute");
    assert_eq!(
        annotation(&fenced, cluster::ANNOTATION_FENCED_BOOT_ID).as_deref(),
        Some("boot-1")
    );
    assert!(annotation(&fenced, cluster::ANNOTATION_FENCED_AT).is_some());
    let report = daemon
        .wait_rule(&dead_name, "fenced-awaiting-recovery", DECISION)
        .await;
    assert_eq!(report["state"], "fenced");
    let reads = report["reads"].as_array().unwrap();
    let offs = reads.iter().filter(|r| r["result"] == "off").count();
    assert!(offs >= 2, "fenced on at least two Off reads: {reads:?}");
    let events = events_for(&client, &dead_name).await;
    let fenced_event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceFenced"))
        .expect("an OobfenceFenced event");
    assert!(
        fenced_event.message.as_deref().unwrap().contains("Off"),
        "{fenced_event:?}"
    );
    assert!(!FakeNode::has_oos_taint(&healthy.get().await));

    // Power back on: a new boot, Ready again. The fence comes off, the other taint stays.
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    dead.come_back("boot-2").await;
    // A live kubelet from now on: the unfence must not race the controller marking the node
    // NotReady again for want of renewals.
    let _back_kubelet = FakeNode::keep_alive(&[&dead], "boot-2");
    let back = wait_for("taint removed", DECISION, || {
        node_has(&client, &dead_name, |n| !FakeNode::has_oos_taint(n))
    })
    .await;
    assert!(taints(&back).contains(&keep_taint()));
    assert_eq!(annotation(&back, cluster::ANNOTATION_FENCED_AT), None);
    assert_eq!(annotation(&back, cluster::ANNOTATION_FENCED_BOOT_ID), None);
    let events = events_for(&client, &dead_name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceUnfenced"))
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_actions_total{action=\"taint\",result=\"success\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("oobfence_actions_total{action=\"untaint\",result=\"success\"} 1"),
        "{metrics}"
    );
    assert!(!FakeNode::has_oos_taint(&healthy.get().await));
    daemon.stop().await;
    dead.delete().await;
    healthy.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_fences_a_node_whose_bmc_reads_on() {
    let s = Scenario::redfish("on", 1).await;
    let client = s.client.clone();
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;

    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "power-on", DECISION).await;
    assert_eq!(report["state"], "blocked");
    // Keep watching through several more re-reads: still nothing written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let n = node.get().await;
    assert!(!FakeNode::has_oos_taint(&n), "{:?}", taints(&n));
    assert_eq!(annotation(&n, cluster::ANNOTATION_FENCED_AT), None);
    assert!(
        events_for(&client, &name)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceBlocked"))
    );
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_fences_when_the_bmc_is_unreachable_and_why_says_why() {
    let s = Scenario::without_machines("unreach").await;
    s.map_unreachable("a");
    let node = s
        .node_reporting("a", "boot-1", KubeletIdentity::default())
        .await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    node.die("boot-1").await;
    daemon.wait_rule(&name, "power-unknown", DECISION).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));

    let out = support::cli::oobfence_async(&["why", &name], &daemon.config_path).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "why failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rule power-unknown"), "{stdout}");
    assert!(stdout.contains("unreachable"), "{stdout}");
    assert!(stdout.contains("NotReady since"), "{stdout}");
    assert!(stdout.contains("power reads (newest last)"), "{stdout}");
    assert!(!stdout.contains(UNREACHABLE_BMC_PASSWORD), "{stdout}");
    assert!(
        stdout.contains("FAILED; no answer since the start"),
        "{stdout}"
    );
    // The table of every watched node, as the operator lists them.
    let out = support::cli::oobfence_async(&["nodes"], &daemon.config_path).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NODE") && header.contains("LAST ANSWER"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("no row for {name}: {table}"));
    for cell in ["blocked", "power-unknown", "redfish", "FAILED", "NotReady"] {
        assert!(row.contains(cell), "{cell} in {row:?}");
    }
    assert!(
        table.trim_end().ends_with("1 node(s): 1 blocked"),
        "{table}"
    );
    let out =
        support::cli::oobfence_async(&["nodes", "--state", "healthy"], &daemon.config_path).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        !table.contains(&name) && table.contains("0 node(s): none"),
        "{table}"
    );
    // A source that never answered: its last success is 0, which the shipped alert catches.
    let metrics = daemon.metrics().await;
    let never = format!(
        "oobfence_power_source_last_success_timestamp_seconds{{node=\"{name}\",backend=\"redfish\"}} 0"
    );
    assert!(metrics.contains(&never), "{metrics}");

    // A name the daemon does not watch: said in those words, not as an HTTP error.
    let ghost = format!("{name}-typo");
    let out = support::cli::oobfence_async(&["why", &ghost], &daemon.config_path).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("unknown node {ghost:?}")),
        "{stderr}"
    );
    assert!(!stderr.contains("404"), "{stderr}");
    daemon.stop().await;
    node.delete().await;
}

/// A BMC that says Off while its node's kubelet goes on living reads another machine or
/// misreports this one: found while the node is healthy (metric, Event, `why`), and its Off
/// never fences the node when it does go NotReady.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_reads_off_while_its_node_lives_is_never_trusted_to_fence() {
    let s = Scenario::redfish("offalive", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    // The BMC says Off from the start; the kubelet is alive all along.
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let daemon = s.daemon().await;

    let problem =
        format!("oobfence_node_identity_problem{{node=\"{name}\",problem=\"off-while-alive\"}} 1");
    let metrics = wait_for("the contradiction in the metrics", DECISION, || async {
        let m = daemon.metrics().await;
        m.contains(&problem).then_some(m)
    })
    .await;
    // The health read answered (Off is an answer): its time is the source's last success.
    let prefix = format!(
        "oobfence_power_source_last_success_timestamp_seconds{{node=\"{name}\",backend=\"redfish\"}} "
    );
    let last_success: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
        .parse()
        .unwrap();
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(
        (now - 120.0..=now + 1.0).contains(&last_success),
        "{last_success} vs now {now}"
    );
    let report = daemon.report(&name).await.unwrap();
    assert_eq!(report["state"], "healthy", "{report}");
    let events = events_for(&client, &name).await;
    let event = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfencePowerSourceOffWhileAlive"))
        .unwrap_or_else(|| panic!("no OobfencePowerSourceOffWhileAlive Event: {events:?}"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let out = support::cli::oobfence_async(&["why", &name], &daemon.config_path).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("UNTRUSTED: the kubelet went on living"),
        "{stdout}"
    );

    // The node dies now: the BMC's Off is no proof, however often it repeats it.
    kubelet.stop().await;
    node.die(FIRST_BOOT).await;
    let report = daemon.wait_rule(&name, "off-while-alive", DECISION).await;
    assert_eq!(report["state"], "blocked");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(&format!(
            "oobfence_node_blocked{{node=\"{name}\",reason=\"off-while-alive\"}} 1"
        )),
        "{metrics}"
    );
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_node_action_deletes_the_node_and_keeps_a_backup() {
    let s = Scenario::redfish("delete", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon_with_policy("action = \"delete-node\"").await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    wait_for("node deleted", DECISION, || async {
        node.try_get().await.is_none().then_some(())
    })
    .await;
    let events = events_for(&client, &name).await;
    let backup = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("OobfenceNodeDeleted"))
        .expect("backup event before the delete");
    let msg = backup.message.as_deref().unwrap();
    assert!(msg.contains(TEST_LABEL) && msg.contains(&s.group), "{msg}");
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_decides_but_writes_nothing() {
    let s = Scenario::redfish("dry", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let before = node.get().await;
    let daemon = s.daemon_with_policy("dry_run = true").await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "dry-run", DECISION).await;
    assert_eq!(report["step"], "would_fence");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = node.get().await;
    // The node lifecycle controller adds its not-ready taints; oobfence adds nothing.
    assert!(!FakeNode::has_oos_taint(&after), "{:?}", taints(&after));
    assert!(taints(&after).contains(&keep_taint()));
    let ours = |n: &Node| -> Vec<String> {
        n.annotations()
            .keys()
            .filter(|k| k.starts_with("oobfence.io/"))
            .cloned()
            .collect()
    };
    assert!(ours(&before).is_empty());
    assert!(ours(&after).is_empty(), "{:?}", after.annotations());
    assert!(
        events_for(&client, &name)
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceWouldFence"))
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_would_act_total{action=\"taint\"} 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("oobfence_actions_total{"), "{metrics}");
    daemon.stop().await;
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_with_the_same_boot_id_keeps_its_fence() {
    let s = Scenario::redfish("sameboot", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    wait_for("fenced", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    emu.set_power(0, true).await;
    emu.wait_power(0, "On", POWER_CHANGE).await;
    node.come_back("boot-1").await;
    daemon
        .wait_rule(&name, "recovered-same-boot-id", DECISION)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(FakeNode::has_oos_taint(&node.get().await));
    daemon.stop().await;
    node.delete().await;
}

/// The taint write survives a concurrent writer: another writer changes the Node between
/// oobfence's fresh read and its write, twice, so the resourceVersion precondition makes the API
/// server answer 409 twice; the bounded retry reads again and writes the full list on the third
/// round, and the other writer's change stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taint_write_that_meets_409_reads_again_and_keeps_the_other_writers_change() {
    let client = support::k8s::client().await;
    let name = unique("conflict");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    let (racing, competing) = support::k8s::client_racing_a_writer(client.clone(), &name, 2);
    let cluster = Cluster::new(racing, "test");
    let write = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect("taint written despite the other writer");
    assert_eq!(competing.load(std::sync::atomic::Ordering::SeqCst), 2);
    // At least: the controller-manager may write the NotReady node too (its own 409s).
    assert!(
        write.attempts >= 3,
        "two 409s, then the write: {}",
        write.attempts
    );
    let n = node.get().await;
    assert!(FakeNode::has_oos_taint(&n));
    assert!(taints(&n).contains(&keep_taint()));
    assert_eq!(
        n.labels().get("competing-writer").map(String::as_str),
        Some("1"),
        "the other writer's last change was lost"
    );
    // Writing again (a decision from a lagging cache) is a no-op, not a second taint.
    cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect("repeat write");
    let n = node.get().await;
    let oos = taints(&n)
        .iter()
        .filter(|t| t.key == cluster::OUT_OF_SERVICE_KEY)
        .count();
    assert_eq!(oos, 1);
    node.delete().await;
}

/// A writer that changes the Node between every read and write of oobfence's: the taint write
/// gives up after its bounded attempts with the 409 as its error, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taint_write_that_keeps_meeting_409_gives_up_and_writes_nothing() {
    let client = support::k8s::client().await;
    let name = unique("conflict-forever");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    let (racing, competing) =
        support::k8s::client_racing_a_writer(client.clone(), &name, usize::MAX);
    let cluster = Cluster::new(racing, "test");
    let err = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect_err("a write that never stops meeting 409 gives up");
    assert!(
        matches!(&err, ClusterError::Api(kube::Error::Api(s)) if s.code == 409),
        "the error is the 409: {err:?}"
    );
    assert_eq!(
        competing.load(std::sync::atomic::Ordering::SeqCst),
        cluster::CONFLICT_ATTEMPTS,
        "one read and one 409 per attempt"
    );
    let n = node.get().await;
    assert!(!FakeNode::has_oos_taint(&n));
    assert!(taints(&n).contains(&keep_taint()));
    node.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_refuse_a_node_re_registered_under_the_same_name() {
    let client = support::k8s::client().await;
    let group = unique("replaced");
    let name = format!("{group}-a");
    let cluster = Cluster::new(client.clone(), "test");
    let node = FakeNode::create(&client, &name, &group, "boot-1").await;
    let old = node.get().await;
    node.delete().await;
    wait_for("old node gone", Duration::from_secs(10), || async {
        node.try_get().await.is_none().then_some(())
    })
    .await;
    let node = FakeNode::create(&client, &name, &group, "boot-2").await;
    node.die("boot-2").await;
    let mut old_guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    old_guard.uid = old.uid().unwrap();
    let e = cluster.delete_node(&name, &old_guard).await.unwrap_err();
    assert!(matches!(e, ClusterError::NodeReplaced { .. }), "{e}");
    let e = cluster
        .apply_fence_taint(&name, &old_guard, "test")
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::NodeReplaced { .. }), "{e}");
    let n = node.get().await;
    assert!(!FakeNode::has_oos_taint(&n));
    // And a Ready node is never tainted, whatever the caller believed.
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    node.come_back("boot-2").await;
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::Abandoned(_)), "{e}");
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    node.delete().await;
}

/// The path a real outage takes without pre-attestation: the kubelet simply stops,
/// kube-controller-manager's node lifecycle controller marks the node Ready=Unknown when its
/// Lease goes stale, and only then does oobfence start counting its grace. (With
/// pre-attestation, the fault matrix's timeline scenario takes the same path.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_controller_marks_unknown_is_fenced() {
    let s = Scenario::redfish("lifecycle", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon_with_policy("pre_attest = false\n").await;
    emu.set_power(0, false).await;
    // The fake driver can lose a reset under load: waited for (and sent again) as elsewhere.
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    // No status post and no Lease renewal from here on: the controller must notice.
    let unknown = wait_for(
        "node lifecycle controller marks the node Ready=Unknown",
        Duration::from_secs(90),
        || async {
            let n = node.get().await;
            let c = support::k8s::ready_condition_of(&n)?;
            (c.status == "Unknown").then_some(n)
        },
    )
    .await;
    assert!(!FakeNode::has_oos_taint(&unknown));
    daemon.wait_fenced(&name, DECISION).await;
    let fenced = wait_for("fenced after Ready=Unknown", POWER_CHANGE, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    let fenced_at: jiff::Timestamp = annotation(&fenced, cluster::ANNOTATION_FENCED_AT)
        .unwrap()
        .parse()
        .unwrap();
    let since = support::k8s::ready_condition_of(&unknown)
        .unwrap()
        .last_transition_time
        .unwrap()
        .0;
    assert!(
        fenced_at.duration_since(since) >= jiff::SignedDuration::from_secs(2),
        "fenced at {fenced_at}, NotReady since {since}: the grace period was not respected"
    );
    daemon.stop().await;
    node.delete().await;
}

/// The write re-checks, on its fresh GET, what the decision used: a node that booted again, a
/// kubelet that renewed its Lease, or an Off read gone stale while the write was on its way
/// abandons the write; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_write_is_abandoned_when_anything_the_decision_used_moved() {
    let client = support::k8s::client().await;
    let group = unique("recheck");
    let name = format!("{group}-a");
    let cluster = Cluster::new(client.clone(), "test");
    let node = FakeNode::create(&client, &name, &group, "boot-1").await;
    node.die("boot-1").await;

    // The machine booted again (new bootID) between the reads and the write.
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    node.set_status("False", jiff::Timestamp::now(), "boot-2")
        .await;
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("bootID")),
        "{e}"
    );
    let e = cluster.delete_node(&name, &guard).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("bootID")),
        "{e}"
    );

    // The kubelet renewed its Lease after the decision.
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    node.renew_lease().await;
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("Lease")),
        "{e}"
    );

    // The newest Off read is older than read_max_age by the time of the write.
    let mut guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    guard.evidence_at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(31);
    let e = cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClusterError::Abandoned(m) if m.contains("old at write time")),
        "{e}"
    );
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    assert!(node.try_get().await.is_some(), "never deleted");

    // Nothing moved: written.
    let guard = support::k8s::fence_guard_for(&client, &node.get().await).await;
    cluster
        .apply_fence_taint(&name, &guard, "test")
        .await
        .expect("taint");
    let n = node.get().await;
    assert!(FakeNode::has_oos_taint(&n));
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_FENCED_BY).as_deref(),
        Some(cluster.actor())
    );
    node.delete().await;
}

/// A fence placed by another oobfence (another datacenter, or another host) is never lifted
/// nor its record cleared here, even with a guard that would otherwise pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_oobfences_fence_is_never_lifted() {
    let client = support::k8s::client().await;
    let group = unique("foreign");
    let name = format!("{group}-a");
    let me = Cluster::with_actor(client.clone(), "test", "oobfence/test@mgmt1");
    let other = Cluster::with_actor(client.clone(), "test", "oobfence/test@mgmt2");
    let node = FakeNode::create(&client, &name, &group, "boot-1").await;
    node.die("boot-1").await;
    other
        .apply_fence_taint(
            &name,
            &support::k8s::fence_guard_for(&client, &node.get().await).await,
            "test",
        )
        .await
        .expect("the other host fences");
    node.come_back("boot-2").await;
    let n = node.get().await;
    let unfence = WriteGuard {
        purpose: GuardPurpose::Unfence,
        lease_renew_time: None,
        ..support::k8s::fence_guard_for(&client, &n).await
    };
    let e = me.remove_fence_taint(&name, &unfence).await.unwrap_err();
    assert!(
        matches!(&e, ClusterError::Precondition(m) if m.contains("another oobfence")),
        "{e}"
    );
    let e = me
        .clear_fence_record(&name, &n.uid().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, ClusterError::Precondition(_)), "{e}");
    let n = node.get().await;
    assert!(FakeNode::has_oos_taint(&n));
    assert_eq!(
        annotation(&n, cluster::ANNOTATION_FENCED_BY).as_deref(),
        Some("oobfence/test@mgmt2")
    );
    // Its own daemon lifts it, once the re-check passes.
    other
        .remove_fence_taint(&name, &unfence)
        .await
        .expect("untaint");
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    node.delete().await;
}

/// After a node delete only the VolumeAttachments recorded before it go (name and uid): one
/// created since, or re-created under a recorded name, belongs to a node re-registered under
/// the same name and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_recorded_volume_attachments_are_deleted() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let client = support::k8s::client().await;
    let group = unique("va");
    let name = format!("{group}-a");
    let cluster = Cluster::new(client.clone(), "test");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va = |va_name: &str| {
        volume_attachment(va_name, &name, "ebs.csi.aws.com", &format!("pv-{va_name}"))
    };
    let (old, reused, new) = (
        format!("{group}-old"),
        format!("{group}-reused"),
        format!("{group}-new"),
    );
    for n in [&old, &reused] {
        vas.create(&Default::default(), &va(n)).await.unwrap();
    }
    let recorded = cluster.volume_attachments_of(&name).await.unwrap();
    let mut names: Vec<&str> = recorded.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    assert_eq!(names, [old.as_str(), reused.as_str()]);
    // The node is re-registered under its name and gets attachments of its own: a new one,
    // and one under a name that was recorded (a new object, a new uid).
    vas.create(&Default::default(), &va(&new)).await.unwrap();
    vas.delete(&reused, &Default::default()).await.unwrap();
    wait_for(
        "old VolumeAttachment object gone",
        Duration::from_secs(10),
        || async { vas.get_opt(&reused).await.unwrap().is_none().then_some(()) },
    )
    .await;
    vas.create(&Default::default(), &va(&reused)).await.unwrap();

    let deleted = cluster
        .delete_volume_attachments("uid-a", &recorded)
        .await
        .unwrap();
    assert_eq!(deleted, vec![old.clone()]);
    assert!(
        vas.get_opt(&old)
            .await
            .unwrap()
            .is_none_or(|v| v.metadata.deletion_timestamp.is_some())
    );
    assert!(
        vas.get_opt(&new).await.unwrap().is_some(),
        "created after the record"
    );
    assert!(
        vas.get_opt(&reused).await.unwrap().is_some(),
        "re-created under a recorded name"
    );
    let unknown = RecordedAttachment {
        name: format!("{group}-never"),
        uid: "0".into(),
    };
    assert_eq!(
        cluster
            .delete_volume_attachments("uid-a", &[unknown])
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    for n in [&new, &reused] {
        let _ = vas.delete(n, &Default::default()).await;
    }
}

/// A BMC entry that reads another machine: its Off never fences the node, and the mismatch
/// is known while the node is still healthy (metric, Event, `/nodes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_answers_for_another_machine_never_fences() {
    let s = Scenario::redfish("mismatch", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    // The node's kubelet reports machine 1; the entry (a copy-paste slip) reads machine 0.
    s.map("a", 0);
    let node = s.node_reporting("a", "boot-1", s.identity(1).await).await;
    let name = node.name.clone();
    let kubelet = FakeNode::keep_alive(&[&node], "boot-1");
    let daemon = s.daemon().await;
    let report = daemon.wait_identity(&name, "mismatch", DECISION).await;
    assert_eq!(report["state"], "healthy");
    // The metrics follow on the next decision pass.
    let problem = format!(
        "oobfence_node_identity_problem{{node=\"{name}\",problem=\"identity-mismatch\"}} 1"
    );
    let metrics = wait_for("the mismatch in the metrics", DECISION, || async {
        let m = daemon.metrics().await;
        m.contains(&problem).then_some(m)
    })
    .await;
    assert!(
        metrics.contains("oobfence_identity_nodes{verdict=\"mismatch\"} 1"),
        "{metrics}"
    );
    // Machine 0 powers off and the node dies: Off from the wrong machine is no proof.
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    kubelet.stop().await;
    node.die("boot-1").await;
    let report = daemon.wait_rule(&name, "identity-mismatch", DECISION).await;
    assert_eq!(report["state"], "blocked");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    let events = events_for(&client, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceIdentityMismatch")),
        "{events:?}"
    );
    daemon.stop().await;
    node.delete().await;
}

/// A node excluded by its annotation, and a node another remediator (medik8s
/// self-node-remediation) has tainted: both machines read Off, neither is ever fenced, and each
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_out_node_and_one_under_another_remediator_are_left_alone() {
    let s = Scenario::redfish("optout", 2).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let excluded = s.node("a", 0).await;
    let remediated = s.node("b", 1).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &excluded.name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {cluster::ANNOTATION_EXCLUDE: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let mut t = taints(&remediated.get().await);
    t.push(k8s_openapi::api::core::v1::Taint {
        key: "medik8s.io/remediation".into(),
        value: Some("self-node-remediation".into()),
        effect: "NoExecute".into(),
        time_added: None,
    });
    nodes
        .patch(
            &remediated.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": t}})),
        )
        .await
        .unwrap();
    let daemon = s.daemon().await;
    for i in [0, 1] {
        emu.set_power(i, false).await;
    }
    for i in [0, 1] {
        emu.wait_power(i, "Off", POWER_CHANGE).await;
    }
    excluded.die("boot-1").await;
    remediated.die("boot-1").await;
    let r = daemon
        .wait_rule(&excluded.name, "opted-out", DECISION)
        .await;
    assert_eq!(r["state"], "blocked");
    let r = daemon
        .wait_rule(&remediated.name, "other-remediator", DECISION)
        .await;
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .contains("medik8s.io/remediation"),
        "{r}"
    );
    // Well past the grace period and two confirmations: still nothing written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for n in [&excluded, &remediated] {
        let node = n.get().await;
        assert!(
            !FakeNode::has_oos_taint(&node),
            "{}: {:?}",
            n.name,
            taints(&node)
        );
        assert_eq!(annotation(&node, cluster::ANNOTATION_FENCED_AT), None);
    }
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains(&format!(
            "oobfence_node_blocked{{node=\"{}\",reason=\"opted-out\"}} 1",
            excluded.name
        )),
        "{metrics}"
    );
    daemon.stop().await;
    excluded.delete().await;
    remediated.delete().await;
}

/// Kubernetes 1.20's node lifecycle controller writes its `unreachable`/`not-ready` taints with a
/// patch that carries the whole list and no resourceVersion, computed from the API server's
/// cache: a taint written in the same instant (oobfence fences the moment a pre-attested node
/// turns NotReady) can be dropped by it. The node is still NotReady and its machine still Off:
/// oobfence clears its record, says so, and fences again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_dropped_by_another_writer_is_written_again_while_the_machine_is_off() {
    let s = Scenario::redfish("dropped", 1).await;
    let (client, emu) = (s.client.clone(), s.redfish_emulator());
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let daemon = s.daemon().await;
    daemon.wait_identity(&name, "match", DECISION).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    node.die("boot-1").await;
    let fenced = wait_for("out-of-service taint", DECISION, || {
        node_has(&client, &name, FakeNode::has_oos_taint)
    })
    .await;
    // The controller's write: its own taint added to a list read before oobfence's landed.
    let unreachable = k8s_openapi::api::core::v1::Taint {
        key: "node.kubernetes.io/unreachable".into(),
        value: None,
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let stale: Vec<_> = taints(&fenced)
        .into_iter()
        .filter(|t| t.key != cluster::OUT_OF_SERVICE_KEY)
        .chain([unreachable])
        .collect();
    Api::<Node>::all(client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": stale}})),
        )
        .await
        .expect("the controller-like taint patch");
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    // At least twice: the controller-manager's own taint writes may race oobfence's too.
    let again = wait_for("the fence written again", DECISION, || async {
        let m = daemon.metrics().await;
        let taints = sample(
            &m,
            "oobfence_actions_total{action=\"taint\",result=\"success\"}",
        );
        (taints >= Some(2.0)).then_some(())?;
        node_has(&client, &name, FakeNode::has_oos_taint).await
    })
    .await;
    // The controller's own taints are its to keep or correct (it swaps `unreachable` for
    // `not-ready` on a node that posted NotReady); the other writers' taints stay.
    let t = taints(&again);
    assert!(t.contains(&keep_taint()), "{t:?}");
    assert_eq!(
        taints_owner(&again).as_deref(),
        Some("oobfence"),
        "the API server names oobfence as the taints' last writer"
    );
    let metrics = daemon.metrics().await;
    assert!(
        sample(
            &metrics,
            "oobfence_actions_total{action=\"clear_record\",result=\"success\"}"
        ) >= Some(1.0),
        "{metrics}"
    );
    let events = events_for(&client, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("OobfenceRecordCleared")),
        "{events:?}"
    );
    daemon.stop().await;
    node.delete().await;
}
