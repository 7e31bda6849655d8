//! The checks of a config without a cluster: Redfish's note, a kubeconfig's files and token.

use super::*;

fn jwt(claims: &str) -> String {
    use base64::Engine as _;
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.{}",
        e.encode(r#"{"alg":"RS256"}"#),
        e.encode(claims),
        e.encode("sig")
    )
}

/// Redfish cannot tell a hibernated machine or a VM saved to disk from one that is off:
/// check-config says so for every Redfish entry, and for no IPMI one (Get ACPI Power State
/// tells, where the BMC has it; the read says when it does not).
#[test]
fn redfish_entries_get_the_saved_vm_note() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "s3cret-value\n").unwrap();
    let text = format!(
        "datacenter = \"dc1\"\n\
         [[bmc]]\nnodes = [\"rf-*\"]\nprotocol = \"redfish\"\naddress = \"https://{{node}}-bmc\"\nusername = \"u\"\npassword_file = \"{0}\"\n\
         [[bmc]]\nnodes = [\"ipmi-*\"]\nprotocol = \"ipmi\"\naddress = \"{{node}}-bmc\"\nusername = \"u\"\npassword_file = \"{0}\"\n",
        pw.display()
    );
    let cfg = Config::parse(&text, Path::new("dc1.toml")).unwrap();
    let notes: Vec<_> = warnings(&cfg)
        .into_iter()
        .filter(|f| f.key.ends_with(".protocol"))
        .collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].severity, Severity::Note);
    assert_eq!(notes[0].key, "bmc[0].protocol");
    assert!(notes[0].problem.contains("saved to disk"), "{}", notes[0]);
    assert!(notes[0].problem.contains("reads Off"), "{}", notes[0]);
}

#[test]
fn a_tokens_expiry_is_its_exp_claim() {
    assert_eq!(
        token_expiry(&jwt(
            r#"{"exp":1800000000,"sub":"system:serviceaccount:o:o"}"#
        )),
        Some(Timestamp::from_second(1_800_000_000).unwrap())
    );
    assert_eq!(token_expiry(&jwt(r#"{"sub":"x"}"#)), None, "no exp");
    assert_eq!(token_expiry("not-a-jwt"), None);
    assert_eq!(token_expiry("a.b.c.d"), None);
    assert_eq!(token_expiry(&jwt("[1]")), None);
}

fn kubeconfig_file(dir: &Path, token: &str, extra_user: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n    token: {token}\n{extra_user}"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn config_for(path: &Path, context: Option<&str>) -> KubernetesConfig {
    KubernetesConfig {
        kubeconfig: Some(path.to_path_buf()),
        context: context.map(String::from),
        node_selector: None,
    }
}

#[test]
fn a_kubeconfig_is_checked_for_what_run_needs() {
    let dir = tempfile::tempdir().unwrap();
    let now = Timestamp::from_second(1_800_000_000).unwrap();
    let in_a_year = jwt(r#"{"exp":1831536000}"#);
    let path = kubeconfig_file(dir.path(), &in_a_year, "");
    // The CA file it names is missing (relative to the kubeconfig's directory).
    let f = kubeconfig(&config_for(&path, None), now);
    assert!(
        f.iter().any(|f| f.severity == Severity::Error
            && f.problem.contains("certificate-authority")
            && f.problem.contains("ca.crt")),
        "{f:?}"
    );
    std::fs::write(dir.path().join("ca.crt"), "pem").unwrap();
    let f = kubeconfig(&config_for(&path, None), now);
    assert!(f.iter().all(|f| f.severity == Severity::Note), "{f:?}");
    assert!(f[0].problem.contains("2028-01-15 08:00 UTC"), "{f:?}");

    let missing = config_for(&dir.path().join("nope"), None);
    let f = kubeconfig(&missing, now);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].severity, Severity::Error);
    assert_eq!(f[0].key, "kubernetes.kubeconfig");
    assert!(f[0].problem.contains("nope"), "{f:?}");

    let f = kubeconfig(&config_for(&path, Some("other")), now);
    assert_eq!(f[0].key, "kubernetes.context");
    assert!(
        f[0].problem.contains("\"other\" is not in") && f[0].problem.contains("has: c"),
        "{f:?}"
    );

    let soon = kubeconfig_file(dir.path(), &jwt(r#"{"exp":1800086400}"#), "");
    let f = kubeconfig(&config_for(&soon, None), now);
    assert!(
        f.iter()
            .any(|f| f.severity == Severity::Warning && f.problem.contains("in 24 hours")),
        "{f:?}"
    );
    let expired = kubeconfig_file(dir.path(), &jwt(r#"{"exp":1700000000}"#), "");
    let f = kubeconfig(&config_for(&expired, None), now);
    assert!(
        f.iter()
            .any(|f| f.severity == Severity::Error && f.problem.contains("expired on")),
        "{f:?}"
    );
    // What to run: the commands that mint one where the daemon reads it.
    let hint = format!(
        "`oobfence make-kubeconfig --output {0}.new && install -m 0640 -g oobfence {0}.new {0} && rm {0}.new`",
        expired.display()
    );
    assert!(
        f.iter().any(|f| f.problem.contains(&hint)),
        "{hint} in {f:?}"
    );
    assert!(
        f.iter().all(|f| !f.problem.contains("eyJ")),
        "never the token itself: {f:?}"
    );

    std::fs::set_permissions(&expired, std::fs::Permissions::from_mode(0o644)).unwrap();
    let f = kubeconfig(&config_for(&expired, None), now);
    assert!(
        f.iter().any(
            |f| f.severity == Severity::Warning && f.problem.contains("readable by every user")
        ),
        "{f:?}"
    );
}
