//! What comes back to the loop: a power read's answer and a write's outcome.

use std::time::Instant;

use super::action::ActionDone;
use super::reads::{ReadDone, ReadPurpose};
use super::state::{ACTION_RETRY, Daemon, FAILED_SOURCE_RETRY, READS_KEPT, power_action_retry};
use crate::decision::{PowerState, Step};
use crate::identity;
use crate::metrics::{BackendLabels, ReadLabels};

impl Daemon {
    /// A power read answered (or failed): counted, logged when the source starts or stops
    /// failing, its identity verdict learnt, kept as evidence when the core asked for it, and
    /// the node decided again at once.
    pub(super) fn read_done(&mut self, done: ReadDone) {
        let m = &self.shared.metrics;
        let error_kind = match &done.reading.state {
            PowerState::Error { kind, .. } => kind.to_string(),
            _ => String::new(),
        };
        m.power_reads
            .get_or_create(&ReadLabels {
                backend: done.backend,
                result: done.reading.state.label(),
                error_kind,
            })
            .inc();
        if let Some(agent) = &done.agent {
            m.fence_agent_reads
                .get_or_create(&crate::metrics::AgentReadLabels {
                    agent: agent.clone(),
                    result: done.reading.state.label(),
                })
                .inc();
        }
        m.power_read_duration
            .get_or_create(&BackendLabels {
                backend: done.backend,
            })
            .observe(done.reading.latency.as_secs_f64());
        tracing::debug!(
            node = %done.node,
            backend = done.backend,
            state = %done.reading.state,
            latency_ms = done.reading.latency.as_millis() as u64,
            "power read"
        );
        let Some(t) = self.trackers.get_mut(&done.node) else {
            return;
        };
        if t.uid != done.uid {
            return;
        }
        let Some(i) = t.takes_read(&done.uid, done.generation) else {
            // Sent to the source a reload replaced: no evidence about the node's machine now.
            tracing::debug!(node = %done.node, "power read from before a reload remapped the node dropped");
            return self.node_changed(&done.node);
        };
        let several = t.sources.len() > 1;
        let s = &mut t.sources[i];
        s.read_in_flight = false;
        // Where a node has several sources, which one a line is about.
        let through = if several {
            s.label.clone()
        } else {
            String::new()
        };
        let failure = match &done.reading.state {
            PowerState::Error { kind, .. } => Some(*kind),
            _ => None,
        };
        let failed = failure.is_some();
        // One line when a source starts failing (or fails another way) and one when it answers
        // again, not one per retry: the classified reason is what the operator acts on.
        let failed_before = s.last_read.and_then(|(_, f)| f);
        match (&done.reading.state, failed_before) {
            (PowerState::Error { kind, detail }, before) if before != Some(*kind) => {
                tracing::warn!(
                    node = %done.node,
                    backend = done.backend,
                    source = %through,
                    error = %kind,
                    "power source read failed: {detail} (logged again when it answers or fails otherwise)"
                );
            }
            (PowerState::Error { .. }, _) => {}
            (_, Some(_)) => {
                tracing::info!(node = %done.node, backend = done.backend, source = %through, "power source answers again");
            }
            (_, None) => {}
        }
        s.last_read = Some((done.reading.at, failure));
        if !failed {
            s.last_answer = Some(done.reading.at);
        }
        if failed && done.purpose == ReadPurpose::Health {
            s.identity_due = Some(Instant::now() + FAILED_SOURCE_RETRY);
        }
        t.power_answered(
            i,
            &done.reading.state,
            done.reading.at,
            done.ready_when_started,
            crate::clock::now(),
        );
        m.power_source_answered(
            &done.node,
            done.backend,
            (!failed).then(|| done.reading.at.as_millisecond() as f64 / 1000.0),
        );
        let node = self.nodes.get(&done.node);
        if let Some(node) = &node {
            let verdict = identity::verify(&self.node_identity(node), &done.reading.identity);
            let reader = done.reading.reader.clone();
            self.learn_identity(node, i, verdict, done.reading.at, &reader);
        }
        if done.purpose == ReadPurpose::Decision
            && let Some(s) = self
                .trackers
                .get_mut(&done.node)
                .and_then(|t| t.sources.get_mut(i))
        {
            s.reads.push(done.reading);
            if s.reads.len() > READS_KEPT {
                s.reads.remove(0);
            }
        }
        // Decide again at once rather than at the next tick.
        if let Some(node) = node {
            self.evaluate(&node, crate::clock::now());
        }
    }

    /// A write ended: the budget gets back a fence that wrote nothing, a failed write waits
    /// [`ACTION_RETRY`], and the next pass decides the node again.
    pub(super) fn action_done(&mut self, done: ActionDone) {
        // Before the tracker lookup: a deleted node has no tracker, its volumes still count.
        self.volumes_after_action(&done);
        let Some(t) = self.trackers.get_mut(&done.node) else {
            return;
        };
        if t.uid != done.uid {
            return;
        }
        t.action_in_flight = false;
        t.quiet = None;
        if matches!(done.step, Step::Fence(_)) && done.result.is_err() {
            // Nothing was written: the budget gets its place back.
            self.calm.forget_fence(&done.uid);
        }
        let power_step = matches!(done.step, Step::PowerOff | Step::PowerOn);
        match done.result {
            Ok(()) => {
                t.last_action_error = None;
                t.retry_after = None;
                if power_step {
                    t.power_failures = 0;
                }
                // A person lifted the fence: the reads it stood on are spent. Another fence
                // needs reads taken since (the machine may have been powered on meanwhile).
                if done.step == Step::ClearRecord {
                    t.clear_reads();
                }
            }
            Err(e) if done.abandoned => {
                // Nothing was written: decide again on the next pass, with fresh inputs.
                t.last_action_error = Some(e);
                t.acted_on = None;
                t.retry_after = None;
            }
            Err(e) if power_step => {
                // A command refused or failed: retried, later each time, never in a loop.
                t.power_failures = t.power_failures.saturating_add(1);
                let wait = power_action_retry(t.power_failures);
                tracing::warn!(
                    node = %done.node,
                    failures = t.power_failures,
                    retry_in_s = wait.as_secs(),
                    "power action not carried out: {e}"
                );
                t.last_action_error = Some(e);
                t.acted_on = None;
                t.retry_after = Some(Instant::now() + wait);
            }
            Err(e) => {
                t.last_action_error = Some(e);
                t.acted_on = None;
                t.retry_after = Some(Instant::now() + ACTION_RETRY);
            }
        }
    }
}
