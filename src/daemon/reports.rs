//! Reports: what `why` and `/nodes` show of a node, rendered when asked: its facts gathered and
//! the core asked at that moment, as a pass would (a quiet node is not decided at every pass,
//! and the clock moved since), with nothing carried out. And the status line systemd shows.

use jiff::Timestamp;

use super::notify::notify_systemd;
use super::state::Daemon;
use crate::decision::levels::Basis;
use crate::decision::{self, NodeState};
use crate::report::{
    ConfirmationReport, LevelSourceReport, NodeReport, PowerSourceReport, ReportInputs,
};
use crate::status::ReportRequest;

impl Daemon {
    /// Answers a request for reports (one node's, or every node's by name).
    pub(super) fn answer_reports(&mut self, request: ReportRequest) {
        let now = crate::clock::now();
        let reports = match &request.node {
            Some(name) => self.report(name, now).into_iter().collect(),
            None => {
                let mut names: Vec<String> = self.trackers.keys().cloned().collect();
                names.sort_unstable();
                names
                    .iter()
                    .filter_map(|name| self.report(name, now))
                    .collect()
            }
        };
        // The asker may have given up waiting.
        let _ = request.reply.send(reports);
    }

    /// The node's report as of `now`; None for a node no pass has decided yet, or gone.
    fn report(&mut self, name: &str, now: Timestamp) -> Option<NodeReport> {
        // Decided once: a pass has seen it (and counted the guards with it).
        self.trackers.get(name)?.metric_state?;
        let node = self.nodes.get(name)?;
        let gathered = self.gather_facts(&node, now);
        let outcome = self.decide(&node, &gathered, now);
        let tracker = self.trackers.get(name)?;
        let decision = outcome.decision;
        // The source the decision is about (the first without one): what the single-source
        // fields show.
        let shown = outcome.member.unwrap_or(0);
        let facts = gathered.members.get(shown).unwrap_or(&gathered.facts);
        let source = tracker.sources.get(shown);
        let levels: Vec<LevelSourceReport> = tracker
            .sources
            .iter()
            .zip(&gathered.members)
            .enumerate()
            .map(|(i, (s, f))| LevelSourceReport {
                level: s.level,
                source: s.label.clone(),
                attested: f.identity_check == crate::identity::IdentityCheck::Checked,
                last_read: s.last_read.map(|(at, _)| at),
                last_read_failed: s.last_read.is_some_and(|(_, e)| e.is_some()),
                last_answer: s.last_answer,
                said: s.reads.last().map(|r| r.state.to_string()),
                chosen: outcome.member == Some(i),
            })
            .collect();
        let confirmation = tracker.confirmation.as_ref().map(|seen| {
            match (&gathered.facts.confirmation, &seen.note) {
                (_, Err(problem)) => ConfirmationReport::invalid(problem, seen.seen),
                (Some(c), Ok(_)) => ConfirmationReport::of(c, &gathered.facts),
                (None, Ok(_)) => ConfirmationReport::invalid("not read", seen.seen),
            }
        });
        Some(NodeReport::new(ReportInputs {
            node: name,
            datacenter: &self.cfg.datacenter,
            now,
            facts,
            decision: &decision,
            reads: source.map_or(&[][..], |s| &s.reads),
            power_source: source.and_then(|s| {
                let src = s.source.as_ref()?;
                Some(PowerSourceReport {
                    backend: src.source.backend().to_string(),
                    address: src.source.address(),
                    last_answer: s.last_answer,
                    last_read: s.last_read.map(|(at, _)| at),
                    last_read_failed: s.last_read.is_some_and(|(_, e)| e.is_some()),
                    off_while_alive: facts.off_while_alive.clone(),
                })
            }),
            confirmation,
            levels,
            basis: (outcome.basis != Basis::None).then(|| outcome.basis.label().to_string()),
            dry_run: self.cfg.policy.dry_run,
            // A dry run's announcement means nothing once a reload turned the dry run off.
            would: tracker
                .would_announced
                .as_ref()
                .filter(|_| self.cfg.policy.dry_run)
                .map(|(action, _)| *action),
            read_in_flight: tracker.sources.iter().any(|s| s.read_in_flight),
            last_action_error: tracker.last_action_error.clone(),
            action_retry_at: tracker.retry_after.and_then(|at| {
                let left = at.checked_duration_since(std::time::Instant::now())?;
                Some(now + jiff::SignedDuration::try_from(left).ok()?)
            }),
            lease_stale_after: self.cfg.policy.pre_attest_after.map(|r| {
                r.of(facts
                    .lease_duration
                    .unwrap_or(decision::DEFAULT_LEASE_DURATION))
            }),
        }))
    }

    /// The status line `systemctl status` shows.
    pub(super) fn report_status(&self) {
        let count = |s: NodeState| {
            self.trackers
                .values()
                .filter(|t| t.metric_state == Some(s))
                .count()
        };
        let mut status = format!(
            "watching {} nodes, {} fenced, {} blocked, {} confirming",
            self.trackers
                .values()
                .filter(|t| t.metric_state.is_some())
                .count(),
            count(NodeState::Fenced),
            count(NodeState::Blocked),
            count(NodeState::Confirming)
        );
        if self.cfg.policy.dry_run {
            let would = self
                .trackers
                .values()
                .filter(|t| {
                    t.would_announced
                        .as_ref()
                        .is_some_and(|(a, _)| matches!(*a, "taint" | "delete_node"))
                })
                .count();
            status.push_str(&format!("; DRY RUN, {would} would be fenced"));
        }
        if !self.shared.watches.all_ok() {
            status.push_str("; Kubernetes API unreachable, retrying");
        }
        if let Some(l) = self.leadership.as_ref().and_then(|l| l.read().ok()) {
            if l.may_write() {
                status.push_str(&format!("; role leader (term {})", l.term));
            } else if l.duplicate_identity {
                status.push_str(&format!(
                    "; role standby: ANOTHER PROCESS renews the Lease as {} (duplicate [ha] identity)",
                    l.identity
                ));
            } else {
                status.push_str(&format!(
                    "; role standby (Lease held by {})",
                    l.holder.as_deref().unwrap_or("nobody")
                ));
            }
        }
        notify_systemd(&[sd_notify::NotifyState::Status(&status)]);
    }
}
