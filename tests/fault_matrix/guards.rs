//! Scenarios of the guards: storms, a freeze, the pause (file and ConfigMap), a stale view, a
//! flapping node.

use super::*;

pub(super) const RACK: &str = "oobfence.test/rack";

/// Racks r1 and r2 of two nodes each (machines 0 to 3), with a storm past half of a rack
/// (domain_max_unhealthy 50%) and none datacenter-wide.
async fn two_racks(s: &Scenario) -> Vec<FakeNode> {
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
    nodes
}

/// A storm in one failure domain (both nodes of rack r1 dead, domain_max_unhealthy 50%)
/// holds r1; a node of rack r2 that dies at the same time is fenced as usual.
pub(super) fn storm_in_one_domain_while_another_fences() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-storm", 4).await;
        // Rack r1's two kubelets go NotReady one API call apart: on a loaded machine that
        // may be seconds, and with the suite's 2 s grace r1-a may then be fenced, rightly,
        // before r1-b is NotReady (1 of 2 is no storm). The grace is what "together" means.
        const GRACE: Duration = Duration::from_secs(20);
        s.set_policy(
            &s.policy_lines()
                .replace("not_ready_grace = \"2s\"", "not_ready_grace = \"20s\""),
        );
        assert!(s.policy_lines().contains("not_ready_grace = \"20s\""));
        let nodes = two_racks(&s).await;
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
            emu.wait_power(i, "Off", EVENT_BOUND).await;
        }
        for n in &nodes[..3] {
            n.die(FIRST_BOOT).await;
        }
        let mut not_ready = Vec::new();
        for n in &nodes[..2] {
            let at = wait_for(
                &format!("{} seen NotReady", n.name),
                EVENT_BOUND,
                || async { rec.not_ready_at(&n.name) },
            )
            .await;
            not_ready.push(at);
        }
        let apart = not_ready[1].saturating_duration_since(not_ready[0]);
        assert!(
            apart < GRACE,
            "the test's premise failed, not the product: r1's nodes went NotReady {apart:?} apart, not within the {GRACE:?} grace"
        );
        wait_taint(&nodes[2], EVENT_BOUND).await;
        for n in &nodes[..2] {
            let r = daemon.wait_rule(&n.name, "storm", EVENT_BOUND).await;
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

/// The count of a rack and the decision on its node are of one moment. Rack r1's other node
/// is already NotReady (its machine On: never fenced), and counted; r1-a's machine is proven
/// Off ahead of NotReady (its Lease stale), so that it is fenced the moment it turns NotReady,
/// between two passes. That moment makes r1 a storm (2 of 2 NotReady, domain_max_unhealthy
/// 50%): nothing is written. Before the fix the change was decided on the last pass's count
/// (1 of 2) and r1-a was tainted in the storm.
pub(super) fn a_node_proven_off_ahead_that_makes_its_rack_a_storm() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-storm-now", 4).await;
        // Without the release a stale Lease is no NotReady: the node is read ahead, and
        // fenced the moment it turns NotReady.
        s.set_policy(&format!(
            "lease_stale_after = 1.5\nrelease_at_attestation = false\n{}",
            s.policy_lines()
        ));
        let nodes = two_racks(&s).await;
        let r1a = FakeNode::keep_alive(&[&nodes[0]], FIRST_BOOT);
        let r1b = FakeNode::keep_alive(&[&nodes[1]], FIRST_BOOT);
        let _rack2 = FakeNode::keep_alive(&[&nodes[2], &nodes[3]], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon.wait_identity(&n.name, "match", EVENT_BOUND).await;
        }
        drop(r1b);
        nodes[1].die(FIRST_BOOT).await;
        wait_for("rack r1 counted 1 of 2 unhealthy", EVENT_BOUND, || async {
            let (nodes, unhealthy) = scope_count(&daemon, "domain=r1").await?;
            (nodes == 2 && unhealthy == 1).then_some(())
        })
        .await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", EVENT_BOUND).await;
        drop(r1a);
        // The controller-manager marks the node NotReady 20 s after its last renewal, and may
        // beat the test to it on a loaded machine: that change is decided the same way.
        daemon
            .wait_report_where(
                &nodes[0].name,
                "rule pre-attested (or NotReady, by the controller-manager)",
                EVENT_BOUND,
                |r| r["rule"] == "pre-attested" || r["ready"] != "Ready",
            )
            .await;
        nodes[0].die(FIRST_BOOT).await;
        let r = daemon.wait_rule(&nodes[0].name, "storm", EVENT_BOUND).await;
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("failure domain r1"), "{reason}");
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        conclude(
            "a node proven Off ahead turns NotReady and makes its rack a storm",
            vec![],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// A scope's node count and unhealthy count as the daemon's `/guards` shows them.
async fn scope_count(daemon: &RunningDaemon, scope: &str) -> Option<(u64, u64)> {
    let guards: serde_json::Value = reqwest::get(format!("http://{}/guards", daemon.listen))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let s = guards["scopes"]
        .as_array()?
        .iter()
        .find(|s| s["scope"] == scope)?;
    Some((s["nodes"].as_u64()?, s["unhealthy"].as_u64()?))
}

/// With the release at attestation on, a rack that loses power while its nodes still show
/// Ready is a storm too (domain_max_unhealthy 50%): its Leases went stale together, and a stale
/// Lease counts toward the storm where a Ready node may be fenced on its proof alone. Nothing
/// of the rack is written, before or after NotReady; the other rack is left alone.
pub(super) fn a_rack_gone_silent_while_ready_is_a_storm_with_the_release() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-silent-rack", 4).await;
        s.set_policy(&format!("lease_stale_after = 1.5\n{}", s.policy_lines()));
        let nodes = two_racks(&s).await;
        let rack1 = FakeNode::keep_alive(&[&nodes[0], &nodes[1]], FIRST_BOOT);
        let _rack2 = FakeNode::keep_alive(&[&nodes[2], &nodes[3]], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon.wait_identity(&n.name, "match", EVENT_BOUND).await;
        }
        // Rack r1's PDU trips: both machines off, both kubelets silent; nobody marks them.
        let emu = s.redfish_emulator();
        for i in 0..2 {
            emu.set_power(i, false).await;
        }
        drop(rack1);
        for n in &nodes[..2] {
            let r = daemon.wait_rule(&n.name, "storm", EVENT_BOUND).await;
            let reason = r["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("failure domain r1"), "{reason}");
        }
        stays_unfenced(&nodes[0], Duration::from_secs(3)).await;
        conclude(
            "a rack gone silent while Ready, release on: a storm, nothing written",
            vec![],
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
pub(super) fn most_bmcs_unreachable_freezes_then_thaws() -> ScenarioFuture {
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
            .wait_rule(&dead.name, "self-partition", EVENT_BOUND)
            .await;
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("3 of 5 power sources"), "{reason}");
        stays_unfenced(&dead, Duration::from_secs(3)).await;
        let restored = Instant::now();
        gate.restore();
        // Failed sources of healthy nodes are read again within 15 s.
        wait_taint(&dead, EVENT_BOUND).await;
        let taint = Write::Taint(dead.name.clone());
        assert!(rec.seen(&taint).await > restored, "fenced before the thaw");
        wait_journal_tells(&s, &["freeze began", "freeze ended"]).await;
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
pub(super) fn pause_file_on_and_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-pause", 1).await;
        let node = s.node("a", 0).await;
        oobfence::pause::write_file(&s.pause_file(), "rewiring rack 7", "test").unwrap();
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &node, 0).await;
        let r = daemon.wait_rule(&node.name, "paused", EVENT_BOUND).await;
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
        wait_taint(&node, EVENT_BOUND).await;
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
pub(super) fn pause_configmap_on_and_off() -> ScenarioFuture {
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
        let r = daemon.wait_rule(&node.name, "paused", EVENT_BOUND).await;
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
        wait_taint(&node, EVENT_BOUND).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.seen(&taint).await > resumed);
        // On the record: the ConfigMap's words, then the resume.
        wait_journal_tells(&s, &["pause began", "pause ended"]).await;
        let t = journal::timeline(&s.journal(), &journal::Filter::default()).unwrap();
        let began = t.events.iter().find(|e| e.what == "pause began").unwrap();
        let change = began.change.as_ref().unwrap();
        assert_eq!(change.switch.as_deref(), Some("configmap"), "{began:?}");
        assert!(
            change.by.iter().any(|b| b.contains("storm in dc2")),
            "{began:?}"
        );
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
pub(super) fn api_unreachable_longer_than_the_staleness_limit() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-stale", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\nmax_view_age = \"4s\"\n");
        let (gate, kubeconfig) = gated_kubeconfig(s.dir()).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon_with_kubeconfig(&kubeconfig).await;
        gate.cut();
        power_cut(&s, &node, 0).await;
        wait_for("oobfence_view_stale 1", EVENT_BOUND, || async {
            (sample(&daemon.metrics().await, "oobfence_view_stale") == Some(1.0)).then_some(())
        })
        .await;
        let report = daemon.report(&node.name).await.unwrap();
        let holds = report["holds"].to_string();
        assert!(holds.contains("stale-view"), "{report}");
        stays_unfenced(&node, Duration::from_secs(5)).await;
        let restored = Instant::now();
        gate.restore();
        wait_taint(&node, EVENT_BOUND).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.seen(&taint).await > restored);
        wait_journal_tells(&s, &["stale-view began", "stale-view ended"]).await;
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

/// A node that keeps going NotReady and Ready is held, not fenced, though its machine is off
/// whenever it is read.
pub(super) fn flapping_node_is_held() -> ScenarioFuture {
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
        emu.wait_power(0, "Off", EVENT_BOUND).await;
        drop(kubelet);
        for _ in 0..4 {
            node.die(FIRST_BOOT).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            node.come_back(FIRST_BOOT).await;
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        node.die(FIRST_BOOT).await;
        daemon.wait_rule(&node.name, "flapping", EVENT_BOUND).await;
        stays_unfenced(&node, Duration::from_secs(5)).await;
        conclude("node flapping", vec![], daemon, &rec, &[&node]).await
    })
}
