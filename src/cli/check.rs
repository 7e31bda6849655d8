//! `check-config` (the file, what it names, and with `--probe` a read of every mapped node's
//! power source) and `probe` (one node's power source, read now).
//!
//! One pass: the config's errors, the kubeconfig's and those of the files it names (read as the
//! daemon's user would) come together, each as `FILE[:LINE]: KEY: PROBLEM`, and the closing
//! line names the command to run again.

use std::path::Path;
use std::process::ExitCode;

use crate::config::checks::{self, Finding, Severity};
use crate::config::{Config, ConfigError, display_key};

mod cluster;
mod probe;

pub(super) use self::probe::probe;

/// What `check-config` was asked for.
pub(super) struct Options {
    /// `--probe`: read every mapped node's power source too.
    pub probe: bool,
    /// `--strict`: a warning exits 1.
    pub strict: bool,
    /// `--json`: one document instead of lines.
    pub json: bool,
    /// `--daemon-user`: who the named files are checked as, when run as root.
    pub daemon_user: String,
}

/// `check-config`: the text lines, or with `json` one document on stdout holding the same
/// (see [`Say`]); the exit code is the same either way: 2 an error, 1 with `strict` a warning
/// (or with `probe` a node that could not be read), else 0.
pub(super) async fn check_config(path: &Path, options: &Options) -> Result<ExitCode, ExitCode> {
    let mut say = Say::new(path, options.json);
    let code = check_config_into(&mut say, path, options).await;
    let mut code = code.unwrap_or_else(|c| c);
    if options.strict && code == ExitCode::SUCCESS && say.warnings > 0 {
        say.err(format!(
            "oobfence: {} warning(s) and --strict: exit 1 (fix them, or run without --strict to accept them)",
            say.warnings
        ));
        code = ExitCode::from(1);
    }
    Ok(say.finish(code))
}

async fn check_config_into(
    say: &mut Say,
    path: &Path,
    options: &Options,
) -> Result<ExitCode, ExitCode> {
    let (cfg, mut errors) = match Config::load(path) {
        Ok(cfg) => (Some(cfg), Vec::new()),
        Err(e) => (None, e.errors),
    };
    // The kubeconfig as the file names it, even where the rest of the file is broken.
    let kubernetes = match &cfg {
        Some(cfg) => Some(cfg.kubernetes.clone()),
        None => Config::kubernetes_section(path),
    };
    let mut findings: Vec<Finding> = kubernetes
        .map(|k| checks::kubeconfig(&k, jiff::Timestamp::now()))
        .unwrap_or_default();
    let access = checks::unreadable_by(
        &checks::Reader::for_this_run(&options.daemon_user),
        &checks::named_files(path),
    );
    // A file the load or the kubeconfig check could not read either is said once, with its fix.
    let said_by_access = |key: &str, problem: &str| {
        access.iter().any(|a| {
            a.key == key
                && a.problem
                    .split(" cannot be read by ")
                    .next()
                    .is_some_and(|file| problem.contains(file))
        })
    };
    errors.retain(|e| !said_by_access(&e.key, &e.problem));
    findings.retain(|f| f.severity != Severity::Error || !said_by_access(&f.key, &f.problem));
    findings.extend(access);
    if let Some(cfg) = &cfg {
        findings.extend(checks::warnings(cfg));
    }
    // Every error in one format and one list: the file's, then the files it names.
    errors.extend(
        findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| ConfigError {
                file: path.to_owned(),
                line: None,
                key: f.key.clone(),
                problem: f.problem.clone(),
            }),
    );
    for e in &errors {
        say.push("errors", error_json(e));
        say.err(super::error_line(e));
    }
    for f in findings.iter().filter(|f| f.severity != Severity::Error) {
        say.finding(path, f);
    }
    if !errors.is_empty() {
        say.err(format!(
            "oobfence: {} in {}: `oobfence run` would not work with this config; fix {} and run `{}` again",
            match errors.len() {
                1 => "1 error".to_string(),
                n => format!("{n} errors"),
            },
            path.display(),
            if errors.len() == 1 { "it" } else { "them" },
            super::check_config_command(path)
        ));
        return Err(ExitCode::from(2));
    }
    let Some(cfg) = cfg else {
        return Err(ExitCode::from(2));
    };
    let listed: usize = cfg
        .bmc
        .iter()
        .filter_map(|b| b.inventory.as_ref())
        .map(|i| i.len())
        .sum();
    say.set(
        "config",
        serde_json::json!({
            "datacenter": cfg.datacenter,
            "bmc_entries": cfg.bmc.len(),
            "inventory_nodes": listed,
            "action": cfg.policy.action.to_string(),
            "dry_run": cfg.policy.dry_run,
        }),
    );
    say.out(format!(
        "{}: OK (datacenter {}, {} [[bmc]] entries{}, action {}{})",
        path.display(),
        cfg.datacenter,
        cfg.bmc.len(),
        if listed > 0 {
            format!(" ({listed} nodes from inventory files)")
        } else {
            String::new()
        },
        cfg.policy.action,
        if cfg.policy.dry_run { ", dry run" } else { "" }
    ));
    if !options.probe {
        return Ok(ExitCode::SUCCESS);
    }
    cluster::read_cluster(say, cfg, path).await
}

