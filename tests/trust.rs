//! Trust at write time, on the real API server: every write re-checks the pause and the
//! leadership right before it (the VolumeAttachments a Node delete frees too), a dry run
//! writes nothing, the fence and power budgets survive a restart on another host, and the
//! guards' record fails closed (written again when corrupt or deleted).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use oobfence::cluster::{self, Cluster, ClusterError};
use oobfence::decision::holds::record::GuardRecord;
use oobfence::decision::holds::{Hold, HoldKind, Holds};
use oobfence::leader::Leadership;
use support::daemon_process::DaemonProcess;
use support::k8s::{
    FakeNode, kubeconfig_path, sample, scrape, taints, unique, volume_attachment, wait_for,
};
use support::scenario::{DATACENTER, FIRST_BOOT, Scenario};

/// A decision these tests wait for: generous, a loaded 2-core machine is slow.
const DECISION: Duration = Duration::from_secs(90);
const POWER_CHANGE: Duration = Duration::from_secs(30);

/// The uid of the Node whose attachments are deleted (gone: its holds are the datacenter's).
const NODE_UID: &str = "0b7e6c4e-0000-4000-8000-000000000001";

/// Holds that pause every write once `calls` reaches `paused_from` (counted per check).
fn paused_from(paused_from: usize) -> (Arc<AtomicUsize>, oobfence::cluster::HoldsNow) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let holds: oobfence::cluster::HoldsNow = Arc::new(move |_uid: &str| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        Holds {
            write: (n >= paused_from).then(|| Hold {
                kind: HoldKind::Paused,
                reason: "writes are paused by an operator (test)".into(),
            }),
            ..Default::default()
        }
    });
    (calls, holds)
}

async fn exists(vas: &Api<VolumeAttachment>, name: &str) -> bool {
    vas.get_opt(name)
        .await
        .unwrap()
        .is_some_and(|v| v.metadata.deletion_timestamp.is_none())
}

/// The VolumeAttachments a Node delete frees are deletes too: a pause placed after the Node
/// went stops each one not yet made, as it would have stopped the Node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_attachment_deletes_re_check_the_pause_before_each() {
    let client = support::k8s::client().await;
    let group = unique("vapause");
    let node = format!("{group}-a");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let names = [format!("{group}-1"), format!("{group}-2")];
    for n in &names {
        let va = volume_attachment(n, &node, "ebs.csi.aws.com", &format!("pv-{n}"));
        vas.create(&Default::default(), &va).await.unwrap();
    }

    // Paused from the start: nothing is deleted.
    let (_, holds) = paused_from(0);
    let cluster = Cluster::new(client.clone(), "test").with_holds(holds);
    let recorded = cluster.volume_attachments_of(&node).await.unwrap();
    assert_eq!(recorded.len(), 2);
    let r = cluster.delete_volume_attachments(NODE_UID, &recorded).await;
    assert!(matches!(r, Err(ClusterError::Abandoned(_))), "{r:?}");
    for n in &names {
        assert!(exists(&vas, n).await, "{n} deleted while writes are paused");
    }

    // Paused between the first delete and the second: the first goes, the second stays.
    let (calls, holds) = paused_from(1);
    let cluster = Cluster::new(client.clone(), "test").with_holds(holds);
    let r = cluster.delete_volume_attachments(NODE_UID, &recorded).await;
    assert!(matches!(r, Err(ClusterError::Abandoned(_))), "{r:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one check before each delete"
    );
    let gone: Vec<bool> = futures::future::join_all(names.iter().map(|n| exists(&vas, n))).await;
    assert_eq!(gone, [false, true], "the first deleted, the second kept");
    for n in &names {
        let _ = vas.delete(n, &Default::default()).await;
    }
}

