use std::path::{Path, PathBuf};

use super::*;
use crate::decision::FenceAction;
use crate::decision::holds::Limit;

fn write_pw(dir: &Path) -> PathBuf {
    let p = dir.join("pw");
    std::fs::write(&p, "s3cret-value\n").unwrap();
    p
}

fn minimal(pw: &Path) -> String {
    format!(
        r#"
datacenter = "dc1"
[[bmc]]
nodes = ["rack1-*", "db-[0-9]"]
protocol = "redfish"
address = "https://{{node}}-bmc.dc1.example"
username = "fence"
password_file = "{}"
"#,
        pw.display()
    )
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("dc1.toml"))
}

#[test]
fn minimal_config_gets_safe_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(&minimal(&write_pw(dir.path()))).unwrap();
    assert_eq!(cfg.policy, Policy::default());
    assert_eq!(cfg.policy.action, FenceAction::Taint);
    assert!(!cfg.policy.dry_run);
    assert_eq!(cfg.server.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(
        cfg.journal.path,
        Path::new("/var/lib/oobfence/dc1.journal.jsonl")
    );
    assert_eq!(cfg.digest.len(), 64);
    let b = cfg.bmc_for("rack1-07").unwrap();
    assert_eq!(
        b.address_for("rack1-07"),
        "https://rack1-07-bmc.dc1.example"
    );
    assert!(cfg.bmc_for("db-3").is_some());
    assert!(cfg.bmc_for("rack2-01").is_none());
    assert_eq!(b.password.expose(), "s3cret-value");
}

#[test]
fn first_matching_entry_wins() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let text = format!(
        "{}\n[[bmc]]\nnodes = [\"*\"]\nprotocol = \"redfish\"\naddress = \"https://{{node}}.other\"\nusername = \"u\"\npassword_file = \"{}\"\n",
        minimal(&pw),
        pw.display()
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.bmc_for("rack1-1").unwrap().index, 0);
    assert_eq!(cfg.bmc_for("anything").unwrap().index, 1);
}

#[test]
fn unknown_key_names_the_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = minimal(&write_pw(dir.path())).replace(
        "datacenter = \"dc1\"",
        "datacenter = \"dc1\"\n[policy]\nconfirm_read = 3",
    );
    let e = parse(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("dc1.toml: policy.confirm_read (line 4)"),
        "{e}"
    );
    assert!(e.contains("unknown field `confirm_read`"), "{e}");
    assert!(e.contains("line 4"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn malformed_toml_is_one_line_with_a_line_number() {
    let e = parse("datacenter = \"dc1\n[policy]\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("dc1.toml: line 1: invalid TOML"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn missing_password_file_names_key_and_path() {
    let e = parse(&minimal(Path::new("/nonexistent/pw")))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("dc1.toml: bmc[0].password_file: cannot read password file /nonexistent/pw"),
        "{e}"
    );
}

#[test]
fn clients_can_load_the_config_without_the_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let text = minimal(Path::new("/nonexistent/pw"));
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, &text).unwrap();
    assert!(Config::load(&path).is_err());
    let cfg = Config::load_without_secrets(&path).unwrap();
    assert_eq!(cfg.bmc[0].password.expose(), "");
    // Everything else is still validated.
    std::fs::write(&path, text.replace("[0-9]", "[0-9")).unwrap();
    assert!(Config::load_without_secrets(&path).is_err());
}

#[test]
fn bad_glob_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let text = minimal(&write_pw(dir.path())).replace("db-[0-9]", "db-[0-9");
    let e = parse(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("dc1.toml: bmc[0].nodes: bad glob \"db-[0-9\""),
        "{e}"
    );
}

