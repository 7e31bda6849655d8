//! The journal's files: the one the daemon appends to and those logrotate moved away beside it
//! (`DC.journal.jsonl.1`, `.2.gz`, or `-20261128` with `dateext`), newest first, compressed
//! ones read through gzip. `timeline` and `why` read across them as across one file.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::Record;

/// One journal file and when it was last changed (never before its last record was written).
#[derive(Clone, Debug)]
pub struct JournalFile {
    pub path: PathBuf,
    pub modified: SystemTime,
}

/// The journal at `path` and its rotated files, newest first.
/// A missing current file is no error while rotated ones exist (logrotate moved it and the
/// daemon has written nothing since); none at all is `NotFound`.
pub fn journal_files(path: &Path) -> io::Result<Vec<JournalFile>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let base = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", dir.display()),
            ));
        }
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_ours = name == base || name.strip_prefix(base).is_some_and(is_rotation_suffix);
        if !is_ours {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        found.push(JournalFile {
            path: entry.path(),
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        });
    }
    if found.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} does not exist", path.display()),
        ));
    }
    // Newest first by name, not by time: compressing a rotated file gives it a newer time
    // than the one rotated after it.
    found.sort_by_key(|f| age_rank(&f.path, base));
    Ok(found)
}

/// Where a file stands from the newest: the current file, then `.1`, `.2.gz`... (a smaller
/// number is newer), or `-DATE` (a larger date is newer).
fn age_rank(path: &Path, base: &str) -> (u8, u64) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(rest) = name.strip_prefix(base).filter(|r| !r.is_empty()) else {
        return (0, 0);
    };
    let rest = rest.strip_suffix(".gz").unwrap_or(rest);
    let number = |d: &str| d.parse::<u64>().unwrap_or(u64::MAX);
    match rest.strip_prefix('.') {
        Some(n) => (1, number(n)),
        None => (2, u64::MAX - number(rest.trim_start_matches('-'))),
    }
}

/// What logrotate appends: `.N`, `.N.gz`, `-DATE`, `-DATE.gz` (digits, with `dateext`).
fn is_rotation_suffix(rest: &str) -> bool {
    let rest = rest.strip_suffix(".gz").unwrap_or(rest);
    let digits = rest.strip_prefix('.').or_else(|| rest.strip_prefix('-'));
    digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The records of one file, oldest first, and how many lines were not records (a torn
/// write, a foreign line, a gzip stream cut short).
pub fn read_records(path: &Path) -> io::Result<(Vec<Record>, usize)> {
    let file = File::open(path)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut records = Vec::new();
    let mut unreadable = 0;
    for line in BufReader::new(reader).split(b'\n') {
        let line = match line {
            Ok(l) => l,
            // A compressed file cut short: what came before it still counts.
            Err(_) => {
                unreadable += 1;
                break;
            }
        };
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        match serde_json::from_slice::<Record>(&line) {
            Ok(r) => records.push(r),
            Err(_) => unreadable += 1,
        }
    }
    Ok((records, unreadable))
}