/// `[ha]`: an instance that may no longer write (its Lease ran out by its own clock) deletes
/// no VolumeAttachment, whatever its holds say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_attachment_deletes_re_check_the_leadership() {
    let client = support::k8s::client().await;
    let group = unique("vastandby");
    let node = format!("{group}-a");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let name = format!("{group}-1");
    let va = volume_attachment(&name, &node, "ebs.csi.aws.com", &format!("pv-{name}"));
    vas.create(&Default::default(), &va).await.unwrap();
    let standing = Arc::new(RwLock::new(Leadership {
        identity: "host-a".into(),
        holder: Some("host-a".into()),
        term: 3,
        // Held until a moment ago: past its deadline it may start no write.
        writable_until: Some(tokio::time::Instant::now()),
        changes: 1,
        error: Some("renewal timed out (test)".into()),
        duplicate_identity: false,
    }));
    let cluster = Cluster::new(client.clone(), "test")
        .with_leadership(standing.clone(), Duration::from_secs(5));
    let recorded = cluster.volume_attachments_of(&node).await.unwrap();
    assert_eq!(recorded.len(), 1);
    let r = cluster.delete_volume_attachments(NODE_UID, &recorded).await;
    assert!(matches!(r, Err(ClusterError::Abandoned(_))), "{r:?}");
    assert!(
        exists(&vas, &name).await,
        "deleted by an instance that may not write"
    );

    // Renewed: the same writer deletes it.
    standing.write().unwrap().writable_until =
        Some(tokio::time::Instant::now() + Duration::from_secs(60));
    let deleted = cluster
        .delete_volume_attachments(NODE_UID, &recorded)
        .await
        .unwrap();
    assert_eq!(deleted, vec![name.clone()]);
    let _ = vas.delete(&name, &Default::default()).await;
}

