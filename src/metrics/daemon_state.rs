//! The daemon's own series: the config in force, `[ha]` leadership, and the guards (pause,
//! view, each scope's holds and counts, the fence budget).

use std::collections::BTreeSet;

use jiff::Timestamp;

use super::labels::{SCOPE_COUNTS, SCOPE_HOLDS};
use super::{ConfigLabels, DatacenterLabels, Metrics, ScopeCountLabels, ScopeHoldLabels};
use crate::decision::holds::{Calm, GuardPolicy, Scope};

impl Metrics {
    /// The config in force, as `config_info`'s one series.
    pub fn set_config_info(&self, cfg: &crate::config::Config) {
        self.config_info.clear();
        self.config_info
            .get_or_create(&ConfigLabels {
                datacenter: cfg.datacenter.clone(),
                action: cfg.policy.action.to_string(),
                dry_run: cfg.policy.dry_run.to_string(),
                pre_attest: cfg.policy.pre_attest_after.is_some().to_string(),
                ha: cfg.ha.is_some().to_string(),
                config_sha256: cfg.digest.chars().take(12).collect(),
            })
            .set(1);
    }

    /// Whether this instance writes (`None`: no `[ha]`, it always does), and the Lease term.
    pub fn set_leadership(&self, l: Option<&crate::leader::Leadership>) {
        let labels = DatacenterLabels {
            datacenter: self.datacenter.clone(),
        };
        self.leader
            .get_or_create(&labels)
            .set(l.is_none_or(|l| l.may_write()) as i64);
        if let Some(l) = l {
            self.lease_term.get_or_create(&labels).set(l.term as i64);
            self.ha_duplicate_identity
                .get_or_create(&labels)
                .set(l.duplicate_identity as i64);
        }
    }

    /// The guards as of this pass: pause, view, each scope's holds and counts, the budget.
    pub fn set_guards(&self, calm: &Calm, policy: &GuardPolicy, now: Timestamp) {
        self.paused.set(calm.pause.is_paused() as i64);
        self.view_stale.set(calm.stale.is_some() as i64);
        self.leases_late.set(calm.leases_late as i64);
        self.leases_stale.set(calm.leases.1 as i64);
        self.lease_storm
            .set(calm.lease_storm_since.is_some() as i64);
        self.guard_record_pending.set(calm.record_pending as i64);
        let Ok(mut seen) = self.scopes_seen.lock() else {
            return;
        };
        let now_scopes: BTreeSet<String> = calm.scopes.keys().map(|s| s.label()).collect();
        for gone in seen.difference(&now_scopes) {
            for hold in SCOPE_HOLDS {
                self.scope_hold.remove(&ScopeHoldLabels {
                    scope: gone.clone(),
                    hold,
                });
            }
            for count in SCOPE_COUNTS {
                self.scope_nodes.remove(&ScopeCountLabels {
                    scope: gone.clone(),
                    count,
                });
            }
        }
        *seen = now_scopes;
        for (scope, st) in &calm.scopes {
            let label = scope.label();
            let cooling = st.storm_ended.is_some_and(|t| {
                now.duration_since(t)
                    < jiff::SignedDuration::try_from(policy.cooldown).unwrap_or_default()
            });
            for (hold, on) in [
                ("storm", st.storm_since.is_some()),
                ("storm-cooldown", st.storm_since.is_none() && cooling),
                ("self-partition", st.frozen_since.is_some()),
            ] {
                self.scope_hold
                    .get_or_create(&ScopeHoldLabels {
                        scope: label.clone(),
                        hold,
                    })
                    .set(on as i64);
            }
            let c = &st.count;
            for (count, n) in [
                ("nodes", c.nodes),
                ("unhealthy", c.unhealthy),
                ("sources_read", c.sources_read),
                ("sources_failing", c.sources_failing),
            ] {
                self.scope_nodes
                    .get_or_create(&ScopeCountLabels {
                        scope: label.clone(),
                        count,
                    })
                    .set(n as i64);
            }
        }
        let total = calm
            .scopes
            .get(&Scope::Datacenter)
            .map(|s| s.count.nodes)
            .unwrap_or(0);
        self.fence_budget_used.set(calm.fences.len() as i64);
        self.fence_budget_limit
            .set(policy.fence_budget.of(total) as i64);
    }
}
