//! `[guards]`: storms, budgets, partitions. Limits as written (a count or a share) and their
//! checks into a `GuardPolicy`.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, humantime_serde};
use crate::decision::holds::{GuardPolicy, Limit};

/// `[guards] record`'s default: one ConfigMap for every datacenter, a key each.
pub const DEFAULT_GUARD_RECORD: &str = "oobfence/oobfence-guards";

/// A limit as written: a count (`12` or `"12"`) or a share (`"50%"`).
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "must be a count such as 12, or a share such as \"50%\" (quoted)"
)]
enum RawLimit {
    Count(u32),
    Text(String),
}

impl RawLimit {
    fn parse(&self) -> Result<Limit, String> {
        match self {
            RawLimit::Count(n) => Ok(Limit::Count(*n)),
            RawLimit::Text(t) => {
                let t = t.trim();
                let bad = || format!("{t:?} is neither a count (12) nor a share (\"50%\")");
                match t.strip_suffix('%') {
                    Some(p) => {
                        let p: u32 = p.trim().parse().map_err(|_| bad())?;
                        if p > 100 {
                            return Err(format!("{t:?} is more than 100%"));
                        }
                        Ok(Limit::Percent(p))
                    }
                    None => t.parse().map(Limit::Count).map_err(|_| bad()),
                }
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawGuards {
    max_unhealthy: RawLimit,
    /// "" turns failure domains off.
    failure_domain_label: String,
    domain_max_unhealthy: RawLimit,
    fence_budget: RawLimit,
    #[serde(with = "humantime_serde")]
    fence_budget_window: Duration,
    #[serde(with = "humantime_serde")]
    cooldown: Duration,
    #[serde(with = "humantime_serde")]
    max_view_age: Duration,
    freeze_failing_share: RawLimit,
    freeze_min_failing: u32,
    max_stale_leases: RawLimit,
    /// `NAMESPACE/NAME` of the guards' record; "" for none.
    pub(super) record: Option<String>,
}

impl Default for RawGuards {
    fn default() -> Self {
        let g = GuardPolicy::default();
        let raw = |l: Limit| RawLimit::Text(l.to_string());
        RawGuards {
            max_unhealthy: raw(g.max_unhealthy),
            failure_domain_label: g.failure_domain_label.unwrap_or_default(),
            domain_max_unhealthy: raw(g.domain_max_unhealthy),
            fence_budget: raw(g.fence_budget),
            fence_budget_window: g.fence_budget_window,
            cooldown: g.cooldown,
            max_view_age: g.max_view_age,
            freeze_failing_share: raw(Limit::Percent(g.freeze_failing_share)),
            freeze_min_failing: g.freeze_min_failing,
            max_stale_leases: raw(g.max_stale_leases),
            record: None,
        }
    }
}

impl RawGuards {
    pub(super) fn validate(self, path: &Path) -> Result<GuardPolicy, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("guards.{key}"),
            problem,
        };
        let limit = |key: &str, raw: &RawLimit| raw.parse().map_err(|e| err(key, e));
        let max_unhealthy = limit("max_unhealthy", &self.max_unhealthy)?;
        let domain_max_unhealthy = limit("domain_max_unhealthy", &self.domain_max_unhealthy)?;
        let fence_budget = limit("fence_budget", &self.fence_budget)?;
        let max_stale_leases = limit("max_stale_leases", &self.max_stale_leases)?;
        let freeze_failing_share = match limit("freeze_failing_share", &self.freeze_failing_share)?
        {
            Limit::Percent(p) => p,
            Limit::Count(_) => {
                return Err(err(
                    "freeze_failing_share",
                    "must be a share such as \"50%\"".into(),
                ));
            }
        };
        for (key, value) in [
            ("fence_budget_window", self.fence_budget_window),
            ("max_view_age", self.max_view_age),
        ] {
            if value.is_zero() {
                return Err(err(key, "must be longer than 0s".into()));
            }
        }
        let label = self.failure_domain_label.trim();
        if label.contains(char::is_whitespace) || label.contains(['=', ',']) {
            return Err(err(
                "failure_domain_label",
                format!("{label:?} is not a label key such as \"topology.kubernetes.io/zone\""),
            ));
        }
        Ok(GuardPolicy {
            max_unhealthy,
            failure_domain_label: (!label.is_empty()).then(|| label.to_string()),
            domain_max_unhealthy,
            fence_budget,
            fence_budget_window: self.fence_budget_window,
            cooldown: self.cooldown,
            max_view_age: self.max_view_age,
            freeze_failing_share,
            freeze_min_failing: self.freeze_min_failing.max(1),
            max_stale_leases,
        })
    }
}
