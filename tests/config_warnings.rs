//! `oobfence check-config` warnings about a config that works but not as meant: a `[[bmc]]`
//! entry an earlier glob hides, one that matches no Node (`--probe`), a password file of two
//! lines, `[server] listen` off loopback. Warnings go to stderr; the exit code stays 0.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use support::cli::check_config_text as check;
use support::k8s::kubeconfig_path;
use support::scenario::Scenario;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A config in `dir` with these `[[bmc]]` entries (nodes, address) and `[server] listen`,
/// every entry's password in `pw`.
fn config(dir: &Path, listen: &str, entries: &[(&str, &str)]) -> String {
    let pw = dir.join("pw");
    if !pw.exists() {
        std::fs::write(&pw, "sup3r-secret-pw\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    support::k8s::write_offline_kubeconfig(&dir.join("kubeconfig"));
    let mut text = format!(
        "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = \"{}\"\n[server]\nlisten = \"{listen}\"\n",
        dir.join("kubeconfig").display()
    );
    for (nodes, address) in entries {
        text.push_str(&format!(
            "[[bmc]]\nnodes = {nodes}\nprotocol = \"redfish\"\naddress = \"{address}\"\nusername = \"admin\"\npassword_file = \"{}\"\ntls_fingerprint = \"sha256:{}\"\n",
            pw.display(),
            "AB".repeat(32)
        ));
    }
    text
}

/// The line of `[[bmc]]` entry `n` (1-based) of `text`.
fn entry_line(text: &str, n: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| *l == "[[bmc]]")
        .nth(n - 1)
        .map(|(i, _)| i + 1)
        .unwrap()
}

/// An entry whose every pattern an earlier glob matches first is never used: a warning naming
/// both entries by number and line; entries an earlier one only overlaps are not warned about.
#[test]
fn an_entry_an_earlier_glob_hides_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = config(
        d,
        "127.0.0.1:9464",
        &[
            (r#"["rack*"]"#, "https://{node}-bmc.example"),
            (
                r#"["rack1-*", "rack2-0[1-9]"]"#,
                "https://{node}-ipmi.example",
            ),
            (r#"["rack3-07"]"#, "https://10.0.3.7"),
            (r#"["db-*"]"#, "https://{node}-bmc.db.example"),
            (r#"["db-1?", "web-*"]"#, "https://{node}-other.example"),
        ],
    );
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let (l1, l2, l3) = (
        entry_line(&text, 1),
        entry_line(&text, 2),
        entry_line(&text, 3),
    );
    for (n, line) in [(2, l2), (3, l3)] {
        let want = format!(
            "{file}: warning: [[bmc]] #{n} nodes: [[bmc]] #{n} (line {line}) is never used: every node its nodes"
        );
        assert!(err.contains(&want), "want {want} in:\n{err}");
    }
    assert!(
        err.contains(&format!("is matched first by [[bmc]] #1 (line {l1})")),
        "{err}"
    );
    assert!(!err.contains("[[bmc]] #4 nodes"), "{err}");
    assert!(
        !err.contains("[[bmc]] #5 nodes"),
        "web-* is only its own: {err}"
    );
}

/// A password file of two non-empty lines: its whole text is the password; a warning says so,
/// without the password.
#[test]
fn a_password_file_of_two_lines_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("pw"), "sup3r-secret-pw\nold-secret-pw\n").unwrap();
    std::fs::set_permissions(d.join("pw"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = config(d, "127.0.0.1:9464", &[(r#"["n1"]"#, "https://10.0.0.1")]);
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "{file}: warning: [[bmc]] #1 password_file: {} holds 2 non-empty lines: the whole file is the password",
            d.join("pw").display()
        )),
        "{err}"
    );
    assert!(!err.contains("secret-pw"), "{err}");
}

/// `[server] listen` on every address: a warning naming what it serves and what to do; on
/// loopback, none.
#[test]
fn listen_off_loopback_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let entries = [(r#"["n1"]"#, "https://10.0.0.1")];
    let (o, err, file) = check(d, &config(d, "0.0.0.0:9464", &entries));
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "{file}: warning: server.listen: 0.0.0.0:9464 is reachable from other hosts"
        )) && err.contains("/metrics")
            && err.contains("127.0.0.1:9464")
            && err.contains("firewall"),
        "{err}"
    );
    let (_, err, _) = check(d, &config(d, "[::1]:9464", &entries));
    assert!(!err.contains("server.listen"), "{err}");
}

/// `check-config --probe`: an entry that matches none of the cluster's Nodes is warned about,
/// and so are an inventory's lines naming no Node; the entry that matches a Node is not.
#[tokio::test(flavor = "multi_thread")]
async fn probe_warns_of_an_entry_that_matches_no_node() {
    let s = Scenario::redfish("unmatched", 1).await;
    let a = s.node("a", 0).await;
    let b = s
        .node_reporting("b", "boot-1", support::k8s::KubeletIdentity::default())
        .await;
    let pw = s.dir().join("pw-ghost");
    std::fs::write(&pw, "pw\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ghost = s.name("ghost");
    let inventory = s.dir().join("dc.inventory");
    std::fs::write(
        &inventory,
        format!(
            "{} = https://127.0.0.1:1/b\n{}-typo = https://127.0.0.1:1/c\n",
            b.name, b.name
        ),
    )
    .unwrap();
    let text = s.config_text(
        &kubeconfig_path(),
        "127.0.0.1:0",
        &format!(
            "[[bmc]]\nnodes = [\"{ghost}\"]\nprotocol = \"redfish\"\naddress = \"https://127.0.0.1:1\"\nusername = \"u\"\npassword_file = \"{pw}\"\ntls_insecure = true\n[[bmc]]\ninventory = \"{}\"\nprotocol = \"redfish\"\nusername = \"u\"\npassword_file = \"{pw}\"\ntls_insecure = true\ntimeout = \"1s\"\n",
            inventory.display(),
            pw = pw.display()
        ),
    );
    let path = s.dir().join("dc.toml");
    std::fs::write(&path, &text).unwrap();
    let o = support::cli::oobfence_async(&["check-config", "--probe"], &path).await;
    let err = stderr(&o);
    // b's BMC does not answer: exit 1, and the warnings all the same.
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("warning: [[bmc]] #2 nodes: [[bmc]] #2 (line")
            && err.contains(&format!(
                "matches none of the cluster's 2 nodes (nodes [\"{ghost}\"])"
            )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "warning: [[bmc]] #3 inventory: 1 of the 2 nodes of {} are not in the cluster (the first: {}-typo, line 2)",
            inventory.display(),
            b.name
        )),
        "{err}"
    );
    assert!(!err.contains("[[bmc]] #1 nodes"), "{err}");
    a.delete().await;
    b.delete().await;
}
