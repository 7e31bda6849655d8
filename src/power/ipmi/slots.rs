//! One session per BMC: the slots shared by every source that reads a BMC, the session kept in
//! each (reused while fresh, retired after an age or a number of reads), and its closing when
//! idle or when its last source goes away.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::session::Session;
use super::{MAX_AGE, MAX_IDLE, MAX_READS};

pub(super) static NEXT_SOURCE_ID: AtomicU64 = AtomicU64::new(1);

/// Session slots by BMC (`host:port`), shared by every source that reads that BMC, so that one
/// process never holds more than one session on it.
static SLOTS: LazyLock<Mutex<HashMap<String, Weak<tokio::sync::Mutex<Slot>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub(super) fn slot_for(key: &str) -> Arc<tokio::sync::Mutex<Slot>> {
    let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(slot) = slots.get(key).and_then(Weak::upgrade) {
        return slot;
    }
    slots.retain(|_, w| w.strong_count() > 0);
    let slot = Arc::new(tokio::sync::Mutex::new(Slot {
        session: None,
        closer_armed: false,
        max_idle: MAX_IDLE,
    }));
    slots.insert(key.to_string(), Arc::downgrade(&slot));
    slot
}

/// The one session a process may hold on a BMC, when it holds one.
pub(super) struct Slot {
    pub(super) session: Option<Kept>,
    /// A task is waiting to close the session once it has been idle for `max_idle`.
    pub(super) closer_armed: bool,
    /// How long a session may sit idle and still be used again. Lowered when the BMC turns out
    /// to forget idle sessions sooner.
    pub(super) max_idle: Duration,
}

/// A session kept for the next read, closed (Close Session, in the background) when dropped.
pub(super) struct Kept {
    pub(super) owner: u64,
    pub(super) session: Option<Session>,
    pub(super) opened: Instant,
    pub(super) last_used: Instant,
    pub(super) reads: u32,
}

impl Kept {
    pub(super) fn reusable(&self, owner: u64, max_idle: Duration) -> bool {
        self.owner == owner
            && self.session.is_some()
            && self.last_used.elapsed() < max_idle
            && self.opened.elapsed() < MAX_AGE
            && self.reads < MAX_READS
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // At once and without waiting: this may run as the process ends.
        session.close_now();
    }
}

/// Closes the slot's session once it has sat idle for the slot's `max_idle`. Holds only a weak
/// reference: when the last source of the BMC goes, the slot and its session go at once.
async fn close_when_idle(slot: Weak<tokio::sync::Mutex<Slot>>) {
    let step = MAX_IDLE / 3;
    // Bounded: a session is retired after MAX_AGE anyway.
    let passes = (MAX_AGE.as_secs() / step.as_secs().max(1)) as usize + 2;
    for _ in 0..passes {
        tokio::time::sleep(step).await;
        let Some(slot) = slot.upgrade() else { return };
        let mut g = slot.lock().await;
        let max_idle = g.max_idle;
        let finished = match &g.session {
            None => true,
            Some(s) => s.last_used.elapsed() >= max_idle || s.opened.elapsed() >= MAX_AGE,
        };
        if finished {
            g.closer_armed = false;
            let session = g.session.take();
            drop(g);
            drop(session);
            return;
        }
    }
    if let Some(slot) = slot.upgrade() {
        let mut g = slot.lock().await;
        g.closer_armed = false;
        g.session.take();
    }
}

pub(super) fn arm_closer(slot_arc: &Arc<tokio::sync::Mutex<Slot>>, slot: &mut Slot) {
    if !slot.closer_armed && slot.session.is_some() {
        slot.closer_armed = true;
        tokio::spawn(close_when_idle(Arc::downgrade(slot_arc)));
    }
}
