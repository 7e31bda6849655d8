//! `[actuation]`: off by default, both opt-ins read, `after` well past NotReady, a budget of at
//! least one.

use super::*;

#[test]
fn actuation_is_off_unless_enabled_and_each_source_says_actuate() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&minimal(&pw)).unwrap();
    assert_eq!(cfg.actuation, None);
    assert_eq!(cfg.policy.actuation, None);
    assert!(!cfg.bmc[0].actuate);

    let text = format!(
        "{}actuate = true\n[actuation]\nenabled = true\n",
        minimal(&pw)
    );
    let cfg = parse(&text).unwrap();
    let a = cfg.actuation.expect("enabled");
    assert_eq!(a.policy.after, Duration::from_secs(300));
    assert!(a.policy.power_on);
    assert_eq!(a.max_per_hour, 3);
    assert_eq!(a.policy.max_silence, Duration::from_secs(3600));
    assert_eq!(cfg.policy.actuation, Some(a.policy));
    assert!(cfg.bmc[0].actuate);
}

#[test]
fn actuation_after_must_be_well_past_not_ready_and_the_budget_at_least_one() {
    let e = parse("datacenter = \"dc1\"\n[actuation]\nenabled = true\nafter = \"30s\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("actuation.after") && e.contains("shorter than 2m"),
        "{e}"
    );
    let e = parse(
        "datacenter = \"dc1\"\n[policy]\nnot_ready_grace = \"5m\"\n[actuation]\nenabled = true\nafter = \"6m\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("shorter than 10m"), "{e}");
    let e = parse("datacenter = \"dc1\"\n[actuation]\nenabled = true\nmax_per_hour = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("actuation.max_per_hour"), "{e}");
    let e = parse("datacenter = \"dc1\"\n[actuation]\nenabled = true\nforce = true\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("force"), "{e}");
    // A hung node must have room to be powered off before it counts as abandoned.
    let e = parse("datacenter = \"dc1\"\n[actuation]\nenabled = true\nafter = \"40m\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("actuation.max_silence") && e.contains("twice after"),
        "{e}"
    );
    let cfg = parse(
        "datacenter = \"dc1\"\n[actuation]\nenabled = true\nafter = \"40m\"\nmax_silence = \"2h\"\n",
    )
    .unwrap();
    assert_eq!(
        cfg.actuation.unwrap().policy.max_silence,
        Duration::from_secs(7200)
    );
    // Off: its other keys are not judged.
    assert!(parse("datacenter = \"dc1\"\n[actuation]\nafter = \"30s\"\n").is_ok());
}
