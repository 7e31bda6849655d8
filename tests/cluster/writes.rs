//! The Node writes themselves (`oobfence::cluster`): a taint write meeting 409s, a Node
//! re-registered under the same name, the re-check that abandons a write when anything the
//! decision used moved, and the VolumeAttachments deleted after a node delete.

use super::*;

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
