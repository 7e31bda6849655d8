//! `oobfence drill NODE`, the fire drill, on a real node: a healthy node whose BMC reads On for
//! its own machine, with the daemon running, passes every check and would be tainted; the
//! exact taint patch goes to the API server as a server-side dry run and nothing is stored; a
//! pause, a stopped daemon and a BMC answering for another machine each stop it, by name.

use super::*;

/// `drill NODE --json` on `config`: its exit code and the parsed report.
async fn drill(config: &std::path::Path, node: &str) -> (Option<i32>, serde_json::Value) {
    let out = support::cli::oobfence_async(&["drill", node, "--json"], config).await;
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("drill --json printed no JSON ({e}): {out:?}"));
    (out.status.code(), report)
}

fn outcome<'a>(report: &'a serde_json::Value, check: &str) -> &'a str {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["check"] == check))
        .and_then(|c| c["outcome"].as_str())
        .unwrap_or_else(|| panic!("no {check} check: {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fire_drill_goes_through_a_fence_short_of_the_write() {
    let s = Scenario::redfish("drill", 2).await;
    let node = s.node("a", 0).await;
    // Node b's kubelet reports a machine other than the one its entry reads (machine 1).
    s.map("b", 1);
    let b = s
        .node_reporting(
            "b",
            FIRST_BOOT,
            KubeletIdentity::uuid("11111111-2222-4333-8444-555555555555"),
        )
        .await;
    let daemon = s.daemon().await;
    let before = node.get().await;

    let (code, report) = drill(&daemon.config_path, &node.name).await;
    for check in [
        "node",
        "mapping",
        "power read",
        "identity",
        "write",
        "pause",
        "daemon",
    ] {
        assert_eq!(outcome(&report, check), "pass", "{check}: {report:#}");
    }
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["would_fence"], true);
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("would taint it out-of-service"),
        "{verdict}"
    );
    // The server-side dry run stored nothing.
    let after = node.get().await;
    assert!(!FakeNode::has_oos_taint(&after), "{:?}", taints(&after));
    assert_eq!(before.resource_version(), after.resource_version());

    // The text form says the same, one line per check.
    let out = support::cli::oobfence_async(&["drill", &node.name], &daemon.config_path).await;
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(text.lines().any(|l| l.starts_with("ok    write")), "{text}");
    assert!(text.contains("would taint it out-of-service"), "{text}");

    // A BMC that answers for another machine.
    let (code, report) = drill(&daemon.config_path, &b.name).await;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(outcome(&report, "identity"), "fail", "{report:#}");
    assert!(
        report["verdict"]
            .as_str()
            .unwrap()
            .contains("would NOT fence it: identity")
    );

    // A pause holds every write.
    std::fs::write(s.pause_file(), "maintenance\n").unwrap();
    let (code, report) = drill(&daemon.config_path, &node.name).await;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(outcome(&report, "pause"), "fail", "{report:#}");
    std::fs::remove_file(s.pause_file()).unwrap();

    // Without a daemon nothing fences it.
    daemon.stop().await;
    let listen = format!("127.0.0.1:{}", support::k8s::free_port());
    let config = s.write_config(&support::k8s::kubeconfig_path(), &listen);
    let (code, report) = drill(&config, &node.name).await;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(outcome(&report, "daemon"), "fail", "{report:#}");
    node.delete().await;
    b.delete().await;
}
