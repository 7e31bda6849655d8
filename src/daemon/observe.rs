//! The observers: what the daemon reports about its decisions and what followed them — the
//! decision journal, per-node metrics, identity verdicts, VolumeAttachment release.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;

use super::action::{ActionDone, action_label};
use super::carry_out::Recorded;
use super::guards::failure_domain;
use super::state::{DELETED_FENCE_KEPT, Daemon, FAILING_WINDOW};
use crate::cluster::NodeView;
use crate::cluster::{self, EventType, reasons};
use crate::decision::levels::Basis;
use crate::decision::{self, Decision, FenceAction, IdentityBinding, MappingConflict, Step};
use crate::identity::{IdentityCheck, Verdict};
use crate::journal::{self, RecordKind};
use crate::metrics::{self, FailingLabels, Metrics};

/// Seconds from `earlier` to `later`; 0 when the clock says otherwise.
pub(super) fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64().max(0.0)
}

fn unix_seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// Metrics of a fence that landed at `at`.
pub(super) fn observe_fence(
    m: &Metrics,
    node: &str,
    uid: &str,
    action: FenceAction,
    inputs: &journal::Inputs,
    at: Timestamp,
) {
    if let Some(since) = inputs.not_ready_since {
        m.notready_to_fence.observe(seconds_between(since, at));
    }
    // The last sign of life, as the decision core dates it.
    if let Some(lease) = inputs.lease_renewed {
        let alive = inputs.heartbeat_seen.map_or(lease, |h| h.max(lease));
        m.power_cut_to_fence.observe(seconds_between(alive, at));
    }
    if action == FenceAction::DeleteNode {
        m.node_deleted_by_fence(node, uid, unix_seconds(at));
    }
}

impl Daemon {
    /// Records what a read said about the node's machine, and through which reader. A match or
    /// a mismatch replaces the binding; "cannot tell" (a failed read, an instance that no
    /// longer exists) never erases an earlier match, since a "gone" answer relies on it — and
    /// the core counts a "gone" only through the reader that matched. Changes are logged,
    /// journaled and, for a mismatch, an Event.
    pub(super) fn learn_identity(
        &mut self,
        node: &Arc<NodeView>,
        source: usize,
        verdict: Verdict,
        at: Timestamp,
        reader: &str,
    ) {
        let name = node.name.clone();
        let Some(t) = self.trackers.get_mut(&name) else {
            return;
        };
        let several = t.sources.len() > 1;
        let Some(t) = t.sources.get_mut(source) else {
            return;
        };
        let previous = t.binding.as_ref().map(|b| b.verdict.clone());
        let keep_previous = matches!(verdict, Verdict::Unverifiable(_))
            && previous
                .as_ref()
                .is_some_and(|p| !matches!(p, Verdict::Unverifiable(_)));
        if keep_previous {
            return;
        }
        t.binding = Some(IdentityBinding {
            at,
            verdict: verdict.clone(),
            reader: reader.to_string(),
        });
        let changed = previous.as_ref().map(Verdict::label) != Some(verdict.label());
        if !changed {
            return;
        }
        let uid = node.uid.clone();
        let message = match several {
            true => format!(
                "identity of the node's machine through {}: {verdict}",
                t.label
            ),
            false => format!("identity of the node's machine: {verdict}"),
        };
        let rule = match verdict {
            Verdict::Match(_) => {
                tracing::info!(node = %name, "{message}");
                "identity-verified"
            }
            Verdict::Mismatch(_) => {
                tracing::error!(node = %name, "{message}: the config maps this node to another machine; it will never be fenced until fixed");
                let cluster = self.cluster.clone();
                let node = node.clone();
                let event = format!("{message} (rule identity-mismatch)");
                tokio::spawn(async move {
                    cluster
                        .event(
                            &node.name,
                            EventType::Warning,
                            reasons::IDENTITY_MISMATCH,
                            &event,
                        )
                        .await
                });
                "identity-mismatch"
            }
            Verdict::Unverifiable(_) => {
                tracing::warn!(node = %name, "{message}");
                "identity-unverified"
            }
        };
        let mut record = self.journal.record(
            &name,
            &uid,
            RecordKind::Observation,
            rule,
            journal::Inputs::default(),
        );
        record.result = "observed".into();
        record.message = message;
        self.journal.submit(&record);
    }

    /// What the node's kubelet reported about its machine, with the other Nodes that report
    /// the same system UUID.
    pub(super) fn node_identity(&self, node: &NodeView) -> crate::identity::NodeIdentity {
        let mut identity = cluster::node_identity(node);
        identity.uuid_shared_with = self.shared_uuids.of(&node.name.clone());
        identity
    }

