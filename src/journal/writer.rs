//! The writer thread: appends each record (`O_APPEND`, never truncating), calls `fsync` after
//! every action record, notices a rotated file and opens a new one, and never leaves a torn
//! line before the next record.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;

use super::{ERROR_LOG_EVERY, Entry};
use crate::metrics::JournalLabels;

/// The open journal file and what is needed to notice it was moved away.
struct Writer {
    path: PathBuf,
    file: Option<File>,
    /// (device, inode) of `file`.
    ident: (u64, u64),
    /// The last write failed part-way: start the next record on a fresh line.
    torn: bool,
    last_error_log: Option<Instant>,
}

pub(super) fn write_loop(
    mut rx: mpsc::Receiver<Entry>,
    path: PathBuf,
    counts: Family<JournalLabels, Counter>,
) {
    let mut w = Writer {
        path,
        file: None,
        ident: (0, 0),
        torn: false,
        last_error_log: None,
    };
    if let Err(e) = w.ensure_open() {
        w.report(&e);
    }
    while let Some(entry) = rx.blocking_recv() {
        match w.write(&entry) {
            Ok(()) => {
                counts
                    .get_or_create(&JournalLabels { result: "written" })
                    .inc();
            }
            Err(e) => {
                counts
                    .get_or_create(&JournalLabels { result: "failed" })
                    .inc();
                w.report(&e);
            }
        }
    }
}

impl Writer {
    fn report(&mut self, e: &io::Error) {
        if self
            .last_error_log
            .is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY)
        {
            self.last_error_log = Some(Instant::now());
            tracing::error!(
                path = %self.path.display(),
                error = %e,
                "cannot write the decision journal ([journal] path); records are lost until this is fixed (oobfence_journal_records_total{{result=\"failed\"}})"
            );
        }
    }

    /// Opens the file when it is not open, or reopens it when the path now names another
    /// file (rotated by rename) or none.
    fn ensure_open(&mut self) -> io::Result<&mut File> {
        use std::os::unix::fs::MetadataExt;
        if self.file.is_some() {
            let moved = match std::fs::metadata(&self.path) {
                Ok(m) => (m.dev(), m.ino()) != self.ident,
                Err(_) => true,
            };
            if moved {
                tracing::info!(path = %self.path.display(), "decision journal was moved away; opening a new file");
                self.file = None;
            }
        }
        if self.file.is_none() {
            let file = open_append(&self.path)?;
            let m = file.metadata()?;
            self.ident = (m.dev(), m.ino());
            // A file that does not end in a newline has a torn record at its end.
            self.torn = m.len() > 0 && !ends_with_newline(&file, m.len());
            self.file = Some(file);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    fn write(&mut self, entry: &Entry) -> io::Result<()> {
        let torn = self.torn;
        let file = self.ensure_open()?;
        let result = if torn {
            let mut buf = Vec::with_capacity(entry.line.len() + 1);
            buf.push(b'\n');
            buf.extend_from_slice(&entry.line);
            file.write_all(&buf)
        } else {
            // One write(2) for the whole line: with O_APPEND it lands in one piece.
            file.write_all(&entry.line)
        };
        let result = result.and_then(|()| if entry.sync { file.sync_data() } else { Ok(()) });
        match result {
            Ok(()) => {
                self.torn = false;
                Ok(())
            }
            Err(e) => {
                // Part of the line may be on disk; and the file may be gone or read-only now.
                self.torn = true;
                self.file = None;
                Err(e)
            }
        }
    }
}

fn ends_with_newline(file: &File, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut last = [0u8; 1];
    matches!(file.read_at(&mut last, len - 1), Ok(1)) && last[0] == b'\n'
}

/// Opens `path` for appending, creating it (mode 0640) and its directory (0750) if needed.
/// Never truncates.
pub fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)?;
    }
    // Readable too, to check whether the file ends in a torn line.
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}
