//! When a guard starts or ends — a pause, a stale view, standby or leadership, a lease storm,
//! a storm or a freeze in a scope — one log line for journald and one journal record for
//! `oobfence timeline`, once per transition: the pass compares the guards before and after.
//! And a fence or a power action counted against its budget, with what is left.

use jiff::Timestamp;

use super::state::Daemon;
use crate::decision::holds::Calm;
use crate::journal::{Change, Topic, pause_switch};
use crate::leader::Leadership;

impl Daemon {
    /// Logs and journals each guard that started or ended between `before` and now.
    pub(super) fn tell_guard_changes(&self, before: &Calm) {
        self.tell_pause(before);
        if before.stale.is_none()
            && let Some(why) = &self.calm.stale
        {
            tracing::error!(why = %why, "view of the cluster is STALE: no writes until it is fresh again");
            self.journal_change(
                Topic::StaleView,
                "began",
                format!("view of the cluster is stale, no writes until it is fresh again: {why}"),
                Change::default(),
            );
        }
        if before.stale.is_some() && self.calm.stale.is_none() {
            tracing::warn!(
                "view of the cluster is fresh again; reads from before now do not count"
            );
            self.journal_change(
                Topic::StaleView,
                "ended",
                "view of the cluster is fresh again; reads from before now do not count".into(),
                Change::default(),
            );
        }
        self.tell_lease_storm(before);
        self.tell_scopes(before);
    }

    fn journal_change(&self, topic: Topic, result: &str, message: String, change: Change) {
        let record = self
            .journal
            .daemon_record(topic, "", result, message, change);
        self.journal.submit(&record);
    }

    fn tell_pause(&self, before: &Calm) {
        let (was, now) = (&before.pause.by, &self.calm.pause.by);
        if was == now {
            return;
        }
        let change = Change {
            switch: pause_switch(if now.is_empty() { was } else { now }),
            by: if now.is_empty() { was } else { now }.clone(),
            ..Default::default()
        };
        // The pause watch logs the switch itself; the journal has it from here, once.
        let (result, message) = match (was.is_empty(), now.is_empty()) {
            (true, false) => (
                "began",
                format!(
                    "writes PAUSED, nothing is written to any Node until resumed: {}",
                    now.join("; ")
                ),
            ),
            (false, true) => (
                "ended",
                format!("writes resumed (was paused by {})", was.join("; ")),
            ),
            _ => (
                "changed",
                format!("writes still paused, now by {}", now.join("; ")),
            ),
        };
        self.journal_change(Topic::Pause, result, message, change);
    }

    /// `[ha]`: a leader whose renewals do not come back in time stops by its own clock,
    /// without any answer to say so: said here, where the loop sees its standing change. The
    /// journal also says how the instance starts (the first pass), leader or standby.
    pub(super) fn tell_leadership(&mut self, before: &Calm, leadership: Option<&Leadership>) {
        let Some(l) = leadership else { return };
        match (&before.standby, &self.calm.standby) {
            (None, Some(why)) => {
                tracing::warn!(why = %why, "standby: this instance writes nothing")
            }
            (Some(_), None) => tracing::warn!("this instance writes again: it holds the Lease"),
            _ => {}
        }
        let leader = self.calm.standby.is_none();
        if self.told_leader == Some(leader) {
            return;
        }
        self.told_leader = Some(leader);
        let change = Change {
            identity: Some(l.identity.clone()),
            holder: l.holder.clone(),
            term: Some(l.term),
            ..Default::default()
        };
        let (result, message) = match &self.calm.standby {
            Some(why) => (
                "standby",
                format!("this instance ({}) writes nothing: {why}", l.identity),
            ),
            None => (
                "leader",
                format!(
                    "this instance ({}) holds the Lease (term {}) and writes",
                    l.identity, l.term
                ),
            ),
        };
        self.journal_change(Topic::Leadership, result, message, change);
    }

