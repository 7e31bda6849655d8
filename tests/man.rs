//! What the packages ship beside the binary, made by the binary itself: the man pages
//! (`oobfence man`), rendered by the real groff, and the shell completions
//! (`oobfence completions SHELL`), loaded by the real bash.

use std::path::Path;
use std::process::{Command, Output};

fn oobfence(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "oobfence {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// True when BODY has TERM as the tag of an entry: alone on its line, or followed by spaces
/// and its description (a tag shorter than the indent).
fn has_term(body: &str, term: &str) -> bool {
    body.lines().any(|l| {
        let t = l.trim_start();
        t.trim_end() == term || t.strip_prefix(term).is_some_and(|r| r.starts_with(' '))
    })
}

fn write_pages(dir: &Path) {
    oobfence(&["man", "--output", dir.to_str().unwrap()]);
}

/// PAGE rendered by groff as plain text; fails on any groff warning (-ww).
fn render(page: &Path) -> String {
    let o = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-P", "-cbou"])
        .arg(page)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("groff (Debian: groff-base) must be installed");
    let warnings = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && warnings.is_empty(),
        "{}: {warnings}",
        page.display()
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The body of the section HEADING of a rendered page (up to the next heading).
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("no section {heading:?} in:\n{text}"));
    let lines: Vec<&str> = text.lines().collect();
    let first = lines[start + 1..].join("\n");
    let body_start = text.find(&first).unwrap_or(0);
    let body = &text[body_start..];
    let end = body
        .lines()
        .position(|l| !l.is_empty() && !l.starts_with(' '))
        .map(|n| body.lines().take(n).map(|l| l.len() + 1).sum())
        .unwrap_or(body.len());
    &body[..end]
}

#[test]
fn the_main_page_has_exit_status_environment_files_and_examples() {
    let dir = tempfile::tempdir().unwrap();
    write_pages(dir.path());
    let text = render(&dir.path().join("oobfence.1"));
    let exit = section(&text, "EXIT STATUS");
    for code in ["0", "1", "2", "3"] {
        assert!(
            has_term(exit, code),
            "exit status {code} not described:\n{exit}"
        );
    }
    assert!(exit.contains("RestartPreventExitStatus=2"), "{exit}");
    let env = section(&text, "ENVIRONMENT");
    for var in [
        "OOBFENCE_CONFIG",
        "OOBFENCE_LOG",
        "CREDENTIALS_DIRECTORY",
        "KUBECONFIG",
        "JOURNAL_STREAM",
        "AWS_ACCESS_KEY_ID",
        "PATH",
    ] {
        assert!(has_term(env, var), "{var} not in ENVIRONMENT:\n{env}");
    }
    let files = section(&text, "FILES");
    for path in [
        "/etc/oobfence/DC.toml",
        "/etc/oobfence/DC.kubeconfig",
        "/etc/oobfence/secrets/",
        "/var/lib/oobfence/DC.journal.jsonl",
        "/usr/lib/systemd/system/oobfence@.service",
        "/usr/lib/sysusers.d/oobfence.conf",
        "/usr/lib/tmpfiles.d/oobfence.conf",
    ] {
        assert!(has_term(files, path), "{path} not in FILES:\n{files}");
    }
    let examples = section(&text, "EXAMPLES");
    assert!(
        examples.contains("oobfence check-config --config /etc/oobfence/dc1.toml"),
        "{examples}"
    );
    assert!(
        section(&text, "SEE ALSO").contains("oobfence.toml(5)"),
        "{text}"
    );
}

/// Every command's page says what its exit status means and shows it in use.
#[test]
fn every_command_page_has_exit_status_and_examples() {
    let dir = tempfile::tempdir().unwrap();
    write_pages(dir.path());
    let mut pages = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(command) = name
            .strip_prefix("oobfence-")
            .and_then(|n| n.strip_suffix(".1"))
        else {
            continue;
        };
        pages += 1;
        let text = render(&path);
        assert!(
            section(&text, "EXIT STATUS").contains("Success"),
            "{name}:\n{text}"
        );
        assert!(
            section(&text, "EXAMPLES").contains(&format!("oobfence {command}")),
            "{name}: no example of `oobfence {command}`:\n{text}"
        );
    }
    assert!(pages >= 8, "only {pages} command pages");
}

