//! The oobfence binary with IPMI nodes: `probe` and `check-config` (and the settings this
//! build refuses), then the daemon end to end on a real kube-apiserver.

use super::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ipmi_config(dir: &Path, kubeconfig: &Path, nodes: &str, address: &str, extra: &str) -> String {
    format!(
        r#"datacenter = "dc1"
[kubernetes]
kubeconfig = "{}"
[server]
listen = "127.0.0.1:{}"
[[bmc]]
nodes = [{nodes}]
protocol = "ipmi"
address = "{address}"
username = "{}"
password_file = "{}"
{}{extra}
"#,
        kubeconfig.display(),
        support::k8s::free_port(),
        ipmi_sim::USERNAME,
        dir.join("pw").display(),
        if extra.contains("cipher_suite") {
            ""
        } else {
            SUITE_3
        },
    )
}

#[test]
fn probe_reads_an_ipmi_node_from_the_config_alone() {
    let sim = IpmiSim::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), format!("{}\n", ipmi_sim::PASSWORD)).unwrap();
    let path = dir.path().join("dc1.toml");
    // No kubeconfig exists: probe must not need the cluster for a BMC-mapped node.
    let kubeconfig = dir.path().join("kubeconfig");
    let cfg = ipmi_config(dir.path(), &kubeconfig, "\"rack1-01\"", &sim.address(), "");
    std::fs::write(&path, cfg).unwrap();

    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with("rack1-01: On"), "{out}");
    assert!(out.contains(&format!("ipmi {}", sim.address())), "{out}");
    // Logged in as the default role with the entry's suite, and says so.
    assert!(out.contains("session: cipher suite 3, User"), "{out}");

    sim.set_power(false);
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(
        text(&o.stdout).starts_with("rack1-01: Off"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(sim.ipmitool_power(), "off");
    // Each probe closed its session on the way out.
    assert_eq!(sim.other_sessions(), 0);

    std::fs::write(dir.path().join("pw"), "Wr0ng-pw-4711\n").unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("auth"), "{err}");
    assert!(!err.contains("Wr0ng-pw-4711"), "{err}");
}

/// `probe` (as `check-config --probe`'s BACKEND column) shows the suite the session runs
/// with: on ipmi_sim, which refuses suite 17, `[17, 3]` reads with suite 3 and says so.
#[test]
fn probe_shows_the_suite_a_fallback_logged_in_with() {
    let sim = IpmiSim::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), format!("{}\n", ipmi_sim::PASSWORD)).unwrap();
    let path = dir.path().join("dc1.toml");
    let kubeconfig = dir.path().join("kubeconfig");
    let cfg = ipmi_config(
        dir.path(),
        &kubeconfig,
        "\"rack1-01\"",
        &sim.address(),
        "cipher_suite = [17, 3]\n",
    );
    std::fs::write(&path, cfg).unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with("rack1-01: On"), "{out}");
    assert!(out.contains("session: cipher suite 3, User"), "{out}");

    let cfg = std::fs::read_to_string(&path)
        .unwrap()
        .replace("cipher_suite = [17, 3]", "cipher_suite = 17");
    std::fs::write(&path, cfg).unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(
        err.contains("the BMC does not offer cipher suite 17: set cipher_suite = 3 or [17, 3]"),
        "{err}"
    );
}

