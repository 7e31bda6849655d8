//! `systemctl reload` (SIGHUP): a whole new config takes over; a broken one, or one changing
//! what only a restart applies, is refused while the old one runs on.

use super::*;

/// `systemctl reload` (ExecReload=, SIGHUP): a whole new config and its secrets take over, with
/// RELOADING=1 then READY=1; a broken one, or one that changes what only a restart applies, is
/// refused with one ERROR line and a metric while the old one runs on. What the daemon knows
/// about a node whose mapping did not change (its identity binding) carries over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_whole_config_and_refuses_a_broken_one() {
    let s = Scenario::redfish("reload", 1).await;
    s.set_policy("health_read_interval = \"10s\"\n");
    let node = s.node("a", 0).await;
    let _kubelet = support::k8s::FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let (mut notify, mut daemon, cfg, listen) = ready_daemon(&s).await;
    let original = std::fs::read_to_string(&cfg).unwrap();
    let report_path = format!("/nodes/{}", node.name);
    let report =
        |text: String| serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default();
    support::k8s::wait_for("the identity read", Duration::from_secs(30), || async {
        let r = report(daemon.get(&report_path).await);
        (r["identity"]["verdict"] == "match").then_some(())
    })
    .await;
    let digest = |cfg: &str| -> String {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(cfg.as_bytes());
        d.iter().take(6).map(|b| format!("{b:02x}")).collect()
    };
    let metrics = daemon.get("/metrics").await;
    assert!(
        metrics.contains(&format!(
            "dry_run=\"false\",pre_attest=\"true\",ha=\"false\",config_sha256=\"{}\"}} 1",
            digest(&original)
        )),
        "{metrics}"
    );

    // 1. A whole new config: applied, the binding kept (same machine), READY=1 again.
    let dry = original.replace("[policy]\n", "[policy]\ndry_run = true\n");
    std::fs::write(&cfg, &dry).unwrap();
    let from = notify.reloaded(&daemon).await;
    let after: Vec<&str> = notify.seen[from..]
        .iter()
        .map(|(_, l)| l.as_str())
        .collect();
    assert!(after.contains(&"RELOADING=1"), "{after:?}");
    // The decision loop runs on: its keep-alives keep coming.
    let since = Instant::now();
    notify.collect(Duration::from_secs(5)).await;
    assert!(
        notify.watchdogs_since(since).len() >= 2,
        "{:?}",
        notify.lines()
    );
    let metrics = daemon.get("/metrics").await;
    assert!(
        metrics.contains("oobfence_config_last_reload_successful 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "dry_run=\"true\",pre_attest=\"true\",ha=\"false\",config_sha256=\"{}\"}} 1",
            digest(&dry)
        )),
        "{metrics}"
    );
    assert_eq!(
        metrics.matches("oobfence_config_info{").count(),
        1,
        "one series: the config in force"
    );
    // From here on nobody reads the notify socket: closed, so that the daemon's notifications
    // fail at once instead of filling a queue nobody drains (a service manager always drains
    // it; a full one would block the sender).
    drop(notify);
    let r = report(daemon.get(&report_path).await);
    assert_eq!(
        r["identity"]["verdict"], "match",
        "the binding carries over: {r}"
    );
    assert!(
        daemon.log_text().contains("reloaded"),
        "{}",
        daemon.log_text()
    );

    // 2. The secrets are read again: a wrong password in the file shows in the next read.
    let pw_file = original
        .lines()
        .find_map(|l| l.strip_prefix("password_file = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("a password_file in the scenario's config")
        .to_string();
    let right = std::fs::read_to_string(&pw_file).unwrap();
    std::fs::write(&pw_file, "not-the-password\n").unwrap();
    daemon.hangup();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let r = report(daemon.get(&report_path).await);
        if r["power_source"]["last_read_failed"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failed read with the new password within 40s: {}\nlog:\n{}",
            r["power_source"],
            daemon.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    std::fs::write(&pw_file, right).unwrap();

    // 3. A broken file and a change only a restart applies: refused, the old config runs on.
    for (what, text, says) in [
        (
            "broken",
            "datacenter = \"dc1\n".to_string(),
            ":1: invalid TOML",
        ),
        (
            "listen changed",
            dry.replace(&listen, &format!("127.0.0.1:{}", free_port())),
            "server.listen changed, which only a restart applies",
        ),
    ] {
        std::fs::write(&cfg, &text).unwrap();
        daemon.hangup();
        daemon
            .wait_metric(what, "oobfence_config_last_reload_successful 0")
            .await;
        let log = daemon.log_text();
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("config reload refused"))
            .collect();
        assert!(
            refused
                .last()
                .is_some_and(|l| l.contains("ERROR") && l.contains(says)),
            "{what}: {refused:?}"
        );
        assert!(daemon.is_running(), "{what}: the daemon runs on");
        assert_eq!(daemon.readyz().await, Some(200), "{what}");
        let metrics = daemon.get("/metrics").await;
        assert!(
            metrics.contains(&format!("config_sha256=\"{}\"}} 1", digest(&dry))),
            "{what}: still the config that was in force: {metrics}"
        );
        // Back to a good file: the next reload succeeds again.
        std::fs::write(&cfg, &dry).unwrap();
        daemon.hangup();
        daemon
            .wait_metric("a good reload", "oobfence_config_last_reload_successful 1")
            .await;
    }
    let exit = daemon.terminate(Duration::from_secs(15)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit}");

    // 4. The journal tells each reload, for `oobfence timeline`: the digests before and after,
    // and why a refused one was refused.
    let full = |cfg: &str| -> String {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(cfg.as_bytes());
        d.iter().map(|b| format!("{b:02x}")).collect()
    };
    let out = support::cli::oobfence(&["timeline", "--json"], &cfg);
    assert!(out.status.success(), "{out:?}");
    let reloads: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["kind"] == "daemon" && e["rule"] == "reload")
        .collect();
    let results: Vec<&str> = reloads
        .iter()
        .map(|e| e["what"].as_str().unwrap_or_default())
        .collect();
    // The dry run, the new password, then each refusal followed by the good file again.
    assert_eq!(
        results,
        [
            "reload ok",
            "reload ok",
            "reload refused",
            "reload ok",
            "reload refused",
            "reload ok"
        ],
        "{reloads:#?}"
    );
    assert_eq!(reloads[0]["change"]["digest_before"], full(&original));
    assert_eq!(reloads[0]["change"]["digest_after"], full(&dry));
    let refused = &reloads[4];
    assert_eq!(
        refused["change"]["digest_before"], refused["change"]["digest_after"],
        "a refused reload changes nothing: {refused}"
    );
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("server.listen changed")),
        "{refused}"
    );
    node.delete().await;
}