    /// Nodes that now report another Node's system UUID: an ERROR, a journal record and an
    /// Event each, once; `oobfence_node_identity_problem{problem="duplicate-system-uuid"}` for
    /// as long as it lasts.
    pub(super) fn report_shared_uuids(&self, nodes: &[Arc<NodeView>], newly_shared: &[String]) {
        for name in newly_shared {
            let Some(node) = nodes.iter().find(|n| n.name.clone() == *name) else {
                continue;
            };
            let message = format!(
                "node {name} reports the same system UUID as node(s) {}: a UUID several machines share (cloned VMs, boards shipped with one) cannot prove which machine a BMC answers for, so none of their Off reads counts until each machine has its own (rule duplicate-system-uuid)",
                self.shared_uuids.of(name).join(", ")
            );
            self.report_untrusted_source(
                node,
                reasons::DUPLICATE_SYSTEM_UUID,
                "duplicate-system-uuid",
                message,
            );
        }
    }

    /// A power source said Off (or gone) for a node whose kubelet went on living: once per
    /// episode; the core refuses its reads (`off-while-alive`, `gone-while-alive`).
    pub(super) fn report_off_while_alive(
        &self,
        node: &Arc<NodeView>,
        read_at: Timestamp,
        signs: u32,
        gone: bool,
    ) {
        let at = read_at.strftime("%Y-%m-%dT%H:%M:%SZ");
        if gone {
            self.report_untrusted_source(
                node,
                reasons::GONE_WHILE_ALIVE,
                "gone-while-alive",
                format!(
                    "the node's power source said its instance is gone (terminated or not found) at {at} while the node was Ready, and its kubelet showed life {signs} times since: the [aws] credentials, endpoint or region read another account; none of its Off or gone answers fences this node until it reads the instance running again (rule gone-while-alive)"
                ),
            );
        } else {
            self.report_untrusted_source(
                node,
                reasons::OFF_WHILE_ALIVE,
                "off-while-alive",
                format!(
                    "the node's power source read Off at {at} while the node was Ready, and its kubelet showed life {signs} times since: the [[bmc]] entry reads another machine or the BMC misreports; its Off reads never fence this node until it reads On again (rule off-while-alive)"
                ),
            );
        }
    }

    /// A reason the node's power source cannot be trusted, found while nothing is being
    /// decided: an ERROR line, a Warning Event with `reason`, and a journal observation
    /// under `rule`.
    fn report_untrusted_source(
        &self,
        node: &Arc<NodeView>,
        reason: &'static str,
        rule: &'static str,
        message: String,
    ) {
        let name = node.name.clone();
        tracing::error!(node = %name, "{message}");
        let cluster = self.cluster.clone();
        let event_node = node.clone();
        let event = message.clone();
        tokio::spawn(async move {
            cluster
                .event(&event_node.name, EventType::Warning, reason, &event)
                .await
        });
        let mut record = self.journal.record(
            &name,
            &node.uid.clone(),
            RecordKind::Observation,
            rule,
            journal::Inputs::default(),
        );
        record.result = "observed".into();
        record.message = message;
        self.journal.submit(&record);
    }

    /// What a record of the node's decision says it was made on: the node's facts, the
    /// chosen source's reads, its level and the decision's basis.
    pub(super) fn journal_inputs(
        &self,
        name: &str,
        facts: &decision::NodeFacts,
        recorded: &Recorded<'_>,
        with_volumes: bool,
    ) -> journal::Inputs {
        let sources = self.trackers.get(name).map_or(&[][..], |t| &t.sources[..]);
        let source = recorded.member.and_then(|i| sources.get(i));
        // A decision no one source made (a person's word, no level answering) rests on what
        // every source said: all of them are recorded.
        let everyone = recorded.member.is_none() && !sources.is_empty();
        let mut all_reads: Vec<decision::PowerReading> = Vec::new();
        if everyone {
            all_reads = sources
                .iter()
                .flat_map(|s| s.reads.iter().cloned())
                .collect();
            all_reads.sort_by_key(|r| r.at);
        }
        let reads = match source {
            Some(s) => s.reads.as_slice(),
            None => all_reads.as_slice(),
        };
        let described = if everyone {
            let all: Vec<String> = sources
                .iter()
                .filter_map(|s| {
                    let m = s.source.as_ref()?;
                    Some(format!(
                        "level {}: {} {}",
                        s.level,
                        m.source.backend(),
                        m.source.address()
                    ))
                })
                .collect();
            (!all.is_empty()).then(|| all.join("; "))
        } else {
            recorded
                .source
                .map(|s| format!("{} {}", s.source.backend(), s.source.address()))
        };
        let mut inputs = journal::Inputs::new(
            facts,
            reads,
            described,
            if with_volumes {
                self.volumes.attached_to(name)
            } else {
                None
            },
        );
        if let Basis::Reads { level, .. } = recorded.basis {
            inputs.level = Some(*level);
        }
        if *recorded.basis != Basis::None {
            inputs.basis = Some(recorded.basis.label().to_string());
        }
        inputs
    }

