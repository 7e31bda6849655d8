//! The packaged unit (systemd/oobfence@.service) and the daemon under it: a bad config stops
//! the unit instead of restarting it forever, ExecReload sends SIGHUP, the log filter is the
//! default one, and a refused BMC certificate is one log line of oobfence's own.

use super::*;

/// The `[Service]` settings of systemd/oobfence@.service, as (key, value) in order.
fn unit_service_settings() -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/oobfence@.service"),
    )
    .expect("read the unit");
    let mut section = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[Service]"
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// The values of one `[Service]` setting of the unit, in order.
fn unit_values(key: &str) -> Vec<String> {
    unit_service_settings()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

/// A bad config must stop the unit, not restart it every RestartSec forever. systemd.service(5):
/// Restart= covers the processes of ExecStartPre= as well as the main one, but
/// RestartPreventExitStatus= looks at the main process only. So the config is checked by the
/// main process (`oobfence run` exits 2 on a bad config, shown here), and no other process of the
/// start may fail it.
#[test]
fn a_bad_config_stops_the_unit_instead_of_restarting_it_forever() {
    let settings = unit_service_settings();
    let get = |key: &str| {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("Restart"), ["on-failure"]);
    assert_eq!(get("RestartPreventExitStatus"), ["2"]);
    for key in ["ExecStartPre", "ExecStartPost", "ExecCondition"] {
        assert!(
            get(key).is_empty(),
            "{key}={:?}: its failure would be restarted whatever its exit status",
            get(key)
        );
    }
    let start = get("ExecStart");
    assert_eq!(start.len(), 1);
    assert!(start[0].contains("oobfence run --config"), "{start:?}");

    // The main process's answer to a bad config: exit status 2, at once, one clear line.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(
        &path,
        "datacenter = \"dc1\"\n[policy]\nnot_ready_grace = \"soon\"\n",
    )
    .unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not_ready_grace"), "{err}");

    // A kubeconfig that cannot work will not mend itself between two restarts either: the
    // same exit status, not a connection failure restarted every 5 s.
    let kubeconfig = dir.path().join("absent-kubeconfig");
    std::fs::write(
        &path,
        format!(
            "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = {:?}\n",
            kubeconfig.display().to_string()
        ),
    )
    .unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kubernetes.kubeconfig") && err.contains("absent-kubeconfig"),
        "{err}"
    );
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [\n").unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("kubernetes.kubeconfig"), "{err}");
}

/// A `[server] listen` address that cannot be bound (another process holds it, or it is not
/// this host's) does not mend itself between two restarts: exit 2, as a bad config does, with
/// the address and what to change, not a restart every 5 s for ever.
#[test]
fn a_listen_address_that_cannot_be_bound_stops_the_unit() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(
        &path,
        format!(
            "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = {:?}\n[server]\nlisten = \"{addr}\"\n[journal]\npath = {:?}\n[pause]\nfile = \"\"\n",
            support::k8s::kubeconfig_path().display().to_string(),
            dir.path().join("journal.jsonl").display().to_string()
        ),
    )
    .unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&addr.to_string()) && err.contains("[server] listen"),
        "{err}"
    );
    drop(held);
}

/// The unit reloads by SIGHUP, which the daemon handles (above).
#[test]
fn the_unit_reloads_with_sighup() {
    assert_eq!(unit_values("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
}

/// The unit's log filter is the daemon's default, which keeps library noise (a TLS verifier's
/// own ERROR line for a refused BMC certificate) out of the journal.
#[test]
fn the_units_log_filter_is_the_default_one() {
    let env = unit_values("Environment");
    let wanted = format!("OOBFENCE_LOG={}", oobfence::DEFAULT_LOG_FILTER);
    assert!(env.contains(&wanted), "{env:?}");
    assert!(oobfence::DEFAULT_LOG_FILTER.contains("rustls_platform_verifier=off"));
}

/// A BMC certificate the system roots do not know (a BMC's own self-signed one, and no
/// `ca_file`): the log has one line of oobfence's own naming the node and the refusal, and
/// never the TLS verifier's ERROR line beside it, however often the read is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bmc_certificate_is_one_line_of_ours_not_the_tls_librarys() {
    let s = Scenario::redfish("certlog", 1).await;
    let emu = s.redfish_emulator();
    s.map_redfish(
        "a",
        &emu.base_url(),
        support::sushy::PASSWORD,
        &format!("system = \"{}\"\ntimeout = \"5s\"", emu.system_path(0)),
    );
    let node = s
        .node_reporting("a", support::scenario::FIRST_BOOT, s.identity(0).await)
        .await;
    let _kubelet = support::k8s::FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let (notify, mut daemon, _, _) = ready_daemon(&s).await;
    drop(notify);
    let report_path = format!("/nodes/{}", node.name);
    support::k8s::wait_for("the refused read", Duration::from_secs(30), || async {
        let r: serde_json::Value =
            serde_json::from_str(&daemon.get(&report_path).await).unwrap_or_default();
        (r["power_source"]["last_read_failed"] == true).then_some(())
    })
    .await;
    // A failing source is read again every 15 s: let one retry pass.
    tokio::time::sleep(Duration::from_secs(17)).await;
    let log = daemon.log_text();
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&node.name) && l.contains("power source read failed"))
        .collect();
    assert!(
        ours.iter().all(|l| l.contains(" WARN ")),
        "at WARN: {ours:?}"
    );
    // (A first read that timed out under load would be a line of its own kind: not a retry.)
    let tls = ours.iter().filter(|l| l.contains("error=tls")).count();
    assert_eq!(
        tls, 1,
        "one line for the refusal, none per retry; log:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" ERROR ") && !l.contains(" ERROR oobfence")),
        "a library's ERROR line; log:\n{log}"
    );
    assert!(daemon.is_running());
    daemon.terminate(Duration::from_secs(15)).await;
    node.delete().await;
}
