//! The `oobfence` binary as an operator uses it: exit codes, one-line config errors, `probe`,
//! `check-config --probe` and `why` without a daemon.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use support::cli::oobfence;
use support::k8s::{KubeletIdentity, kubeconfig_path};
use support::scenario::Scenario;
use support::sushy::SushyEmulator;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn valid_config(dir: &Path, address: &str, extra: &str) -> String {
    let pw = dir.join("pw");
    std::fs::write(&pw, "sup3r-secret-pw\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    if !kubeconfig.exists() {
        support::k8s::write_offline_kubeconfig(&kubeconfig);
    }
    format!(
        r#"datacenter = "dc1"
[kubernetes]
kubeconfig = "{}/kubeconfig"
[server]
listen = "127.0.0.1:{}"
[[bmc]]
nodes = ["rack1-*"]
protocol = "redfish"
address = "{address}"
username = "admin"
password_file = "{}"
{extra}
"#,
        dir.display(),
        support::k8s::free_port(),
        pw.display()
    )
}

/// A config every check passes: `rack1-*` BMCs at `https://{node}-bmc.example`.
fn good_config(dir: &Path) -> String {
    valid_config(dir, "https://{node}-bmc.example", "tls_insecure = true")
}

#[test]
fn check_config_accepts_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, good_config(dir.path())).unwrap();
    let o = oobfence(&["check-config"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("OK"), "{}", stdout(&o));
}

