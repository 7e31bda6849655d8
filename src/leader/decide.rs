//! The elector's decisions, pure and synchronous: given the Lease as one GET returned it, and
//! when that GET was sent and answered (this process's clock), renew, take over or follow.
//! The I/O around it is in [`super::Elector`]; the property tests in `tests` drive two of
//! these against a simulated API server with arbitrary latencies.
//!
//! Two rules carry the safety argument:
//!
//! - **A renewal counts from before it could land anywhere.** The deadline of a leader's
//!   writes counts from the start of the round that renewed ([`Core::writable_until`]), which
//!   is before its GET was sent, so before the renewal reached the API server.
//! - **An observation counts from after the answer arrived.** A standby starts counting
//!   `lease_duration` from the arrival of the first answer that carried the current record,
//!   never from the sending of that GET: the record may have been written while the GET was
//!   on its way (a slow API server answers with what it reads late), and counting from the
//!   send would date the leader's renewal back by up to the GET's latency, so that a takeover
//!   could begin before the leader's own deadline had passed. client-go's elector does the
//!   same (it stamps its observation after the GET returns).
//!
//! And one rule for two processes that share one `[ha] identity` (one file copied to both
//! hosts, cloned host names): the Lease naming our identity is ours only if this process
//! wrote its renewTime. Each process remembers the renewTimes it sent; a Lease that names us
//! with a renewTime we never sent was renewed by another process under our name. We then stop
//! writing at once, report it, and treat that Lease like anyone else's: we take it only once
//! it has gone unrenewed for `lease_duration`, so that of the two exactly one writes.
//! (Why renewTime rather than a nonce in `holderIdentity` or an annotation: `holderIdentity`
//! stays the name operators configured and see; and renewTime is written by every version of
//! oobfence, and by any elector at all, so the duplicate is found whatever runs beside us.
//! renewTime has microsecond resolution and is taken from the wall clock, so two processes
//! never send the same one in practice; if they did, the resourceVersion precondition on
//! every write still lets only one of the two writes land.)

use std::collections::VecDeque;
use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

/// The Lease's holder, renewTime and transitions: what changes whenever anyone renews it or
/// takes it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub holder: Option<String>,
    pub renew: Option<Timestamp>,
    pub term: i32,
}

/// What to do with the Lease as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It is ours (we wrote its renewTime): renew it, same term.
    Renew,
    /// Nobody holds it, or its record has stood unrenewed for `lease_duration` by our clock:
    /// take it, next term.
    TakeOver,
    /// Someone else holds it (possibly another process under our own name): write nothing.
    Follow,
}

/// How many renewTimes this process remembers having sent. A write of ours may be applied
/// after its round gave up on it, so more than the last one; a record older than these has
/// been renewed by someone since, whoever that was.
const WRITTEN_KEPT: usize = 32;

pub struct Core {
    me: String,
    lease_duration: Duration,
    safety_margin: Duration,
    /// The record as first seen, and when its answer arrived (our clock).
    seen: Option<(Record, Instant)>,
    /// renewTimes this process sent under its identity, newest last.
    written: VecDeque<Timestamp>,
    /// When we last saw a renewal under our name that this process did not write.
    foreign_renewal_at: Option<Instant>,
}

impl Core {
    pub fn new(me: &str, lease_duration: Duration, safety_margin: Duration) -> Core {
        Core {
            me: me.to_string(),
            lease_duration,
            safety_margin,
            seen: None,
            written: VecDeque::new(),
            foreign_renewal_at: None,
        }
    }

    /// The Lease as a GET returned it (`None`: there is none), its answer arrived at
    /// `answered` (after the GET, not the round's start: see the module's rules).
    pub fn read(&mut self, record: Option<&Record>, answered: Instant) -> Step {
        let Some(record) = record else {
            return Step::TakeOver;
        };
        let ours_by_name = record.holder.as_deref() == Some(self.me.as_str());
        let ours = ours_by_name && record.renew.is_some_and(|r| self.written.contains(&r));
        let first_seen = match &self.seen {
            Some((r, at)) if r == record => *at,
            previous => {
                // A renewal under our name that we did not send, and new since we last
                // looked: another process renews as us. (A record merely left by an earlier
                // run of this instance does not change, so is not reported.)
                if ours_by_name && !ours && previous.is_some() {
                    self.foreign_renewal_at = Some(answered);
                }
                self.seen = Some((record.clone(), answered));
                answered
            }
        };
        if ours {
            return Step::Renew;
        }
        if record.holder.is_none() || answered.duration_since(first_seen) >= self.lease_duration {
            return Step::TakeOver;
        }
        Step::Follow
    }

    /// A write of `renew` under our identity is about to be sent: from now on a Lease with
    /// this renewTime is ours, even if the write's answer never comes.
    pub fn sending(&mut self, renew: Timestamp) {
        if self.written.len() == WRITTEN_KEPT {
            self.written.pop_front();
        }
        self.written.push_back(renew);
    }

    /// Our write of `record` was accepted; its answer arrived at `answered`.
    pub fn wrote(&mut self, record: Record, answered: Instant) {
        self.seen = Some((record, answered));
    }

    /// Until when a leader whose renewing round started at `round_started` may start writes.
    pub fn writable_until(&self, round_started: Instant) -> Instant {
        round_started + self.lease_duration.saturating_sub(self.safety_margin)
    }

    /// Whether another process has renewed the Lease under our name within the last
    /// `lease_duration`.
    pub fn duplicate(&self, now: Instant) -> bool {
        self.foreign_renewal_at
            .is_some_and(|at| now.duration_since(at) < self.lease_duration)
    }
}

#[cfg(test)]
mod tests;
