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
//! file it holds and opens a new one. `oobfence why` reads the tail of the file named in the
//! config, with or without a running daemon.
//!
//! Longer than 600 lines: the record format, its writer thread (fsync, rotation, torn lines)
//! and its reader for `why` belong together, since they must agree on every field.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::decision::PowerReading;
use crate::decision::{NodeFacts, Readiness, Rule};
use crate::metrics::JournalLabels;

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

/// What kind of entry a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// oobfence wrote to the cluster (or tried to): taint, untaint, delete_node, clear_record.
    Action,
    /// oobfence refused to act on a NotReady node, or kept a fence a human must look at.
    Refusal,
    /// Dry run: everything said act, nothing was written.
    DryRun,
    /// Something oobfence saw after acting: the fenced node's volumes were released.
    Observation,
}

impl RecordKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Action => "action",
            RecordKind::Refusal => "refusal",
            RecordKind::DryRun => "dry_run",
            RecordKind::Observation => "observation",
        }
    }
}

/// One journal line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When the record was made.
    pub ts: Timestamp,
    pub datacenter: String,
    pub node: String,
    /// The Node object's uid the decision was about (a node re-registered under the same name
    /// has another one).
    #[serde(default)]
    pub uid: String,
    pub kind: RecordKind,
    /// The Kubernetes Event reason emitted with it (`OobfenceFenced`, `OobfenceBlocked`...);
    /// empty when no Event goes with the record.
    #[serde(default)]
    pub event: String,
    /// The decision rule (`confirmed-off`, `power-unknown`...).
    pub rule: String,
    /// `taint`, `untaint`, `delete_node`, `clear_record`, or `none` for a refusal.
    pub action: String,
    /// `success`, `failure`, `refused`, `not_written` (dry run) or `observed`.
    pub result: String,
    /// The same human sentence the Event carries.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub inputs: Inputs,
    /// `[ha]`: the Lease term (leaseTransitions) this instance held when it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_term: Option<i32>,
    /// SHA-256 of the config file text the daemon was started with.
    pub config_digest: String,
    /// oobfence version that wrote the record.
    pub version: String,
}

/// What the decision was made on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    /// `Ready`, `NotReady` or `NoCondition`.
    pub ready: String,
    #[serde(default)]
    pub not_ready_since: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the node's Lease renewed.
    #[serde(default)]
    pub lease_renewed: Option<Timestamp>,
    /// The Lease's renewTime as the kubelet wrote it (the kubelet's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_renew_time: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the kubelet post a new Ready heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_seen: Option<Timestamp>,
    /// The node's identity and the last verification of its machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityInput>,
    #[serde(default)]
    pub boot_id: String,
    /// oobfence's fence record on the node at decision time.
    #[serde(default)]
    pub fence: Option<FenceInput>,
    /// `backend address` of the node's power source; none when the config maps none.
    #[serde(default)]
    pub power_source: Option<String>,
    /// The node's recent power reads, oldest first.
    #[serde(default)]
    pub reads: Vec<ReadInput>,
    /// VolumeAttachments pointing at the node (when fencing: at fence time). `None` when the
    /// VolumeAttachment watch was not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_attachments: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityInput {
    /// `status.nodeInfo.systemUUID`.
    pub system_uuid: String,
    pub addresses: Vec<String>,
    /// `checked` or `unchecked`.
    pub check: String,
    /// The last verification: `match: ...`, `mismatch: ...`, `unverifiable: ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Timestamp>,
    /// Who answered the read that verified it (a "gone" answer counts only through it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_through: Option<String>,
    /// Other Nodes that report the same system UUID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uuid_shared_with: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceInput {
    pub at: Timestamp,
    pub boot_id: String,
    pub taint_present: bool,
}

/// One power read as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadInput {
    /// When the read started (what it says was true no later than that); the answer came
    /// `latency_seconds` later.
    pub at: Timestamp,
    /// `on`, `off`, `transitional` or `error`.
    pub value: String,
    /// The full answer as oobfence understood it (`Off`, `transitional (PoweringOff)`,
    /// `error: timeout: no answer within 7s`).
    pub raw: String,
    pub latency_seconds: f64,
    /// Extra evidence the power source reported with the state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// What the machine that answered says it is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// Who answered: the source, where it asked and as whom.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reader: String,
    /// The system's power draw read beside an Off, where the entry asks for that witness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_draw: Option<String>,
}

impl From<&PowerReading> for ReadInput {
    fn from(r: &PowerReading) -> Self {
        ReadInput {
            at: r.at,
            value: r.state.label().to_string(),
            raw: r.state.to_string(),
            latency_seconds: r.latency.as_secs_f64(),
            details: r.details.iter().map(ToString::to_string).collect(),
            identity: r.identity.to_string(),
            reader: r.reader.clone(),
            power_draw: r.power_draw.as_ref().map(ToString::to_string),
        }
    }
}

