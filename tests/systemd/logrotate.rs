//! The packaged logrotate rule (packaging/logrotate) run by the real logrotate on a journal,
//! and `oobfence timeline` and `oobfence why` reading across what it leaves.

use super::*;

/// A journal line as the daemon writes it: a record about `node` ("" for the datacenter).
fn record_line(ts: &str, node: &str, kind: &str, rule: &str, result: &str) -> String {
    serde_json::json!({
        "ts": ts, "datacenter": "dc1", "node": node, "kind": kind, "rule": rule,
        "action": "none", "result": result, "message": format!("{rule} {result}"),
        "inputs": {"ready": "NotReady"}, "config_digest": "d", "version": "0.1.0",
    })
    .to_string()
        + "\n"
}

fn append(path: &Path, line: &str) {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
}

/// Three months of a journal: rotated twice by the shipped rule (the newest rotated file
/// plain, the older gzipped), then told back whole, in order, by `timeline`, and by `why`
/// when asked for more records than the current file holds.
#[test]
fn the_shipped_logrotate_rule_leaves_files_timeline_and_why_read() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("dc1.journal.jsonl");
    let rule =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/logrotate"))
            .unwrap();
    assert!(
        rule.contains("/var/lib/oobfence/*.journal.jsonl {"),
        "{rule}"
    );
    // The test's directory for /var/lib/oobfence, and root for the daemon's user.
    let rule = rule
        .replace(
            "/var/lib/oobfence/*.journal.jsonl",
            &format!("{}/*.journal.jsonl", dir.path().display()),
        )
        .replace("su oobfence oobfence", "su root root");
    let conf = dir.path().join("logrotate.conf");
    std::fs::write(&conf, rule).unwrap();
    let state = dir.path().join("logrotate.state");
    let rotate = || {
        let out = std::process::Command::new("logrotate")
            .arg("--force")
            .arg("--state")
            .arg(&state)
            .arg(&conf)
            .output()
            .expect("run logrotate (scripts/install-deps installs it)");
        assert!(out.status.success(), "logrotate: {out:?}");
    };
    append(
        &journal,
        &record_line("2026-09-28T03:00:00Z", "", "daemon", "storm", "began"),
    );
    append(
        &journal,
        &record_line("2026-09-28T03:01:00Z", "n1", "refusal", "storm", "refused"),
    );
    rotate();
    append(
        &journal,
        &record_line("2026-10-28T03:00:00Z", "", "daemon", "pause", "began"),
    );
    rotate();
    append(
        &journal,
        &record_line(
            "2026-11-28T03:00:00Z",
            "n1",
            "refusal",
            "power-on",
            "refused",
        ),
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dc1.journal"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "dc1.journal.jsonl",
            "dc1.journal.jsonl.1",
            "dc1.journal.jsonl.2.gz"
        ]
    );

    // Its [journal] path is the directory's dc1.journal.jsonl.
    let config = support::daemon_process::write_bare_config(dir.path(), "dc1", "127.0.0.1:9", "g");
    let out = support::cli::oobfence(&["timeline"], &config);
    let story = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let what: Vec<&str> = story
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap_or_default())
        .collect();
    assert_eq!(what, ["storm", "refused", "pause", "refused"], "{story}");

    let out = support::cli::oobfence(&["why", "--records", "3", "n1"], &config);
    let why = String::from_utf8_lossy(&out.stdout);
    let refusals: Vec<&str> = why.lines().filter(|l| l.contains(" refused ")).collect();
    assert_eq!(refusals.len(), 2, "{why}");
    assert!(
        refusals[0].contains("2026-09-28") && refusals[1].contains("2026-11-28"),
        "{why}"
    );
}
