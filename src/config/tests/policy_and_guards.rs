//! `[policy]` and `[guards]`: their defaults (also the example's), Lease staleness and
//! pre-attestation, the health read interval, the pause file, counts and shares.

use super::*;

/// The example's `[policy]` and `[guards]` are the built-in defaults, written out: what the
/// docs/decisions.md and the timeline test call "the example config's defaults" is one thing.
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
        (
            "[guards]\nmax_unhealthyy = 3",
            "guards",
            "unknown key `max_unhealthyy`: did you mean `max_unhealthy`?",
        ),
    ] {
        let e = parse(&format!("{base}\n{body}\n")).unwrap_err();
        assert!(e.key.starts_with(key), "{body}: {e}");
        assert!(e.problem.contains(says), "{body}: {e}");
    }
}

/// The code, the reference example and the packaged example agree on the dry run: an
/// operator copying either example gets what a config without the key gets.
#[test]
fn both_shipped_examples_state_the_dry_run_default() {
    let dir = tempfile::tempdir().unwrap();
    let default = parse(&minimal(&write_pw(dir.path())))
        .unwrap()
        .policy
        .dry_run;
    for example in ["config/example-dc.toml", "packaging/example.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
        let table: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        let stated = table["policy"]["dry_run"].as_bool();
        assert_eq!(stated, Some(default), "{example}: policy.dry_run");
    }
}
