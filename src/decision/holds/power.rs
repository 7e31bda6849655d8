//! The power actions' own guard (opt-in actuation): at most `max_per_hour` of them in any hour,
//! datacenter-wide, and one machine at a time per failure domain on its way from power-off to
//! fence. A power action cuts a machine's power: a mis-mapped rack or a control-plane event
//! must never turn into many of them.

use std::time::Duration;

use jiff::Timestamp;

use super::{Calm, Hold, HoldKind};
use crate::decision::{elapsed, plus};

/// The power budget's window.
pub const POWER_WINDOW: Duration = Duration::from_secs(3600);

/// Two sightings of one node's power action at most this far apart are one action.
const SAME_ACTION: Duration = Duration::from_secs(60);

impl Calm {
    /// A power action of node `uid` started (or was recorded on its Node) at `at`: it counts
    /// against the power budget for an hour. The same action seen twice (as started, then on
    /// its Node's record, a moment apart) counts once.
    pub fn record_power_action(&mut self, uid: &str, at: Timestamp) {
        let same = |t: &Timestamp| elapsed(*t.min(&at), *t.max(&at)) < SAME_ACTION;
        if !self.power_actions.iter().any(|(t, u)| u == uid && same(t)) {
            self.power_actions.push((at, uid.to_string()));
            self.power_actions.sort();
        }
    }

    /// How many power actions the last hour holds, as of `now`.
    pub fn power_budget_used(&self, now: Timestamp) -> usize {
        self.power_actions
            .iter()
            .filter(|(t, _)| elapsed(*t, now) < POWER_WINDOW)
            .count()
    }

    /// Forgets the power actions older than the window.
    pub fn expire_power_actions(&mut self, now: Timestamp) {
        self.power_actions
            .retain(|(t, _)| elapsed(*t, now) < POWER_WINDOW);
    }

    /// What holds a power action of node `uid` in failure domain `domain` ("" without the
    /// label): the budget of `max_per_hour` spent, or another node of its domain powered off
    /// and not fenced yet.
    pub fn power_hold(
        &self,
        uid: &str,
        domain: &str,
        max_per_hour: u32,
        now: Timestamp,
    ) -> Option<Hold> {
        if let Some(other) = self.powering_off.get(domain).filter(|u| *u != uid) {
            return Some(Hold {
                kind: HoldKind::PowerBudget,
                reason: format!(
                    "another node of {} (uid {other}) was powered off by oobfence and is not fenced yet: one power action at a time per failure domain",
                    if domain.is_empty() {
                        "the datacenter".to_string()
                    } else {
                        format!("failure domain {domain}")
                    }
                ),
            });
        }
        let used: Vec<&Timestamp> = self
            .power_actions
            .iter()
            .filter(|(t, u)| u != uid && elapsed(*t, now) < POWER_WINDOW)
            .map(|(t, _)| t)
            .collect();
        if used.len() >= max_per_hour as usize {
            let frees = used.iter().min().map(|t| plus(**t, POWER_WINDOW));
            return Some(Hold {
                kind: HoldKind::PowerBudget,
                reason: format!(
                    "{} power actions in the last hour already use [actuation] max_per_hour = {max_per_hour}{}",
                    used.len(),
                    frees
                        .map(|t| format!(
                            "; the next place frees at {}",
                            t.strftime("%Y-%m-%dT%H:%M:%SZ")
                        ))
                        .unwrap_or_default()
                ),
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn the_power_budget_counts_the_last_hour_and_one_domain_goes_at_a_time() {
        let mut calm = Calm::default();
        for (i, at) in [0, 10, 20].into_iter().enumerate() {
            calm.record_power_action(&format!("u{i}"), t(at));
        }
        assert_eq!(calm.power_hold("u9", "r1", 4, t(30)), None);
        // Seen again on its Node's record a moment later: still one.
        calm.record_power_action("u2", t(21));
        assert_eq!(calm.power_actions.len(), 3);
        let h = calm.power_hold("u9", "r1", 3, t(30)).expect("spent");
        assert_eq!(h.kind, HoldKind::PowerBudget);
        assert!(h.reason.contains("max_per_hour = 3"), "{}", h.reason);
        // A node's own action never holds it; an hour later the oldest place frees.
        assert_eq!(calm.power_hold("u0", "r1", 3, t(30)), None);
        assert_eq!(calm.power_hold("u9", "r1", 3, t(3601)), None);
        calm.expire_power_actions(t(3615));
        assert_eq!(calm.power_actions.len(), 1);
        // One machine at a time per domain, from power-off to fence.
        calm.powering_off.insert("r1".into(), "u5".into());
        let h = calm.power_hold("u9", "r1", 10, t(30)).expect("busy");
        assert!(h.reason.contains("failure domain r1"), "{}", h.reason);
        assert_eq!(calm.power_hold("u5", "r1", 10, t(30)), None);
        assert_eq!(calm.power_hold("u9", "r2", 10, t(30)), None);
    }
}
