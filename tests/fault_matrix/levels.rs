//! Fencing levels and a person's word when the BMC goes dark with its machine: a power cord
//! pulled takes the BMC (level 1, sushy-tools behind a [`Gate`] that is cut) with the machine,
//! and only the Redfish PDU outlet that feeds it (level 2, the project's test PDU) or a person
//! who looked can say it is off. A dual-fed machine with one feed drawing, a BMC that answers
//! On whatever its outlet reads, a confirmation of an older boot and a whole rack gone dark
//! are never fenced.

use super::*;
use oobfence::decision::confirmation::ANNOTATION as CONFIRMED_OFF;
use support::gate::ClosedGate;
use support::redfish_pdu::{self, RedfishPdu};

/// A level-2 entry for node `suffix`: `outlet` of `pdu`, the mapping the operator's word
/// (`identity = "unchecked"`).
fn map_outlet(s: &Scenario, suffix: &str, pdu: &RedfishPdu, outlet: &str) {
    let extra = format!(
        "outlet = \"{}\"\nidentity = \"unchecked\"\nca_file = \"{}\"\ntimeout = \"3s\"\nlevel = 2\n",
        RedfishPdu::outlet(outlet),
        pdu.cert.display()
    );
    s.map_redfish(suffix, &pdu.base_url(), redfish_pdu::PASSWORD, &extra);
}

/// Node `suffix` on Redfish system `machine`, its BMC read through a gate that
/// [`cord_pulled`] closes: the BMC answers while the machine has power.
async fn node_behind_gate(s: &Scenario, suffix: &str, machine: usize) -> (FakeNode, Gate) {
    let gate = Gate::start(s.redfish_emulator().port(), true).await;
    let node = s.node_through(suffix, machine, &gate.base_url()).await;
    (node, gate)
}

/// The cord is pulled: the kubelet falls silent, the BMC goes dark with the machine, and the
/// outlet (if any) stays switched On but draws nothing.
async fn cord_pulled(
    node: &FakeNode,
    bmc: Gate,
    outlet: Option<(&RedfishPdu, &str)>,
) -> ClosedGate {
    node.die(FIRST_BOOT).await;
    let dark = bmc.close();
    if let Some((pdu, id)) = outlet {
        pdu.set_outlet(id, "On", Some(0.0));
    }
    dark
}

/// Writes the confirmation by hand, as `kubectl annotate` does.
async fn confirm_by_hand(node: &FakeNode, boot_id: &str, reason: &str) {
    node.nodes()
        .patch(
            &node.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                CONFIRMED_OFF: json!({"bootID": boot_id, "reason": reason, "by": "alice"}).to_string()
            }}})),
        )
        .await
        .expect("annotate the node");
}

/// (a) The BMC goes dark with its machine and its outlet, switched On, draws 0 W: fenced
/// through level 2, unattested, and the journal says so.
pub(super) fn a_dark_bmc_and_an_outlet_drawing_nothing_fence_through_level_2() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-cord", 1).await;
        let pdu = RedfishPdu::start(&[("A1", "On", Some(197.4))]);
        let (node, bmc) = node_behind_gate(&s, "a", 0).await;
        map_outlet(&s, "a", &pdu, "A1");
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        cord_pulled(&node, bmc, Some((&pdu, "A1"))).await;
        let r = daemon.wait_fenced(&node.name, EVENT_BOUND).await;
        let levels = r["levels"].as_array().cloned().unwrap_or_default();
        assert_eq!(levels.len(), 2, "{r}");
        assert_eq!(levels[0]["last_read_failed"], true, "{r}");
        assert_eq!(levels[1]["chosen"], true, "{r}");
        let fenced = s.fence_record(&node.name, EVENT_BOUND).await;
        assert_eq!(fenced.inputs.level, Some(2), "{fenced:?}");
        assert_eq!(
            fenced.inputs.basis.as_deref(),
            Some("unattested"),
            "{fenced:?}"
        );
        assert_eq!(
            fenced.inputs.power_source,
            Some(format!("redfish {}", pdu.base_url())),
            "{fenced:?}"
        );
        assert!(
            fenced.inputs.reads.iter().all(|r| r
                .details
                .iter()
                .any(|d| d.contains("switched: On, but drawing only 0 W"))),
            "{fenced:?}"
        );
        assert!(
            fenced
                .message
                .contains("level 2 speaks (level 1 cannot answer"),
            "{}",
            fenced.message
        );
        conclude(
            "levels: BMC dark with its machine, its outlet On at 0 W (level 2)",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &nodes_of([&node]),
        )
        .await
    })
}