/// A dry run writes nothing at all: a fence record of this daemon's whose taint someone else
/// removed stays on the Node as it is (the daemon that is not a dry run drops it), and so does
/// everything else of the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_leaves_a_record_without_taint_untouched() {
    let s = Scenario::redfish("dryrecord", 1).await;
    let node = s.node("a", 0).await;
    let name = node.name.clone();
    let _kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let record = json!({"metadata": {"annotations": {
        cluster::ANNOTATION_FENCED_AT: "2026-01-01T00:00:00Z",
        cluster::ANNOTATION_FENCED_BOOT_ID: "boot-0",
        cluster::ANNOTATION_ACTION: "taint",
        cluster::ANNOTATION_FENCED_BY: cluster::actor_name(DATACENTER),
        cluster::ANNOTATION_REASON: "written by an earlier run that was no dry run",
    }}});
    node.nodes()
        .patch(&name, &PatchParams::default(), &Patch::Merge(&record))
        .await
        .unwrap();
    let before = node.get().await;
    assert!(!FakeNode::has_oos_taint(&before));
    let ours = |n: &Node| -> BTreeMap<String, String> {
        n.annotations()
            .iter()
            .filter(|(k, _)| k.starts_with("oobfence.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_eq!(ours(&before).len(), 5);

    let daemon = s.daemon_with_policy("dry_run = true").await;
    wait_for("the node decided", DECISION, || daemon.report(&name)).await;
    // Long enough for a write to land: the daemon decides the node every pass.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = node.get().await;
    assert_eq!(ours(&after), ours(&before), "the record is left as it was");
    assert_eq!(taints(&after), taints(&before));
    assert_eq!(after.labels(), before.labels());
    let report = daemon.wait_rule(&name, "dry-run", DECISION).await;
    assert_eq!(report["step"], "idle", "{report}");
    assert!(
        report["reason"].as_str().unwrap().contains("would drop"),
        "{report}"
    );
    let metrics = daemon.metrics().await;
    assert!(!metrics.contains("oobfence_actions_total{"), "{metrics}");
    daemon.stop().await;
    node.delete().await;
}

/// `oobfence run` of the scenario's config plus `extra` (sections such as `[ha]`), as its own
/// process (SIGKILLed when dropped), its log in the scenario's directory under `name`.
async fn run_process(s: &Scenario, name: &str, extra: &str) -> DaemonProcess {
    let dir = s.dir().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let listen = format!("127.0.0.1:{}", support::k8s::free_port());
    let config = dir.join("dc.toml");
    std::fs::write(&config, s.config_text(&kubeconfig_path(), &listen, extra)).unwrap();
    DaemonProcess::start(&config, &listen, &dir, &[], &[]).await
}

/// Whether the daemon serving on `listen` is the `[ha]` leader, by its own metric.
async fn leads(d: &DaemonProcess) -> bool {
    sample(
        &scrape(&d.listen).await,
        "oobfence_leader{datacenter=\"test\"}",
    ) == Some(1.0)
}

/// The fence budget outlives the process that spent it: a Node deleted by a fence leaves no
/// record on the cluster but the guards' ConfigMap, and a daemon started on another host (a
/// new process, none of the first one's journal) counts it, so the next fence is held by the
/// budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_budget_spent_by_a_predecessor_holds_the_next_fence() {
    let s = Scenario::redfish("budgetkept", 2).await;
    s.set_guards("max_unhealthy = \"100%\"\nfence_budget = 1\n");
    s.set_policy(&format!("{}action = \"delete-node\"\n", s.policy_lines()));
    let emu = s.redfish_emulator();
    let a = s.node("a", 0).await;
    let b = s.node("b", 1).await;
    let first = run_process(&s, "first", "").await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    a.die("boot-1").await;
    wait_for("node a deleted by its fence", DECISION, || async {
        a.try_get().await.is_none().then_some(())
    })
    .await;
    // Killed a moment after its fence, as a host dies.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(first); // SIGKILL

    // Another host takes over: nothing of the first one's journal.
    std::fs::remove_file(s.journal()).expect("the first daemon's journal");
    let second = run_process(&s, "second", "").await;
    wait_for("the budget restored", DECISION, || async {
        let m = scrape(&second.listen).await;
        (sample(&m, "oobfence_fence_budget_used") == Some(1.0)).then_some(())
    })
    .await;
    emu.set_power(1, false).await;
    emu.wait_power(1, "Off", POWER_CHANGE).await;
    b.die("boot-1").await;
    let report = second
        .wait_report(&b.name, "held by the budget", DECISION, |r| {
            r["rule"] == "fence-budget"
        })
        .await;
    assert_eq!(report["state"], "blocked", "{report}");
    assert!(
        b.try_get().await.is_some(),
        "node b deleted past the budget"
    );
    let m = scrape(&second.listen).await;
    assert_eq!(
        sample(
            &m,
            "oobfence_actions_total{action=\"delete_node\",result=\"success\"}"
        ),
        None,
        "{m}"
    );
    assert_eq!(sample(&m, "oobfence_guard_record_ok"), Some(1.0), "{m}");
    drop(second);
    b.delete().await;
    let _ = Api::<ConfigMap>::namespaced(s.client.clone(), "default")
        .delete(&s.guard_record()["default/".len()..], &Default::default())
        .await;
}

/// `[ha]`: the instance that takes over counts the Node deletes of the one it replaces (a
/// standby sees none of them: the Nodes are gone), so the next fence is held by the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_counts_its_predecessors_node_deletes_against_the_budget() {
    let s = Scenario::redfish("budgetha", 2).await;
    s.set_guards("max_unhealthy = \"100%\"\nfence_budget = 1\n");
    s.set_policy(&format!("{}action = \"delete-node\"\n", s.policy_lines()));
    let namespace = unique("budgetha");
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
    namespaces.create(&Default::default(), &ns).await.unwrap();
    let ha = |identity: &str| {
        format!(
            "[ha]\nenabled = true\nnamespace = \"{namespace}\"\nidentity = \"{identity}\"\nlease_duration = \"9s\"\nrenew_interval = \"1s\"\n"
        )
    };
    let emu = s.redfish_emulator();
    let a = s.node("a", 0).await;
    let b = s.node("b", 1).await;
    let first = run_process(&s, "host-a", &ha("host-a")).await;
    wait_for("host-a leads", DECISION, || async {
        leads(&first).await.then_some(())
    })
    .await;
    let second = run_process(&s, "host-b", &ha("host-b")).await;
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", POWER_CHANGE).await;
    a.die("boot-1").await;
    wait_for("node a deleted by its fence", DECISION, || async {
        a.try_get().await.is_none().then_some(())
    })
    .await;
    assert!(!leads(&second).await, "host-b is the standby");
    drop(first); // SIGKILL
    wait_for("host-b takes over", DECISION, || async {
        leads(&second).await.then_some(())
    })
    .await;
    emu.set_power(1, false).await;
    emu.wait_power(1, "Off", POWER_CHANGE).await;
    b.die("boot-1").await;
    let report = second
        .wait_report(&b.name, "held by the budget", DECISION, |r| {
            r["rule"] == "fence-budget"
        })
        .await;
    assert_eq!(report["state"], "blocked", "{report}");
    // Long enough for a fence to land if the hold were only the record being read.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        b.try_get().await.is_some(),
        "node b deleted past the budget"
    );
    let m = scrape(&second.listen).await;
    assert_eq!(sample(&m, "oobfence_fence_budget_used"), Some(1.0), "{m}");
    drop(second);
    b.delete().await;
    let _ = namespaces.delete(&namespace, &Default::default()).await;
    let _ = Api::<ConfigMap>::namespaced(s.client.clone(), "default")
        .delete(&s.guard_record()["default/".len()..], &Default::default())
        .await;
}

