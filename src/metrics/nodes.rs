//! The per-node series: a node's state and the counts by state, its fence and how long it has
//! held, why it is blocked, its taint's age, its volumes, its power source's last answer, its
//! identity problems; and the actions taken.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{
    ALL_STATES, ActionLabels, BLOCKED_REASONS, BlockedLabels, FailingLabels, FenceLabels,
    IDENTITY_VERDICTS, Metrics, NodeActionLabels, NodeBackendLabels, NodeDomainLabels, NodeLabels,
    NodeProblemLabels, NodeReasonLabels, NodeStateLabels, ReadyLabels, StateLabels, VerdictLabels,
};
use crate::decision::NodeState;

impl Metrics {
    /// A node's own series, only while it is not healthy: a healthy node is what
    /// `oobfence_nodes{state="healthy"}` counts, and a series per healthy node (thousands)
    /// would say nothing more.
    pub fn set_node_state(&self, node: &str, state: NodeState) {
        for s in ALL_STATES.into_iter().filter(|s| *s != state) {
            self.node_state.remove(&NodeStateLabels {
                node: node.to_string(),
                state: s.as_str(),
            });
        }
        let labels = NodeStateLabels {
            node: node.to_string(),
            state: state.as_str(),
        };
        if state == NodeState::Healthy {
            self.node_state.remove(&labels);
        } else {
            self.node_state.get_or_create(&labels).set(1);
        }
    }

    /// `nodes{state}`: how many watched nodes are in each state, every state listed.
    pub fn set_node_counts(&self, counts: &BTreeMap<&'static str, i64>) {
        for s in ALL_STATES {
            self.nodes
                .get_or_create(&StateLabels { state: s.as_str() })
                .set(counts.get(s.as_str()).copied().unwrap_or(0));
        }
    }

    /// Drops every per-node series of a node that left the cache. Volume series stay: a
    /// deleted node's volumes can still be attached.
    pub fn forget_node(&self, node: &str) {
        for s in ALL_STATES {
            self.node_state.remove(&NodeStateLabels {
                node: node.to_string(),
                state: s.as_str(),
            });
        }
        self.set_node_blocked(node, None);
        self.set_node_failure_domain(node, None);
        self.set_taint_age(node, None);
        self.forget_power_source(node);
        self.fenced_since.remove(&NodeActionLabels {
            node: node.to_string(),
            action: "taint",
        });
    }

    /// A read of `node`'s power source ended: an answer dates its last success; an error
    /// leaves it, creating the series at 0 if the source never answered.
    pub fn power_source_answered(&self, node: &str, backend: &'static str, at: Option<f64>) {
        let labels = NodeBackendLabels {
            node: node.to_string(),
            backend,
        };
        let gauge = self.power_source_last_success.get_or_create(&labels);
        if let Some(at) = at {
            gauge.set(at);
        }
    }

    pub fn forget_power_source(&self, node: &str) {
        for backend in crate::power::BACKENDS {
            self.power_source_last_success.remove(&NodeBackendLabels {
                node: node.to_string(),
                backend,
            });
        }
    }

    /// Sets or removes a node's taint fence series (from its fence record, every pass). A
    /// node in the cache without a fence record also loses a delete_node series, unless it is
    /// still the very Node object oobfence deleted (the cache lags the delete).
    pub fn set_fenced_since(&self, node: &str, uid: &str, taint_fenced_at: Option<f64>) {
        let labels = NodeActionLabels {
            node: node.to_string(),
            action: "taint",
        };
        match taint_fenced_at {
            Some(at) => {
                self.fenced_since.get_or_create(&labels).set(at);
            }
            None => {
                if self.fenced_since.get(&labels).is_some() {
                    self.fenced_since.remove(&labels);
                }
                let Ok(mut deleted) = self.deleted_fences.lock() else {
                    return;
                };
                if deleted.get(node).is_some_and(|(d, _)| d != uid) {
                    deleted.remove(node);
                    self.fenced_since.remove(&NodeActionLabels {
                        node: node.to_string(),
                        action: "delete_node",
                    });
                }
            }
        }
    }

    /// oobfence fenced `node` by deleting its Node object `uid` at `at` (Unix seconds).
    pub fn node_deleted_by_fence(&self, node: &str, uid: &str, at: f64) {
        if let Ok(mut deleted) = self.deleted_fences.lock() {
            deleted.insert(node.to_string(), (uid.to_string(), Instant::now()));
        }
        self.fenced_since
            .get_or_create(&NodeActionLabels {
                node: node.to_string(),
                action: "delete_node",
            })
            .set(at);
    }

    /// Drops delete_node fence series older than `keep`.
    pub fn prune_deleted_fences(&self, keep: Duration) {
        let Ok(mut deleted) = self.deleted_fences.lock() else {
            return;
        };
        deleted.retain(|node, (_, at)| {
            let keep_it = at.elapsed() < keep;
            if !keep_it {
                self.fenced_since.remove(&NodeActionLabels {
                    node: node.clone(),
                    action: "delete_node",
                });
            }
            keep_it
        });
    }