#[test]
fn bad_values_are_rejected_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = minimal(&write_pw(dir.path()));
    let cases = [
        ("[policy]\nconfirm_reads = 0", "policy.confirm_reads"),
        (
            "[policy]\nnot_ready_grace = \"soon\"",
            "policy.not_ready_grace",
        ),
        ("[policy]\naction = \"reboot\"", "policy.action"),
        ("[server]\nlisten = \"localhost\"", "server.listen"),
        ("[journal]\npath = \"journal.jsonl\"", "journal.path"),
        ("[journal]\npath = \"/tmp\"", "journal.path"),
        ("[journal]\nfsync = true", "journal.fsync"),
    ];
    for (extra, key) in cases {
        let text = base.replace(
            "datacenter = \"dc1\"",
            &format!("datacenter = \"dc1\"\n{extra}"),
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.starts_with(&format!("dc1.toml: {key}")), "{extra}: {e}");
    }
    let plain = base.replace("https://", "http://");
    assert!(
        parse(&plain)
            .unwrap_err()
            .to_string()
            .contains("bmc[0].address")
    );
    let both = base.replace(
        "username",
        "tls_insecure = true\nca_file = \"/x\"\nusername",
    );
    assert!(
        parse(&both)
            .unwrap_err()
            .to_string()
            .contains("bmc[0].tls_insecure")
    );
    let shared = base.replace("https://{node}-bmc.dc1.example", "https://bmc.dc1.example");
    let e = parse(&shared).unwrap_err().to_string();
    assert!(
        e.contains("bmc[0].address") && e.contains("same machine"),
        "{e}"
    );
    let creds = base.replace("https://", "https://root:calvin@");
    let e = parse(&creds).unwrap_err().to_string();
    assert!(
        e.contains("must not contain credentials") && !e.contains("calvin"),
        "{e}"
    );
    let proto = base.replace("\"redfish\"", "\"telnet\"");
    assert!(
        parse(&proto)
            .unwrap_err()
            .to_string()
            .contains("bmc[0].protocol")
    );
}

#[test]
fn aws_section_maps_nodes_after_bmc_entries() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n[aws]\nregion = \"us-east-1\"\nnodes = [\"*\"]\nendpoint_url = \"http://127.0.0.1:5000\"\n",
        minimal(&write_pw(dir.path()))
    );
    let cfg = parse(&text).unwrap();
    assert!(matches!(cfg.mapping_for("rack1-01"), Some(Mapping::Bmc(_))));
    assert!(matches!(
        cfg.mapping_for("ip-10-0-0-1"),
        Some(Mapping::Aws(_))
    ));
    let aws = cfg.aws.as_ref().unwrap();
    assert_eq!(aws.timeout, Duration::from_secs(10));
    assert_eq!(aws.volume_release_warning, Duration::from_secs(600));
    let bad = text.replace("us-east-1", "US East");
    assert!(parse(&bad).unwrap_err().to_string().contains("aws.region"));
    let bad = text.replace("http://127.0.0.1:5000", "ftp://x");
    assert!(
        parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("aws.endpoint_url")
    );
}

