//! The decision journal: an append-only JSON-lines file with one record per action oobfence
//! took or refused, with the inputs it decided on.
//!
//! It is the durable answer to "why did oobfence fence (or not fence) this node at 03:12?":
//! logs rotate and Kubernetes Events expire after an hour, the journal stays. The daemon only
//! ever appends (the file is opened with `O_APPEND`, never truncated) and calls `fsync` after
//! every action record. Writes go through a small bounded queue to a writer thread, so a slow
//! disk never holds up the decision loop; refusal records are dropped (and counted) rather
//! than waited for when the queue is full, action records wait for room.
//!
//! Rotating the file by renaming it is safe: the writer notices the path no longer names the
//! file it holds and opens a new one. The packages ship a logrotate rule that does just that
//! (`packaging/logrotate`: monthly or at 100 MiB, compressed from the second rotation on).
//! `oobfence why` and `oobfence timeline` read the file named in the config and the rotated
//! ones beside it (`.1`, `.2.gz`...), with or without a running daemon.
//!
//! This file holds the daemon's handle on the journal and its queue; beside it, `record` is
//! the record format with the inputs it carries, `change` the daemon's own changes, `writer`
//! the writer thread (fsync, rotation, torn lines), `files` the current and rotated files,
//! `reader` the tail `why` reads and renders, and `timeline` the story `timeline` tells. They
//! must agree on every field.

use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;

use crate::metrics::JournalLabels;

mod change;
mod files;
mod reader;
mod record;
#[cfg(test)]
mod tests;
mod timeline;
mod writer;

pub use change::{Change, Topic, pause_switch};
pub use files::{JournalFile, journal_files, read_records};
pub use reader::{Tail, recent_fences, render, tail};
pub use record::{
    ConfirmationInput, FenceInput, IdentityInput, Inputs, ReadInput, Record, RecordKind, refusal,
};
pub use timeline::{Event, Filter, Timeline, events, node_width, render_line, since, timeline};
pub use writer::open_append;
use writer::write_loop;

/// Records waiting for the writer. Small on purpose: a backlog means the disk is in trouble,
/// and the daemon must not pile up memory behind it.
const QUEUE: usize = 64;
/// An action record waits at most this long for room in the queue before it is dropped.
const ACTION_QUEUE_WAIT: Duration = Duration::from_secs(5);
/// `oobfence why` reads at most this much from the end of the file.
const TAIL_SCAN_BYTES: u64 = 8 << 20;
/// Write failures are logged at most this often (each one is counted).
const ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

// The config digest is computed where the config is read.
pub use crate::config::sha256_hex;

struct Entry {
    line: Vec<u8>,
    /// fsync after writing.
    sync: bool,
}

/// The daemon's handle on the journal: cheap to clone, never blocks the caller for long.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Entry>,
    counts: Family<JournalLabels, Counter>,
    datacenter: String,
    config_digest: String,
}

/// The writer thread; wait on it at shutdown so queued records reach the disk.
pub struct JournalWriter {
    handle: tokio::task::JoinHandle<()>,
}

impl JournalWriter {
    /// Waits until every handle is dropped and the queue is written, at most `limit`.
    pub async fn finish(self, limit: Duration) {
        if tokio::time::timeout(limit, self.handle).await.is_err() {
            tracing::warn!(
                "decision journal writer did not finish in {limit:?}; records may be lost"
            );
        }
    }
}

impl Journal {
    /// The config digest recorded from now on (after a reload).
    pub fn set_config_digest(&mut self, digest: &str) {
        self.config_digest = digest.to_string();
    }
}

impl Journal {
    /// Starts the writer for `path`. Opening happens in the writer: a journal that cannot be
    /// opened is logged and counted, and retried on every record, but never stops the daemon.
    pub fn start(
        path: PathBuf,
        datacenter: &str,
        config_digest: &str,
        counts: Family<JournalLabels, Counter>,
    ) -> (Journal, JournalWriter) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer_counts = counts.clone();
        let handle = tokio::task::spawn_blocking(move || write_loop(rx, path, writer_counts));
        (
            Journal {
                tx,
                counts,
                datacenter: datacenter.to_string(),
                config_digest: config_digest.to_string(),
            },
            JournalWriter { handle },
        )
    }

    /// A record with the fields every record shares filled in.
    pub fn record(
        &self,
        node: &str,
        uid: &str,
        kind: RecordKind,
        rule: &str,
        inputs: Inputs,
    ) -> Record {
        Record {
            ts: Timestamp::now(),
            datacenter: self.datacenter.clone(),
            node: node.to_string(),
            uid: uid.to_string(),
            kind,
            event: String::new(),
            rule: rule.to_string(),
            action: "none".into(),
            result: String::new(),
            message: String::new(),
            error: None,
            inputs,
            change: None,
            lease_term: None,
            config_digest: self.config_digest.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    fn encode(&self, r: &Record) -> Option<Vec<u8>> {
        match serde_json::to_vec(r) {
            Ok(mut line) => {
                line.push(b'\n');
                Some(line)
            }
            Err(e) => {
                // Cannot happen for these types; count it rather than panic in the loop.
                self.count("failed");
                tracing::error!(node = %r.node, error = %e, "cannot encode a journal record");
                None
            }
        }
    }

    fn count(&self, result: &'static str) {
        self.counts.get_or_create(&JournalLabels { result }).inc();
    }

    /// Queues a record without waiting; when the queue is full it is dropped and counted.
    /// For the decision loop.
    pub fn submit(&self, r: &Record) {
        let Some(line) = self.encode(r) else { return };
        let sync = r.kind.synced();
        if self.tx.try_send(Entry { line, sync }).is_err() {
            self.count("dropped");
            tracing::warn!(node = %r.node, rule = %r.rule, "decision journal queue full; record dropped");
        }
    }

    /// Queues a record, waiting a bounded time for room. For action tasks, whose records
    /// matter most; the decision loop never calls this.
    pub async fn submit_wait(&self, r: &Record) {
        let Some(line) = self.encode(r) else { return };
        let sync = r.kind.synced();
        let sent =
            tokio::time::timeout(ACTION_QUEUE_WAIT, self.tx.send(Entry { line, sync })).await;
        if !matches!(sent, Ok(Ok(()))) {
            self.count("dropped");
            tracing::error!(node = %r.node, rule = %r.rule, action = %r.action, "decision journal did not take an action record; it is only in the log and Events");
        }
    }
}
