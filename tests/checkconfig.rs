//! `oobfence check-config` as an operator meets it on day one: every problem in one pass and
//! one format (the file's, the kubeconfig's, the files it names as the daemon's user reads
//! them), a closing hint that runs as printed, `--strict`, notes said once, bare numbers for
//! durations, and `[[bmc]]` entries numbered alike in text and JSON.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use support::cli::{DAEMON_USER_ENV, check_config_text as check, config_head, oobfence};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A Redfish `[[bmc]]` entry for `nodes` (a TOML array), its password in `dir/pw`.
fn redfish(dir: &Path, nodes: &str, extra: &str) -> String {
    format!(
        "[[bmc]]\nnodes = {nodes}\nprotocol = \"redfish\"\naddress = \"https://{{node}}-bmc.example\"\nusername = \"admin\"\npassword_file = \"{}\"\ntls_fingerprint = \"sha256:{}\"\n{extra}",
        dir.join("pw").display(),
        "AB".repeat(32)
    )
}

/// A shell command line of the form the CLI prints, run by `sh` with the built binary first
/// on $PATH (as an installed one is).
fn run_in_shell(line: &str) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_oobfence")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("sh")
        .args(["-c", line])
        .env("PATH", path)
        .env(DAEMON_USER_ENV.0, DAEMON_USER_ENV.1)
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .expect("run sh")
}

/// The command between the last pair of backticks of `text`.
fn last_quoted_command(text: &str) -> String {
    let line = text.lines().last().expect("a closing line");
    let mut parts = line.rsplit('`');
    parts.next();
    parts.next().expect("a `command`").to_string()
}

/// A broken file whose kubeconfig is broken too: both in the first run, each as
/// `oobfence: FILE[:LINE]: KEY: PROBLEM`, counted together; `--json` lists both as errors.
#[test]
fn config_and_kubeconfig_errors_come_in_one_pass_and_one_format() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = config_head(d);
    // A context the kubeconfig does not have.
    text.push_str("context = \"nowhere\"\n[policy]\nconfirm_reads = 0\n");
    text.push_str(&redfish(d, "[\"a\"]", ""));
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "oobfence: {file}:6: policy.confirm_reads: must be at least 1"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "oobfence: {file}: kubernetes.context: context \"nowhere\" is not in"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("2 errors in {file}")), "{err}");

    let o = oobfence(&["check-config", "--json"], &d.join("dc1.toml"));
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let keys: Vec<&str> = doc["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert_eq!(
        keys,
        ["policy.confirm_reads", "kubernetes.context"],
        "{doc:#}"
    );
}

/// The closing line's command, pasted into a shell, runs `check-config` on the same file
/// (whose path has a space) and says the same: for one error and for several.
#[test]
fn the_printed_hint_runs_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dc one");
    std::fs::create_dir(&d).unwrap();
    for mistakes in [
        "[policy]\nconfirm_reads = 0\n",
        "[policy]\nconfirm_reads = 0\nbogus = 1\n",
    ] {
        let text = format!(
            "{}{mistakes}{}",
            config_head(&d),
            redfish(&d, "[\"a\"]", "")
        );
        let (o, err, file) = check(&d, &text);
        assert_eq!(o.status.code(), Some(2), "{err}");
        let hint = last_quoted_command(&err);
        assert!(hint.starts_with("oobfence check-config"), "{err}");
        let again = run_in_shell(&hint);
        assert_eq!(again.status.code(), Some(2), "`{hint}`: {}", stderr(&again));
        assert_eq!(stderr(&again), err, "`{hint}` says what the first run said");
        assert!(
            err.contains(&format!("errors in {file}"))
                || err.contains(&format!("1 error in {file}")),
            "{err}"
        );
    }
}

/// A glob that hides 9 of an inventory's 14 nodes is a warning: exit 0, and 1 with `--strict`
/// (in text and JSON alike).
#[test]
fn strict_turns_warnings_into_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let inventory = d.join("dc1.inventory");
    let mut lines = String::new();
    for n in 1..=9 {
        lines.push_str(&format!("rack1-{n:02} = https://10.0.1.{n}\n"));
    }
    for n in 1..=5 {
        lines.push_str(&format!("rack2-{n:02} = https://10.0.2.{n}\n"));
    }
    std::fs::write(&inventory, lines).unwrap();
    let text = format!(
        "{}{}[[bmc]]\ninventory = \"{}\"\nprotocol = \"redfish\"\nusername = \"admin\"\npassword_file = \"{}\"\ntls_fingerprint = \"sha256:{}\"\n",
        config_head(d),
        redfish(d, "[\"rack1-*\"]", ""),
        inventory.display(),
        d.join("pw").display(),
        "AB".repeat(32)
    );
    let (o, err, _) = check(d, &text);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("9 of the 14 nodes"), "{err}");
    let config = d.join("dc1.toml");
    let o = oobfence(&["check-config", "--strict"], &config);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("9 of the 14 nodes"), "{}", stderr(&o));
    assert!(stderr(&o).contains("--strict: exit 1"), "{}", stderr(&o));
    let o = oobfence(&["check-config", "--strict", "--json"], &config);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(doc["exit_code"], 1, "{doc:#}");
}