/// What this build cannot do is a config error: exit 2, one line naming file and key.
#[test]
fn unsupported_ipmi_settings_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), "sup3r-secret-pw\n").unwrap();
    // check-config also checks the kubeconfig `run` would use: one it can load (no cluster
    // is contacted).
    let kubeconfig = dir.path().join("kubeconfig");
    support::k8s::write_offline_kubeconfig(&kubeconfig);
    let good = ipmi_config(
        dir.path(),
        &kubeconfig,
        "\"rack1-*\"",
        "{node}-ipmi.dc1.example",
        "",
    );
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, &good).unwrap();
    let o = oobfence(&["check-config"], &path);
    assert!(o.status.success(), "{}", text(&o.stderr));

    // Suite 17, 17 then 3, and every role from User up are accepted.
    for (suite, privilege) in [
        ("17", "user"),
        ("[17, 3]", "operator"),
        ("3", "administrator"),
    ] {
        let cfg = good.replace("cipher_suite = 3", &format!("cipher_suite = {suite}"))
            + &format!("privilege = \"{privilege}\"\n");
        std::fs::write(&path, &cfg).unwrap();
        let o = oobfence(&["check-config"], &path);
        assert!(
            o.status.success(),
            "{suite}/{privilege}: {}",
            text(&o.stderr)
        );
    }

    let with = |extra: &str| good.clone() + extra + "\n";
    let suite = |s: &str| good.replace("cipher_suite = 3", &format!("cipher_suite = {s}"));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            suite("5"),
            "[[bmc]] #1 cipher_suite",
            "cipher suite 5 is not spoken by oobfence: use 17",
        ),
        (suite("0"), "[[bmc]] #1 cipher_suite", "refused"),
        (
            suite("[3, 3]"),
            "[[bmc]] #1 cipher_suite",
            "two different ones",
        ),
        (
            with("privilege = \"root\""),
            "[[bmc]] #1 privilege",
            "\"root\" is not a privilege",
        ),
        (
            with("system = \"/redfish/v1/Systems/1\""),
            "[[bmc]] #1 system",
            "redfish",
        ),
        (
            with("tls_insecure = true"),
            "[[bmc]] #1 tls_insecure",
            "redfish",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "ipmi.dc1.example"),
            "[[bmc]] #1 address",
            "same machine",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "https://{node}-ipmi.dc1.example"),
            "[[bmc]] #1 address",
            "without a scheme",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "{node}-ipmi.dc1.example:99999"),
            "[[bmc]] #1 address",
            "bad port",
        ),
        (
            good.replace(
                "username = \"admin\"",
                "username = \"a-very-long-user-name\"",
            ),
            "[[bmc]] #1 username",
            "at most 16",
        ),
    ];
    for (cfg, key, want) in cases {
        std::fs::write(&path, &cfg).unwrap();
        let o = oobfence(&["check-config"], &path);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}: {err}");
        // One error, then the closing line that counts it.
        assert_eq!(err.trim_end().lines().count(), 2, "{key}: {err}");
        let file = path.display().to_string();
        assert!(
            err.trim_end()
                .lines()
                .last()
                .is_some_and(|l| l.starts_with(&format!("oobfence: 1 error in {file}"))),
            "{key}: {err}"
        );
        assert!(
            err.contains(key) && err.contains(want),
            "{key}/{want}: {err}"
        );
        assert!(!err.contains("sup3r-secret-pw"), "{err}");
    }
    // A password no IPMI 2.0 BMC can hold.
    std::fs::write(dir.path().join("pw"), format!("{}\n", "p".repeat(21))).unwrap();
    std::fs::write(&path, &good).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("[[bmc]] #1 password_file") && err.contains("21 bytes"),
        "{err}"
    );
    assert!(!err.contains("ppppp"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_reads_ipmi_nodes_of_the_cluster() {
    let s = Scenario::ipmi("ipmiprobe", 1).await;
    let sim = s.ipmi_sim(0);
    let a = s.node("a", 0).await;
    let path = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:0");
    let o = support::cli::oobfence_async(&["check-config", "--probe"], &path).await;
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out} {}", text(&o.stderr));
    let row = out
        .lines()
        .find(|l| l.starts_with(&a.name))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("ipmi") && row.contains(" On"), "{row}");
    assert!(row.contains("match: system UUID"), "{row}");
    // The suite and role the read logged in with (the scenario's entries: 3, Administrator).
    assert!(
        row.contains("ipmi (cipher suite 3, Administrator)"),
        "{row}"
    );
    assert_eq!(sim.other_sessions(), 0);
    a.delete().await;
}