/// Each kind of bad config: exit code 2, one line on stderr naming the file and the key, and the
/// closing count with the command to run again.
#[test]
fn bad_configs_exit_2_with_one_line_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_config(dir.path());
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "malformed",
            "datacenter = \"dc1\n".to_string(),
            "dc1.toml:1: ",
        ),
        (
            "unknown key",
            good.replace("[server]", "[server]\nlisten_port = 1"),
            "server.listen_port",
        ),
        (
            "missing password file",
            good.replace(
                &dir.path().join("pw").display().to_string(),
                "/nonexistent/pw",
            ),
            "[[bmc]] #1 password_file",
        ),
        (
            "bad glob",
            good.replace("rack1-*", "rack1-[*"),
            "[[bmc]] #1 nodes",
        ),
        (
            "unknown witness",
            good.replace(
                "tls_insecure = true",
                "tls_insecure = true\ncorroborate = \"power\"",
            ),
            "[[bmc]] #1 corroborate",
        ),
        (
            "max_off_watts out of range",
            good.replace(
                "tls_insecure = true",
                "tls_insecure = true\ncorroborate = \"power-draw\"\nmax_off_watts = 5000",
            ),
            "[[bmc]] #1 max_off_watts",
        ),
    ];
    for (what, text, key) in cases {
        let path = dir.path().join("dc1.toml");
        std::fs::write(&path, text).unwrap();
        let o = oobfence(&["check-config"], &path);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        // The error, then the count with the command to run again.
        assert_eq!(err.trim_end().lines().count(), 2, "{what}: {err}");
        assert!(err.contains("1 error in"), "{what}: {err}");
        assert!(err.contains(&path.display().to_string()), "{what}: {err}");
        assert!(err.contains(key), "{what}: expected {key} in {err}");
        assert!(!err.contains("sup3r-secret-pw"), "{what}: {err}");
    }
    // A missing config file is a config error too.
    let o = oobfence(&["check-config"], &dir.path().join("absent.toml"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// What `run` needs beyond the file's syntax: a kubeconfig that is there, whole and names its
/// context; a node_selector the API server would accept. Errors exit 2, each naming its key;
/// settings that weaken the proof or expose a secret are warned about, and pass.
#[test]
fn check_config_covers_what_run_needs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    let strict = valid_config(
        dir.path(),
        "https://{node}-bmc.example",
        &format!("ca_file = \"{}\"", dir.path().join("ca.pem").display()),
    );
    // A CA certificate the loader accepts: the test suite's own.
    let (cert, _key) = support::sushy::self_signed_cert(dir.path(), "bmc");
    std::fs::copy(cert, dir.path().join("ca.pem")).unwrap();
    std::fs::write(&path, &strict).unwrap();
    let o = oobfence(&["check-config"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).trim().is_empty(), "no warning: {}", stderr(&o));

    let errors: Vec<(&str, String, &str)> = vec![
        (
            "missing kubeconfig",
            strict.replace("/kubeconfig\"", "/absent-kubeconfig\""),
            "kubernetes.kubeconfig: cannot load",
        ),
        (
            "unknown context",
            strict.replace("[kubernetes]", "[kubernetes]\ncontext = \"dc2\""),
            "kubernetes.context: context \"dc2\" is not in",
        ),
        (
            "malformed node_selector",
            strict.replace(
                "[kubernetes]",
                "[kubernetes]\nnode_selector = \"topology.kubernetes.io/zone in (dc1\"",
            ),
            "kubernetes.node_selector",
        ),
    ];
    for (what, text, says) in errors {
        std::fs::write(&path, text).unwrap();
        let o = oobfence(&["check-config"], &path);
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(says),
            "{what}: expected {says:?} in {}",
            stderr(&o)
        );
        assert!(!stdout(&o).contains("OK"), "{what}: {}", stdout(&o));
    }

    // Warnings: the run works, with less safety or secrecy than it should.
    std::fs::write(&path, good_config(dir.path())).unwrap();
    std::fs::set_permissions(
        dir.path().join("pw"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: [[bmc]] #1 tls_insecure: TLS certificate verification is off"),
        "{err}"
    );
    assert!(
        err.contains("warning: [[bmc]] #1 password_file:")
            && err.contains("readable by every user"),
        "{err}"
    );
    assert!(!err.contains("sup3r-secret-pw"), "{err}");
}

#[test]
fn why_without_a_daemon_says_none_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, good_config(dir.path())).unwrap();
    let o = oobfence(&["why", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("no oobfence daemon answers"), "{err}");
    assert!(err.contains("oobfence@dc1"), "{err}");
    // An operator's shell has no $CREDENTIALS_DIRECTORY: why never needs the passwords.
    let text = std::fs::read_to_string(&path).unwrap();
    let pw_line = text
        .lines()
        .find(|l| l.starts_with("password_file"))
        .unwrap()
        .to_string();
    std::fs::write(
        &path,
        text.replace(&pw_line, "password_credential = \"rack1\""),
    )
    .unwrap();
    let o = oobfence(&["why", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no oobfence daemon answers"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reads_one_node_from_the_config_alone() {
    let emu = SushyEmulator::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    let extra = format!(
        "system = \"{}\"\nca_file = \"{}\"",
        emu.system_path(0),
        emu.cert_pem_path().display()
    );
    // No kubeconfig exists: probe must not need the cluster for a BMC-mapped node.
    let text = valid_config(dir.path(), &emu.base_url(), &extra).replace("rack1-*", "rack1-01");
    std::fs::write(&path, text).unwrap();
    std::fs::write(dir.path().join("pw"), "password\n").unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("rack1-01: On"), "{}", stdout(&o));
    // How it logged in, and the TLS version the BMC picks (sushy-tools' server: 1.2 or 1.3,
    // as its Python's ssl module offers).
    assert!(
        stdout(&o).contains("\n  session: HTTP Basic, auth = auto"),
        "{}",
        stdout(&o)
    );
    assert!(
        ["\n  transport: TLS 1.2\n", "\n  transport: TLS 1.3\n"]
            .iter()
            .any(|l| stdout(&o).contains(l)),
        "{}",
        stdout(&o)
    );

    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", std::time::Duration::from_secs(30))
        .await;
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(stdout(&o).starts_with("rack1-01: Off"), "{}", stdout(&o));
    // --json: where it was read, and the reading as the journal records it.
    let o = oobfence(&["probe", "rack1-01", "--json"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("probe --json");
    assert_eq!(doc["node"], "rack1-01");
    assert_eq!(doc["backend"], "redfish");
    assert_eq!(doc["reading"]["state"], "off", "{doc:#}");
    assert!(doc["reading"]["latency"].is_number(), "{doc:#}");

    // A node no entry maps, and a BMC that refuses the password: both non-zero.
    let o = oobfence(&["probe", "rack2-01"], &path);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no [[bmc]] entry"), "{}", stderr(&o));
    std::fs::write(dir.path().join("pw"), "wrong\n").unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("auth"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("wrong"), "{}", stderr(&o));
    let o = oobfence(&["probe", "rack1-01", "--json"], &path);
    assert_eq!(o.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("probe --json");
    assert_eq!(doc["reading"]["state"], "error", "{doc:#}");
    assert!(!stdout(&o).contains("wrong"), "{}", stdout(&o));
}

/// `probe` names how a read logged in and what TLS the BMC speaks: a BMC with Basic turned
/// off is read through a session, and one that offers only TLS 1.1 is named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_names_the_login_form_and_the_tls_version() {
    use support::session_bmc::{self, Basic, SessionBmc};
    let bmc = SessionBmc::start(Basic::Refused);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    let extra = format!("system = \"/redfish/v1/Systems/1\"\n{}", bmc.pinned());
    let text = valid_config(dir.path(), &bmc.address(), &extra).replace("rack1-*", "rack1-01");
    std::fs::write(&path, text).unwrap();
    std::fs::write(
        dir.path().join("pw"),
        format!("{}\n", session_bmc::PASSWORD),
    )
    .unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    for line in [
        "rack1-01: On",
        "\n  session: Redfish session, auth = auto (the BMC refused HTTP Basic)",
        "\n  transport: TLS 1.3",
    ] {
        assert!(stdout(&o).contains(line), "{line:?} in {}", stdout(&o));
    }
    assert!(
        !stdout(&o).contains(session_bmc::PASSWORD),
        "{}",
        stdout(&o)
    );
    // Its session is logged out when probe is done.
    let stats = bmc.stats().await;
    assert_eq!((stats.logins, stats.open), (1, 0), "{stats:?}");

    let old = support::odd_bmc::OddBmc::start_tls_1_1_only();
    let extra = format!("system = \"/off\"\nca_file = \"{}\"", old.cert.display());
    let text = valid_config(
        dir.path(),
        &format!("https://127.0.0.1:{}", old.port),
        &extra,
    )
    .replace("rack1-*", "rack1-01");
    std::fs::write(&path, text).unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains(
            "transport: TLS unknown: TLS handshake failed: the BMC offers only TLS 1.0/1.1"
        ),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_reads_every_mapped_node_of_the_cluster() {
    let s = Scenario::redfish("probe", 1).await;
    let a = s.node("a", 0).await;
    let b = s
        .node_reporting("b", "boot-1", KubeletIdentity::default())
        .await;
    let (mapped, unmapped) = (&a.name, &b.name);
    let path = s.write_config(&kubeconfig_path(), "127.0.0.1:0");
    let o = oobfence(&["check-config", "--probe"], &path);
    let out = stdout(&o);
    assert!(o.status.success(), "{out} {}", stderr(&o));
    let row = |n: &str| out.lines().find(|l| l.starts_with(n)).map(String::from);
    let ra = row(mapped).unwrap_or_else(|| panic!("{out}"));
    assert!(ra.contains("redfish") && ra.contains(" On"), "{ra}");
    assert!(
        ra.contains("redfish (HTTP Basic, auth = auto; TLS 1.2)")
            || ra.contains("redfish (HTTP Basic, auth = auto; TLS 1.3)"),
        "BACKEND names the login form and the TLS version: {ra}"
    );
    assert!(
        ra.contains("match") && ra.contains(&s.redfish_emulator().uuid(0)),
        "the IDENTITY column ties the BMC to the node: {ra}"
    );
    let rb = row(unmapped).unwrap_or_else(|| panic!("{out}"));
    assert!(rb.contains("not mapped"), "{rb}");
    a.delete().await;
    b.delete().await;
}

/// `oobfence pause` writes the pause file named in the config (its reason first), `resume`
/// removes it; a datacenter without a pause file says how to pause instead.
#[test]
fn pause_and_resume_manage_the_pause_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dc1.paused");
    let path = dir.path().join("dc1.toml");
    std::fs::write(
        &path,
        format!(
            "{}\n[pause]\nfile = \"{}\"\n",
            good_config(dir.path()),
            file.display()
        ),
    )
    .unwrap();
    let o = oobfence(&["pause", "--reason", "rewiring rack 7"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("oobfence resume"), "{}", stdout(&o));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("rewiring rack 7 (paused by "), "{text}");
    assert_eq!(
        oobfence::pause::read_file(&file).map(|r| r.contains("rewiring rack 7")),
        Some(true)
    );
    let o = oobfence(&["resume"], &path);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!file.exists());
    assert!(stdout(&o).contains("removed"), "{}", stdout(&o));
    // No pause file configured: exit 2, pointing at the ConfigMap.
    std::fs::write(
        &path,
        format!("{}\n[pause]\nfile = \"\"\n", good_config(dir.path())),
    )
    .unwrap();
    let o = oobfence(&["pause"], &path);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("oobfence.io/paused"), "{}", stderr(&o));
}

/// The test control plane's start, when it fails: it is tried once more on fresh ports, and each
/// attempt's logs are kept (and their tails printed), so that the message's pointer to them
/// leads somewhere. A kube-apiserver given an unknown flag fails every time.
#[test]
fn a_failed_control_plane_start_is_retried_once_and_keeps_each_attempts_logs() {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster");
    let o = std::process::Command::new(&script)
        .arg("start")
        .arg(dir.path())
        .env("OOBFENCE_TEST_APISERVER_ARGS", "--no-such-flag")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run scripts/test-cluster");
    let _ = std::process::Command::new(&script)
        .arg("stop")
        .arg(dir.path())
        .output();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("retrying once"), "{err}");
    assert!(err.contains("each attempt's logs are in"), "{err}");
    // The tails were printed, and the logs are still there.
    assert!(err.contains("unknown flag: --no-such-flag"), "{err}");
    for attempt in ["attempt-1", "attempt-2"] {
        let log = std::fs::read_to_string(dir.path().join(attempt).join("kube-apiserver.log"))
            .unwrap_or_else(|e| panic!("{attempt}'s kube-apiserver.log: {e}"));
        assert!(log.contains("unknown flag: --no-such-flag"), "{log}");
    }
    assert!(!dir.path().join("attempt-3").exists(), "retried only once");
}

