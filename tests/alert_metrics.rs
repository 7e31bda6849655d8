//! The series the shipped alerts compare, as the real `oobfence` binary (`oobfence run`, a
//! process of its own) serves them against a real kube-apiserver (OOBFENCE_TEST_KUBECONFIG): a
//! value the daemon cannot know yet is not served as 0, and what makes a healthy node
//! unfenceable is on /metrics before it dies.
//!
//! The alerts themselves are replayed by promtool (deploy/prometheus/tests, run by
//! scripts/check-prometheus).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::daemon_process::DaemonProcess;
use support::gate::gated_kubeconfig;
use support::k8s::{
    FakeNode, KubeletIdentity, free_port, kubeconfig_path, node_report, sample, scrape, wait_for,
    wait_ready,
};
use support::scenario::{FIRST_BOOT, Scenario};

// Generous: a loaded 2-core machine has taken over 45 s for a decision expected in seconds.
const DECISION: Duration = Duration::from_secs(90);
/// The firmware placeholder UUID many boards ship with: it identifies no machine.
const PLACEHOLDER_UUID: &str = "03000200-0400-0500-0006-000700080009";

/// Before the first sync (the API server does not answer), the fence budget's limit, a share
/// of nodes nobody has counted yet, has no sample: it used to read 0, and
/// OobfenceFenceBudgetSpent (used >= limit) fired at every start and through every outage at
/// start. Once the API answers, both gauges are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_budget_is_not_served_before_the_first_sync() {
    let s = Scenario::without_machines("amsync").await;
    s.set_guards("max_unhealthy = \"100%\"\nfence_budget = \"10%\"\n");
    let (gate, kubeconfig) = gated_kubeconfig(s.dir()).await;
    gate.cut();
    let listen = format!("127.0.0.1:{}", free_port());
    let config = s.dir().join("dc.toml");
    std::fs::write(&config, s.config_text(&kubeconfig, &listen, "")).unwrap();
    let daemon = DaemonProcess::spawn(&config, &listen, s.dir(), &[], &[]);

    let url = format!("http://{listen}/metrics");
    let first = wait_for(
        "/metrics before the sync",
        Duration::from_secs(30),
        || async { reqwest::get(&url).await.ok()?.text().await.ok() },
    )
    .await;
    // Still unsynced a while later: the loop would have run many passes by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let unsynced = scrape(&listen).await;
    for m in [&first, &unsynced] {
        assert!(
            m.contains("# HELP oobfence_fence_budget_limit "),
            "the family is listed from the start:\n{m}"
        );
        assert_eq!(
            sample(m, "oobfence_last_successful_sync_timestamp_seconds"),
            Some(0.0),
            "the daemon has not synced: the API server is cut off\n{}",
            daemon.log_text()
        );
        for name in ["oobfence_fence_budget_limit", "oobfence_fence_budget_used"] {
            assert_eq!(
                sample(m, name),
                None,
                "{name} has a sample before the first sync:\n{m}"
            );
        }
    }

    gate.restore();
    wait_ready(&listen, Duration::from_secs(60)).await;
    let synced = wait_for(
        "the fence budget served",
        Duration::from_secs(30),
        || async {
            let m = scrape(&listen).await;
            sample(&m, "oobfence_fence_budget_limit")
                .is_some()
                .then_some(m)
        },
    )
    .await;
    assert_eq!(sample(&synced, "oobfence_fence_budget_used"), Some(0.0));
    assert!(
        sample(&synced, "oobfence_last_successful_sync_timestamp_seconds").unwrap() > 0.0,
        "{synced}"
    );
    daemon.stop().await;
}

/// A healthy node whose machine cannot prove it is the node's (its kubelet reports the
/// firmware placeholder UUID) under identity = "checked" would never be fenced if it died:
/// /metrics says so while it is still Ready (oobfence_node_identity_problem
/// identity-unverifiable), and not for a node whose machine matches. Once it dies, its blocked
/// series is joined to its failure domain (oobfence_node_failure_domain), which the rack alert
/// and the Alertmanager inhibition group by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unattestable_healthy_node_and_a_dead_nodes_domain_are_on_metrics() {
    let s = Scenario::redfish("amattest", 2).await;
    s.map("a", 0);
    let a = s
        .node_reporting("a", FIRST_BOOT, KubeletIdentity::uuid(PLACEHOLDER_UUID))
        .await;
    let b = s.node("b", 1).await;
    let nodes: Api<Node> = Api::all(s.client.clone());
    for n in [&a, &b] {
        nodes
            .patch(
                &n.name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "rack-am"}}}),
                ),
            )
            .await
            .expect("label the node's failure domain");
    }
    let alive_a = FakeNode::keep_alive(&[&a], FIRST_BOOT);
    let alive_b = FakeNode::keep_alive(&[&b], FIRST_BOOT);
    let listen = format!("127.0.0.1:{}", free_port());
    let config = s.dir().join("dc.toml");
    std::fs::write(&config, s.config_text(&kubeconfig_path(), &listen, "")).unwrap();
    let daemon = DaemonProcess::start(&config, &listen, s.dir(), &[], &[]).await;

    let problem_of = |node: &str| {
        format!(
            "oobfence_node_identity_problem{{node=\"{node}\",problem=\"identity-unverifiable\"}}"
        )
    };
    let domain_of =
        |node: &str| format!("oobfence_node_failure_domain{{node=\"{node}\",domain=\"rack-am\"}}");
    daemon
        .wait_report(&b.name, "identity verdict match", DECISION, |r| {
            r["identity"]["verdict"] == "match"
        })
        .await;
    let m = wait_metric(&daemon, "node a unattestable while healthy", |m| {
        sample(m, &problem_of(&a.name)) == Some(1.0)
    })
    .await;
    let report = node_report(&listen, &a.name).await.unwrap();
    assert_eq!(report["state"], "healthy", "{report}");
    assert_eq!(report["identity"]["verdict"], "unverifiable", "{report}");
    assert_eq!(sample(&m, &problem_of(&b.name)), None, "{m}");
    // Healthy nodes have no domain series (thousands would say nothing).
    for n in [&a, &b] {
        assert_eq!(sample(&m, &domain_of(&n.name)), None, "{m}");
    }

    // Node a dies with its machine off: the Off read proves nothing, it is blocked, and its
    // blocked series can be joined to its rack.
    s.redfish_emulator().set_power(0, false).await;
    s.redfish_emulator()
        .wait_power(0, "Off", Duration::from_secs(30))
        .await;
    alive_a.stop().await;
    a.die(FIRST_BOOT).await;
    daemon
        .wait_report(&a.name, "rule identity-unverified", DECISION, |r| {
            r["rule"] == "identity-unverified"
        })
        .await;
    let blocked = format!(
        "oobfence_node_blocked{{node=\"{}\",reason=\"identity-unverified\"}}",
        a.name
    );
    let m = wait_metric(&daemon, "node a blocked in rack-am", |m| {
        sample(m, &blocked) == Some(1.0) && sample(m, &domain_of(&a.name)) == Some(1.0)
    })
    .await;
    assert_eq!(sample(&m, &domain_of(&b.name)), None, "{m}");
    assert!(!FakeNode::has_oos_taint(&a.get().await));

    alive_b.stop().await;
    daemon.stop().await;
    a.delete().await;
    b.delete().await;
}

async fn wait_metric(daemon: &DaemonProcess, what: &str, check: impl Fn(&str) -> bool) -> String {
    wait_for(what, DECISION, || async {
        let m = scrape(&daemon.listen).await;
        check(&m).then_some(m)
    })
    .await
}