#[test]
fn ipmi_entries_get_defaults_and_keep_to_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let ipmi = minimal(&pw)
        .replace("\"redfish\"", "\"ipmi\"")
        .replace("https://{node}-bmc.dc1.example", "{node}-ipmi.dc1.example");
    let cfg = parse(&ipmi).unwrap();
    let b = cfg.bmc_for("rack1-07").unwrap();
    assert_eq!(b.protocol, Protocol::Ipmi);
    assert_eq!(b.ipmi, Some(ipmi::IpmiOptions::default()));
    assert_eq!(b.address_for("rack1-07"), "rack1-07-ipmi.dc1.example");
    assert_eq!(b.timeout, Duration::from_secs(5));
    // Suite 17 as User by default; 3, or 17 then 3, and the other roles when asked for.
    let options = |extra: &str| parse(&format!("{ipmi}{extra}")).map(|c| c.bmc[0].ipmi.unwrap());
    let default = options("").unwrap();
    assert_eq!(default.cipher_suites.to_string(), "17");
    assert_eq!(default.privilege, ipmi::Privilege::User);
    assert_eq!(
        options("cipher_suite = 3\n")
            .unwrap()
            .cipher_suites
            .to_string(),
        "3"
    );
    let both = options("cipher_suite = [17, 3]\nprivilege = \"operator\"\n").unwrap();
    assert_eq!(both.cipher_suites.to_string(), "17, then 3");
    assert_eq!(both.cipher_suites.in_order().collect::<Vec<_>>(), [17, 3]);
    assert_eq!(both.privilege, ipmi::Privilege::Operator);
    for (extra, want) in [
        (
            "cipher_suite = 5\n",
            "cipher suite 5 is not spoken by oobfence: use 17",
        ),
        (
            "cipher_suite = 0\n",
            "cipher suite 0 has no integrity protection",
        ),
        ("cipher_suite = [17, 17]\n", "two different ones"),
        ("cipher_suite = [17, 3, 1]\n", "two different ones"),
        (
            "cipher_suite = [17, 2]\n",
            "cipher suite 2 has no encryption",
        ),
        ("cipher_suite = \"17\"\n", "bmc"),
        (
            "privilege = \"root\"\n",
            "\"root\" is not a privilege: use \"user\"",
        ),
    ] {
        let e = options(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    let e = parse(&format!("{ipmi}ca_file = \"/x\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bmc[0].ca_file") && e.contains("redfish"), "{e}");
    let e = parse(&format!("{ipmi}cipher_suite = 300\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bmc[0].cipher_suite"), "{e}");
    // Redfish entries refuse the IPMI keys.
    let e = parse(&format!("{}privilege = \"administrator\"\n", minimal(&pw)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bmc[0].privilege") && e.contains("\"ipmi\" only"),
        "{e}"
    );
    assert_eq!(parse(&minimal(&pw)).unwrap().bmc[0].ipmi, None);
}

#[test]
fn two_entries_for_one_machine_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let entry = |node: &str, system: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"redfish\"\naddress = \"https://10.0.0.5/\"\nsystem = \"{system}\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    let ok = format!(
        "datacenter = \"dc1\"\n{}{}",
        entry("n1", "/redfish/v1/Systems/1"),
        entry("n2", "/redfish/v1/Systems/2")
    );
    assert!(parse(&ok).is_ok());
    let dup = format!(
        "datacenter = \"dc1\"\n{}{}",
        entry("n1", "/redfish/v1/Systems/1"),
        entry("n2", "/redfish/v1/Systems/1/")
    );
    let e = parse(&dup).unwrap_err().to_string();
    assert!(
        e.contains("bmc[1].address") && e.contains("same machine as bmc[0]"),
        "{e}"
    );
}

/// Two spellings of one BMC are one machine: the default port written out or not, a
/// trailing slash, the host's case.
#[test]
fn two_spellings_of_one_bmc_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let redfish = |node: &str, address: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"redfish\"\naddress = \"{address}\"\nsystem = \"/redfish/v1/Systems/1\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    for (a, b) in [
        ("https://bmc1.example/", "https://bmc1.example:443"),
        ("https://BMC1.example", "https://bmc1.example/"),
        ("https://10.0.0.5:443/", "https://10.0.0.5"),
    ] {
        let dup = format!(
            "datacenter = \"dc1\"\n{}{}",
            redfish("n1", a),
            redfish("n2", b)
        );
        let e = parse(&dup).unwrap_err().to_string();
        assert!(e.contains("same machine as bmc[0]"), "{a} vs {b}: {e}");
    }
    let other_port = format!(
        "datacenter = \"dc1\"\n{}{}",
        redfish("n1", "https://bmc1.example"),
        redfish("n2", "https://bmc1.example:8443")
    );
    assert!(parse(&other_port).is_ok());
    let ipmi = |node: &str, address: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"ipmi\"\naddress = \"{address}\"\nusername = \"u\"\npassword_file = \"{}\"\n",
            pw.display()
        )
    };
    let dup = format!(
        "datacenter = \"dc1\"\n{}{}",
        ipmi("n1", "IPMI1.example"),
        ipmi("n2", "ipmi1.example:623")
    );
    let e = parse(&dup).unwrap_err().to_string();
    assert!(e.contains("same machine as bmc[0]"), "{e}");
}