const DECISION: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_an_ipmi_node_that_reads_off_never_one_that_reads_on() {
    use oobfence::cluster;
    use support::k8s::{FakeNode, KubeletIdentity, annotation, keep_taint, taints, wait_for};

    let s = Scenario::ipmi("ipmi", 3).await;
    let client = s.client.clone();
    let (off_sim, on_sim) = (s.ipmi_sim(0), s.ipmi_sim(1));
    let other_sim = s.ipmi_sim(2);
    // The kubelets report their SMBIOS UUID; each BMC's System GUID stands for it in one of the
    // byte orders BMCs use (the SMBIOS layout for one, as sent for the other).
    let smbios_form = off_sim.uuid_forms()[0].clone();
    assert_ne!(smbios_form, off_sim.uuid(), "the SMBIOS decoding differs");
    s.map("off", 0);
    let dead_node = s
        .node_reporting("off", "boot-1", KubeletIdentity::uuid(&smbios_form))
        .await;
    let alive_node = s.node("on", 1).await;
    // Mapped to other_sim's BMC, but its kubelet is the machine behind on_sim: a re-cabled BMC.
    s.map("impostor", 2);
    let impostor_node = s
        .node_reporting("impostor", "boot-1", s.identity(1).await)
        .await;
    let (dead, alive, impostor) = (
        dead_node.name.clone(),
        alive_node.name.clone(),
        impostor_node.name.clone(),
    );
    let daemon = s.daemon().await;

    off_sim.set_power(false);
    other_sim.set_power(false);
    dead_node.die("boot-1").await;
    alive_node.die("boot-1").await;
    impostor_node.die("boot-1").await;

    let has_taint = |name: String| {
        let client = client.clone();
        async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
            let n = api.get(&name).await.ok()?;
            FakeNode::has_oos_taint(&n).then_some(n)
        }
    };
    let fenced = wait_for("IPMI node that reads Off is tainted", DECISION, || {
        has_taint(dead.clone())
    })
    .await;
    assert!(taints(&fenced).contains(&keep_taint()));
    assert_eq!(
        annotation(&fenced, cluster::ANNOTATION_FENCED_BOOT_ID).as_deref(),
        Some("boot-1")
    );
    let report = daemon
        .wait_rule(&dead, "fenced-awaiting-recovery", DECISION)
        .await;
    assert_eq!(report["power_source"]["backend"], "ipmi");
    assert_eq!(report["power_source"]["address"], off_sim.address());
    let reads = report["reads"].as_array().unwrap();
    let offs: Vec<_> = reads.iter().filter(|r| r["result"] == "off").collect();
    assert!(
        offs.len() >= 2,
        "fenced on at least two Off reads: {reads:?}"
    );
    let details = offs[0]["details"].to_string();
    assert!(details.contains("chassis power faults: none"), "{details}");
    assert_eq!(off_sim.ipmitool_power(), "off");

    // The node whose BMC says On is blocked and never tainted.
    let report = daemon.wait_rule(&alive, "power-on", DECISION).await;
    assert_eq!(report["state"], "blocked");
    assert_eq!(on_sim.ipmitool_power(), "on");
    // The BMC that answers Off for another machine fences nothing.
    let report = daemon
        .wait_rule(&impostor, "identity-mismatch", DECISION)
        .await;
    assert_eq!(report["state"], "blocked");
    assert!(!FakeNode::has_oos_taint(&impostor_node.get().await));

    // `why` shows the IPMI evidence.
    let out = support::cli::oobfence_async(&["why", &dead], &daemon.config_path).await;
    let why = text(&out.stdout);
    assert!(out.status.success(), "{why} {}", text(&out.stderr));
    assert!(why.contains("ipmi"), "{why}");
    assert!(why.contains("chassis power faults: none"), "{why}");

    // Power back on with a new boot: the fence comes off, as for Redfish nodes.
    off_sim.set_power(true);
    dead_node.come_back("boot-2").await;
    // A live kubelet from now on: the unfence must not race the controller marking the node
    // NotReady again for want of renewals.
    let _back_kubelet = FakeNode::keep_alive(&[&dead_node], "boot-2");
    daemon.wait_unfenced(&dead, DECISION).await;
    assert!(!FakeNode::has_oos_taint(&dead_node.get().await));
    assert!(!FakeNode::has_oos_taint(&alive_node.get().await));
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_power_reads_total{backend=\"ipmi\",result=\"off\""),
        "{metrics}"
    );
    assert!(!FakeNode::has_oos_taint(&impostor_node.get().await));
    daemon.stop().await;
    dead_node.delete().await;
    alive_node.delete().await;
    impostor_node.delete().await;
    // The daemon closed its sessions when it stopped.
    assert_eq!(off_sim.other_sessions(), 0);
    assert_eq!(on_sim.other_sessions(), 0);
}