    /// Sets the node's blocked reason (one of [`BLOCKED_REASONS`]), or removes it.
    pub fn set_node_blocked(&self, node: &str, reason: Option<&'static str>) {
        for r in BLOCKED_REASONS {
            let labels = NodeReasonLabels {
                node: node.to_string(),
                reason: r,
            };
            if Some(r) == reason {
                self.node_blocked.get_or_create(&labels).set(1);
            } else if self.node_blocked.get(&labels).is_some() {
                // Checked first: called for every node on every pass, and a read lock does
                // not hold up a scrape.
                self.node_blocked.remove(&labels);
            }
        }
    }

    /// Sets the failure domain of a node that is not healthy, or removes its series (healthy,
    /// gone, or no domain).
    pub fn set_node_failure_domain(&self, node: &str, domain: Option<&str>) {
        let Ok(mut domains) = self.node_domains.lock() else {
            return;
        };
        if domains.get(node).map(String::as_str) == domain {
            return;
        }
        if let Some(old) = domains.remove(node) {
            self.node_failure_domain.remove(&NodeDomainLabels {
                node: node.to_string(),
                domain: old,
            });
        }
        if let Some(d) = domain {
            domains.insert(node.to_string(), d.to_string());
            self.node_failure_domain
                .get_or_create(&NodeDomainLabels {
                    node: node.to_string(),
                    domain: d.to_string(),
                })
                .set(1);
        }
    }

    /// Sets the age of oobfence's taint on the node, or removes the series.
    pub fn set_taint_age(&self, node: &str, age_seconds: Option<f64>) {
        let labels = NodeLabels {
            node: node.to_string(),
        };
        match age_seconds {
            Some(age) => {
                self.taint_age.get_or_create(&labels).set(age);
            }
            None => {
                if self.taint_age.get(&labels).is_some() {
                    self.taint_age.remove(&labels);
                }
            }
        }
    }

    /// Sets how many of a fenced node's VolumeAttachments are still there; `None` or 0
    /// removes the series.
    pub fn set_fenced_volume_attachments(&self, node: &str, count: Option<usize>) {
        let labels = NodeLabels {
            node: node.to_string(),
        };
        match count {
            Some(n) if n > 0 => {
                self.fenced_volume_attachments
                    .get_or_create(&labels)
                    .set(n as i64);
            }
            _ => {
                self.fenced_volume_attachments.remove(&labels);
            }
        }
    }

    /// Sets `blocked{reason}` for every reason from a count per reason (absent = 0).
    pub fn set_blocked_counts(&self, counts: &BTreeMap<&'static str, i64>) {
        for reason in BLOCKED_REASONS {
            self.blocked
                .get_or_create(&BlockedLabels { reason })
                .set(counts.get(reason).copied().unwrap_or(0));
        }
    }

    /// Sets `power_sources_failing` from a count per (backend, error_kind); label sets seen
    /// before and absent now go to 0.
    pub fn set_power_sources_failing(&self, counts: &BTreeMap<FailingLabels, i64>) {
        let Ok(mut seen) = self.failing_seen.lock() else {
            return;
        };
        seen.extend(counts.keys().cloned());
        for labels in seen.iter() {
            self.power_sources_failing
                .get_or_create(labels)
                .set(counts.get(labels).copied().unwrap_or(0));
        }
    }

    pub fn set_foreign_taints(&self, ready: i64, not_ready: i64) {
        self.foreign_taints
            .get_or_create(&ReadyLabels { ready: "true" })
            .set(ready);
        self.foreign_taints
            .get_or_create(&ReadyLabels { ready: "false" })
            .set(not_ready);
    }

    pub fn action(&self, action: &'static str, ok: bool) {
        self.action_result(action, if ok { "success" } else { "failure" });
    }

    /// A fence landed: `action` (`taint`, `delete_node`) resting on `basis` (`attested`,
    /// `unattested`, `person`).
    pub fn fenced(&self, action: &'static str, basis: &'static str) {
        self.fences
            .get_or_create(&FenceLabels { action, basis })
            .inc();
    }

    /// `result`: `success`, `failure`, or `abandoned` (the write-time re-check found that
    /// something the decision relied on had moved; nothing was written).
    pub fn action_result(&self, action: &'static str, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabels { action, result })
            .inc();
    }

    /// The nodes whose mapping cannot be trusted now; series of nodes no longer listed go.
    pub fn set_identity_problems(&self, problems: &BTreeSet<(String, &'static str)>) {
        let Ok(mut seen) = self.identity_problems_seen.lock() else {
            return;
        };
        for (node, problem) in seen.difference(problems) {
            self.node_identity_problem.remove(&NodeProblemLabels {
                node: node.clone(),
                problem,
            });
        }
        for (node, problem) in problems {
            self.node_identity_problem
                .get_or_create(&NodeProblemLabels {
                    node: node.clone(),
                    problem,
                })
                .set(1);
        }
        *seen = problems.clone();
    }

    /// Nodes by the verdict of the last identity read of their machine (`unknown`: none yet),
    /// and how many nodes' entries say `identity = "unchecked"`.
    pub fn set_identity_counts(&self, verdicts: &BTreeMap<&'static str, i64>, unchecked: i64) {
        for v in IDENTITY_VERDICTS {
            self.identity_nodes
                .get_or_create(&VerdictLabels { verdict: v })
                .set(verdicts.get(v).copied().unwrap_or(0));
        }
        self.identity_unchecked.set(unchecked);
    }
}