/// Taking back the record of a power action never sent is a Node write too: a pause placed
/// after the record, or the end of `[ha]` leadership, leaves the record where it is (it keeps a
/// second power-off of this boot from being sent; the operator lifts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_back_a_power_action_record_asks_the_holds_and_the_leadership() {
    use oobfence::decision::{GuardPurpose, WriteGuard};
    use oobfence::power::PowerAction;
    let client = support::k8s::client().await;
    let name = unique("forget");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.die("boot-1").await;
    let guard = WriteGuard {
        purpose: GuardPurpose::PowerOff,
        ..support::k8s::fence_guard_for(&client, &node.get().await).await
    };
    let recorded = |n: &k8s_openapi::api::core::v1::Node| {
        support::k8s::annotation(n, cluster::ANNOTATION_POWERED_OFF_AT).is_some()
    };

    // Paused once the record is written.
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let p = paused.clone();
    let holds: cluster::HoldsNow = Arc::new(move |_: &str| Holds {
        write: p.load(Ordering::SeqCst).then(|| Hold {
            kind: HoldKind::Paused,
            reason: "writes are paused by an operator (test)".into(),
        }),
        ..Default::default()
    });
    let cluster = Cluster::new(client.clone(), "test").with_holds(holds);
    cluster
        .record_power_action(&name, &guard, PowerAction::Off)
        .await
        .expect("the record lands before the pause");
    assert!(recorded(&node.get().await));
    paused.store(true, Ordering::SeqCst);
    let r = cluster
        .forget_power_action(&name, &guard.uid, PowerAction::Off)
        .await;
    assert!(matches!(r, Err(ClusterError::Abandoned(_))), "{r:?}");
    assert!(recorded(&node.get().await), "taken back while paused");

    // [ha]: past its own deadline the instance takes nothing back either.
    let standing = Arc::new(RwLock::new(Leadership {
        identity: "host-a".into(),
        holder: Some("host-a".into()),
        term: 3,
        writable_until: Some(tokio::time::Instant::now()),
        changes: 1,
        error: Some("renewal timed out (test)".into()),
        duplicate_identity: false,
    }));
    let cluster = Cluster::new(client.clone(), "test")
        .with_leadership(standing.clone(), Duration::from_secs(5));
    let r = cluster
        .forget_power_action(&name, &guard.uid, PowerAction::Off)
        .await;
    assert!(matches!(r, Err(ClusterError::Abandoned(_))), "{r:?}");
    assert!(recorded(&node.get().await), "taken back by a standby");

    // Renewed: the same writer takes it back.
    standing.write().unwrap().writable_until =
        Some(tokio::time::Instant::now() + Duration::from_secs(60));
    cluster
        .forget_power_action(&name, &guard.uid, PowerAction::Off)
        .await
        .expect("resumed: the record is taken back");
    assert!(!recorded(&node.get().await));
    node.delete().await;
}

/// The record of the fence of Node `uid` in the guards' ConfigMap `name`, once it is a record
/// that holds it.
async fn record_holding(cms: &Api<ConfigMap>, name: &str, uid: &str) -> Option<GuardRecord> {
    let cm = cms.get_opt(name).await.ok()??;
    let text = cm.data?.get(&format!("{DATACENTER}.json"))?.clone();
    let record: GuardRecord = serde_json::from_str(&text).ok()?;
    record.fences.iter().any(|f| f.uid == uid).then_some(record)
}

