//! Whether each of the daemon's watches works, one flag per watch: one that answers again never
//! vouches for another that still fails (a Leases event says nothing about the Nodes watch).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The daemon's watches by name (`nodes`, `leases`), each broken until its first answer.
#[derive(Debug, Default)]
pub struct Watches(Mutex<BTreeMap<&'static str, bool>>);

impl Watches {
    /// A watch that has not answered yet: broken until it does.
    pub fn register(&self, what: &'static str) {
        if let Ok(mut w) = self.0.lock() {
            w.entry(what).or_insert(false);
        }
    }

    /// The watch `what` answered (`ok`) or failed.
    pub fn answered(&self, what: &'static str, ok: bool) {
        if let Ok(mut w) = self.0.lock() {
            w.insert(what, ok);
        }
    }

    /// The watches whose last call failed (or that never answered), by name. A flag that
    /// cannot be read counts as every watch broken: fail closed.
    pub fn broken(&self) -> Vec<&'static str> {
        match self.0.lock() {
            Ok(w) => w.iter().filter(|(_, ok)| !**ok).map(|(k, _)| *k).collect(),
            Err(_) => vec!["(unknown)"],
        }
    }

    /// Every watch registered answered last time (and at least one is registered).
    pub fn all_ok(&self) -> bool {
        self.0
            .lock()
            .map(|w| !w.is_empty() && w.values().all(|ok| *ok))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Leases watch answering again does not clear the Nodes watch's failure, nor the
    /// other way round: the view is fresh only once both answer.
    #[test]
    fn one_watch_recovering_does_not_clear_anothers_staleness() {
        let w = Watches::default();
        w.register("nodes");
        w.register("leases");
        assert!(!w.all_ok(), "nothing answered yet");
        w.answered("nodes", true);
        w.answered("leases", true);
        assert!(w.all_ok());

        w.answered("nodes", false);
        w.answered("leases", true);
        assert!(!w.all_ok(), "the Nodes watch still fails");
        assert_eq!(w.broken(), ["nodes"]);

        w.answered("leases", false);
        w.answered("nodes", true);
        assert_eq!(w.broken(), ["leases"]);
        w.answered("leases", true);
        assert!(w.all_ok());
        assert!(w.broken().is_empty());
    }

    #[test]
    fn a_watch_never_heard_from_is_broken() {
        let w = Watches::default();
        assert!(!w.all_ok(), "no watch registered");
        w.register("nodes");
        w.register("leases");
        w.answered("leases", true);
        assert_eq!(w.broken(), ["nodes"]);
        // Registering again never clears a failure.
        w.answered("nodes", false);
        w.register("nodes");
        assert_eq!(w.broken(), ["nodes"]);
    }
}