#[test]
fn identity_defaults_to_checked_and_can_be_unchecked() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&minimal(&pw)).unwrap();
    assert_eq!(cfg.bmc[0].identity, IdentityCheck::Checked);
    let text = minimal(&pw) + "identity = \"unchecked\"\n";
    assert_eq!(
        parse(&text).unwrap().bmc[0].identity,
        IdentityCheck::Unchecked
    );
    let e = parse(&(minimal(&pw) + "identity = \"off\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bmc") && e.contains("identity"), "{e}");
}

#[test]
fn sha256_matches_the_standard_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    // Two blocks of padding.
    assert_eq!(
        sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    assert_eq!(
        sha256_hex(&[b'a'; 1000]),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
}

#[test]
fn config_debug_never_shows_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(&minimal(&write_pw(dir.path()))).unwrap();
    let dbg = format!("{cfg:?}");
    assert!(!dbg.contains("s3cret-value"), "{dbg}");
    assert!(dbg.contains("<redacted>"));
}

#[test]
fn example_config_documents_and_parses() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example-dc.toml"),
    )
    .unwrap();
    // The example points at /etc paths that do not exist here; the parse must get past
    // syntax and keys and stop only at the missing secret.
    let e = parse(&text).unwrap_err().to_string();
    assert!(
        e.contains("password_file: cannot read password file"),
        "{e}"
    );
}

/// The example's `[policy]` and `[guards]` are the built-in defaults, written out: what the
/// README and the timeline test call "the example config's defaults" is one thing.
#[test]
fn example_config_policy_and_guards_are_the_defaults() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example-dc.toml"),
    )
    .unwrap();
    let example: toml::Table = text.parse().unwrap();
    let mut only = toml::Table::new();
    only.insert("datacenter".into(), "dc1".into());
    for section in ["policy", "guards"] {
        only.insert(section.into(), example[section].clone());
    }
    let cfg = parse(&toml::to_string(&only).unwrap()).unwrap();
    assert_eq!(cfg.policy, crate::decision::Policy::default());
    assert_eq!(cfg.guards, crate::decision::holds::GuardPolicy::default());
    assert!(cfg.policy.pre_attest_after.is_some());
}

