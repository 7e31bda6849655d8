//! Reading the journal back: the tail of the file for `why` (by node; older records from the
//! rotated files when asked for more), the recent fences, and records rendered for a person.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use jiff::Timestamp;

use super::files::{journal_files, read_records};
use super::{Record, RecordKind, TAIL_SCAN_BYTES};

/// The newest records about one node, as `oobfence why` shows them.
#[derive(Debug, Default)]
pub struct Tail {
    /// Newest last.
    pub records: Vec<Record>,
    /// Lines that were not journal records (a torn write, a foreign line).
    pub unreadable: usize,
    /// The file was longer than the part read.
    pub truncated_scan: bool,
}

/// The fences this journal records as written since `since` (taints and Node deletions), as
/// (when, Node uid), oldest first: after a restart they still count against the fence budget.
/// Reads the end of the current file, as [`tail`] does, and the rotated files written to
/// since `since` (a rotation inside the budget window loses no fence).
pub fn recent_fences(path: &Path, since: Timestamp) -> io::Result<Vec<(Timestamp, String)>> {
    let newer = std::time::SystemTime::from(since);
    let mut records = Vec::new();
    for f in journal_files(path)?.iter().rev() {
        if f.path == path {
            let (text, _) = tail_text(path)?;
            records.extend(
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Record>(l).ok()),
            );
        } else if f.modified >= newer {
            records.extend(read_records(&f.path)?.0);
        }
    }
    let mut fences: Vec<(Timestamp, String)> = records
        .into_iter()
        .filter(|r| {
            r.kind == RecordKind::Action
                && r.result == "success"
                && matches!(r.action.as_str(), "taint" | "delete_node")
                && r.ts >= since
        })
        .map(|r| (r.ts, r.uid))
        .collect();
    fences.sort();
    Ok(fences)
}

/// The end of the journal (at most its last few MiB), without a first line cut in two; and
/// whether that is less than the whole file.
fn tail_text(path: &Path) -> io::Result<(String, bool)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let start = len.saturating_sub(TAIL_SCAN_BYTES);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    file.take(TAIL_SCAN_BYTES).read_to_end(&mut buf)?;
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if start > 0 {
        // The first line is probably cut; skip it.
        let cut = text.find('\n').map(|i| i + 1).unwrap_or(text.len());
        text.drain(..cut);
    }
    Ok((text, start > 0))
}

/// Reads the last `limit` records about `node`: from the end of the current file (at most
/// its last few MiB) and, when that holds fewer, from the rotated files, newest first.
pub fn tail(path: &Path, node: &str, limit: usize) -> io::Result<Tail> {
    let mut out = Tail::default();
    // Newest first while collecting.
    let mut newest_first: Vec<Record> = Vec::new();
    for f in journal_files(path)? {
        if newest_first.len() >= limit {
            break;
        }
        let records = if f.path == path {
            let (text, truncated_scan) = tail_text(path)?;
            out.truncated_scan = truncated_scan;
            let mut records = Vec::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Record>(line) {
                    Ok(r) => records.push(r),
                    Err(_) => out.unreadable += 1,
                }
            }
            records
        } else {
            let (records, unreadable) = read_records(&f.path)?;
            out.unreadable += unreadable;
            records
        };
        newest_first.extend(
            records
                .into_iter()
                .rev()
                .filter(|r| r.node == node)
                .take(limit - newest_first.len()),
        );
        if out.truncated_scan {
            // What lies between the part read and the rotated files is not known: no gap.
            break;
        }
    }
    newest_first.reverse();
    out.records = newest_first;
    Ok(out)
}

/// The journal part of `oobfence why`.
pub fn render(records: &[Record]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for r in records {
        let what = match r.kind {
            RecordKind::Action => format!("{} {}", r.action, r.result),
            RecordKind::Refusal => "refused".to_string(),
            RecordKind::DryRun => format!("dry run: would {}", r.action),
            RecordKind::Observation => r.result.clone(),
            RecordKind::Daemon => format!("{} {}", r.rule, r.result),
        };
        let _ = writeln!(
            s,
            "    {}  {:<22} rule {}{}",
            r.ts.strftime("%Y-%m-%dT%H:%M:%SZ"),
            what,
            r.rule,
            if r.event.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.event)
            }
        );
        let _ = writeln!(s, "        {}", one_line(&r.message, 300));
        if let Some(e) = &r.error {
            let _ = writeln!(s, "        error: {}", one_line(e, 300));
        }
        let i = &r.inputs;
        let mut facts = Vec::new();
        match i.not_ready_since {
            Some(t) => facts.push(format!("NotReady since {}", t.strftime("%H:%M:%SZ"))),
            None if !i.ready.is_empty() => facts.push(i.ready.clone()),
            None => {}
        }
        if let Some(t) = i.lease_renewed {
            facts.push(format!("lease renewal seen {}", t.strftime("%H:%M:%SZ")));
        }
        if let Some(id) = &i.identity
            && let Some(v) = &id.verdict
        {
            facts.push(format!("identity {v}"));
        }
        if !i.boot_id.is_empty() {
            facts.push(format!("boot id {}", i.boot_id));
        }
        if let Some(v) = &i.volume_attachments {
            facts.push(format!("{} VolumeAttachment(s)", v.len()));
        }
        if !facts.is_empty() {
            let _ = writeln!(s, "        inputs: {}", facts.join(", "));
        }
        if let Some(c) = &i.confirmed_off {
            let _ = writeln!(
                s,
                "        confirmed off by {} at {} for boot {}: {}",
                if c.by.is_empty() {
                    "(not given)"
                } else {
                    &c.by
                },
                c.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                c.boot_id,
                one_line(&c.reason, 300)
            );
        }
        if !i.reads.is_empty() {
            let reads: Vec<String> = i
                .reads
                .iter()
                .rev()
                .take(3)
                .rev()
                .map(|x| {
                    format!(
                        "{} {} ({:.2}s)",
                        x.at.strftime("%H:%M:%SZ"),
                        x.raw,
                        x.latency_seconds
                    )
                })
                .collect();
            let _ = writeln!(s, "        reads:  {}", one_line(&reads.join("; "), 300));
        }
    }
    s
}

pub(super) fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}
