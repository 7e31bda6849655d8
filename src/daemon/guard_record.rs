//! The guards' memory across restarts and leader changes: the fences of the budget window,
//! the storms' cooldowns and the power actions of the hour, restored before the first pass
//! (the journal on this host, the ConfigMap record) and kept in the ConfigMap while this
//! instance writes.
//!
//! An instance that may not write (a standby) writes no record: the leader's is the one that
//! counts, and a standby's memory lacks the leader's Node deletes. When it takes over it reads
//! the record again and merges it before writing its own, so that a new leader never
//! overwrites its predecessor's fences with its own, shorter memory.
//!
//! It fails closed. A record that cannot be read (the API does not answer, or refuses) is not
//! taken as empty: until it is read, the instance fences nothing new (`record_pending`) and
//! writes nothing over it. A record that is not a record (corrupt) or is gone (deleted) is
//! written again from what this instance knows, and counted
//! (`oobfence_guard_record_repairs_total`). While it writes, the instance reads the record back
//! every [`VERIFY`], so that a deletion or an edit is repaired within that, not at the next
//! change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

use prometheus_client::metrics::gauge::Gauge;

use crate::cluster::{GuardStore, StoredRecord};
use crate::config::Config;
use crate::decision::holds::Calm;
use crate::decision::holds::record::GuardRecord;
use crate::metrics::{CauseLabels, Metrics};

/// The first read of the record, before the first pass, gets this long.
const FIRST_READ: Duration = Duration::from_secs(10);
/// After a failed read or write, the next try waits this long.
const RETRY: Duration = Duration::from_secs(30);
/// While this instance writes, the record is read back this often: one GET of one ConfigMap.
const VERIFY: Duration = Duration::from_secs(30);

/// The record on the cluster and what this process knows of it.
pub(super) struct Keeper {
    store: Option<GuardStore>,
    /// The record as last read or written: written again only when what it must hold changes
    /// (`None`: to be written at once: it is missing or corrupt).
    written: Arc<Mutex<Option<GuardRecord>>>,
    /// What a read by a task found, for the next pass to merge (`Err`: the read failed).
    read_back: Arc<Mutex<Option<Result<StoredRecord, ()>>>>,
    /// This instance's memory includes the record on the cluster: only then does it write.
    caught_up: bool,
    /// The record was seen on the cluster (read or written) since the start: its absence
    /// later is a deletion, not a first start.
    seen: Arc<AtomicBool>,
    /// When the record was last read.
    last_read: Option<Timestamp>,
    /// A read or a write is under way.
    busy: Arc<AtomicBool>,
    /// The last read or write failed (logged once until one works again).
    failing: Arc<AtomicBool>,
}

impl Keeper {
    pub(super) fn new(store: Option<GuardStore>) -> Keeper {
        Keeper {
            store,
            written: Arc::default(),
            read_back: Arc::default(),
            caught_up: false,
            seen: Arc::default(),
            last_read: None,
            busy: Arc::default(),
            failing: Arc::default(),
        }
    }
}

fn report(
    failing: &AtomicBool,
    ok: &Gauge,
    what: &str,
    store: &GuardStore,
    result: Result<(), String>,
) {
    ok.set(result.is_ok().into());
    match result {
        Ok(()) => {
            if failing.swap(false, Ordering::Relaxed) {
                tracing::info!(record = %store.describe(), "the guards' record works again");
            }
        }
        Err(e) => {
            if !failing.swap(true, Ordering::Relaxed) {
                tracing::warn!(record = %store.describe(), error = %e, "cannot {what} the guards' record: until it is read, no new fence (its fences and power actions are not known); until it is written, the fence and power budgets and storm cooldowns would not survive a restart or a leader change (retrying; see deploy/rbac.yaml)");
            }
        }
    }
}

impl Keeper {
    /// Before the first pass: the fences of the budget window and the storms' cooldowns, from
    /// the journal here and the record on the cluster (every pass also counts the fence
    /// records on the Nodes, in `update_guards`).
    pub(super) async fn restore(
        &mut self,
        calm: &mut Calm,
        cfg: &Config,
        metrics: &Metrics,
        now: Timestamp,
    ) {
        let window = cfg.guards.fence_budget_window;
        let since = now
            .checked_sub(
                jiff::SignedDuration::try_from(window).unwrap_or(jiff::SignedDuration::MAX),
            )
            .unwrap_or(Timestamp::MIN);
        match crate::journal::recent_fences(&cfg.journal.path, since) {
            Ok(fences) => {
                for (at, uid) in fences {
                    calm.record_fence(&uid, at);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %cfg.journal.path.display(), error = %e, "cannot read the journal's recent fences; the fence budget counts the Nodes' fence records and the guards' record only")
            }
        }
        if let Some(store) = self.store.clone() {
            let read = tokio::time::timeout(FIRST_READ, store.read()).await;
            let read = match read {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {FIRST_READ:?}")),
            };
            match read {
                Ok(stored) => {
                    self.take(calm, cfg, metrics, &store, stored, now);
                    report(
                        &self.failing,
                        &metrics.guard_record_ok,
                        "read",
                        &store,
                        Ok(()),
                    );
                }
                Err(e) => report(
                    &self.failing,
                    &metrics.guard_record_ok,
                    "read",
                    &store,
                    Err(e),
                ),
            }
        }
        if !calm.fences.is_empty() {
            tracing::info!(fences = calm.fences.len(), window = %humantime::format_duration(window), "fences of the budget window restored");
        }
    }