/// (b) A dual-fed machine: its BMC dark, two level-2 outlets, one drawing nothing and the
/// other still drawing. One live feed keeps a machine running: never fenced.
pub(super) fn a_dual_fed_machine_with_one_feed_drawing_is_never_fenced() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-dual", 1).await;
        let pdu = RedfishPdu::start(&[("A1", "On", Some(120.0)), ("B1", "On", Some(118.0))]);
        let (node, bmc) = node_behind_gate(&s, "a", 0).await;
        map_outlet(&s, "a", &pdu, "A1");
        map_outlet(&s, "a", &pdu, "B1");
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        // Feed A's cord is pulled; feed B carries the whole machine now.
        cord_pulled(&node, bmc, Some((&pdu, "A1"))).await;
        pdu.set_outlet("B1", "On", Some(236.0));
        let r = daemon
            .wait_report_where(&node.name, "power-on read at level 2", EVENT_BOUND, |r| {
                r["rule"] == "power-on"
                    && r["reason"].as_str().is_some_and(|t| t.contains("level 2"))
            })
            .await;
        assert!(r["fence"].is_null(), "{r}");
        stays_unfenced(&node, Duration::from_secs(5)).await;
        conclude(
            "levels: dual-fed, one outlet at 0 W and one drawing",
            Vec::new(),
            daemon,
            &rec,
            &nodes_of([&node]),
        )
        .await
    })
}

/// (c) The BMC answers On while its outlet reads Off (switched On, drawing 0 W: a mis-mapped
/// outlet, say): level 1 answers, so level 2 is never asked to speak over it. Never fenced.
pub(super) fn a_bmc_that_answers_on_outweighs_an_outlet_that_reads_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-on", 1).await;
        let pdu = RedfishPdu::start(&[("A1", "On", Some(197.4))]);
        let node = s.node("a", 0).await;
        map_outlet(&s, "a", &pdu, "A1");
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        node.die(FIRST_BOOT).await;
        pdu.set_outlet("A1", "On", Some(0.0));
        let r = daemon.wait_rule(&node.name, "power-on", EVENT_BOUND).await;
        assert!(r["fence"].is_null(), "{r}");
        // Level 1 answers, so it decides: the outlet below it is never asked to find an Off.
        assert_eq!(r["levels"][0]["chosen"], true, "{r}");
        assert_eq!(r["levels"][1]["chosen"], false, "{r}");
        stays_unfenced(&node, Duration::from_secs(5)).await;
        // Waited for, not read once: the test cluster's controller may have turned NotReady
        // into Unknown meanwhile, which starts the grace period again.
        let r = daemon.wait_rule(&node.name, "power-on", EVENT_BOUND).await;
        assert!(r["fence"].is_null(), "{r}");
        conclude(
            "levels: BMC answers On, its outlet reads Off",
            Vec::new(),
            daemon,
            &rec,
            &nodes_of([&node]),
        )
        .await
    })
}

/// (d) The BMC dark with its machine and no outlet: nothing can answer, until a person who
/// looked writes the confirmation for the node's boot. Fenced on it; the machine comes back on
/// a new boot (its BMC with it) and is unfenced.
pub(super) fn a_persons_word_fences_a_dark_node_until_its_new_boot() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-person", 1).await;
        let (node, bmc) = node_behind_gate(&s, "a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let dark_bmc = cord_pulled(&node, bmc, None).await;
        daemon
            .wait_rule(&node.name, "power-unknown", EVENT_BOUND)
            .await;
        assert!(!FakeNode::has_oos_taint(&node.get().await));
        confirm_by_hand(
            &node,
            FIRST_BOOT,
            "cord pulled in rack 12, seen dark on site",
        )
        .await;
        let r = daemon.wait_fenced(&node.name, EVENT_BOUND).await;
        assert_eq!(r["confirmation"]["standing"], "stands", "{r}");
        wait_taint(&node, EVENT_BOUND).await;
        let record = s.fence_record(&node.name, EVENT_BOUND).await;
        assert_eq!(record.rule, "confirmed-off-by-person", "{record:?}");
        // Power back: the BMC answers On again, the machine boots anew.
        let _bmc = dark_bmc.reopen().await;
        node.come_back("boot-2").await;
        let alive = FakeNode::keep_alive(&[&node], "boot-2");
        daemon.wait_unfenced(&node.name, EVENT_BOUND).await;
        let untaint = Write::Untaint(node.name.clone());
        rec.seen(&untaint).await;
        alive.stop().await;
        conclude(
            "levels: BMC dark, a person's word, unfenced on the new boot",
            vec![Write::Taint(node.name.clone()), untaint],
            daemon,
            &rec,
            &nodes_of([&node]),
        )
        .await
    })
}

