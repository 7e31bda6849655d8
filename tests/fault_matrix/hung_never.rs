//! Nodes that look hung and are not oobfence's to power off, or not again: an abandoned node,
//! a cordoned one, one under maintenance; a boot a person untainted after oobfence powered it
//! off; a second hang after a takeover that followed a whole power cycle (the power budget is
//! the guards' record's, not the Nodes'). Each beside what proves the daemon would act.

use super::hung::{AFTER, actuated_nodes, actuation, own_domain};
use super::*;

/// Sets `spec` fields of a node as its operators would (`kubectl cordon`, a NodeMaintenance's
/// taint).
async fn patch_spec(node: &FakeNode, spec: serde_json::Value) {
    node.nodes()
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the node's spec");
}

/// Nodes that look hung and are not oobfence's to power off, beside a control node that is:
/// one NotReady before the daemon started (abandoned: reinstalled outside the cluster, its
/// UUID unchanged — the silence was never watched begin), one cordoned and one under a
/// NodeMaintenance taint (their kubelets stopped for maintenance, watched). By the time the
/// control node is powered off and fenced, `after` has passed for all of them: none carries a
/// power-off record, every machine reads On.
pub(super) fn abandoned_or_maintained_nodes_are_never_powered_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-never", 4).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 10)));
        let nodes = actuated_nodes(&s, &["abandoned", "cordoned", "maintained", "control"]).await;
        let [abandoned, cordoned, maintained, control] = &nodes[..] else {
            unreachable!()
        };
        // Silent and NotReady before oobfence ever looked at it.
        abandoned.die(FIRST_BOOT).await;
        patch_spec(cordoned, json!({ "unschedulable": true })).await;
        patch_spec(
            maintained,
            json!({ "taints": [{ "key": "medik8s.io/drain", "effect": "NoSchedule" }] }),
        )
        .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        hang_under_watch(&daemon.listen, &[cordoned, maintained, control], FIRST_BOOT).await;
        // The control node proves the daemon powers a watched hang off: `after` has passed for
        // the others too by then.
        wait_fenced_by(&daemon.listen, control, AFTER + EVENT_BOUND).await;
        for (n, says) in [
            (abandoned, "did not see the silence begin"),
            (cordoned, "cordoned"),
            (maintained, "medik8s.io/drain"),
        ] {
            let r = daemon
                .wait_report_where(&n.name, says, EVENT_BOUND, |r| {
                    r["rule"] == "power-on" && r["reason"].to_string().contains(says)
                })
                .await;
            assert!(r["fence"].is_null(), "{r}");
            let node = n.get().await;
            assert_eq!(
                support::k8s::annotation(&node, "oobfence.io/powered-off-at"),
                None,
                "{} carries a power-off record",
                n.name
            );
        }
        for i in 0..3 {
            assert_eq!(s.redfish_emulator().power(i).await, "On", "machine {i}");
        }
        conclude(
            "hung: abandoned, cordoned and maintained nodes never powered off",
            vec![Write::Taint(control.name.clone())],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// A hung node powered off and fenced by oobfence (`power_on = false`: left off for a
/// person); a person powers the machine on by hand and removes the taint, its kubelet still
/// silent (it has not registered a new bootID yet). oobfence drops its fence record and the
/// reads it stood on, but keeps the power-off of that boot: the machine reads On, silent far
/// past `after`, and gets no second ForceOff (`power-off-ignored`) nor a fence on old reads.
pub(super) fn a_persons_untaint_after_a_power_off_brings_no_second_power_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-untaint", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 10)));
        s.map_with("n", 0, "actuate = true");
        let node = s.node_reporting("n", FIRST_BOOT, s.identity(0).await).await;
        own_domain(&node).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        hang_under_watch(&daemon.listen, &[&node], FIRST_BOOT).await;
        wait_fenced_by(&daemon.listen, &node, AFTER + EVENT_BOUND).await;
        // A person powers the machine on and lifts the fence; its kubelet is not back yet.
        s.redfish_emulator().set_power(0, true).await;
        s.redfish_emulator().wait_power(0, "On", EVENT_BOUND).await;
        let powered_on = jiff::Timestamp::now();
        patch_spec(&node, json!({ "taints": [] })).await;
        daemon
            .wait_report_where(&node.name, "the fence record dropped", EVENT_BOUND, |r| {
                r["fence"].is_null()
            })
            .await;
        let r = daemon
            .wait_rule(&node.name, "power-off-ignored", EVENT_BOUND)
            .await;
        assert!(
            r["reason"].to_string().contains("never powered off twice"),
            "{r}"
        );
        let n = node.get().await;
        assert!(
            support::k8s::annotation(&n, "oobfence.io/powered-off-at").is_some(),
            "the power-off record of the boot went with the fence record"
        );
        // Read On again a few times, long past `after`: still one ForceOff.
        daemon
            .wait_report_where(
                &node.name,
                "two On reads after the person's power-on",
                EVENT_BOUND,
                |r| {
                    let on_since = |x: &serde_json::Value| {
                        x["result"] == "on"
                            && x["at"]
                                .as_str()
                                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                                .is_some_and(|t| t > powered_on)
                    };
                    r["reads"]
                        .as_array()
                        .is_some_and(|a| a.iter().filter(|x| on_since(x)).count() >= 2)
                },
            )
            .await;
        assert_eq!(s.redfish_emulator().power(0).await, "On");
        let metrics = daemon.metrics().await;
        assert_eq!(
            sample(
                &metrics,
                "oobfence_power_actions_total{action=\"power_off\",result=\"sent\",backend=\"redfish\"}"
            ),
            Some(1.0),
            "one ForceOff for the boot: {metrics}"
        );
        conclude(
            "hung: a person's untaint after the power-off, machine powered on by hand",
            vec![
                Write::Taint(node.name.clone()),
                Write::Untaint(node.name.clone()),
            ],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// The power budget survives a takeover after a whole power cycle. Two `[ha]` hosts,
/// `max_per_hour = 1`: the leader powers a hung node off, fences it, powers it on (its own
/// node's power-on is no other node's budget), and lifts the fence when it boots anew, which
/// removes every record of it from the Node. The leader is killed; the other host takes over
/// and a second node hangs under its watch: the power action of the last hour, read back from
/// the guards' record, holds it (`power-budget`).
pub(super) fn a_takeover_after_a_power_cycle_keeps_the_power_budget() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-budget-ha", 2).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(true, 1)));
        let namespaces = lease_namespace(&s).await;
        let nodes = actuated_nodes(&s, &["n0", "n1"]).await;
        let [cycled, second] = &nodes[..] else {
            unreachable!()
        };
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let (mut host_a, mut host_b) = leader_and_standby(&s).await;
        let second_alive = FakeNode::keep_alive(&[second], FIRST_BOOT);
        hang_under_watch(&host_a.listen, &[cycled], FIRST_BOOT).await;
        // Off, fenced, on: two power actions.
        wait_fenced_by(&host_a.listen, cycled, AFTER + EVENT_BOUND).await;
        wait_for("the machine powered on again", EVENT_BOUND, || async {
            (s.redfish_emulator().power(0).await == "On").then_some(())
        })
        .await;
        // It boots: a new bootID, and the fence comes off with every record of it.
        cycled.come_back("boot-2").await;
        let back = FakeNode::keep_alive(&[cycled], "boot-2");
        wait_for(
            "the fence and the power records lifted",
            EVENT_BOUND,
            || async {
                let n = cycled.get().await;
                (!FakeNode::has_oos_taint(&n)
                    && support::k8s::annotation(&n, "oobfence.io/powered-off-at").is_none())
                .then_some(())
            },
        )
        .await;
        host_a.kill().await;
        host_b.wait_leader(1.0, EVENT_BOUND).await;
        second_alive.stop().await;
        hang_under_watch(&host_b.listen, &[second], FIRST_BOOT).await;
        let r = support::k8s::wait_node_report(
            &host_b.listen,
            &second.name,
            "the power budget holding the second hang",
            AFTER + EVENT_BOUND,
            |r| r["rule"] == "power-budget",
            String::new,
        )
        .await;
        assert!(r["reason"].to_string().contains("max_per_hour = 1"), "{r}");
        assert_eq!(s.redfish_emulator().power(1).await, "On");
        let n = second.get().await;
        assert_eq!(
            support::k8s::annotation(&n, "oobfence.io/powered-off-at"),
            None,
            "the second node was powered off on a fresh budget"
        );
        host_b.kill().await;
        back.stop().await;
        let expected = vec![
            Write::Taint(cycled.name.clone()),
            Write::Untaint(cycled.name.clone()),
        ];
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "hung: [ha] takeover after a power cycle, the power budget kept",
            expected,
            seen,
        }
    })
}
