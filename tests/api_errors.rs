//! What the real binary says when it cannot use the API server: the address and the cause
//! (refused, DNS, TLS and why), a 401 as an expired or revoked token with what to run, and no
//! RBAC blamed for a watch that never reached the server. Against the real kube-apiserver where
//! one is involved.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::certs::ca_and_leaf;
use support::cli::oobfence;
use support::k8s::{free_port, kubeconfig_path};

/// The test cluster's `server` and `certificate-authority-data`.
fn test_cluster() -> (String, String) {
    let text = std::fs::read_to_string(kubeconfig_path()).expect("read the test kubeconfig");
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the test kubeconfig"))
            .trim()
            .to_string()
    };
    (field("server:"), field("certificate-authority-data:"))
}

/// A kubeconfig for `server` trusting `ca` (a kubeconfig `cluster:` line), with `token`, and a
/// config that uses it. Returns the config's path.
fn config(dir: &Path, server: &str, ca: &str, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: dc1\n\
             clusters:\n- name: dc1\n  cluster:\n    server: {server}\n    {ca}\n\
             contexts:\n- name: dc1\n  context: {{cluster: dc1, user: oobfence}}\n\
             users:\n- name: oobfence\n  user: {{token: {token}}}\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o600)).unwrap();
    let password = dir.join("password");
    std::fs::write(&password, "secret\n").unwrap();
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let path = dir.join("dc.toml");
    std::fs::write(
        &path,
        format!(
            "datacenter = \"dc1\"\n\
             [kubernetes]\nkubeconfig = \"{}\"\n\
             [server]\nlisten = \"127.0.0.1:0\"\n\
             [journal]\npath = \"{}\"\n\
             [[bmc]]\nnodes = [\"n1\"]\nprotocol = \"redfish\"\naddress = \"https://127.0.0.1:9\"\n\
             username = \"u\"\npassword_file = \"{}\"\nidentity = \"unchecked\"\n",
            kubeconfig.display(),
            dir.join("journal.jsonl").display(),
            password.display()
        ),
    )
    .unwrap();
    path
}

/// `check-config --probe`'s stderr; the probe must fail.
fn probe_fails(config: &Path) -> String {
    let out = oobfence(&["check-config", "--probe"], config);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the probe passed:\n{stderr}");
    stderr
}

fn assert_names_server_and_cause(stderr: &str, server: &str, cause: &str) {
    let line = stderr
        .lines()
        .find(|l| l.contains("cannot list nodes"))
        .unwrap_or_else(|| panic!("no `cannot list nodes` line:\n{stderr}"));
    assert!(line.contains(server), "the address is not named:\n{line}");
    assert!(
        line.contains(cause),
        "the cause ({cause}) is not named:\n{line}"
    );
    assert!(
        !line.contains("ServiceError"),
        "the client's words:\n{line}"
    );
}

#[test]
fn nothing_listening_is_a_refused_connection_to_the_named_address() {
    let dir = tempfile::tempdir().unwrap();
    let server = format!("https://127.0.0.1:{}", free_port());
    let cfg = config(dir.path(), &server, "insecure-skip-tls-verify: true", "t");
    let stderr = probe_fails(&cfg);
    assert_names_server_and_cause(&stderr, &server, "connection refused");
}

#[test]
fn a_name_that_does_not_resolve_is_a_dns_failure() {
    let dir = tempfile::tempdir().unwrap();
    let server = "https://no-such-api-server.invalid:6443";
    let cfg = config(dir.path(), server, "insecure-skip-tls-verify: true", "t");
    let stderr = probe_fails(&cfg);
    assert_names_server_and_cause(&stderr, server, "host name does not resolve");
}

#[test]
fn an_api_server_certificate_from_another_ca_is_a_tls_failure_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = test_cluster();
    let (other_ca, _, _) = ca_and_leaf(dir.path(), "other", "20200101000000Z", "20900101000000Z");
    let ca = format!("certificate-authority: {}", other_ca.display());
    let cfg = config(dir.path(), &server, &ca, "t");
    let stderr = probe_fails(&cfg);
    assert_names_server_and_cause(&stderr, &server, "TLS handshake failed");
    assert!(
        stderr.contains("not signed by the kubeconfig's certificate-authority"),
        "{stderr}"
    );
    // And what to do about it.
    assert!(
        stderr.contains("set the cluster's certificate-authority in the kubeconfig")
            && stderr.contains("oobfence make-kubeconfig"),
        "{stderr}"
    );
}

/// `make-kubeconfig` against an administrator's kubeconfig whose API server does not answer
/// names that server's URL and the cause.
#[test]
fn make_kubeconfig_names_the_api_server_it_could_not_reach() {
    let dir = tempfile::tempdir().unwrap();
    let server = format!("https://127.0.0.1:{}", free_port());
    config(dir.path(), &server, "insecure-skip-tls-verify: true", "t");
    let o = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["make-kubeconfig", "--kubeconfig"])
        .arg(dir.path().join("kubeconfig"))
        .arg("--output")
        .arg(dir.path().join("minted"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the API server at {server}")),
        "{stderr}"
    );
    assert!(stderr.contains("connection refused"), "{stderr}");
    assert!(!dir.path().join("minted").exists());
}

#[test]
fn a_refused_token_says_it_expired_or_was_revoked_and_what_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca_data) = test_cluster();
    let ca = format!("certificate-authority-data: {ca_data}");
    let cfg = config(dir.path(), &server, &ca, "a-token-no-server-issued");
    let stderr = probe_fails(&cfg);
    let line = stderr
        .lines()
        .find(|l| l.contains("cannot list nodes"))
        .unwrap_or_else(|| panic!("no `cannot list nodes` line:\n{stderr}"));
    assert!(line.contains("401 Unauthorized"), "{line}");
    assert!(line.contains("expired or was revoked"), "{line}");
    assert!(line.contains("oobfence make-kubeconfig"), "{line}");
    assert!(!line.contains("Status {"), "a Rust struct:\n{line}");
}

/// The daemon's first log lines with nothing listening at the API server's address: every
/// watch names the address and the refusal, and none blames RBAC.
#[test]
fn the_daemon_does_not_blame_rbac_for_an_api_server_it_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    let server = format!("https://127.0.0.1:{}", free_port());
    let cfg = config(dir.path(), &server, "insecure-skip-tls-verify: true", "t");
    let mut child = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env_remove("CREDENTIALS_DIRECTORY")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oobfence run");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = Vec::new();
    let watches = [
        "watch=\"nodes\"",
        "watch=\"leases\"",
        "VolumeAttachment watch",
    ];
    while Instant::now() < deadline
        && !watches
            .iter()
            .all(|w| lines.iter().any(|l: &String| l.contains(w)))
    {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(line);
        }
    }
    child.kill().ok();
    child.wait().ok();
    let all = lines.join("\n");
    for w in watches {
        let line = lines
            .iter()
            .find(|l| l.contains(w))
            .unwrap_or_else(|| panic!("no line for {w} within 30 s:\n{all}"));
        assert!(line.contains(&server), "the address is not named:\n{line}");
        assert!(line.contains("connection refused"), "{line}");
        assert!(
            !line.contains("RBAC"),
            "RBAC blamed for a refused connection:\n{line}"
        );
    }
}
