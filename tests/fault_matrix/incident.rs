//! The night reconstructed: an incident run on real parts, then told back by `oobfence
//! timeline` (the binary, from the journal files alone) in the order it happened.

use super::*;

/// Waits until the scenario's journal tells an event `what` (of `node`, or the datacenter's
/// when `None`).
async fn wait_told(s: &Scenario, node: Option<&str>, what: &str) {
    wait_for(
        &format!("the journal to tell {what} ({})", node.unwrap_or("-")),
        EVENT_BOUND,
        || async {
            let t = journal::timeline(&s.journal(), &journal::Filter::default()).ok()?;
            t.events
                .iter()
                .any(|e| e.what == what && e.node.as_deref() == node)
                .then_some(())
        },
    )
    .await;
}

/// Both machines of a two-node datacenter lose power (a storm: `max_unhealthy = "50%"`), an
/// operator pauses, one machine comes back (the storm ends), the operator resumes, the other
/// is fenced after the cooldown, and it comes back on a new boot and is released. The
/// timeline tells each of these, in that order.
pub(super) fn an_incident_reconstructed_by_the_timeline() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-timeline", 2).await;
        s.set_guards("max_unhealthy = \"50%\"\ncooldown = \"3s\"\n");
        // Both kubelets go silent one API call apart: within the grace, that is one storm
        // (as in the storm scenario), not a fence of the first before the second is NotReady.
        s.set_policy(
            &s.policy_lines()
                .replace("not_ready_grace = \"2s\"", "not_ready_grace = \"20s\""),
        );
        let (a, b) = (s.node("a", 0).await, s.node("b", 1).await);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let emu = s.redfish_emulator();
        // The power cut.
        for i in 0..2 {
            emu.set_power(i, false).await;
        }
        for i in 0..2 {
            emu.wait_power(i, "Off", EVENT_BOUND).await;
        }
        a.die(FIRST_BOOT).await;
        b.die(FIRST_BOOT).await;
        daemon.wait_rule(&a.name, "storm", EVENT_BOUND).await;
        wait_told(&s, None, "storm began").await;
        // The operator stops everything while looking.
        oobfence::pause::write_file(&s.pause_file(), "incident 4711: hands off", "ana").unwrap();
        wait_told(&s, None, "pause began").await;
        // Machine b comes back with its kubelet: one of two down is no storm.
        emu.set_power(1, true).await;
        b.come_back(FIRST_BOOT).await;
        let alive_b = FakeNode::keep_alive(&[&b], FIRST_BOOT);
        wait_told(&s, None, "storm ended").await;
        stays_unfenced(&a, Duration::from_secs(1)).await;
        assert!(oobfence::pause::remove_file(&s.pause_file()).unwrap());
        wait_taint(&a, EVENT_BOUND).await;
        wait_told(&s, Some(&a.name), "taint success").await;
        // Machine a comes back on a new boot: released.
        emu.set_power(0, true).await;
        a.come_back("boot-2").await;
        let alive_a = FakeNode::keep_alive(&[&a], "boot-2");
        daemon.wait_unfenced(&a.name, EVENT_BOUND).await;
        let untaint = Write::Untaint(a.name.clone());
        rec.seen(&untaint).await;
        wait_told(&s, Some(&a.name), "untaint success").await;

        // The morning after: the binary, no daemon asked.
        let config = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:9");
        let out = support::cli::oobfence_async(&["timeline", "--since", "1h"], &config).await;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The first line about `node` (`-`: the datacenter) that says `what`, and `rule`.
        let line_of_rule = |node: &str, what: &str, rule: &str| {
            text.lines()
                .position(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.get(1) == Some(&node)
                        && l.contains(&format!(" {what} "))
                        && l.contains(rule)
                })
                .unwrap_or_else(|| panic!("no line for {node} {what:?} {rule} in:\n{text}"))
        };
        let line_of = |node: &str, what: &str| line_of_rule(node, what, "");
        let story = [
            line_of(&a.name, "power read off"),
            line_of("-", "storm began"),
            line_of_rule(&a.name, "refused", "[storm]"),
            line_of("-", "pause began"),
            line_of("-", "storm ended"),
            line_of("-", "pause ended"),
            line_of(&a.name, "fence-budget spent"),
            line_of(&a.name, "taint success"),
            line_of(&a.name, "untaint success"),
        ];
        // The first read of a's Off comes before its fence; the rest is one story in order.
        assert!(story[0] < story[7], "{text}");
        assert!(story[1..].is_sorted(), "{story:?}\n{text}");
        assert!(text.contains("incident 4711: hands off"), "{text}");
        // One node's story as JSON: only it and the datacenter.
        let out = support::cli::oobfence_async(
            &["timeline", "--node", a.name.as_str(), "--json"],
            &config,
        )
        .await;
        assert!(out.status.success());
        let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
            .collect();
        assert!(
            events
                .iter()
                .all(|e| e["node"] == a.name.as_str() || e["node"].is_null()),
            "{events:?}"
        );
        let pause = events
            .iter()
            .find(|e| e["kind"] == "daemon" && e["rule"] == "pause")
            .expect("the pause in a's story");
        assert_eq!(pause["change"]["switch"], "file", "{pause}");
        alive_a.stop().await;
        alive_b.stop().await;
        conclude(
            "an incident reconstructed by the timeline",
            vec![Write::Taint(a.name.clone()), untaint],
            daemon,
            &rec,
            &nodes_of([&a, &b]),
        )
        .await
    })
}
