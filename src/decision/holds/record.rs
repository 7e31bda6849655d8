//! What of the guards' memory must outlive the process: the fences of the budget window, when
//! each scope's last storm ended (its cooldown), and the power actions of the last hour (the
//! `[actuation] max_per_hour` budget). A restarted daemon, or the `[ha]` instance that takes
//! over, reads it back before its first pass, so that it counts its predecessor's fences and
//! power actions and keeps its cooldowns.
//!
//! The fence and power records on the Nodes (`oobfence.io/*`) tell of taints and power-offs,
//! but a Node deleted by a fence leaves nothing, an unfence or a cleared record erases them, and
//! a storm's end is written nowhere on the cluster: hence this record ([`crate::daemon`] keeps
//! it in a ConfigMap). An entry dated after the reader's clock counts as made now: a writer's
//! clock far ahead (or a hand edit) must not hold a budget or a cooldown for ever. Pure: the
//! clock is passed in.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::power::POWER_WINDOW;
use super::{Calm, GuardPolicy, Scope, elapsed};

/// The guards' memory as written down.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardRecord {
    /// Fences (taints and Node deletes) started within the budget window, oldest first.
    #[serde(default)]
    pub fences: Vec<RecordedFence>,
    /// When the last storm of each scope ended, while its cooldown lasts, by the scope's
    /// label (`datacenter`, `domain=VALUE`).
    #[serde(default)]
    pub storms_ended: BTreeMap<String, Timestamp>,
    /// Power actions (opt-in actuation) of the last hour, oldest first. Absent when none, so a
    /// datacenter without actuation writes the record it always did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub power_actions: Vec<RecordedPowerAction>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedFence {
    pub at: Timestamp,
    /// The fenced Node's uid.
    pub uid: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedPowerAction {
    pub at: Timestamp,
    /// The Node's uid.
    pub uid: String,
}

/// The scope a label names ([`Scope::label`]'s inverse); `None` for anything else.
fn scope_of(label: &str) -> Option<Scope> {
    match label {
        "datacenter" => Some(Scope::Datacenter),
        _ => label
            .strip_prefix("domain=")
            .map(|d| Scope::Domain(d.to_string())),
    }
}

impl Calm {
    /// What must outlive the process now: the fences still in the window and the storm ends
    /// whose cooldown still runs.
    pub fn record(&self, policy: &GuardPolicy, now: Timestamp) -> GuardRecord {
        GuardRecord {
            fences: self
                .fences
                .iter()
                .filter(|(at, _)| elapsed(*at, now) < policy.fence_budget_window)
                .map(|(at, uid)| RecordedFence {
                    at: *at,
                    uid: uid.clone(),
                })
                .collect(),
            storms_ended: self
                .scopes
                .iter()
                .filter_map(|(scope, st)| Some((scope, st.storm_ended?)))
                .filter(|(_, ended)| elapsed(*ended, now) < policy.cooldown)
                .map(|(scope, ended)| (scope.label(), ended))
                .collect(),
            power_actions: self
                .power_actions
                .iter()
                .filter(|(at, _)| elapsed(*at, now) < POWER_WINDOW)
                .map(|(at, uid)| RecordedPowerAction {
                    at: *at,
                    uid: uid.clone(),
                })
                .collect(),
        }
    }

