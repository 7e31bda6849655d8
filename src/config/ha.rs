//! `[ha]`: leader election on a Lease. The settings, the time bounds derived from them, and the
//! check that the leader has time to renew.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, humantime_serde};

/// `[ha]`: leader election on a Lease, so that of two (or more) instances of one datacenter's
/// config, exactly one writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    /// Where the Lease lives; its name is `oobfence-<datacenter>`.
    pub namespace: String,
    /// This instance's name in the Lease (default: the host name).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_interval: Duration,
}

impl HaConfig {
    pub fn lease_name(&self, datacenter: &str) -> String {
        format!(
            "oobfence-{}",
            datacenter.to_ascii_lowercase().replace(['_', '.'], "-")
        )
    }

    /// How long one write may take once started: our call is cut off after this, and the
    /// API server is asked (`?timeout=`) to give up on it after as long again from when it
    /// has the request. Also the bound on one round of the elector.
    pub fn write_timeout(&self) -> Duration {
        self.lease_duration / 4
    }

    /// By when, after it started, a write has landed or been given up on by both sides. Our
    /// client cuts the call off after `write_timeout`, but a request it gave up on may already
    /// be at the API server, which goes on with it: a PATCH cut off on our side can still be
    /// applied. The server has the request by our cut-off at the latest and gives up on it
    /// `write_timeout` after it has it (the `timeout` parameter every `[ha]` write carries;
    /// without it the server allows itself 34 s or more, longer than a lease). A request held
    /// up in the network past our cut-off, or etcd committing after the server has given up,
    /// is beyond any bound we can set; the clock allowance of the margin is all there is.
    pub fn write_settled_within(&self) -> Duration {
        self.write_timeout() * 2
    }

    /// How long before the Lease could be taken by another instance this one stops starting
    /// writes. Another instance takes the Lease only after it has seen no renewal for
    /// `lease_duration` by its own clock, counted from the arrival of the answer that showed
    /// the renewal, which is after the renewal landed: so nobody else acts before (start of
    /// our last successful renewal) + `lease_duration`. A write started before then must also
    /// have landed or been given up by then ([`Self::write_settled_within`]), and clocks may
    /// run apart by a little (1 s, plus 1 % of the lease). The property tests of
    /// `leader::decide` check this against arbitrary latencies.
    pub fn safety_margin(&self) -> Duration {
        self.write_settled_within() + Duration::from_secs(1) + self.lease_duration / 100
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHa {
    #[serde(default)]
    enabled: bool,
    #[serde(default = "default_ha_namespace")]
    namespace: String,
    identity: Option<String>,
    #[serde(default = "default_lease_duration", with = "humantime_serde")]
    lease_duration: Duration,
    #[serde(default = "default_renew_interval", with = "humantime_serde")]
    renew_interval: Duration,
}

fn default_ha_namespace() -> String {
    "oobfence".into()
}

fn default_lease_duration() -> Duration {
    Duration::from_secs(30)
}

fn default_renew_interval() -> Duration {
    Duration::from_secs(5)
}

impl RawHa {
    pub(super) fn validate(self, path: &Path) -> Result<Option<HaConfig>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("ha.{key}"),
            problem,
        };
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if !dns(&self.namespace) {
            return Err(err(
                "namespace",
                format!("{:?} is not a namespace name", self.namespace),
            ));
        }
        let identity = match self.identity {
            Some(i) => i.trim().to_string(),
            None => nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default(),
        };
        if identity.is_empty()
            || identity.len() > 128
            || identity.contains(|c: char| c.is_whitespace() || c == '#' || c == '/')
        {
            return Err(err(
                "identity",
                format!(
                    "{identity:?} must be a short name without spaces, '/' or '#' (default: the host name)"
                ),
            ));
        }
        let ha = HaConfig {
            namespace: self.namespace,
            identity,
            lease_duration: self.lease_duration,
            renew_interval: self.renew_interval,
        };
        if ha.renew_interval.is_zero() {
            return Err(err("renew_interval", "must be longer than 0s".into()));
        }
        // The leader must be able to renew at least twice within the time it may write.
        let writable = ha.lease_duration.saturating_sub(ha.safety_margin());
        if writable < ha.renew_interval * 2 {
            return Err(err(
                "lease_duration",
                format!(
                    "{} leaves the leader {} to write after a renewal (half of it bounds a write on both sides, plus clock allowance), less than two renew_interval of {}: use a longer lease or renew more often",
                    humantime::format_duration(ha.lease_duration),
                    humantime::format_duration(writable),
                    humantime::format_duration(ha.renew_interval)
                ),
            ));
        }
        Ok(Some(ha))
    }
}