    fn tell_lease_storm(&self, before: &Calm) {
        match (before.lease_storm_since, self.calm.lease_storm_since) {
            (None, Some(_)) => {
                tracing::error!(
                    leases = self.calm.leases.0,
                    late = self.calm.leases_late,
                    stale = self.calm.leases.1,
                    "LEASE STORM: most Leases went unrenewed at once; that is the control plane (or oobfence's view of it) not hearing the kubelets, not the machines: no power is read ahead of NotReady until it passes"
                );
                self.journal_change(
                    Topic::LeaseStorm,
                    "began",
                    format!(
                        "lease storm: {} of {} Leases late at once; no power read ahead of NotReady until it passes",
                        self.calm.leases_late, self.calm.leases.0
                    ),
                    Change::default(),
                );
            }
            (Some(_), None) => {
                tracing::warn!(
                    stale = self.calm.leases.1,
                    "lease storm over: power is read ahead of NotReady again"
                );
                self.journal_change(
                    Topic::LeaseStorm,
                    "ended",
                    "lease storm over: power is read ahead of NotReady again".into(),
                    Change::default(),
                );
            }
            _ => {}
        }
    }

    fn tell_scopes(&self, before: &Calm) {
        for (scope, st) in &self.calm.scopes {
            let old = before.scopes.get(scope);
            let was_storm = old.is_some_and(|o| o.storm_since.is_some());
            let was_frozen = old.is_some_and(|o| o.frozen_since.is_some());
            let c = &st.count;
            let change = || Change {
                scope: Some(scope.label()),
                ..Default::default()
            };
            match (was_storm, st.storm_since.is_some()) {
                (false, true) => {
                    tracing::error!(scope = %scope, unhealthy = c.unhealthy, nodes = c.nodes, "STORM: too many NotReady nodes; no new fence in this scope");
                    self.journal_change(
                        Topic::Storm,
                        "began",
                        format!(
                            "storm in {scope}: {} of {} nodes unhealthy; no new fence there",
                            c.unhealthy, c.nodes
                        ),
                        change(),
                    );
                }
                (true, false) => {
                    tracing::warn!(scope = %scope, unhealthy = c.unhealthy, nodes = c.nodes, "storm over; fences resume after the cooldown");
                    self.journal_change(
                        Topic::Storm,
                        "ended",
                        format!(
                            "storm in {scope} over ({} of {} nodes unhealthy); fences resume after the cooldown",
                            c.unhealthy, c.nodes
                        ),
                        change(),
                    );
                }
                _ => {}
            }
            match (was_frozen, st.frozen_since.is_some()) {
                (false, true) => {
                    tracing::error!(scope = %scope, failing = c.sources_failing, read = c.sources_read, "FROZEN: too many power sources fail at once (oobfence is likely cut off); no new fence in this scope");
                    self.journal_change(
                        Topic::Freeze,
                        "began",
                        format!(
                            "freeze in {scope}: {} of {} power sources failing at once (oobfence likely cut off); no new fence there",
                            c.sources_failing, c.sources_read
                        ),
                        change(),
                    );
                }
                (true, false) => {
                    tracing::warn!(scope = %scope, "freeze over; reads from before now do not count");
                    self.journal_change(
                        Topic::Freeze,
                        "ended",
                        format!("freeze in {scope} over; reads from before now do not count"),
                        change(),
                    );
                }
                _ => {}
            }
        }
    }

    /// A fence (or power action) of `node` started and was counted against its budget: the
    /// journal says how much of the window's allowance it leaves.
    pub(super) fn journal_budget_spent(&self, topic: Topic, node: &str, now: Timestamp) {
        let (used, limit, what, setting) = match topic {
            Topic::PowerBudget => {
                let used = self.calm.power_budget_used(now);
                let limit = self.cfg.actuation.as_ref().map_or(0, |a| a.max_per_hour);
                (
                    used,
                    limit as usize,
                    "power action",
                    "[actuation] max_per_hour",
                )
            }
            _ => {
                let (used, limit) = self.calm.fence_budget(&self.cfg.guards);
                (used, limit, "fence", "[guards] fence_budget")
            }
        };
        let change = Change {
            used: Some(used),
            limit: Some(limit),
            ..Default::default()
        };
        let message = format!(
            "{what} of {node} started: {used} of {limit} ({setting}) used, {} left",
            limit.saturating_sub(used)
        );
        let record = self
            .journal
            .daemon_record(topic, node, "spent", message, change);
        self.journal.submit(&record);
    }
}
