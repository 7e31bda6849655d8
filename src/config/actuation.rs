//! `[actuation]`: opt-in power actions. Off unless `enabled = true` here **and** `actuate = true`
//! on the node's `[[bmc]]` entry or `[aws]` section.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, humantime_serde};
use crate::decision::actuation::ActuationPolicy;

/// `[actuation]` as the daemon uses it, when enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActuationConfig {
    /// What the decision core needs: the silence before a power-off, and whether to power on.
    pub policy: ActuationPolicy,
    /// Power actions allowed in any hour, datacenter-wide.
    pub max_per_hour: u32,
}

/// The shortest `after` accepted: a kubelet may stall for tens of seconds (a long GC pause, a
/// saturated link) and must have time to come back before its machine is cut.
pub const MIN_AFTER: Duration = Duration::from_secs(120);

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawActuation {
    enabled: bool,
    #[serde(with = "humantime_serde")]
    after: Duration,
    #[serde(with = "humantime_serde")]
    max_silence: Duration,
    power_on: bool,
    max_per_hour: u32,
}

impl Default for RawActuation {
    fn default() -> Self {
        let p = ActuationPolicy::default();
        RawActuation {
            enabled: false,
            after: p.after,
            max_silence: p.max_silence,
            power_on: p.power_on,
            max_per_hour: 3,
        }
    }
}

impl RawActuation {
    /// `None` unless enabled; `not_ready_grace` bounds `after` from below.
    pub(super) fn validate(
        self,
        path: &Path,
        not_ready_grace: Duration,
    ) -> Result<Option<ActuationConfig>, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("actuation.{key}"),
            problem,
        };
        if !self.enabled {
            return Ok(None);
        }
        let floor = MIN_AFTER.max(not_ready_grace * 2);
        if self.after < floor {
            return Err(err(
                "after",
                format!(
                    "{} is shorter than {}: a machine is powered off only after its kubelet has been silent well past NotReady ({} at least, and twice policy.not_ready_grace)",
                    humantime::format_duration(self.after),
                    humantime::format_duration(floor),
                    humantime::format_duration(MIN_AFTER)
                ),
            ));
        }
        if self.max_silence < self.after * 2 {
            return Err(err(
                "max_silence",
                format!(
                    "{} is shorter than twice after ({}): a hung node must have time to be powered off between the two (holds, a busy failure domain); max_silence only keeps abandoned nodes from being powered off",
                    humantime::format_duration(self.max_silence),
                    humantime::format_duration(self.after * 2)
                ),
            ));
        }
        if self.max_per_hour == 0 {
            return Err(err(
                "max_per_hour",
                "must be at least 1 (set enabled = false to turn power actions off)".into(),
            ));
        }
        Ok(Some(ActuationConfig {
            policy: ActuationPolicy {
                after: self.after,
                max_silence: self.max_silence,
                power_on: self.power_on,
            },
            max_per_hour: self.max_per_hour,
        }))
    }
}
