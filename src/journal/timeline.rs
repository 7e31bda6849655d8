//! `oobfence timeline`: the journal told as one ordered story — the power reads the decisions
//! rested on, the refusals, the writes and releases, the power actions, and the daemon's own
//! changes (pause, reload, leadership, storms, freezes, budgets) — across rotated files, one
//! line per event. Reading and rendering only: the files come from [`super::files`].

use std::collections::HashSet;
use std::io;
use std::path::Path;

use jiff::Timestamp;
use serde::Serialize;

use super::files::{journal_files, read_records};
use super::reader::one_line;
use super::{Change, Record, RecordKind};

/// Which events to tell.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only events at or after this time.
    pub since: Option<Timestamp>,
    /// Only this node's events, and the datacenter's (a pause, a storm...), which explain them.
    pub node: Option<String>,
}

impl Filter {
    fn keeps(&self, ts: Timestamp, node: &str) -> bool {
        self.since.is_none_or(|s| ts >= s)
            && self
                .node
                .as_deref()
                .is_none_or(|n| node.is_empty() || node == n)
    }
}

/// One line of the story.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    pub ts: Timestamp,
    /// The node it is about; `None` for the datacenter (the daemon's own changes).
    pub node: Option<String>,
    /// `read`, or the record's kind: `refusal`, `action`, `dry_run`, `observation`, `daemon`.
    pub kind: &'static str,
    /// What happened, in two or three words: `power read off`, `taint success`, `storm began`.
    pub what: String,
    /// The record's rule (for a daemon record, its topic).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rule: String,
    /// Why, in a sentence: the record's message (and error), or the read's answer.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// The story and what could not be read into it.
#[derive(Debug, Default)]
pub struct Timeline {
    pub events: Vec<Event>,
    /// Lines that were not records (torn writes, foreign lines).
    pub unreadable: usize,
    /// The files read, oldest first.
    pub files: Vec<std::path::PathBuf>,
}

/// Reads the journal at `path` and its rotated files into one ordered story. Files last
/// written before `filter.since` are not opened: everything in them is older.
pub fn timeline(path: &Path, filter: &Filter) -> io::Result<Timeline> {
    let mut files = journal_files(path)?;
    if let Some(since) = filter.since {
        let since = std::time::SystemTime::from(since);
        files.retain(|f| f.modified >= since);
    }
    let mut out = Timeline::default();
    let mut records = Vec::new();
    // Oldest file first, so that equal times keep the order they were written in.
    for f in files.iter().rev() {
        let (mut r, unreadable) = read_records(&f.path)?;
        out.unreadable += unreadable;
        records.append(&mut r);
        out.files.push(f.path.clone());
    }
    out.events = events(&records, filter);
    Ok(out)
}

/// The events of `records` (oldest first as written), in time order: each record, and each
/// power read it rests on once (the same read is in every record made on it).
pub fn events(records: &[Record], filter: &Filter) -> Vec<Event> {
    let mut seen_reads = HashSet::new();
    let mut out = Vec::new();
    for r in records {
        for read in &r.inputs.reads {
            if !seen_reads.insert((r.node.clone(), read.at, read.raw.clone())) {
                continue;
            }
            if !filter.keeps(read.at, &r.node) {
                continue;
            }
            let mut reason = read.raw.clone();
            if !read.reader.is_empty() {
                reason.push_str(&format!(" from {}", read.reader));
            }
            reason.push_str(&format!(" in {:.2}s", read.latency_seconds));
            if let Some(draw) = &read.power_draw {
                reason.push_str(&format!(", drawing {draw}"));
            }
            out.push(Event {
                ts: read.at,
                node: Some(r.node.clone()),
                kind: "read",
                what: format!("power read {}", read.value),
                rule: String::new(),
                reason: one_line(&reason, 200),
                change: None,
            });
        }
        if !filter.keeps(r.ts, &r.node) {
            continue;
        }
        out.push(event_of(r));
    }
    // Stable: events of one instant keep the order they were written in.
    out.sort_by_key(|e| e.ts);
    out
}

fn event_of(r: &Record) -> Event {
    let what = match r.kind {
        RecordKind::Action => format!("{} {}", r.action, r.result),
        RecordKind::Refusal => "refused".to_string(),
        RecordKind::DryRun => format!("would {}", r.action),
        RecordKind::Observation => r.result.replace('_', " "),
        RecordKind::Daemon => format!("{} {}", r.rule, r.result),
    };
    let mut reason = r.message.clone();
    if let Some(e) = r.error.as_ref().filter(|e| !r.message.contains(e.as_str())) {
        reason.push_str(&format!(" (error: {e})"));
    }
    Event {
        ts: r.ts,
        node: (!r.node.is_empty()).then(|| r.node.clone()),
        kind: r.kind.as_str(),
        what,
        rule: r.rule.clone(),
        reason: one_line(&reason, 300),
        change: r.change.clone(),
    }
}

/// The width of the node column for `events`: the longest name, within reason.
pub fn node_width(events: &[Event]) -> usize {
    events
        .iter()
        .filter_map(|e| e.node.as_deref())
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(1)
        .clamp(8, 48)
}

/// One line for a person: time, node (`-` for the datacenter) in a column `width` wide, what,
/// rule and why.
pub fn render_line(e: &Event, width: usize) -> String {
    let rule = if e.rule.is_empty() || e.kind == "daemon" {
        String::new()
    } else {
        format!("[{}] ", e.rule)
    };
    format!(
        "{}  {:<width$} {:<24} {rule}{}",
        e.ts.strftime("%Y-%m-%dT%H:%M:%SZ"),
        e.node.as_deref().unwrap_or("-"),
        e.what,
        e.reason
    )
}

/// When `--since` starts: a duration back from `now` (`2h`, `90m`, `1d 12h`) or a time
/// (`2026-11-28T03:00:00Z`).
pub fn since(text: &str, now: Timestamp) -> Result<Timestamp, String> {
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t);
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        format!(
            "--since {text:?}: {e}; give a duration back from now (2h, 90m, 1d) or a time (2026-11-28T03:00:00Z)"
        )
    })?;
    let span = jiff::SignedDuration::try_from(d).map_err(|e| format!("--since {text:?}: {e}"))?;
    now.checked_sub(span)
        .map_err(|e| format!("--since {text:?} reaches before any time: {e}"))
}