/// The guards' record fails closed: one that is not a record (a hand edit, a truncated
/// write) is written again at the start from what the daemon knows (here a fence of its own
/// on a Node), and one deleted while the daemon runs is written again within a read-back;
/// each counted by cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_deleted_guards_record_is_written_again() {
    let s = Scenario::redfish("recordrepair", 1).await;
    let a = s.node("a", 0).await;
    a.die("boot-1").await;
    let me = Cluster::new(s.client.clone(), DATACENTER);
    let guard = support::k8s::fence_guard_for(&s.client, &a.get().await).await;
    me.apply_fence_taint(&a.name, &guard, "test")
        .await
        .expect("fenced");
    let uid = a.get().await.uid().unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let cm_name = s.guard_record()["default/".len()..].to_string();
    let corrupt: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": cm_name},
        "data": {format!("{DATACENTER}.json"): "{\"fences\": [{\"at\": \"yester"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &corrupt).await.unwrap();
    let daemon = s.daemon().await;
    wait_for("the corrupt record written again", DECISION, || {
        record_holding(&cms, &cm_name, &uid)
    })
    .await;
    let repairs = |cause: &str| format!("oobfence_guard_record_repairs_total{{cause=\"{cause}\"}}");
    let m = daemon.metrics().await;
    assert_eq!(sample(&m, &repairs("corrupt")), Some(1.0), "{m}");
    assert_eq!(sample(&m, &repairs("missing")), Some(0.0), "{m}");

    cms.delete(&cm_name, &Default::default()).await.unwrap();
    wait_for("the deleted record written again", DECISION, || {
        record_holding(&cms, &cm_name, &uid)
    })
    .await;
    let m = daemon.metrics().await;
    assert_eq!(sample(&m, &repairs("missing")), Some(1.0), "{m}");
    assert_eq!(sample(&m, "oobfence_guard_record_ok"), Some(1.0), "{m}");
    daemon.stop().await;
    a.delete().await;
    let _ = cms.delete(&cm_name, &Default::default()).await;
}

/// The power budget outlives the process that spent it: with `max_per_hour = 1` and two hung
/// nodes, the first daemon powers one machine off and fences it by deleting its Node (which
/// takes the Node's power record with it), and is killed; a daemon started on another host
/// (none of the first one's journal) still holds the other node's power-off (`power-budget`),
/// from the guards' record alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_power_budget_spent_by_a_predecessor_holds_the_next_power_off() {
    let s = Scenario::redfish("powerkept", 2).await;
    s.set_guards("max_unhealthy = \"100%\"\n");
    s.set_policy(&format!(
        "{}action = \"delete-node\"\n\n[actuation]\nenabled = true\nafter = \"2m\"\npower_on = false\nmax_per_hour = 1\n",
        s.policy_lines()
    ));
    let emu = s.redfish_emulator();
    let mut nodes = Vec::new();
    for (i, suffix) in ["a", "b"].into_iter().enumerate() {
        s.map_with(suffix, i, "actuate = true");
        nodes.push(
            s.node_reporting(suffix, FIRST_BOOT, s.identity(i).await)
                .await,
        );
    }
    let first = run_process(&s, "first", "").await;
    support::k8s::hang_under_watch(&first.listen, &nodes.iter().collect::<Vec<_>>(), FIRST_BOOT)
        .await;
    // After `after` of silence one machine is powered off; the budget holds the other.
    let off = wait_for(
        "one machine powered off",
        Duration::from_secs(240),
        || async {
            for i in 0..2 {
                if emu.power(i).await == "Off" {
                    return Some(i);
                }
            }
            None
        },
    )
    .await;
    let (gone, held) = (&nodes[off], &nodes[1 - off]);
    wait_for(
        "the powered-off node deleted by its fence",
        DECISION,
        || async { gone.try_get().await.is_none().then_some(()) },
    )
    .await;
    drop(first); // SIGKILL

    std::fs::remove_file(s.journal()).expect("the first daemon's journal");
    let second = run_process(&s, "second", "").await;
    let report = second
        .wait_report(&held.name, "the power budget held", DECISION, |r| {
            r["holds"]
                .to_string()
                .contains("power-budget (power actions)")
        })
        .await;
    assert!(
        report["holds"].to_string().contains("max_per_hour = 1"),
        "{report}"
    );
    assert_eq!(emu.power(1 - off).await, "On", "{report}");
    drop(second);
    held.delete().await;
    let _ = Api::<ConfigMap>::namespaced(s.client.clone(), "default")
        .delete(&s.guard_record()["default/".len()..], &Default::default())
        .await;
}
