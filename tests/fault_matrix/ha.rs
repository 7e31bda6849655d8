//! The fault matrix's `[ha]` scenarios beyond the handover of `two_hosts_one_actor`.

use super::*;

/// Whether an instance reports another process renewing the Lease under its identity.
async fn reports_duplicate(instance: &HaInstance) -> bool {
    let Ok(r) = reqwest::get(format!("http://{}/metrics", instance.listen)).await else {
        return false;
    };
    let m = r.text().await.unwrap_or_default();
    sample(&m, "oobfence_ha_duplicate_identity{datacenter=\"test\"}") == Some(1.0)
}

/// Two hosts run with one `[ha] identity` (a config copied with its identity in it). Never
/// both write: the second follows the first, and reports it. A dead node is fenced once, by
/// the one that writes; when that one is SIGKILLed the other takes over after the lease and
/// fences the next.
pub(super) fn two_hosts_one_identity() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-dupid", 3).await;
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
        for (i, suffix) in ["a", "b", "c"].into_iter().enumerate() {
            let n = s.node(suffix, i).await;
            alive.push(Some(FakeNode::keep_alive(&[&n], FIRST_BOOT)));
            nodes.push(n);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let mut first = HaInstance::named(&s, "first", "host-x", &s.group).await;
        let mut second = HaInstance::named(&s, "second", "host-x", &s.group).await;
        first.start().await;
        first.wait_leader(1.0, Duration::from_secs(20)).await;
        second.start().await;
        // Longer than the lease (9 s): one writer throughout, and the second says why.
        never_two_leaders(&first, &second, Duration::from_secs(12)).await;
        assert_eq!(first.leader().await, Some(1.0), "the first stopped writing");
        wait_for(
            "the second reports a duplicate identity",
            Duration::from_secs(20),
            || async { reports_duplicate(&second).await.then_some(()) },
        )
        .await;
        assert!(!reports_duplicate(&first).await);

        // A node dies: fenced once, by whichever writes.
        alive[0] = None;
        power_cut(&s, &nodes[0], 0).await;
        wait_taint(&nodes[0], Duration::from_secs(60)).await;
        never_two_leaders(&first, &second, Duration::from_secs(3)).await;

        // The writer is SIGKILLed: the other takes over once the Lease has gone unrenewed for
        // the lease, and fences the next dead node.
        first.kill().await;
        second.wait_leader(1.0, Duration::from_secs(60)).await;
        alive[1] = None;
        power_cut(&s, &nodes[1], 1).await;
        wait_taint(&nodes[1], Duration::from_secs(60)).await;
        assert!(
            fenced_by(&nodes[1].get().await).starts_with("oobfence/test@ha/host-x#"),
            "{}",
            fenced_by(&nodes[1].get().await)
        );
        second.kill().await;
        drop(alive);
        let expected = vec![
            Write::Taint(nodes[0].name.clone()),
            Write::Taint(nodes[1].name.clone()),
        ];
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "[ha] two hosts under one identity: one writer, the other reports it",
            expected,
            seen,
        }
    })
}