    /// Per node, every evaluation: fence age series, resumed volume tracking after a restart,
    /// and the journal record and Event of a refusal or a dry-run decision.
    pub(super) fn observe_node(
        &mut self,
        node: &Arc<NodeView>,
        facts: &decision::NodeFacts,
        decision: &Decision,
        recorded: &Recorded<'_>,
        new_would: bool,
        now: Timestamp,
    ) {
        let name = node.name.clone();
        let uid = node.uid.clone();
        let m = &self.shared.metrics;
        let taint_fence = facts.fence.as_ref().filter(|f| f.taint_present);
        m.set_fenced_since(&name, &uid, taint_fence.map(|f| unix_seconds(f.at)));
        m.set_taint_age(&name, taint_fence.map(|f| seconds_between(f.at, now)));
        if let Some(f) = taint_fence
            && facts.readiness != decision::Readiness::Ready
        {
            self.volumes.resume(&name, f.at);
        }

        let Some(tracker) = self.trackers.get_mut(&name) else {
            return;
        };
        let previous = tracker.refusal;
        // Reading ahead of NotReady refuses nothing yet: a Ready node's refusal starts, with
        // its Event, if it turns NotReady.
        let ahead = facts.readiness == decision::Readiness::Ready && facts.fence.is_none();
        let current = if ahead {
            None
        } else {
            journal::refusal(decision.rule, previous)
        };
        tracker.refusal = current;
        m.set_node_blocked(&name, current.and_then(metrics::blocked_reason));
        let domain = if decision.state == decision::NodeState::Healthy {
            None
        } else {
            failure_domain(node, self.cfg.guards.failure_domain_label.as_deref())
        };
        m.set_node_failure_domain(&name, domain.as_deref());
        let started = current.is_some() && current != previous;
        let dry_run =
            new_would && matches!(decision.step, Step::WouldFence(_) | Step::WouldUnfence);
        if !started && !dry_run {
            return;
        }
        let message = format!("{} (rule {})", decision.reason, decision.rule.name());
        let inputs = self.journal_inputs(&name, facts, recorded, false);
        let (kind, event, action, result) = match decision.step {
            Step::WouldFence(a) if dry_run => (
                RecordKind::DryRun,
                reasons::WOULD_FENCE,
                action_label(a),
                "not_written",
            ),
            Step::WouldUnfence if dry_run => (
                RecordKind::DryRun,
                reasons::WOULD_UNFENCE,
                "untaint",
                "not_written",
            ),
            _ => {
                self.spawn_event(node, EventType::Warning, reasons::BLOCKED, decision);
                (RecordKind::Refusal, reasons::BLOCKED, "none", "refused")
            }
        };
        let mut record = self
            .journal
            .record(&name, &uid, kind, decision.rule.name(), inputs);
        record.event = event.to_string();
        record.action = action.to_string();
        record.result = result.to_string();
        record.message = message;
        self.journal.submit(&record);
    }