/// Power reads a record keeps, newest last: enough for any confirmation run.
const READS_RECORDED: usize = 8;

impl Inputs {
    /// The inputs of a decision about one node.
    pub fn new(
        facts: &NodeFacts,
        reads: &[PowerReading],
        power_source: Option<String>,
        volume_attachments: Option<Vec<String>>,
    ) -> Inputs {
        let (ready, not_ready_since) = match facts.readiness {
            Readiness::Ready => ("Ready", None),
            Readiness::NotReady { since } => ("NotReady", Some(since)),
            Readiness::NoCondition => ("NoCondition", None),
        };
        Inputs {
            ready: ready.to_string(),
            not_ready_since,
            lease_renewed: facts.lease_renewal_seen,
            lease_renew_time: facts.lease_renew_time,
            heartbeat_seen: facts.heartbeat_seen,
            identity: Some(IdentityInput {
                system_uuid: facts.identity.system_uuid.clone(),
                addresses: facts.identity.addresses.clone(),
                check: match facts.identity_check {
                    crate::identity::IdentityCheck::Checked => "checked",
                    crate::identity::IdentityCheck::Unchecked => "unchecked",
                }
                .into(),
                verdict: facts
                    .identity_binding
                    .as_ref()
                    .map(|b| b.verdict.to_string()),
                verified_at: facts.identity_binding.as_ref().map(|b| b.at),
                verified_through: facts.identity_binding.as_ref().map(|b| b.reader.clone()),
                uuid_shared_with: facts.identity.uuid_shared_with.clone(),
            }),
            boot_id: facts.boot_id.clone(),
            fence: facts.fence.as_ref().map(|f| FenceInput {
                at: f.at,
                boot_id: f.boot_id.clone(),
                taint_present: f.taint_present,
            }),
            power_source,
            reads: reads
                .iter()
                .skip(reads.len().saturating_sub(READS_RECORDED))
                .map(ReadInput::from)
                .collect(),
            volume_attachments,
        }
    }
}

/// The refusal a node is in after a decision with `rule`, given the one it was in: a refusal
/// (power on, unknown or transitional, no power source, a live kubelet, a same-bootID return)
/// holds while the daemon only waits for its next read, so that one episode is one journal
/// record and one Event, and the blocked metrics do not flap between re-reads.
pub fn refusal(rule: Rule, previous: Option<Rule>) -> Option<Rule> {
    match rule {
        Rule::PowerOn
        | Rule::PowerUnknown
        | Rule::PowerTransitional
        | Rule::PowerSuspended
        | Rule::NoPowerSource
        | Rule::OptedOut
        | Rule::Flapping
        | Rule::OtherRemediator
        | Rule::RegionMismatch
        | Rule::SharedMachine
        | Rule::IdentityMismatch
        | Rule::OffWhileAlive
        | Rule::GoneWhileAlive
        | Rule::IdentityUnverified
        | Rule::ReaderChanged
        | Rule::DuplicateSystemUuid
        | Rule::OffUncorroborated
        | Rule::LeaseRenewedRecently
        | Rule::RecoveredSameBootId
        | Rule::Paused
        | Rule::StaleView
        | Rule::SelfPartition
        | Rule::Storm
        | Rule::StormCooldown
        | Rule::FenceBudget => Some(rule),
        Rule::StalePowerRead | Rule::AwaitingPowerRead | Rule::RecoveryNeedsPowerOn => previous,
        _ => None,
    }
}

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
        let sync = r.kind == RecordKind::Action;
        if self.tx.try_send(Entry { line, sync }).is_err() {
            self.count("dropped");
            tracing::warn!(node = %r.node, rule = %r.rule, "decision journal queue full; record dropped");
        }
    }

    /// Queues a record, waiting a bounded time for room. For action tasks, whose records
    /// matter most; the decision loop never calls this.
    pub async fn submit_wait(&self, r: &Record) {
        let Some(line) = self.encode(r) else { return };
        let sync = r.kind == RecordKind::Action;
        let sent =
            tokio::time::timeout(ACTION_QUEUE_WAIT, self.tx.send(Entry { line, sync })).await;
        if !matches!(sent, Ok(Ok(()))) {
            self.count("dropped");
            tracing::error!(node = %r.node, rule = %r.rule, action = %r.action, "decision journal did not take an action record; it is only in the log and Events");
        }
    }
}

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

fn write_loop(
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

#[cfg(test)]
mod tests;
