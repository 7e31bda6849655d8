//! `[aws]`: the nodes whose power state comes from EC2, and the checks of the section.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, IdentityCheck, compile_globs, humantime_serde};

/// `[aws]`: nodes whose power state comes from EC2 (DescribeInstances), by their providerID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsConfig {
    pub region: String,
    pub nodes: Vec<glob::Pattern>,
    /// Another endpoint than the region's public one (VPC endpoint, test emulator).
    pub endpoint_url: Option<String>,
    /// A profile from the shared AWS config files; otherwise the standard credential chain.
    pub profile: Option<String>,
    /// Deadline for one EC2 call, retries included.
    pub timeout: Duration,
    /// Warn when a fenced instance's volumes are still attached this long after the fence.
    pub volume_release_warning: Duration,
    /// Whether an instance must prove it is the node's (private IP or DNS name).
    pub identity: IdentityCheck,
    /// Its instances may be stopped and started (`actuate = true`), where `[actuation]` is
    /// enabled too.
    pub actuate: bool,
}

impl AwsConfig {
    pub fn matches(&self, node: &str) -> bool {
        self.nodes.iter().any(|p| p.matches(node))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAws {
    region: String,
    nodes: Vec<String>,
    endpoint_url: Option<String>,
    profile: Option<String>,
    #[serde(default = "default_aws_timeout", with = "humantime_serde")]
    timeout: Duration,
    #[serde(default = "default_volume_release_warning", with = "humantime_serde")]
    volume_release_warning: Duration,
    #[serde(default)]
    identity: IdentityCheck,
    /// Opt-in actuation, this section's half: `[actuation] enabled` is the other.
    #[serde(default)]
    actuate: bool,
}

fn default_aws_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_volume_release_warning() -> Duration {
    Duration::from_secs(600)
}

impl RawAws {
    pub(super) fn validate(self, path: &Path) -> Result<AwsConfig, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("aws.{key}"),
            problem,
        };
        let region = self.region.trim().to_string();
        if region.is_empty()
            || !region
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(err(
                "region",
                format!("{region:?} is not a region name such as \"us-east-1\""),
            ));
        }
        let nodes = compile_globs(&self.nodes).map_err(|e| err("nodes", e))?;
        if let Some(url) = &self.endpoint_url {
            let parsed = reqwest::Url::parse(url)
                .map_err(|e| err("endpoint_url", format!("{url:?} is not a URL ({e})")))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(err(
                    "endpoint_url",
                    format!("{url:?} must be http(s)://host[:port]"),
                ));
            }
        }
        if let Some(p) = &self.profile
            && p.trim().is_empty()
        {
            return Err(err("profile", "must not be empty".into()));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(120) {
            return Err(err("timeout", "use between 1ms and 120s".into()));
        }
        if self.volume_release_warning.is_zero() {
            return Err(err(
                "volume_release_warning",
                "must be longer than 0s".into(),
            ));
        }
        Ok(AwsConfig {
            region,
            nodes,
            endpoint_url: self.endpoint_url,
            profile: self.profile,
            timeout: self.timeout,
            volume_release_warning: self.volume_release_warning,
            identity: self.identity,
            actuate: self.actuate,
        })
    }
}
