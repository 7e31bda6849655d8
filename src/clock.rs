//! oobfence's clock, for every time it stamps and every duration it measures itself: the wall
//! time when it started, advanced by the monotonic clock. A step of the system clock (an NTP
//! correction, `date -s`, a VM resumed) moves neither a read's age nor a kubelet's silence:
//! followed, a backward step would make old Off reads fresh and a forward one would make a
//! live kubelet look silent. The unit starts after `time-sync.target`, so the start is right;
//! a step later is reported ([`stepped`]) and not followed.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};

/// A wall time and the monotonic instant it was read at.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Timestamp,
    at: Instant,
}

impl Clock {
    /// A clock that reads `wall` now and advances with the monotonic clock from here on.
    pub fn starting_at(wall: Timestamp) -> Clock {
        Clock {
            wall,
            at: Instant::now(),
        }
    }

    pub fn now(&self) -> Timestamp {
        let run = SignedDuration::try_from(self.at.elapsed()).unwrap_or(SignedDuration::MAX);
        self.wall.checked_add(run).unwrap_or(Timestamp::MAX)
    }

    /// How far `wall` (the system clock) is from this clock now: positive when ahead.
    pub fn offset_of(&self, wall: Timestamp) -> SignedDuration {
        wall.duration_since(self.now())
    }
}

static CLOCK: LazyLock<Clock> = LazyLock::new(|| Clock::starting_at(Timestamp::now()));

/// The time now, by oobfence's clock.
pub fn now() -> Timestamp {
    CLOCK.now()
}

/// A system clock this far from oobfence's has stepped, not drifted.
const STEP: SignedDuration = SignedDuration::from_secs(2);

/// The system clock's offset last reported, in whole seconds.
static REPORTED: AtomicI64 = AtomicI64::new(0);

/// A sentence for the log when the system clock has stepped away from oobfence's clock since
/// the last report (by more than 2 s); `None` otherwise.
pub fn stepped() -> Option<String> {
    let offset = CLOCK.offset_of(Timestamp::now());
    let secs = offset.as_secs();
    let last = REPORTED.load(Ordering::Relaxed);
    if (secs - last).abs() <= STEP.as_secs() {
        return None;
    }
    REPORTED.store(secs, Ordering::Relaxed);
    Some(format!(
        "the system clock is {:.1}s {} oobfence's clock (it stepped since oobfence started); oobfence keeps its own, monotonic clock for every age and silence it measures, and stamps records by it",
        offset.as_secs_f64().abs(),
        if secs > 0 { "ahead of" } else { "behind" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock advances with the monotonic clock from its start and never reads the system
    /// clock again: started a day in the past, it stays a day in the past.
    #[test]
    fn a_clock_advances_from_its_start_whatever_the_system_clock_says() {
        let day_ago = Timestamp::now() - SignedDuration::from_hours(24);
        let clock = Clock::starting_at(day_ago);
        let first = clock.now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let later = clock.now();
        assert!(later.duration_since(first) >= SignedDuration::from_millis(20));
        assert!(later.duration_since(day_ago) < SignedDuration::from_secs(600));
        let offset = clock.offset_of(Timestamp::now());
        assert!(
            (offset - SignedDuration::from_hours(24)).abs() < SignedDuration::from_secs(600),
            "{offset:?}"
        );
        // Ages measured by it are the monotonic clock's, never negative.
        let mut prev = clock.now();
        for _ in 0..1000 {
            let t = clock.now();
            assert!(t >= prev);
            prev = t;
        }
    }
}
