//! `oobfence check-config` on files with an operator's typical mistakes: every error of a file
//! in one pass, each on its own line as `FILE:LINE: KEY: PROBLEM` with `[[bmc]]` entries
//! numbered from 1, then their count; a duplicate key named; plain words where serde would say
//! "untagged enum"; the known key nearest to a mistyped one.

mod support;

use std::path::Path;
use std::process::Output;

use support::cli::{check_config_text as check, oobfence};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A password file and an offline kubeconfig in `dir`; the top of a config using them.
fn head(dir: &Path) -> String {
    support::cli::config_head(dir)
}

/// One `[[bmc]]` entry for `nodes`, its extra keys after it.
fn entry(dir: &Path, nodes: &str, protocol: &str, address: &str, extra: &str) -> String {
    format!(
        "[[bmc]]\nnodes = [\"{nodes}\"]\nprotocol = \"{protocol}\"\naddress = \"{address}\"\nusername = \"admin\"\npassword_file = \"{}\"\n{extra}",
        dir.join("pw").display()
    )
}

/// The 1-based line of the first line of `text` that starts with `start`, after line `after`.
fn line_of(text: &str, start: &str, after: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(after)
        .find(|(_, l)| l.starts_with(start))
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("no line {start:?} in\n{text}"))
}

/// A file with seven mistakes in five sections and entries: all seven reported in one run,
/// each on its own line with its line number, in the file's order, then "7 errors in FILE".
#[test]
fn every_error_of_a_file_in_one_pass_each_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = head(d);
    text.push_str(
        "[policy]\nconfirm_read = 3\ndry_run = \"yes\"\n[server]\nlisten = \"nowhere\"\n",
    );
    // 400 good entries, so that the bad ones are entries #401 to #404 far down the file.
    for i in 0..400 {
        text.push_str(&entry(
            d,
            &format!("n{i}"),
            "redfish",
            &format!("https://10.1.{}.{}", i / 200, i % 200),
            "tls_insecure = true\n",
        ));
    }
    text.push_str(&entry(
        d,
        "rack1-*",
        "redfish",
        "http://{node}-bmc.example",
        "",
    ));
    text.push_str(&entry(
        d,
        "rack2-*",
        "ipmi",
        "{node}-ipmi.example",
        "cipher_suite = \"seventeen\"\n",
    ));
    text.push_str(&entry(d, "rack3-*", "redfsh", "https://{node}.example", ""));
    text.push_str(&format!(
        "[[bmc]]\nnodes = [\"rack4-*\"]\nprotocol = \"redfish\"\nusername = \"admin\"\npassword_file = \"{}\"\n",
        d.join("pw").display()
    ));
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let bmc401 = line_of(&text, "address = \"http://", 0);
    let want = [
        format!(
            "{file}:{}: policy.confirm_read: unknown key `confirm_read`: did you mean `confirm_reads`?",
            line_of(&text, "confirm_read ", 0)
        ),
        format!(
            "{file}:{}: policy.dry_run: invalid type: string \"yes\", expected true or false",
            line_of(&text, "dry_run", 0)
        ),
        format!(
            "{file}:{}: server.listen: \"nowhere\" is not an IP:port address",
            line_of(&text, "listen", 0)
        ),
        format!(
            "{file}:{bmc401}: [[bmc]] #401 address: \"http://{{node}}-bmc.example\" must use https://"
        ),
        format!(
            "{file}:{}: [[bmc]] #402 cipher_suite: must be a cipher suite number such as 17 or 3 (unquoted), or a list of two tried in order such as [17, 3]",
            line_of(&text, "cipher_suite", 0)
        ),
        format!(
            "{file}:{}: [[bmc]] #403 protocol: unknown value `redfsh`: did you mean `redfish`? (accepted values: `redfish`, `ipmi`, `fence-agent`)",
            line_of(&text, "protocol = \"redfsh\"", 0)
        ),
        // A missing key is on the line of its entry.
        format!(
            "{file}:{}: [[bmc]] #404 address: missing",
            line_of(&text, "[[bmc]]", line_of(&text, "protocol = \"redfsh\"", 0))
        ),
    ];
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), want.len() + 1, "{err}");
    for (got, want) in lines.iter().zip(&want) {
        assert!(
            got.contains(want.as_str()),
            "want {want}\n got {got}\nin:\n{err}"
        );
    }
    assert!(
        lines[want.len()].contains(&format!("7 errors in {file}")),
        "{err}"
    );
    assert!(!err.contains("untagged"), "{err}");
    assert!(!err.contains("sup3r-secret-pw"), "{err}");
}

/// Several semantic errors across sections, none of them serde's: all of them, not the first.
#[test]
fn every_semantic_error_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = head(d);
    text.push_str("[policy]\nconfirm_reads = 0\nhealth_read_interval = \"1s\"\n[journal]\npath = \"relative.jsonl\"\n[guards]\nrecord = \"no-slash\"\n");
    text.push_str(&entry(
        d,
        "a",
        "redfish",
        "https://10.0.0.1",
        "tls_insecure = true\n",
    ));
    text.push_str(&entry(
        d,
        "b",
        "redfish",
        "https://10.0.0.1",
        "tls_insecure = true\n",
    ));
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        format!(
            "{file}:{}: policy.confirm_reads: must be at least 1",
            line_of(&text, "confirm_reads", 0)
        ),
        format!(
            "{file}:{}: policy.health_read_interval: 1s is shorter than 10s",
            line_of(&text, "health_read_interval", 0)
        ),
        format!(
            "{file}:{}: journal.path: \"relative.jsonl\" must be an absolute path",
            line_of(&text, "path = \"rel", 0)
        ),
        format!(
            "{file}:{}: guards.record: \"no-slash\" must be NAMESPACE/NAME",
            line_of(&text, "record", 0)
        ),
        format!(
            "{file}:{}: [[bmc]] #2 address: reads the same machine as [[bmc]] #1 (line {})",
            line_of(&text, "address", line_of(&text, "nodes = [\"b\"]", 0)),
            line_of(&text, "[[bmc]]", 0)
        ),
        format!("5 errors in {file}"),
    ] {
        assert!(err.contains(&want), "want {want} in:\n{err}");
    }
}