/// `--config` may come from $OOBFENCE_CONFIG (what a shell for one datacenter sets once).
#[test]
fn the_config_may_come_from_oobfence_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, good_config(dir.path())).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--log-level", "debug"])
        .env(
            support::cli::DAEMON_USER_ENV.0,
            support::cli::DAEMON_USER_ENV.1,
        )
        .env("OOBFENCE_CONFIG", &path)
        .env_remove("OOBFENCE_LOG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("{}: OK", path.display())),
        "{}",
        stdout(&o)
    );
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--log-level", "loud"])
        .env("OOBFENCE_CONFIG", &path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("possible values"), "{}", stderr(&o));
}

/// `--version` says which build this is: version, commit, date, target, profile.
#[test]
fn version_names_the_commit_and_the_build_date() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .arg("--version")
        .output()
        .unwrap();
    let v = stdout(&o);
    assert!(o.status.success(), "{v}");
    assert!(
        v.starts_with(&format!("oobfence {} (", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let commit = v.contains("commit ") && !v.contains("unknown commit");
    // A checkout has a commit; a source tarball says so.
    assert!(commit || v.contains("unknown commit"), "{v}");
    let date = v.split("built ").nth(1).unwrap_or_default();
    assert!(
        date.len() >= 10 && date[..10].chars().filter(|c| *c == '-').count() == 2,
        "{v}"
    );
    assert!(v.contains(std::env::consts::ARCH), "{v}");
}

/// The man pages the package ships: one for oobfence, one per command, valid roff.
#[test]
fn man_pages_are_written_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["man", "--output"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    for page in [
        "oobfence",
        "oobfence-run",
        "oobfence-check-config",
        "oobfence-why",
        "oobfence-nodes",
    ] {
        let text = std::fs::read_to_string(dir.path().join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    let run = std::fs::read_to_string(dir.path().join("oobfence-run.1")).unwrap();
    assert!(run.contains("OOBFENCE_CONFIG"), "{run}");
    assert!(
        !dir.path().join("oobfence-man.1").exists(),
        "the hidden command has no page"
    );
}