/// (e) The BMC dark and a confirmation that names an older boot: void, never fenced.
pub(super) fn a_confirmation_of_an_older_boot_is_refused() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-oldboot", 1).await;
        let (node, bmc) = node_behind_gate(&s, "a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        cord_pulled(&node, bmc, None).await;
        confirm_by_hand(&node, "boot-0", "pulled the cord last week").await;
        let r = daemon
            .wait_report_where(&node.name, "a void confirmation", EVENT_BOUND, |r| {
                r["confirmation"]["standing"] == "void" && r["rule"] == "power-unknown"
            })
            .await;
        let problem = r["confirmation"]["problem"].as_str().unwrap_or_default();
        assert!(problem.contains("boot-0"), "{r}");
        stays_unfenced(&node, Duration::from_secs(5)).await;
        conclude(
            "levels: BMC dark, a confirmation of an older boot",
            Vec::new(),
            daemon,
            &rec,
            &nodes_of([&node]),
        )
        .await
    })
}

/// (f) The dark rack: three machines of one failure domain lose power together and their BMCs
/// and their PDU go dark with them. No level can answer for any (`power-unknown`), every
/// power source read there fails so the rack is frozen (`self-partition`), and nothing is
/// written.
pub(super) fn a_dark_rack_is_never_fenced_from_reads() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-lvl-rack", 3).await;
        s.set_guards(&format!(
            "max_unhealthy = \"100%\"\nfailure_domain_label = \"{}\"\n",
            guards::RACK
        ));
        let pdu = RedfishPdu::start(&[
            ("A1", "On", Some(190.0)),
            ("A2", "On", Some(185.0)),
            ("A3", "On", Some(201.0)),
        ]);
        let mut nodes = Vec::new();
        let mut bmcs = Vec::new();
        for (i, outlet) in ["A1", "A2", "A3"].into_iter().enumerate() {
            let suffix = format!("r1-{i}");
            let (node, bmc) = node_behind_gate(&s, &suffix, i).await;
            map_outlet(&s, &suffix, &pdu, outlet);
            label(&node, guards::RACK, "r1").await;
            nodes.push(node);
            bmcs.push(bmc);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        // The rack's feed trips: kubelets, BMCs and the PDU's controller all go dark.
        drop(pdu);
        for (node, bmc) in nodes.iter().zip(bmcs) {
            cord_pulled(node, bmc, None).await;
        }
        for node in &nodes {
            let r = daemon
                .wait_report_where(&node.name, "no level can answer", EVENT_BOUND, |r| {
                    r["rule"] == "power-unknown"
                        && r["reason"]
                            .as_str()
                            .is_some_and(|t| t.contains("no level can answer"))
                })
                .await;
            assert!(r["fence"].is_null(), "{r}");
        }
        // Every level of every node failing: oobfence may be the one cut off, and holds the
        // rack (a fence there would be held even if a read said Off).
        let frozen = "oobfence_scope_hold{scope=\"domain=r1\",hold=\"self-partition\"}";
        wait_for("the rack frozen (self-partition)", EVENT_BOUND, || async {
            (sample(&daemon.metrics().await, frozen) == Some(1.0)).then_some(())
        })
        .await;
        for node in &nodes {
            stays_unfenced(node, Duration::from_secs(2)).await;
        }
        conclude(
            "levels: a dark rack (3 BMCs and their PDU dark)",
            Vec::new(),
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}
