//! The daemon with fence-agent entries on the real API server: a node whose `fence_ipmilan`
//! reads Off is fenced; one whose machine reads On, and one whose agent fails, are not.

use std::time::Duration;

use super::support::k8s::FakeNode;
use super::support::scenario::{FIRST_BOOT, Scenario};
use super::support::{ipmi_sim, k8s::KubeletIdentity};
use super::{fixture_agent, ipmilan};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_on_a_fence_agents_off_never_on_on_or_on_its_failure() {
    let s = Scenario::ipmi("fa-daemon", 2).await;
    s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
    let (off_sim, on_sim) = (s.ipmi_sim(0), s.ipmi_sim(1));
    s.map_fence_agent("off", ipmi_sim::PASSWORD, &ipmilan(off_sim));
    s.map_fence_agent("on", ipmi_sim::PASSWORD, &ipmilan(on_sim));
    let failing = fixture_agent(
        s.dir(),
        "fence_broken",
        "echo 'Failed: Unable to connect/login to fencing device' >&2\nexit 1",
    );
    s.map_fence_agent("broken", "pw", &super::vouched(&failing));
    let mut nodes = Vec::new();
    for suffix in ["off", "on", "broken"] {
        nodes.push(
            s.node_reporting(suffix, FIRST_BOOT, KubeletIdentity::default())
                .await,
        );
    }
    let daemon = s.daemon().await;
    off_sim.set_power(false);
    for n in &nodes {
        n.die(FIRST_BOOT).await;
    }
    let limit = Duration::from_secs(90);
    let r = daemon.wait_fenced(&nodes[0].name, limit).await;
    assert_eq!(r["power_source"]["backend"], "fence-agent", "{r}");
    assert!(FakeNode::has_oos_taint(&nodes[0].get().await));
    let r = daemon.wait_rule(&nodes[1].name, "power-on", limit).await;
    assert!(r["fence"].is_null(), "{r}");
    let r = daemon
        .wait_rule(&nodes[2].name, "power-unknown", limit)
        .await;
    assert!(
        r["reason"].to_string().contains("Unable to connect/login"),
        "{r}"
    );
    for n in &nodes[1..] {
        assert!(!FakeNode::has_oos_taint(&n.get().await), "{}", n.name);
    }
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_power_reads_total{backend=\"fence-agent\",result=\"off\""),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("oobfence_fence_agent_reads_total{agent=\"fence_ipmilan\",result=\"off\"}"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("oobfence_fence_agent_reads_total{agent=\"fence_broken\",result=\"error\"}"),
        "{metrics}"
    );
    // `why` says which agent answered and that the mapping is trusted, not proven.
    let out =
        super::support::cli::oobfence_async(&["why", &nodes[0].name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("fence_ipmilan"), "{why}");
    assert!(why.contains("mapping is trusted"), "{why}");
    daemon.stop().await;
    for n in &nodes {
        n.delete().await;
    }
}

/// An agent that echoes every option it was given and fails: no secret of the entry reaches
/// `/nodes`, `why`, the decision journal or the node's Events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_agents_secrets_never_reach_nodes_why_the_journal_or_events() {
    use super::support::k8s::events_for;
    use super::trust::{leaked, secret_options};
    let s = Scenario::without_machines("fa-secrets").await;
    s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
    let echoes = fixture_agent(
        s.dir(),
        "fence_echoes",
        "echo \"$input\" | tr '\\n' ' ' >&2\necho 'Failed: Unable to obtain correct plug status' >&2\nexit 1",
    );
    s.map_fence_agent(
        "echo",
        "hunter2-secret",
        &format!("{}{}", super::vouched(&echoes), secret_options()),
    );
    let node = s
        .node_reporting("echo", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let daemon = s.daemon().await;
    node.die(FIRST_BOOT).await;
    let limit = Duration::from_secs(90);
    let r = daemon.wait_rule(&node.name, "power-unknown", limit).await;
    let reason = r["reason"].to_string();
    assert!(reason.contains("community=<community>"), "{r}");
    assert!(leaked(&r.to_string()).is_empty(), "/nodes: {r}");

    let out = super::support::cli::oobfence_async(&["why", &node.name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("community=<community>"), "{why}");
    assert!(leaked(&why).is_empty(), "why: {why}");
    // An agent oobfence does not list: why says whose word its reads rest on.
    assert!(why.contains("the operator vouched"), "{why}");

    // The refusal's Event and journal record are written once the episode starts.
    let started = std::time::Instant::now();
    let events = loop {
        let events = events_for(&s.client, &node.name).await;
        if !events.is_empty() || started.elapsed() > limit {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let messages: Vec<String> = events.iter().filter_map(|e| e.message.clone()).collect();
    assert!(
        messages.iter().any(|m| m.contains("community=<community>")),
        "{messages:?}"
    );
    assert!(
        leaked(&messages.join("\n")).is_empty(),
        "Events: {messages:?}"
    );
    let journal = std::fs::read_to_string(s.journal()).unwrap_or_default();
    assert!(journal.contains("community=<community>"), "{journal}");
    assert!(leaked(&journal).is_empty(), "journal: {journal}");
    daemon.stop().await;
    node.delete().await;
}
