//! The guards' memory across restarts and leader changes: the fences of the budget window and
//! the storms' cooldowns, restored before the first pass (the journal on this host, the
//! ConfigMap record) and kept in the ConfigMap while this instance writes.
//!
//! An instance that may not write (a standby) writes no record: the leader's is the one that
//! counts, and a standby's memory lacks the leader's Node deletes. When it takes over it reads
//! the record again and merges it before writing its own, so that a new leader never
//! overwrites its predecessor's fences with its own, shorter memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

use prometheus_client::metrics::gauge::Gauge;

use crate::cluster::GuardStore;
use crate::config::Config;
use crate::decision::holds::Calm;
use crate::decision::holds::record::GuardRecord;

/// The first read of the record, before the first pass, gets this long.
const FIRST_READ: Duration = Duration::from_secs(10);
/// After a failed read or write, the next try waits this long.
const RETRY: Duration = Duration::from_secs(30);

/// The record on the cluster and what this process knows of it.
pub(super) struct Keeper {
    store: Option<GuardStore>,
    /// The record as last read or written: written again only when what it must hold changes.
    written: Arc<Mutex<Option<GuardRecord>>>,
    /// What a read by a task found, for the next pass to merge (`Err`: the read failed).
    read_back: Arc<Mutex<Option<Result<GuardRecord, ()>>>>,
    /// This instance's memory includes the record on the cluster: only then does it write.
    caught_up: bool,
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
                tracing::warn!(record = %store.describe(), error = %e, "cannot {what} the guards' record: the fence budget and storm cooldowns would not survive a restart or a leader change (retrying; see deploy/rbac.yaml)");
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
        ok: &Gauge,
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
                Ok(record) => {
                    self.merge(calm, cfg, record.unwrap_or_default(), now);
                    report(&self.failing, ok, "read", &store, Ok(()));
                }
                Err(e) => report(&self.failing, ok, "read", &store, Err(e)),
            }
        }
        if !calm.fences.is_empty() {
            tracing::info!(fences = calm.fences.len(), window = %humantime::format_duration(window), "fences of the budget window restored");
        }
    }

    fn merge(&mut self, calm: &mut Calm, cfg: &Config, record: GuardRecord, now: Timestamp) {
        calm.restore(&record, &cfg.guards, now);
        calm.record_pending = false;
        if let Ok(mut w) = self.written.lock() {
            *w = Some(record);
        }
        self.caught_up = true;
    }

    /// Every pass, once the guards are up to date: merge a record read back, read it again
    /// after a takeover, and write it when what it must hold changed. Never in a dry run (it
    /// writes nothing) nor on a standby.
    pub(super) fn keep(&mut self, calm: &mut Calm, cfg: &Config, ok: &Gauge, now: Timestamp) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let read_back = self.read_back.lock().ok().and_then(|mut r| r.take());
        match read_back {
            Some(Ok(record)) => self.merge(calm, cfg, record, now),
            // Not to hold fences for as long as the record cannot be read (RBAC, a missing
            // namespace): the journal and the Nodes' records still count; the log says so.
            Some(Err(())) => calm.record_pending = false,
            None => {}
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
        let ok = ok.clone();
        if !k.caught_up {
            // A new leader fences nothing until its predecessor's fences are counted.
            calm.record_pending = true;
            let read_back = k.read_back.clone();
            tokio::spawn(async move {
                let result = store.read().await;
                if let Ok(mut r) = read_back.lock() {
                    *r = Some(match &result {
                        Ok(record) => Ok(record.clone().unwrap_or_default()),
                        Err(_) => Err(()),
                    });
                }
                let failed = result.is_err();
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
        let written = k.written.clone();
        tokio::spawn(async move {
            let result = store.write(&record).await;
            if result.is_ok()
                && let Ok(mut w) = written.lock()
            {
                *w = Some(record);
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
