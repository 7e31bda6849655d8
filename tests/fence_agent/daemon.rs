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
    s.map_fence_agent(
        "broken",
        "pw",
        &format!("agent = \"{}\"\n", failing.display()),
    );
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