    /// Takes back a predecessor's record (before the first pass, or any time: nothing already
    /// known is lost). Fences count against the budget while in the window; a storm end starts
    /// the cooldown of its scope as if this process had seen it. A later storm end seen here
    /// wins. Power actions count against their budget for their hour. Entries dated after
    /// `now` count as made at `now`.
    pub fn restore(&mut self, record: &GuardRecord, policy: &GuardPolicy, now: Timestamp) {
        for f in &record.fences {
            let at = f.at.min(now);
            if elapsed(at, now) < policy.fence_budget_window {
                self.record_fence(&f.uid, at);
            }
        }
        self.fences.sort_by_key(|(at, _)| *at);
        for (label, ended) in &record.storms_ended {
            let Some(scope) = scope_of(label) else {
                continue;
            };
            let ended = (*ended).min(now);
            if elapsed(ended, now) >= policy.cooldown {
                continue;
            }
            let st = self.scopes.entry(scope).or_default();
            if st.storm_ended.is_none_or(|mine| mine < ended) {
                st.storm_ended = Some(ended);
            }
        }
        for a in &record.power_actions {
            let at = a.at.min(now);
            if elapsed(at, now) < POWER_WINDOW {
                self.record_power_action(&a.uid, at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Census, CensusNode, HoldKind, Pause, View};
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn policy() -> GuardPolicy {
        GuardPolicy {
            fence_budget: super::super::Limit::Count(2),
            fence_budget_window: Duration::from_secs(3600),
            cooldown: Duration::from_secs(300),
            failure_domain_label: Some("zone".into()),
            ..GuardPolicy::default()
        }
    }

    fn node(uid: &str, zone: &str, unhealthy: bool) -> CensusNode<'static> {
        CensusNode {
            uid: uid.to_string().into(),
            domain: Some(zone.to_string().into()),
            unhealthy,
            source_failing: None,
            lease: None,
        }
    }

    fn pass(calm: &mut Calm, nodes: &[CensusNode<'_>], now: Timestamp) {
        let census = Census::count(nodes, true);
        let view = View {
            broken_watches: Vec::new(),
            last_round_trip: Some(now),
        };
        calm.update(&census, &view, Pause::default(), &policy(), now);
    }

    /// A new process given its predecessor's record holds what the predecessor held: the
    /// budget it spent and the cooldown of the storm it saw end.
    #[test]
    fn a_successor_keeps_the_budget_spent_and_the_cooldown() {
        let p = policy();
        let healthy: Vec<_> = (0..4).map(|i| node(&format!("u{i}"), "a", false)).collect();
        let mut storm = healthy.clone();
        for n in &mut storm[..3] {
            n.unhealthy = true;
        }
        let mut before = Calm::default();
        pass(&mut before, &healthy, t(0));
        before.record_fence("u0", t(10));
        before.record_fence("u1", t(20));
        pass(&mut before, &storm, t(30));
        pass(&mut before, &healthy, t(60));
        let record = before.record(&p, t(70));
        assert_eq!(record.fences.len(), 2);
        assert_eq!(record.storms_ended.get("datacenter"), Some(&t(60)));

        // Through its written form, as a ConfigMap keeps it.
        let text = serde_json::to_string(&record).unwrap();
        let read: GuardRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(read, record);

        let mut after = Calm::default();
        after.restore(&read, &p, t(80));
        pass(&mut after, &healthy, t(80));
        let h = after.holds(Some("a"), "u3", &p, t(90));
        let hold = h.fence.expect("held");
        assert_eq!(hold.kind, HoldKind::StormCooldown, "{}", hold.reason);
        // The cooldown over, the spent budget still holds a new fence.
        let h = after.holds(Some("a"), "u3", &p, t(400));
        assert_eq!(h.fence.map(|h| h.kind), Some(HoldKind::FenceBudget));
        // A node fenced before is not counted against itself.
        assert_eq!(after.holds(Some("a"), "u0", &p, t(400)).fence, None);
        // The window over, nothing of it is kept or written again.
        pass(&mut after, &healthy, t(3700));
        assert_eq!(after.holds(Some("a"), "u3", &p, t(3700)).fence, None);
        assert_eq!(after.record(&p, t(3700)), GuardRecord::default());
    }

    /// A new leader fences nothing while its predecessor's record is being read: until then
    /// it cannot know how much of the budget is spent.
    #[test]
    fn no_new_fence_while_the_predecessors_record_is_read() {
        let p = policy();
        let nodes: Vec<_> = (0..4).map(|i| node(&format!("u{i}"), "a", false)).collect();
        let mut c = Calm::default();
        pass(&mut c, &nodes, t(0));
        assert_eq!(c.holds(Some("a"), "u1", &p, t(1)).fence, None);
        c.record_pending = true;
        let h = c.holds(Some("a"), "u1", &p, t(1)).fence.expect("held");
        assert_eq!(h.kind, HoldKind::FenceBudget);
        assert!(h.reason.contains("being read"), "{}", h.reason);
        c.restore(&GuardRecord::default(), &p, t(2));
        c.record_pending = false;
        assert_eq!(c.holds(Some("a"), "u1", &p, t(2)).fence, None);
    }

    /// A record read back holds the power budget as it holds the fence budget: the power
    /// actions of the last hour, written and restored, so that a restart or a takeover (whose
    /// Nodes' records an unfence or a cleared record may have erased) gets no fresh budget.
    #[test]
    fn a_successor_keeps_the_power_budget_spent() {
        let p = policy();
        let mut before = Calm::default();
        before.record_power_action("u0", t(10));
        before.record_power_action("u1", t(20));
        let text = serde_json::to_string(&before.record(&p, t(30))).unwrap();
        assert!(text.contains("u1"), "no power action written: {text}");
        let read: GuardRecord = serde_json::from_str(&text).unwrap();
        let mut after = Calm::default();
        after.restore(&read, &p, t(40));
        let h = after
            .power_hold("u9", "a", 2, t(50))
            .expect("the budget spent");
        assert_eq!(h.kind, HoldKind::PowerBudget);
        assert!(h.reason.contains("max_per_hour = 2"), "{}", h.reason);
        // An hour on, the places free and nothing of them is written again.
        assert_eq!(after.power_hold("u9", "a", 2, t(3621)), None);
        after.expire_power_actions(t(3621));
        assert_eq!(after.record(&p, t(3621)), GuardRecord::default());
    }

    /// An entry dated ahead of the reader's clock (a writer's clock far off, a hand edit) is
    /// taken as made now: it holds for one window from now, not until its date comes.
    #[test]
    fn entries_from_the_future_count_from_now() {
        let p = policy();
        let now = t(0);
        let year = 365 * 24 * 3600;
        let record: GuardRecord = serde_json::from_value(serde_json::json!({
            "fences": [{"at": t(year).to_string(), "uid": "f1"}, {"at": t(year).to_string(), "uid": "f2"}],
            "storms_ended": {"datacenter": t(year).to_string()},
            "power_actions": [{"at": t(year).to_string(), "uid": "p1"}],
        }))
        .unwrap();
        let nodes: Vec<_> = (0..4).map(|i| node(&format!("u{i}"), "a", false)).collect();
        let mut c = Calm::default();
        c.restore(&record, &p, now);
        pass(&mut c, &nodes, now);
        let h = c.holds(Some("a"), "u3", &p, now).fence.expect("held");
        assert_eq!(h.kind, HoldKind::StormCooldown, "{}", h.reason);
        assert!(c.power_hold("u3", "a", 1, now).is_some());
        // Past the cooldown, the window and the power hour (from now, not from a year on).
        let later = t(3700);
        pass(&mut c, &nodes, later);
        c.expire_power_actions(later);
        assert_eq!(c.holds(Some("a"), "u3", &p, later).fence, None);
        assert_eq!(c.power_hold("u3", "a", 1, later), None);
        assert_eq!(c.record(&p, later), GuardRecord::default());
    }

    /// Old entries and unknown scopes are ignored; an empty or partial record is no error.
    #[test]
    fn a_stale_or_odd_record_restores_nothing_it_should_not() {
        let p = policy();
        let record: GuardRecord = serde_json::from_str(
            r#"{"fences":[{"at":"2027-01-15T08:00:00Z","uid":"old"}],"storms_ended":{"rack=7":"2027-01-15T08:00:00Z","datacenter":"2027-01-15T08:00:00Z"}}"#,
        )
        .unwrap();
        let mut c = Calm::default();
        c.restore(&record, &p, "2027-01-15T10:00:00Z".parse().unwrap());
        assert!(c.fences.is_empty());
        assert!(c.scopes.is_empty());
        let empty: GuardRecord = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, GuardRecord::default());
    }
}