    /// What a read found, merged: a record's entries join this instance's memory; a missing
    /// or corrupt one is to be written at once from that memory. Either way this instance now
    /// knows all there is to know, and may fence and write.
    fn take(
        &mut self,
        calm: &mut Calm,
        cfg: &Config,
        metrics: &Metrics,
        store: &GuardStore,
        stored: StoredRecord,
        now: Timestamp,
    ) {
        let written = match stored {
            StoredRecord::Record(record) => {
                calm.restore(&record, &cfg.guards, now);
                self.seen.store(true, Ordering::Relaxed);
                Some(record)
            }
            StoredRecord::Missing => {
                if self.seen.load(Ordering::Relaxed) {
                    metrics
                        .guard_record_repairs
                        .get_or_create(&CauseLabels { cause: "missing" })
                        .inc();
                    tracing::error!(record = %store.describe(), "the guards' record is gone (deleted?): written again from this instance's memory; fences, cooldowns and power actions only it held are lost");
                }
                None
            }
            StoredRecord::Corrupt(why) => {
                metrics
                    .guard_record_repairs
                    .get_or_create(&CauseLabels { cause: "corrupt" })
                    .inc();
                tracing::error!(record = %store.describe(), error = %why, "the guards' record is corrupt: written again from this instance's memory; fences, cooldowns and power actions only it held are lost");
                None
            }
        };
        calm.record_pending = false;
        if let Ok(mut w) = self.written.lock() {
            *w = written;
        }
        self.caught_up = true;
        self.last_read = Some(now);
    }

    /// Every pass, once the guards are up to date: merge a record read back, read it again
    /// after a takeover (and every [`VERIFY`]), and write it when what it must hold changed or
    /// it is missing or corrupt. Never in a dry run (it writes nothing) nor on a standby.
    pub(super) fn keep(
        &mut self,
        calm: &mut Calm,
        cfg: &Config,
        metrics: &Metrics,
        now: Timestamp,
    ) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let read_back = self.read_back.lock().ok().and_then(|mut r| r.take());
        // A failed read changes nothing: not caught up, this instance still holds new fences
        // (fail closed: the record may hold fences it does not know) and reads again.
        if let Some(Ok(stored)) = read_back {
            self.take(calm, cfg, metrics, &store, stored, now);
        }
        if calm.standby.is_some() {
            // Its memory misses what the leader does from now on: read again on a takeover.
            self.caught_up = false;
            calm.record_pending = false;
            return;
        }
        if cfg.policy.dry_run || self.busy.swap(true, Ordering::Relaxed) {
            return;
        }
        let k = &*self;
        let (busy, failing) = (k.busy.clone(), k.failing.clone());
        let ok = metrics.guard_record_ok.clone();
        let must_write = k.written.lock().map(|w| w.is_none()).unwrap_or(true);
        let verify_due = k.last_read.is_none_or(|t| {
            now.duration_since(t) >= jiff::SignedDuration::try_from(VERIFY).unwrap_or_default()
        });
        if !k.caught_up || (verify_due && !must_write) {
            // A new leader fences nothing until its predecessor's fences are counted.
            if !k.caught_up {
                calm.record_pending = true;
            }
            self.last_read = Some(now);
            let read_back = self.read_back.clone();
            tokio::spawn(async move {
                let result = store.read().await;
                let failed = result.is_err();
                if let Ok(mut r) = read_back.lock() {
                    *r = Some(result.as_ref().map(Clone::clone).map_err(|_| ()));
                }
                report(
                    &failing,
                    &ok,
                    "read",
                    &store,
                    result.map(|_| ()).map_err(|e| e.to_string()),
                );
                if failed {
                    tokio::time::sleep(RETRY).await;
                }
                busy.store(false, Ordering::Relaxed);
            });
            return;
        }
        let record = calm.record(&cfg.guards, now);
        let unchanged = k
            .written
            .lock()
            .map(|w| w.as_ref() == Some(&record))
            .unwrap_or(false);
        if unchanged {
            busy.store(false, Ordering::Relaxed);
            return;
        }
        let (written, seen) = (k.written.clone(), k.seen.clone());
        tokio::spawn(async move {
            let result = store.write(&record).await;
            if result.is_ok()
                && let Ok(mut w) = written.lock()
            {
                *w = Some(record);
                seen.store(true, Ordering::Relaxed);
            }
            let failed = result.is_err();
            report(
                &failing,
                &ok,
                "write",
                &store,
                result.map_err(|e| e.to_string()),
            );
            if failed {
                tokio::time::sleep(RETRY).await;
            }
            busy.store(false, Ordering::Relaxed);
        });
    }
}
