//! Power reads as tasks: bounded in number by the read semaphore and in time by a deadline,
//! reported back to the loop over a channel.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Semaphore, mpsc};

use crate::decision::{PowerReading, PowerState, ReadErrorKind};
use crate::power::{self, MappedSource, PowerSource};

/// Why a read was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadPurpose {
    /// The decision asked for it (a NotReady or recovering node).
    Decision,
    /// A healthy node's health read (every `health_read_interval`): is the power source
    /// answering, for the node's machine, and saying it runs?
    Health,
}

/// Whom a read is for: the node, its object, and the generation of its power source when the
/// read was sent ([`super::tracker::Tracker::source_generation`]).
pub(super) struct ReadFor {
    pub(super) node: String,
    pub(super) uid: String,
    pub(super) generation: u64,
}

pub(super) struct ReadDone {
    pub(super) node: String,
    pub(super) uid: String,
    /// The node's source generation when the read was sent: an answer from a source a reload
    /// has since replaced is no evidence about the node.
    pub(super) generation: u64,
    pub(super) reading: PowerReading,
    pub(super) backend: &'static str,
    /// The fence agent that answered, for a `protocol = "fence-agent"` source.
    pub(super) agent: Option<String>,
    pub(super) purpose: ReadPurpose,
    /// The node was Ready when the read was started.
    pub(super) ready_when_started: bool,
}

/// The read semaphores: every read takes a `read` slot; a healthy node's health read first
/// takes one of the fewer `identity` slots, so that a rack of broken BMCs re-read in the
/// background never holds up the reads a decision waits on.
#[derive(Clone)]
pub(super) struct ReadSlots {
    pub(super) read: Arc<Semaphore>,
    pub(super) identity: Arc<Semaphore>,
    /// Reads holding a `read` slot now (`oobfence_power_reads_in_flight`).
    in_flight: Gauge,
    /// Identity reads started and not yet done, waiting for a slot or reading.
    identity_queued: Arc<AtomicUsize>,
}

/// Identity reads queued at once, at most: at start every healthy node's machine is due, and a
/// task waiting for a slot per node (thousands) would cost memory the process keeps; the rest
/// start on later passes, a pass queueing more than the slots read in a second.
const IDENTITY_QUEUE_MAX: usize = 256;

impl ReadSlots {
    pub(super) fn new(max_concurrent_reads: usize, in_flight: Gauge) -> ReadSlots {
        ReadSlots {
            read: Arc::new(Semaphore::new(max_concurrent_reads)),
            identity: Arc::new(Semaphore::new((max_concurrent_reads / 2).max(1))),
            in_flight,
            identity_queued: Arc::default(),
        }
    }

    /// Whether another identity read may be queued now.
    pub(super) fn identity_room(&self) -> bool {
        self.identity_queued.load(Ordering::Relaxed) < IDENTITY_QUEUE_MAX
    }
}

/// One identity read queued, counted until dropped.
struct Queued(Arc<AtomicUsize>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One read slot taken, counted in flight until dropped.
struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub(super) fn spawn_read(
    who: ReadFor,
    src: MappedSource,
    purpose: ReadPurpose,
    ready_when_started: bool,
    slots: ReadSlots,
    tx: mpsc::Sender<ReadDone>,
) {
    let queued = (purpose == ReadPurpose::Health).then(|| {
        slots.identity_queued.fetch_add(1, Ordering::Relaxed);
        Queued(slots.identity_queued.clone())
    });
    tokio::spawn(async move {
        let _queued = queued;
        let slotted = !src.source.batches_reads();
        let _identity = match purpose {
            ReadPurpose::Health if slotted => Some(slots.identity.acquire_owned().await),
            _ => None,
        };
        let _permit = match slotted {
            true => Some(slots.read.acquire_owned().await),
            false => None,
        };
        slots.in_flight.inc();
        let _counted = InFlight(slots.in_flight.clone());
        let reading = read_once(&src.source, src.deadline).await;
        let _ = tx
            .send(ReadDone {
                node: who.node,
                uid: who.uid,
                generation: who.generation,
                reading,
                backend: src.source.backend(),
                agent: src.source.agent().map(str::to_string),
                purpose,
                ready_when_started,
            })
            .await;
    });
}

/// One read with a hard deadline; a panic in the backend becomes an error read.
pub async fn read_once(source: &Arc<dyn PowerSource>, deadline: Duration) -> PowerReading {
    // The read's time is when it started: whatever it says was true no later than that.
    let at = crate::clock::now();
    let started = Instant::now();
    let s = source.clone();
    let mut task = tokio::spawn(async move { s.read_reply().await });
    let reply = match tokio::time::timeout(deadline, &mut task).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(join)) => power::Reply::without_identity(
            PowerState::error(
                ReadErrorKind::BadReply,
                format!("power source failed internally: {join}"),
            ),
            "the read failed",
        ),
        Err(_) => {
            task.abort();
            power::Reply::without_identity(
                PowerState::error(
                    ReadErrorKind::Timeout,
                    format!("no answer within {deadline:?}"),
                ),
                "the read timed out",
            )
        }
    };
    PowerReading {
        at,
        latency: started.elapsed(),
        state: reply.state,
        details: reply.details,
        identity: reply.identity,
        reader: reply.reader.unwrap_or_else(|| source.reader_id()),
        power_draw: reply.power_draw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct SlowOff;

    impl PowerSource for SlowOff {
        fn backend(&self) -> &'static str {
            "test"
        }
        fn address(&self) -> String {
            "slow".into()
        }
        fn read(&self) -> futures::future::BoxFuture<'_, PowerState> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                PowerState::Off
            })
        }
    }

    /// A read is dated when it started: an answer that took 1.5 s proves the machine was off
    /// no later than the request, not at its arrival.
    #[tokio::test]
    async fn a_read_is_dated_when_it_started() {
        let before = crate::clock::now();
        let source: Arc<dyn PowerSource> = Arc::new(SlowOff);
        let r = read_once(&source, Duration::from_secs(5)).await;
        let after = crate::clock::now();
        assert_eq!(r.state, PowerState::Off);
        assert!(r.latency >= Duration::from_millis(1500), "{:?}", r.latency);
        assert!(r.at >= before, "{} < {before}", r.at);
        assert!(
            after.duration_since(r.at) >= jiff::SignedDuration::from_millis(1500),
            "read dated {} but it ended at {after}",
            r.at
        );
    }
}
