//! `oobfence timeline`: the decision journal told as one ordered story, from the files alone
//! (no daemon needed): one line per event, or one JSON object per line.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::journal::{self, Filter};

pub(super) fn timeline(
    path: &Path,
    since: Option<&str>,
    node: Option<String>,
    json: bool,
) -> Result<ExitCode, ExitCode> {
    // The journal's path is all it needs: never a password.
    let cfg = Config::load_without_secrets(path).map_err(super::say_config_errors)?;
    let since = since
        .map(|s| journal::since(s, jiff::Timestamp::now()))
        .transpose()
        .map_err(|e| {
            super::say_error(e);
            ExitCode::from(2)
        })?;
    let filter = Filter { since, node };
    let journal_path = &cfg.journal.path;
    let t = match journal::timeline(journal_path, &filter) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            super::say_error(format!(
                "no decision journal at {} ([journal] path of {}), nor rotated files beside it: nothing acted on or refused so far, or the journal is on another host",
                journal_path.display(),
                path.display()
            ));
            return Err(ExitCode::from(1));
        }
        Err(e) => {
            super::say_error(format!("cannot read {}: {e}", journal_path.display()));
            return Err(ExitCode::from(1));
        }
    };
    let mut out = std::io::stdout().lock();
    let width = journal::node_width(&t.events);
    for e in &t.events {
        let line = if json {
            serde_json::to_string(e).unwrap_or_default()
        } else {
            journal::render_line(e, width)
        };
        let _ = writeln!(out, "{line}");
    }
    if t.events.is_empty() && !json {
        let _ = writeln!(
            out,
            "no event in {} (and its rotated files){}{}",
            journal_path.display(),
            filter
                .since
                .map(|s| format!(" since {}", s.strftime("%Y-%m-%dT%H:%M:%SZ")))
                .unwrap_or_default(),
            filter
                .node
                .as_deref()
                .map(|n| format!(" about node {n}"))
                .unwrap_or_default(),
        );
    }
    if t.unreadable > 0 {
        eprintln!(
            "oobfence: {} line(s) of the journal were not records and were skipped (a torn write?)",
            t.unreadable
        );
    }
    Ok(ExitCode::SUCCESS)
}