/// A key set twice: the error names it and its second line; nothing further is checked, and
/// the message says so; the closing line counts it and names the command to run again.
#[test]
fn a_duplicate_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = format!(
        "{}[policy]\ndry_run = true\nconfirm_reads = 2\ndry_run = false\n",
        head(d)
    );
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 2, "{err}");
    assert!(
        err.trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with(&format!("oobfence: 1 error in {file}"))),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{file}:{}: invalid TOML: duplicate key `dry_run`",
            line_of(&text, "dry_run = false", 0)
        )),
        "{err}"
    );
    assert!(err.contains("nothing else in the file is checked"), "{err}");
}

/// A mistyped section or key gets the nearest known one; one far from every key lists them.
#[test]
fn a_near_miss_key_or_section_says_did_you_mean() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let password = entry(d, "n1", "redfish", "https://10.0.0.1", "")
        .replace("password_file = ", "password = ");
    for (extra, says) in [
        (
            password.as_str(),
            "[[bmc]] #1 password: unknown key `password`: did you mean `password_file` or `password_credential`?",
        ),
        (
            "[polcy]\ndry_run = true\n",
            "polcy: unknown key: did you mean `policy`?",
        ),
        (
            "[guards]\nmax_unhealty = 3\n",
            "guards.max_unhealty: unknown key `max_unhealty`: did you mean `max_unhealthy`?",
        ),
        (
            "[server]\nport = 9464\n",
            "server.port: unknown key `port` (this table's keys are `listen`)",
        ),
        (
            "[guards]\nfence_budget = [1]\n",
            "guards.fence_budget: must be a count such as 12, or a share such as \"50%\" (quoted)",
        ),
    ] {
        let (o, err, file) = check(d, &format!("{}{extra}", head(d)));
        assert_eq!(o.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(&format!("{file}:")), "{extra}: {err}");
        assert!(err.contains(says), "{extra}: want {says} in {err}");
    }
}

/// One `[[bmc]]` entry with several problems: each of them, not the first.
#[test]
fn every_problem_of_one_entry_in_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text =
        format!(
        "{}{}",
        head(d),
        entry(
            d,
            "rack2-*",
            "ipmi",
            "{node}-ipmi.example",
            "cipher_suite = 300\nauth = \"session\"\ntimeout = \"10m\"\ncorroborate = \"power\"\n",
        )
        .replace("username = \"admin\"", "username = \"a-name-longer-than-sixteen\"")
    );
    let (o, err, file) = check(d, &text);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for (key, says) in [
        ("username", "username = \"a-name"),
        ("cipher_suite", "cipher_suite"),
        ("auth", "auth"),
        ("timeout", "timeout"),
        ("corroborate", "corroborate"),
    ] {
        let want = format!("{file}:{}: [[bmc]] #1 {key}: ", line_of(&text, says, 0));
        assert!(err.contains(&want), "want {want} in:\n{err}");
    }
    assert!(err.contains(&format!("5 errors in {file}")), "{err}");
}

/// `check-config --json`: one document on stdout, nothing on stderr, the same exit codes: a
/// broken file's errors each with its line; a good one's summary and warnings.
#[test]
fn check_config_json_holds_the_errors_with_their_lines_and_the_findings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = head(d);
    text.push_str("[policy]\nconfirm_reads = 0\n[journal]\npath = \"relative.jsonl\"\n");
    text.push_str(&entry(d, "a", "redfish", "https://10.0.0.1", ""));
    let path = d.join("dc1.toml");
    std::fs::write(&path, &text).unwrap();
    let o = oobfence(&["check-config", "--json"], &path);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["exit_code"], 2);
    let errors = doc["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 2, "{doc:#}");
    assert_eq!(errors[0]["key"], "policy.confirm_reads");
    assert_eq!(errors[0]["line"], line_of(&text, "confirm_reads", 0));
    assert_eq!(errors[1]["key"], "journal.path");

    // Fixed, with a warning (TLS verification off): exit 0, the summary and the finding.
    let text = format!(
        "{}{}",
        head(d),
        entry(
            d,
            "a",
            "redfish",
            "https://10.0.0.1",
            "tls_insecure = true\n"
        )
    );
    std::fs::write(&path, &text).unwrap();
    let o = oobfence(&["check-config", "--json"], &path);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["config"]["datacenter"], "dc1");
    assert_eq!(doc["config"]["bmc_entries"], 1);
    assert!(
        doc["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["severity"] == "warning"
                && f["key"]
                    .as_str()
                    .is_some_and(|k| k.contains("tls_insecure")))),
        "{doc:#}"
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("sup3r-secret-pw"));
}