/// Run as root, a password file of another owner, mode 600, and the root-only kubeconfig are
/// named as files the daemon's user cannot read, each with the commands that fix it; run,
/// those commands make check-config pass.
#[test]
fn files_the_daemon_user_cannot_read_are_named_with_the_fix() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test checks as the daemon's user, which check-config does as root: run it as root"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let text = format!("{}{}", config_head(d), redfish(d, "[\"a\"]", ""));
    let config = d.join("dc1.toml");
    std::fs::write(&config, &text).unwrap();
    let pw = d.join("pw");
    std::os::unix::fs::chown(&pw, Some(65534), None).unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The packaged user; where the package is not installed, another system user stands in.
    let user = match Command::new("getent")
        .args(["passwd", "oobfence"])
        .output()
        .map(|o| o.status)
    {
        Ok(s) if s.success() => "oobfence",
        _ => "nobody",
    };
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_oobfence"))
            .args(["check-config", "--config"])
            .arg(&config)
            .env("OOBFENCE_DAEMON_USER", user)
            .output()
            .unwrap()
    };
    let o = run();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let fixes: Vec<String> = err
        .lines()
        .filter(|l| l.contains(&format!("cannot be read by user {user}")))
        .map(|l| l.rsplit("fix: ").next().unwrap().to_string())
        .collect();
    let group = if user == "oobfence" {
        "oobfence"
    } else {
        "nogroup"
    };
    for file in [pw.clone(), d.join("kubeconfig")] {
        let fix = format!("chgrp {group} {0} && chmod 640 {0}", file.display());
        assert!(fixes.contains(&fix), "{fix:?} not in\n{err}");
    }
    assert!(err.contains("owner nobody"), "{err}");
    assert!(err.contains("mode 0600"), "{err}");
    for fix in &fixes {
        let o = run_in_shell(fix);
        assert!(o.status.success(), "{fix}: {}", stderr(&o));
    }
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// Redfish's note on hibernated machines is about every Redfish entry: said once, naming
/// them, however many there are.
#[test]
fn a_note_for_every_redfish_entry_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = format!(
        "{}{}{}{}",
        config_head(d),
        redfish(d, "[\"a-*\"]", ""),
        redfish(d, "[\"b-*\"]", ""),
        redfish(d, "[\"c-*\"]", "")
    );
    let (o, err, _) = check(d, &text);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let out = stdout(&o);
    assert_eq!(
        out.matches("Redfish has no sleep state").count(),
        1,
        "{out}"
    );
    assert!(out.contains("the 3 Redfish entries (#1, #2, #3)"), "{out}");
}

/// `60` unquoted (a TOML integer) gets the very words `"60"` gets, for every duration key.
#[test]
fn a_bare_number_duration_gets_the_words_of_its_quoted_form() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (section, key) in [
        ("[policy]", "not_ready_grace"),
        ("[policy]", "confirm_interval"),
        ("[policy]", "read_max_age"),
        ("[policy]", "recheck_interval"),
        ("[policy]", "health_read_interval"),
        ("[policy]", "flap_window"),
        ("", "timeout"),
    ] {
        let said = |value: &str| {
            let text = match section {
                "" => format!(
                    "{}{}",
                    config_head(d),
                    redfish(d, "[\"a\"]", &format!("{key} = {value}\n"))
                ),
                _ => format!(
                    "{}{section}\n{key} = {value}\n{}",
                    config_head(d),
                    redfish(d, "[\"a\"]", "")
                ),
            };
            let (o, err, _) = check(d, &text);
            assert_eq!(o.status.code(), Some(2), "{key} = {value}: {err}");
            err.lines().next().unwrap_or_default().to_string()
        };
        let (bare, quoted) = (said("60"), said("\"60\""));
        assert_eq!(bare, quoted, "{key}");
        assert!(bare.contains("\"60\" is not a duration"), "{bare}");
    }
}

/// An entry's error is `[[bmc]] #2` in the text and in the JSON (its key, and `bmc_entry` 2).
#[test]
fn json_and_text_number_bmc_entries_alike() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = format!(
        "{}{}{}",
        config_head(d),
        redfish(d, "[\"a\"]", ""),
        redfish(d, "[\"b\"]", "tls_pin_validity = \"sometimes\"\n")
    );
    let (o, err, _) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("[[bmc]] #2 tls_pin_validity"), "{err}");
    let o = oobfence(&["check-config", "--json"], &d.join("dc1.toml"));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let e = &doc["errors"][0];
    assert_eq!(e["key"], "[[bmc]] #2 tls_pin_validity", "{doc:#}");
    assert_eq!(e["bmc_entry"], 2, "{doc:#}");
}