/// Where `check-config` says what it found: lines on stdout (all is well) and stderr (what is
/// not), or with `--json` one JSON document on stdout at the end, holding the same: `file`,
/// `errors` (the config's, each with its line), `findings` (warnings and notes), `config`,
/// and with `--probe` `kubernetes`, `permissions` and `nodes`; `exit_code` last.
struct Say {
    doc: Option<serde_json::Map<String, serde_json::Value>>,
    /// The warnings said so far (for `--strict`).
    warnings: usize,
}

impl Say {
    fn new(path: &Path, json: bool) -> Say {
        Say {
            doc: json.then(|| {
                let mut doc = serde_json::Map::new();
                doc.insert("file".into(), path.display().to_string().into());
                doc
            }),
            warnings: 0,
        }
    }

    /// A warning or a note about the config at `path`: a line (a note on stdout, a warning on
    /// stderr) or an item of `findings`.
    fn finding(&mut self, path: &Path, f: &Finding) {
        self.push("findings", finding_json(f));
        match f.severity {
            Severity::Note => self.out(format!("{}: {f}", path.display())),
            Severity::Warning => {
                self.warnings += 1;
                self.err(format!("{}: {f}", path.display()));
            }
            Severity::Error => self.err(format!("{}: {f}", path.display())),
        }
    }

    fn out(&self, line: String) {
        if self.doc.is_none() {
            println!("{line}");
        }
    }

    fn err(&self, line: String) {
        if self.doc.is_none() {
            eprintln!("{line}");
        }
    }

    fn set(&mut self, key: &str, value: serde_json::Value) {
        if let Some(doc) = &mut self.doc {
            doc.insert(key.into(), value);
        }
    }

    fn push(&mut self, key: &str, value: serde_json::Value) {
        if let Some(doc) = &mut self.doc
            && let serde_json::Value::Array(items) = doc
                .entry(key)
                .or_insert_with(|| serde_json::Value::Array(Vec::new()))
        {
            items.push(value);
        }
    }

    /// Prints the document (with `exit_code`), and passes the exit code on.
    fn finish(self, code: ExitCode) -> ExitCode {
        if let Some(mut doc) = self.doc {
            let n = if code == ExitCode::SUCCESS {
                0
            } else if code == ExitCode::from(2) {
                2
            } else {
                1
            };
            doc.insert("ok".into(), (n == 0).into());
            doc.insert("exit_code".into(), n.into());
            match serde_json::to_string_pretty(&doc) {
                Ok(text) => println!("{text}"),
                Err(e) => eprintln!("oobfence: cannot print the JSON: {e}"),
            }
        }
        code
    }
}

/// A warning or note as JSON: its key as the text shows it (`[[bmc]] #1 protocol`), and the
/// `[[bmc]]` entry's number where it is about one (1-based, as in the text).
fn finding_json(f: &Finding) -> serde_json::Value {
    serde_json::json!({
        "severity": match f.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        },
        "key": display_key(&f.key),
        "bmc_entry": bmc_entry(&f.key),
        "problem": f.problem,
    })
}

/// An error as JSON, numbered as [`finding_json`] numbers; `text` its line.
fn error_json(e: &ConfigError) -> serde_json::Value {
    serde_json::json!({
        "file": e.file, "line": e.line, "key": display_key(&e.key),
        "bmc_entry": bmc_entry(&e.key), "problem": e.problem, "text": e.to_string(),
    })
}

/// The 1-based number of the `[[bmc]]` entry a key (`bmc[0].address`) is about.
fn bmc_entry(key: &str) -> Option<usize> {
    let n = key.strip_prefix("bmc[")?.split_once(']')?.0;
    n.parse::<usize>().ok().map(|n| n + 1)
}
