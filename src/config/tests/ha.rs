//! `[ha]`: off by default, its timings checked, no pause file with it, and an identity many
//! hosts share is a warning.

use super::*;

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
        ("leader = true", "ha", "unknown key"),
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
