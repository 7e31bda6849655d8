//! Hung nodes under opt-in actuation (`[actuation]`): the kubelet silent while the machine
//! stays On. A BMC that refuses the power-off, one that takes it and leaves the machine On, one
//! that allows no ForceOff; a kubelet that comes back before the power-off; more hung nodes
//! than the power budget allows; a rack of them (a storm); two `[ha]` hosts. Besides the Node
//! writes the matrix counts, each scenario counts the power commands the machines received.

use super::*;

/// `[actuation]` as these scenarios set it (after the `[policy]` lines): the shortest silence
/// allowed; power-on off where the scenario does not follow the machine back.
pub(super) fn actuation(power_on: bool, max_per_hour: u32) -> String {
    format!(
        "[actuation]\nenabled = true\nafter = \"2m\"\npower_on = {power_on}\nmax_per_hour = {max_per_hour}\n"
    )
}

/// `[actuation] after` in these scenarios.
pub(super) const AFTER: Duration = Duration::from_secs(120);

/// Each node in its own failure domain: one node's power-off does not hold another's.
pub(super) async fn own_domain(node: &FakeNode) {
    label(node, "topology.kubernetes.io/zone", &node.name).await;
}

/// Nodes `suffixes`, the i-th on machine i, each mapped with `actuate = true`, reporting as
/// its machine, in a failure domain of its own.
pub(super) async fn actuated_nodes(s: &Scenario, suffixes: &[&str]) -> Vec<FakeNode> {
    let mut nodes = Vec::new();
    for (i, suffix) in suffixes.iter().enumerate() {
        s.map_with(suffix, i, "actuate = true");
        let n = s
            .node_reporting(suffix, FIRST_BOOT, s.identity(i).await)
            .await;
        own_domain(&n).await;
        nodes.push(n);
    }
    nodes
}

/// When the machine of sushy system `i` first reads Off, polled until `limit`; `None` if it
/// never does.
async fn first_off(s: &Scenario, i: usize, limit: Duration) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if s.redfish_emulator().power(i).await == "Off" {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// Three hung nodes whose BMCs will not power them off, beside a control node whose BMC
/// does: one answers every Reset 403 (retried later each time, never in a loop), one takes
/// the Reset and leaves the machine On (`power-off-ignored`: never fenced, never a second
/// power-off), one allows no ForceOff (refused before anything is sent). Only the control node
/// is powered off and fenced.
pub(super) fn hung_nodes_whose_bmcs_refuse_or_ignore_the_power_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-bmc", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 10)));
        let odd = OddBmc::start();
        s.map_with("control", 0, "actuate = true");
        let control = s
            .node_reporting("control", FIRST_BOOT, s.identity(0).await)
            .await;
        let cases = [
            ("refuses", odd_bmc::REFUSES_UUID),
            ("ignores", odd_bmc::IGNORES_UUID),
            ("graceful-only", odd_bmc::GRACEFUL_ONLY_UUID),
        ];
        let mut hung = Vec::new();
        for (suffix, uuid) in cases {
            s.map_redfish(
                suffix,
                &format!("https://127.0.0.1:{}", odd.port),
                "pw",
                &format!(
                    "system = \"/hung/{suffix}\"\nca_file = \"{}\"\ntimeout = \"2s\"\nactuate = true",
                    odd.cert.display()
                ),
            );
            hung.push(
                s.node_reporting(suffix, FIRST_BOOT, KubeletIdentity::uuid(uuid))
                    .await,
            );
        }
        for n in hung.iter().chain([&control]) {
            own_domain(n).await;
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let all: Vec<&FakeNode> = hung.iter().chain([&control]).collect();
        hang_under_watch(&daemon.listen, &all, FIRST_BOOT).await;
        let started = Instant::now();
        daemon
            .wait_rule(&hung[1].name, "waiting-to-actuate", EVENT_BOUND)
            .await;
        // The control machine goes off by oobfence's hand and is fenced.
        wait_fenced_by(&daemon.listen, &control, AFTER + EVENT_BOUND).await;
        let control_fenced = started.elapsed();
        // The ignoring BMC's machine: one ForceOff, then power-off-ignored for good.
        let r = daemon
            .wait_rule(&hung[1].name, "power-off-ignored", EVENT_BOUND)
            .await;
        assert!(r["fence"].is_null(), "{r}");
        // Let the refusing BMC's retries run past the ignored one's decision.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let elapsed = started.elapsed();
        let reset = |suffix: &str| format!("/hung/{suffix}/Actions/ComputerSystem.Reset");
        let refused = odd.posts(&reset("refuses")).await;
        let ignored = odd.posts(&reset("ignores")).await;
        let graceful = odd.posts(&reset("graceful-only")).await;
        report(&format!(
            "fault matrix: hung nodes: the control fenced {:.0}s after the kubelets stopped; {} Reset POSTs to the refusing BMC, {} to the ignoring one, {} to the one without ForceOff, in {:.0}s",
            control_fenced.as_secs_f64(),
            refused.len(),
            ignored.len(),
            graceful.len(),
            elapsed.as_secs_f64()
        ));
        // Tried again, with a growing wait (30 s, then about 60 s or more): a 10 s retry
        // would have sent a dozen by now.
        assert!(
            (2..=4).contains(&refused.len()),
            "the refusing BMC got {} Reset POSTs: {refused:?}",
            refused.len()
        );
        assert!(
            refused.iter().all(|b| b.contains("ForceOff")),
            "{refused:?}"
        );
        assert_eq!(ignored.len(), 1, "never twice for one boot: {ignored:?}");
        assert!(ignored[0].contains("\"ForceOff\""), "{ignored:?}");
        assert!(
            graceful.is_empty(),
            "no ForceOff allowed, none sent: {graceful:?}"
        );
        let r = daemon.report(&hung[0].name).await.unwrap();
        let error = r["last_action_error"].to_string();
        assert!(error.contains("403"), "{r}");
        assert!(!r["action_retry_at"].is_null(), "{r}");
        let r = daemon.report(&hung[2].name).await.unwrap();
        assert!(
            r["last_action_error"].to_string().contains("not ForceOff"),
            "{r}"
        );
        for n in &hung {
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        let metrics = daemon.metrics().await;
        assert_eq!(
            sample(
                &metrics,
                "oobfence_power_actions_total{action=\"power_off\",result=\"sent\",backend=\"redfish\"}"
            ),
            Some(2.0),
            "the control's and the ignored one's: {metrics}"
        );
        let mut nodes = nodes_of(&hung);
        nodes.push(&control);
        conclude(
            "hung: BMC refusing the Reset, machine ignoring it, no ForceOff",
            vec![Write::Taint(control.name.clone())],
            daemon,
            &rec,
            &nodes,
        )
        .await
    })
}

