//! Reading the journal back: the tail of the file for `why` (by node), the recent fences, and
//! records rendered for a person.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use jiff::Timestamp;

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
/// Reads the end of the journal only, as [`tail`] does.
pub fn recent_fences(path: &Path, since: Timestamp) -> io::Result<Vec<(Timestamp, String)>> {
    let (text, _) = tail_text(path)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Record>(l).ok())
        .filter(|r| {
            r.kind == RecordKind::Action
                && r.result == "success"
                && matches!(r.action.as_str(), "taint" | "delete_node")
                && r.ts >= since
        })
        .map(|r| (r.ts, r.uid))
        .collect())
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

/// Reads the last `limit` records about `node` from the end of the journal (at most the last
/// few MiB of it).
pub fn tail(path: &Path, node: &str, limit: usize) -> io::Result<Tail> {
    let (text, truncated_scan) = tail_text(path)?;
    let mut out = Tail {
        truncated_scan,
        ..Default::default()
    };
    let mut matching = std::collections::VecDeque::with_capacity(limit + 1);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Record>(line) {
            Ok(r) if r.node == node => {
                matching.push_back(r);
                if matching.len() > limit {
                    matching.pop_front();
                }
            }
            Ok(_) => {}
            Err(_) => out.unreadable += 1,
        }
    }
    out.records = matching.into();
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

fn one_line(s: &str, max: usize) -> String {
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