    /// Every pass: the metrics that count over nodes, and volume release.
    pub(super) fn observe_all(&mut self, nodes: &[Arc<NodeView>], now: Timestamp) {
        let m = &self.shared.metrics;
        let mut blocked: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut failing: BTreeMap<FailingLabels, i64> = BTreeMap::new();
        for t in self.trackers.values() {
            if let Some(reason) = t.refusal.and_then(metrics::blocked_reason) {
                *blocked.entry(reason).or_default() += 1;
            }
            // The last read for any purpose: a healthy node's health read counts, so that a
            // management network gone shows before the nodes behind it fail.
            for s in &t.sources {
                if let Some((at, Some(kind))) = s.last_read
                    && seconds_between(at, now) <= FAILING_WINDOW.as_secs_f64()
                {
                    let backend = s.source.as_ref().map_or("none", |s| s.source.backend());
                    let labels = FailingLabels {
                        backend,
                        error_kind: kind.to_string(),
                    };
                    *failing.entry(labels).or_default() += 1;
                }
            }
        }
        let mut states: BTreeMap<&'static str, i64> = BTreeMap::new();
        for t in self.trackers.values() {
            if let Some(state) = t.metric_state {
                *states.entry(state.as_str()).or_default() += 1;
            }
        }
        m.set_node_counts(&states);
        m.set_blocked_counts(&blocked);
        m.set_power_sources_failing(&failing);

        let mut verdicts: BTreeMap<&'static str, i64> = BTreeMap::new();
        let mut unchecked = 0;
        let mut problems = std::collections::BTreeSet::new();
        for (name, t) in &self.trackers {
            // Per node, as its first source (its lowest level's) tells: built when the node
            // was first decided (a tracker exists only after that).
            let Some(first) = t.sources.first() else {
                continue;
            };
            let identity = first.identity;
            if identity == IdentityCheck::Unchecked {
                unchecked += 1;
            }
            let verdict = first
                .binding
                .as_ref()
                .map_or("unknown", |b| b.verdict.label());
            *verdicts.entry(verdict).or_default() += 1;
            // Healthy or not: a machine that cannot prove it is the node's (no UUID, a
            // placeholder one) is never fenced under identity = "checked", so it is said
            // while the node still runs, not first when it dies.
            if verdict == "unverifiable" && identity == IdentityCheck::Checked {
                problems.insert((name.clone(), "identity-unverifiable"));
            }
        }
        m.set_identity_counts(&verdicts, unchecked);
        for (name, t) in &self.trackers {
            if t.sources.iter().any(|s| {
                s.binding
                    .as_ref()
                    .is_some_and(|b| b.verdict.label() == "mismatch")
            }) {
                problems.insert((name.clone(), "identity-mismatch"));
            }
        }
        for (name, t) in &self.trackers {
            for o in t
                .sources
                .iter()
                .filter_map(|s| s.off_while_alive.as_ref().filter(|o| o.reported))
            {
                let problem = if o.gone {
                    "gone-while-alive"
                } else {
                    "off-while-alive"
                };
                problems.insert((name.clone(), problem));
            }
        }
        for name in self.shared_uuids.nodes() {
            problems.insert((name.clone(), "duplicate-system-uuid"));
        }
        for (name, c) in &self.conflicts {
            let problem = match c {
                MappingConflict::RegionMismatch(_) => "region-mismatch",
                MappingConflict::SharedMachine(_) => "shared-machine",
            };
            problems.insert((name.clone(), problem));
        }
        m.set_identity_problems(&problems);

        let (mut foreign_ready, mut foreign_not_ready) = (0, 0);
        for n in nodes {
            // Only nodes with an out-of-service taint are looked at further.
            if !cluster::foreign_out_of_service(n, None) {
                continue;
            }
            let fence = cluster::fence_record(n, self.cluster.actor());
            if cluster::foreign_out_of_service(n, fence.as_ref()) {
                if cluster::readiness(n) == decision::Readiness::Ready {
                    foreign_ready += 1;
                } else {
                    foreign_not_ready += 1;
                }
            }
        }
        m.set_foreign_taints(foreign_ready, foreign_not_ready);
        m.prune_deleted_fences(DELETED_FENCE_KEPT);

        m.volume_watch_up.set(i64::from(self.volumes.watch_up()));
        for r in self.volumes.check(now) {
            m.fence_to_volumes_released.observe(r.after.as_secs_f64());
            m.set_fenced_volume_attachments(&r.node, None);
            let message = format!(
                "all {} VolumeAttachment(s) that pointed at the node when it was fenced are gone, {:.0}s after the fence: {}",
                r.names.len(),
                r.after.as_secs_f64(),
                r.names.join(", ")
            );
            tracing::info!(node = %r.node, after_s = r.after.as_secs(), "{message}");
            let inputs = journal::Inputs {
                volume_attachments: Some(r.names.clone()),
                ..Default::default()
            };
            let mut record = self.journal.record(
                &r.node,
                "",
                RecordKind::Observation,
                "volumes-released",
                inputs,
            );
            record.result = "observed".into();
            record.message = message;
            self.journal.submit(&record);
        }
        for (node, remaining) in self.volumes.pending() {
            m.set_fenced_volume_attachments(node, Some(remaining));
        }
    }

    pub(super) fn volumes_after_action(&mut self, done: &ActionDone) {
        match (done.step, &done.result) {
            (Step::Fence(_), Ok(())) => {
                if let (Some(at), Some(names)) = (done.fenced_at, &done.volume_attachments) {
                    self.volumes.track(&done.node, at, names);
                }
            }
            (Step::Unfence | Step::ClearRecord, Ok(())) => {
                self.volumes.forget(&done.node);
                self.shared
                    .metrics
                    .set_fenced_volume_attachments(&done.node, None);
            }
            _ => {}
        }
    }
}