/// A hung node whose kubelet comes back a minute into its silence: the silence starts again
/// from its last sign of life, and the machine is powered off only `after` past that, then
/// fenced.
pub(super) fn a_kubelet_back_before_the_power_off_restarts_the_silence() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-back", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 10)));
        s.map_with("n", 0, "actuate = true");
        let node = s.node_reporting("n", FIRST_BOOT, s.identity(0).await).await;
        let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        daemon.wait_identity(&node.name, "match", EVENT_BOUND).await;
        daemon.wait_lease_watched(&node.name, EVENT_BOUND).await;
        kubelet.stop().await;
        node.die(FIRST_BOOT).await;
        daemon
            .wait_rule(&node.name, "waiting-to-actuate", EVENT_BOUND)
            .await;
        // A minute in, the kubelet is back for 30 s, then silent again.
        tokio::time::sleep(Duration::from_secs(60)).await;
        node.come_back(FIRST_BOOT).await;
        let back = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        tokio::time::sleep(Duration::from_secs(30)).await;
        back.stop().await;
        let last_words = jiff::Timestamp::now();
        let silent_again = Instant::now();
        node.die(FIRST_BOOT).await;
        // The first silence's two minutes pass: the machine stays On.
        let off = first_off(&s, 0, AFTER + EVENT_BOUND).await;
        let off = off.expect("the machine was never powered off");
        let waited = off.duration_since(silent_again);
        let n = node.get().await;
        let recorded: jiff::Timestamp = support::k8s::annotation(&n, "oobfence.io/powered-off-at")
            .expect("the power record")
            .parse()
            .unwrap();
        report(&format!(
            "fault matrix: hung node back a minute into its silence: powered off {:.0}s after its second silence began",
            waited.as_secs_f64()
        ));
        // oobfence's clock: the power-off was decided at least `after` past the last sign of
        // life it saw (the kubelet's last renewal, at or before these last words).
        let silence = recorded.duration_since(last_words);
        assert!(
            silence.as_secs_f64() >= AFTER.as_secs_f64() - 6.0,
            "powered off {silence:?} after the kubelet's last words"
        );
        wait_taint(&node, EVENT_BOUND).await;
        conclude(
            "hung: kubelet back before the power-off, silent again",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// Three hung nodes, each in its own failure domain, and `max_per_hour = 1`: one machine is
/// powered off and fenced; the other two wait for the budget (`power-budget`), their machines
/// On, unfenced.
pub(super) fn hung_nodes_beyond_the_power_budget_wait() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-budget", 3).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 1)));
        let nodes = actuated_nodes(&s, &["n0", "n1", "n2"]).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        hang_under_watch(
            &daemon.listen,
            &nodes.iter().collect::<Vec<_>>(),
            FIRST_BOOT,
        )
        .await;
        let fenced = wait_for("one hung node fenced", AFTER + EVENT_BOUND, || async {
            for (i, n) in nodes.iter().enumerate() {
                if FakeNode::has_oos_taint(&n.get().await) {
                    return Some(i);
                }
            }
            None
        })
        .await;
        // The others hold on the budget.
        for (i, n) in nodes.iter().enumerate().filter(|(i, _)| *i != fenced) {
            let r = daemon.wait_rule(&n.name, "power-budget", EVENT_BOUND).await;
            assert!(r["reason"].to_string().contains("max_per_hour = 1"), "{r}");
            assert!(r["fence"].is_null(), "{r}");
            assert_eq!(s.redfish_emulator().power(i).await, "On");
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        for (i, n) in nodes.iter().enumerate().filter(|(i, _)| *i != fenced) {
            assert_eq!(s.redfish_emulator().power(i).await, "On", "{}", n.name);
        }
        // The one power action, on the record with what it left: nothing.
        let t = journal::timeline(&s.journal(), &journal::Filter::default()).unwrap();
        let spent: Vec<_> = t
            .events
            .iter()
            .filter(|e| e.what == "power-budget spent")
            .collect();
        assert_eq!(spent.len(), 1, "{spent:?}");
        assert_eq!(spent[0].node.as_deref(), Some(nodes[fenced].name.as_str()));
        let change = spent[0].change.as_ref().unwrap();
        assert_eq!(
            (change.used, change.limit, change.left()),
            (Some(1), Some(1), Some(0))
        );
        let expected = vec![Write::Taint(nodes[fenced].name.clone())];
        conclude(
            "hung: three hung nodes, max_per_hour = 1",
            expected,
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// Three of four nodes hang at once, past `max_unhealthy`: that is the network or the control
/// plane, not three machines, and nothing is powered off.
pub(super) fn a_rack_of_hung_nodes_is_a_storm_not_a_power_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-storm", 4).await;
        s.set_guards("max_unhealthy = \"50%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(false, 10)));
        let nodes = actuated_nodes(&s, &["n0", "n1", "n2", "n3"]).await;
        let alive = FakeNode::keep_alive(&[&nodes[3]], FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        // Hangs it watched begin: only the storm guard keeps them On.
        hang_under_watch(
            &daemon.listen,
            &nodes[..3].iter().collect::<Vec<_>>(),
            FIRST_BOOT,
        )
        .await;
        let r = daemon
            .wait_report_where(&nodes[0].name, "a storm hold", EVENT_BOUND, |r| {
                r["holds"].to_string().contains("storm")
            })
            .await;
        assert!(r["fence"].is_null(), "{r}");
        // Past `after` and a margin: every machine still On.
        let off = first_off(&s, 0, AFTER + Duration::from_secs(30)).await;
        assert!(off.is_none(), "a machine of the storm was powered off");
        for i in 0..4 {
            assert_eq!(s.redfish_emulator().power(i).await, "On", "machine {i}");
        }
        drop(alive);
        conclude(
            "hung: three of four nodes at once (a storm)",
            vec![],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}

/// Two `[ha]` hosts and a hung node: the leader powers it off and is SIGKILLed before the
/// fence; the other host takes over, fences it on its Off reads and powers it on, never
/// powering it off a second time. One power-off, one power-on, whoever sent them.
pub(super) fn two_hosts_one_power_off() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-hung-ha", 1).await;
        s.set_guards("max_unhealthy = \"100%\"\n");
        s.set_policy(&format!("{}{}", s.policy_lines(), actuation(true, 10)));
        let namespaces = lease_namespace(&s).await;
        s.map_with("n", 0, "actuate = true");
        let node = s.node_reporting("n", FIRST_BOOT, s.identity(0).await).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let (mut host_a, mut host_b) = leader_and_standby(&s).await;
        hang_under_watch(&host_a.listen, &[&node], FIRST_BOOT).await;
        // The leader powers the machine off; it is killed at once, before any fence.
        let off = first_off(&s, 0, AFTER + EVENT_BOUND).await;
        if off.is_none() {
            panic!(
                "never powered off; host-a's report: {:#}; host-b's: {:#}",
                support::k8s::node_report(&host_a.listen, &node.name)
                    .await
                    .unwrap_or_default(),
                support::k8s::node_report(&host_b.listen, &node.name)
                    .await
                    .unwrap_or_default()
            );
        }
        host_a.kill().await;
        let n = node.get().await;
        let by = support::k8s::annotation(&n, "oobfence.io/powered-off-by").unwrap_or_default();
        assert!(by.starts_with("oobfence/test@ha/host-a#"), "{by}");
        // host-b takes over: fences it and powers it on again.
        host_b.wait_leader(1.0, EVENT_BOUND).await;
        wait_taint(&node, EVENT_BOUND).await;
        wait_for("the machine powered on again", EVENT_BOUND, || async {
            (s.redfish_emulator().power(0).await == "On").then_some(())
        })
        .await;
        host_b.kill().await;
        let journal = std::fs::read_to_string(s.journal()).unwrap_or_default();
        let sent = |action: &str| {
            journal
                .lines()
                .filter(|l| l.contains(&format!("\"action\":\"{action}\"")))
                .filter(|l| l.contains("\"result\":\"sent\""))
                .count()
        };
        assert_eq!(sent("power_off"), 1, "{journal}");
        assert_eq!(sent("power_on"), 1, "{journal}");
        let expected = vec![Write::Taint(node.name.clone())];
        let seen = rec.writes_once_seen(&expected).await;
        node.delete().await;
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "hung: [ha] leader killed between power-off and fence",
            expected,
            seen,
        }
    })
}