/// The keys of config/example-dc.toml, the commented-out ones included, with their section
/// ("" for the top level): `key = value` lines, optionally behind "# ".
fn example_keys() -> Vec<(String, String)> {
    let text = include_str!("../config/example-dc.toml");
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in text.lines() {
        let line = line.strip_prefix("# ").unwrap_or(line);
        if line.starts_with('[') && line.ends_with(']') {
            section = line.trim_matches(['[', ']']).to_owned();
            continue;
        }
        if let Some((key, _)) = line.split_once(" = ")
            && !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            keys.push((section.clone(), key.to_owned()));
        }
    }
    keys
}

#[test]
fn the_scanner_of_this_test_sees_every_key_that_toml_sees() {
    let table: toml::Table = include_str!("../config/example-dc.toml").parse().unwrap();
    let keys = example_keys();
    for (name, value) in &table {
        let (section, inner) = match value {
            toml::Value::Table(t) => (name.as_str(), t.clone()),
            toml::Value::Array(a) if a.iter().all(toml::Value::is_table) => {
                (name.as_str(), a[0].as_table().unwrap().clone())
            }
            _ => {
                assert!(keys.contains(&(String::new(), name.clone())), "{name}");
                continue;
            }
        };
        for key in inner.keys() {
            assert!(
                keys.contains(&(section.to_owned(), key.clone())),
                "[{section}] {key} missed"
            );
        }
    }
}

/// oobfence.toml(5) is made from config/example-dc.toml: every section and key of it,
/// commented-out ones included, is a heading or an entry of the page.
#[test]
fn the_config_page_documents_every_section_and_key_of_the_example() {
    let dir = tempfile::tempdir().unwrap();
    write_pages(dir.path());
    let page = dir.path().join("oobfence.toml.5");
    let source = std::fs::read_to_string(&page).unwrap();
    assert!(source.contains(".TH oobfence.toml 5"), "{source}");
    let text = render(&page);
    for heading in ["NAME", "DESCRIPTION", "FILES", "SEE ALSO"] {
        section(&text, heading);
    }
    let keys = example_keys();
    assert!(keys.len() > 60, "{keys:?}");
    let mut current = String::new();
    let mut seen = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            current = t.trim_matches(['[', ']']).to_owned();
        } else if let Some((key, _)) = t.split_once(" = ") {
            seen.push((current.clone(), key.to_owned()));
        }
    }
    let missing: Vec<_> = keys.iter().filter(|k| !seen.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "not in oobfence.toml(5): {missing:?}\n{text}"
    );
    // The prose comes along: a sentence of the example's comments on `confirm_reads`.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("Consecutive Off reads needed before acting"),
        "{text}"
    );
}

fn completions(shell: &str) -> String {
    String::from_utf8(oobfence(&["completions", shell]).stdout).unwrap()
}

#[test]
fn bash_loads_the_completions_and_completes_commands() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("oobfence");
    std::fs::write(&file, completions("bash")).unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(
            r#"set -e; source "$1"; complete -p oobfence
            f=$(complete -p oobfence | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
            COMP_WORDS=(oobfence check-c); COMP_CWORD=1; COMP_LINE="oobfence check-c"
            COMP_POINT=${#COMP_LINE}
            "$f" oobfence check-c oobfence
            echo "words: ${COMPREPLY[*]}""#,
        )
        .arg("bash")
        .arg(&file)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let spec = out.lines().next().unwrap_or_default();
    assert!(
        spec.starts_with("complete ") && spec.contains(" -F ") && spec.ends_with(" oobfence"),
        "{out}"
    );
    assert!(out.contains("words: check-config"), "{out}");
}

#[test]
fn zsh_and_fish_completions_name_every_command() {
    let zsh = completions("zsh");
    assert!(zsh.starts_with("#compdef oobfence"), "{zsh}");
    let fish = completions("fish");
    assert!(fish.contains("complete -c oobfence"), "{fish}");
    for command in [
        "run",
        "check-config",
        "probe",
        "why",
        "nodes",
        "pause",
        "resume",
        "confirm-off",
        "timeline",
        "make-kubeconfig",
    ] {
        assert!(zsh.contains(&format!("'{command}:")), "zsh: {command}");
        assert!(
            fish.contains(&format!("-a \"{command}\"")),
            "fish: {command}"
        );
    }
    let o = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