#[test]
fn lease_stale_after_is_checked_and_pre_attest_can_be_turned_off() {
    let e = parse("datacenter = \"dc1\"\n[policy]\nlease_stale_after = 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("policy.lease_stale_after"), "{e}");
    assert!(e.contains("between 1.5 and 100"), "{e}");
    let cfg = parse("datacenter = \"dc1\"\n[policy]\nlease_stale_after = 3\n").unwrap();
    assert_eq!(
        cfg.policy.pre_attest_after,
        crate::decision::Renewals::new(3.0)
    );
    let cfg = parse("datacenter = \"dc1\"\n[policy]\npre_attest = false\n").unwrap();
    assert_eq!(cfg.policy.pre_attest_after, None);
    let e = parse("datacenter = \"dc1\"\n[guards]\nmax_stale_leases = \"lots\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("guards.max_stale_leases"), "{e}");
}

#[test]
fn health_read_interval_has_a_default_a_floor_and_a_ceiling() {
    let cfg = parse("datacenter = \"dc1\"\n").unwrap();
    assert_eq!(cfg.health_read_interval, Duration::from_secs(600));
    let with = |v: &str| {
        parse(&format!(
            "datacenter = \"dc1\"\n[policy]\nhealth_read_interval = \"{v}\"\n"
        ))
    };
    assert_eq!(
        with("2m").unwrap().health_read_interval,
        Duration::from_secs(120)
    );
    for (v, says) in [("1s", "shorter than 10s"), ("1h", "longer than 15m")] {
        let e = with(v).unwrap_err().to_string();
        assert!(e.contains("policy.health_read_interval"), "{e}");
        assert!(e.contains(says), "{e}");
    }
    assert_eq!(
        with("15m").unwrap().health_read_interval,
        Duration::from_secs(900)
    );
}

/// Found by the fuzz test: a value with a line break, quoted by the TOML parser in its error,
/// broke the one-line error promise.
#[test]
fn an_error_quoting_a_line_break_stays_on_one_line() {
    let text = "datacenter = \"dc1\"\n[policy]\naction = \"\"\"ta\nt\"\"\"\n";
    let e = parse(text).unwrap_err().to_string();
    assert!(e.contains("policy.action"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

proptest::proptest! {
    #![proptest_config(crate::fuzz::config())]

    /// Any config text, the example mutated: no panic, and a refusal is one line naming the
    /// file.
    #[test]
    fn fuzz_config_files(text in crate::fuzz::text_like(include_str!("../../config/example-dc.toml"))) {
        if let Err(e) = Config::parse_with(&text, Path::new("dc1.toml"), Secrets::Skip) {
            let line = e.to_string();
            proptest::prop_assert!(!line.contains('\n'), "{}", line);
            proptest::prop_assert!(line.starts_with("dc1.toml: "), "{}", line);
        }
    }
}

#[test]
fn guards_and_pause_get_safe_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(&minimal(&write_pw(dir.path()))).unwrap();
    assert_eq!(cfg.guards, GuardPolicy::default());
    assert_eq!(cfg.guards.max_unhealthy, Limit::Percent(50));
    assert_eq!(
        cfg.guards.failure_domain_label.as_deref(),
        Some("topology.kubernetes.io/zone")
    );
    assert_eq!(
        cfg.pause.file.as_deref(),
        Some(Path::new("/etc/oobfence/dc1.paused"))
    );
    assert_eq!(
        cfg.pause
            .configmap
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("oobfence/oobfence-pause")
    );
}

#[test]
fn guards_take_counts_and_shares_and_name_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let base = minimal(&write_pw(dir.path()));
    let cfg = parse(&format!(
        "{base}\n[guards]\nmax_unhealthy = 12\ndomain_max_unhealthy = \"60%\"\nfence_budget = \"3\"\nfailure_domain_label = \"\"\n[pause]\nfile = \"\"\nconfigmap = \"\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.guards.max_unhealthy, Limit::Count(12));
    assert_eq!(cfg.guards.domain_max_unhealthy, Limit::Percent(60));
    assert_eq!(cfg.guards.fence_budget, Limit::Count(3));
    assert_eq!(cfg.guards.failure_domain_label, None);
    assert_eq!(
        cfg.pause,
        PauseConfig {
            file: None,
            configmap: None
        }
    );
    for (body, key, says) in [
        (
            "[guards]\nmax_unhealthy = \"half\"",
            "guards.max_unhealthy",
            "neither a count",
        ),
        (
            "[guards]\nfence_budget = \"150%\"",
            "guards.fence_budget",
            "more than 100%",
        ),
        (
            "[guards]\nfreeze_failing_share = 3",
            "guards.freeze_failing_share",
            "share",
        ),
        (
            "[guards]\nmax_view_age = \"0s\"",
            "guards.max_view_age",
            "longer than 0s",
        ),
        (
            "[guards]\nfailure_domain_label = \"rack=a\"",
            "guards.failure_domain_label",
            "label key",
        ),
        ("[pause]\nfile = \"dc1.paused\"", "pause.file", "absolute"),
        (
            "[pause]\nconfigmap = \"just-a-name\"",
            "pause.configmap",
            "NAMESPACE/NAME",
        ),
        ("[guards]\nmax_unhealthyy = 3", "guards", "unknown field"),
    ] {
        let e = parse(&format!("{base}\n{body}\n")).unwrap_err();
        assert!(e.key.starts_with(key), "{body}: {e}");
        assert!(e.problem.contains(says), "{body}: {e}");
    }
}

#[test]
fn ha_is_off_by_default_and_checks_its_timings() {
    let dir = tempfile::tempdir().unwrap();
    let base = minimal(&write_pw(dir.path()));
    assert_eq!(parse(&base).unwrap().ha, None);
    assert_eq!(
        parse(&format!("{base}\n[ha]\nenabled = false\n"))
            .unwrap()
            .ha,
        None
    );
    let ha = parse(&format!(
        "{base}\n[ha]\nenabled = true\nidentity = \"mgmt-a\"\n"
    ))
    .unwrap()
    .ha
    .unwrap();
    assert_eq!(ha.namespace, "oobfence");
    assert_eq!(ha.identity, "mgmt-a");
    assert_eq!(ha.lease_name("DC_1.x"), "oobfence-dc-1-x");
    assert_eq!(ha.lease_duration, Duration::from_secs(30));
    // A write is cut off after a quarter of the lease on our side, and as long again on the
    // API server's; the leader stops writing that long (plus clock allowance) before the
    // lease could be taken.
    assert_eq!(ha.write_timeout(), Duration::from_millis(7500));
    assert_eq!(ha.write_settled_within(), Duration::from_secs(15));
    assert!(ha.safety_margin() > ha.write_settled_within());
    assert!(ha.lease_duration - ha.safety_margin() >= ha.renew_interval * 2);
    for (body, key, says) in [
        (
            "lease_duration = \"5s\"",
            "ha.lease_duration",
            "two renew_interval",
        ),
        (
            "renew_interval = \"0s\"",
            "ha.renew_interval",
            "longer than 0s",
        ),
        ("namespace = \"Oobfence\"", "ha.namespace", "namespace name"),
        ("identity = \"a b\"", "ha.identity", "without spaces"),
        ("leader = true", "ha", "unknown field"),
    ] {
        let e = parse(&format!("{base}\n[ha]\nenabled = true\n{body}\n")).unwrap_err();
        assert!(e.key.starts_with(key), "{body}: {e}");
        assert!(e.problem.contains(says), "{body}: {e}");
    }
}

/// With `[ha]` the pause is the group's: no default pause file, an explicit one refused (a
/// failover would lift it), the ConfigMap kept.
#[test]
fn with_ha_there_is_no_pause_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = minimal(&write_pw(dir.path()));
    assert!(
        parse(&base).unwrap().pause.file.is_some(),
        "the default file"
    );
    let ha = "\n[ha]\nenabled = true\nidentity = \"mgmt-a\"\n";
    let cfg = parse(&format!("{base}{ha}")).unwrap();
    assert_eq!(cfg.pause.file, None);
    assert!(cfg.pause.configmap.is_some());
    let e = parse(&format!(
        "{base}{ha}[pause]\nfile = \"/etc/oobfence/dc1.paused\"\n"
    ))
    .unwrap_err();
    assert_eq!(e.key, "pause.file");
    assert!(e.problem.contains("failover"), "{e}");
    assert!(parse(&format!("{base}{ha}[pause]\nfile = \"\"\n")).is_ok());
    // No ConfigMap either: the group has no pause switch at all, which check-config says.
    let none = parse(&format!("{base}{ha}[pause]\nconfigmap = \"\"\n")).unwrap();
    assert!(
        crate::config::checks::warnings(&none)
            .iter()
            .any(|f| f.key == "pause.configmap")
    );
    assert!(
        !crate::config::checks::warnings(&cfg)
            .iter()
            .any(|f| f.key == "pause.configmap")
    );
}

/// An `[ha] identity` that many hosts carry by default (a cloned image's host name) would make
/// two instances one: check-config says so.
#[test]
fn an_ha_identity_many_hosts_share_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let base = minimal(&write_pw(dir.path()));
    let warned = |identity: &str| {
        let cfg = parse(&format!(
            "{base}\n[ha]\nenabled = true\nidentity = \"{identity}\"\n"
        ))
        .unwrap();
        crate::config::checks::warnings(&cfg)
            .into_iter()
            .find(|f| f.key == "ha.identity")
    };
    for shared in ["localhost", "localhost.localdomain", "ubuntu", "Debian"] {
        let f = warned(shared).unwrap_or_else(|| panic!("{shared}: no warning"));
        assert!(f.problem.contains("its own identity"), "{f}");
    }
    for own in ["mgmt-a", "mgmt-b.dc1.example.org"] {
        assert_eq!(warned(own), None, "{own}");
    }
}
