//! The file as written: TOML into `RawConfig` (errors naming key and line), the top-level
//! sections without a module of their own (`[kubernetes]`, `[policy]`, `[server]`,
//! `[journal]`), and the validation that turns it all into a `Config`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::actuation::RawActuation;
use super::aws::RawAws;
use super::bmc::RawBmc;
use super::guards::{DEFAULT_GUARD_RECORD, RawGuards};
use super::ha::RawHa;
use super::pause::RawPause;
use super::{
    BmcEntry, Config, ConfigError, ConfigMapRef, DEFAULT_HEALTH_READ_INTERVAL, DEFAULT_LISTEN,
    JournalConfig, KubernetesConfig, MAX_HEALTH_READ_INTERVAL, MIN_HEALTH_READ_INTERVAL, Secrets,
    ServerConfig, default_journal_path, humantime_serde, selector,
};
use crate::decision::{FenceAction, Policy, Renewals};

pub(super) fn parse_raw(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
    let line_of = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| {
            text.as_bytes()[..s.start.min(text.len())]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1
        })
    };
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError {
        file: path.to_owned(),
        key: line_of(e.span())
            .map(|l| format!("line {l}"))
            .unwrap_or_default(),
        problem: format!("invalid TOML: {}", e.message().trim()),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let key = if key == "." { String::new() } else { key };
        let line = line_of(e.inner().span());
        ConfigError {
            file: path.to_owned(),
            key: match (key.is_empty(), line) {
                (false, Some(l)) => format!("{key} (line {l})"),
                (false, None) => key,
                (true, Some(l)) => format!("line {l}"),
                (true, None) => String::new(),
            },
            problem: e.inner().message().trim().to_string(),
        }
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    datacenter: String,
    #[serde(default)]
    kubernetes: RawKubernetes,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    bmc: Vec<RawBmc>,
    aws: Option<RawAws>,
    #[serde(default)]
    journal: RawJournal,
    #[serde(default)]
    guards: RawGuards,
    #[serde(default)]
    pause: RawPause,
    ha: Option<RawHa>,
    #[serde(default)]
    actuation: RawActuation,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawJournal {
    path: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawKubernetes {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    node_selector: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPolicy {
    #[serde(with = "humantime_serde")]
    not_ready_grace: Duration,
    confirm_reads: u32,
    #[serde(with = "humantime_serde")]
    confirm_interval: Duration,
    #[serde(with = "humantime_serde")]
    read_max_age: Duration,
    #[serde(with = "humantime_serde")]
    recheck_interval: Duration,
    action: FenceAction,
    on_terminated: FenceAction,
    untaint_on_recovery: bool,
    dry_run: bool,
    max_concurrent_reads: usize,
    #[serde(with = "humantime_serde")]
    health_read_interval: Duration,
    flap_limit: u32,
    #[serde(with = "humantime_serde")]
    flap_window: Duration,
    pre_attest: bool,
    lease_stale_after: f64,
    release_at_attestation: bool,
}

impl Default for RawPolicy {
    fn default() -> Self {
        let p = Policy::default();
        RawPolicy {
            not_ready_grace: p.not_ready_grace,
            confirm_reads: p.confirm_reads,
            confirm_interval: p.confirm_interval,
            read_max_age: p.read_max_age,
            recheck_interval: p.recheck_interval,
            action: p.action,
            on_terminated: p.on_terminated,
            untaint_on_recovery: p.untaint_on_recovery,
            dry_run: p.dry_run,
            max_concurrent_reads: 16,
            health_read_interval: DEFAULT_HEALTH_READ_INTERVAL,
            flap_limit: p.flap_limit,
            flap_window: p.flap_window,
            pre_attest: p.pre_attest_after.is_some(),
            lease_stale_after: p.pre_attest_after.map_or(2.5, f64::from),
            release_at_attestation: p.release_at_attestation,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default = "default_listen")]
    listen: String,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: default_listen(),
        }
    }
}

fn default_listen() -> String {
    DEFAULT_LISTEN.to_string()
}

impl RawConfig {
    pub(super) fn validate(self, path: &Path, secrets: Secrets) -> Result<Config, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            key: key.to_string(),
            problem,
        };
        let dc = self.datacenter.trim();
        if dc.is_empty()
            || !dc
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(
                "datacenter",
                format!("{dc:?} must be a non-empty name of letters, digits, '-', '_' or '.'"),
            ));
        }

        let p = &self.policy;
        if p.confirm_reads == 0 {
            return Err(err(
                "policy.confirm_reads",
                "must be at least 1 (2 or more is recommended)".into(),
            ));
        }
        for (key, value) in [
            ("policy.not_ready_grace", p.not_ready_grace),
            ("policy.confirm_interval", p.confirm_interval),
            ("policy.read_max_age", p.read_max_age),
            ("policy.recheck_interval", p.recheck_interval),
        ] {
            if value.is_zero() {
                return Err(err(key, "must be longer than 0s".into()));
            }
        }
        if p.max_concurrent_reads == 0 {
            return Err(err(
                "policy.max_concurrent_reads",
                "must be at least 1".into(),
            ));
        }
        let out_of_range = if p.health_read_interval < MIN_HEALTH_READ_INTERVAL {
            Some((
                "shorter",
                MIN_HEALTH_READ_INTERVAL,
                "every mapped machine is read this often while healthy, and BMCs are slow, shared controllers (10m, the default, is what most want)",
            ))
        } else if p.health_read_interval > MAX_HEALTH_READ_INTERVAL {
            Some((
                "longer",
                MAX_HEALTH_READ_INTERVAL,
                "the shipped OobfencePowerSourceSilent alert would fire for sources that answer every time they are read",
            ))
        } else {
            None
        };
        if let Some((word, bound, why)) = out_of_range {
            return Err(err(
                "policy.health_read_interval",
                format!(
                    "{} is {word} than {}: {why}",
                    humantime::format_duration(p.health_read_interval),
                    humantime::format_duration(bound)
                ),
            ));
        }
        let lease_stale_after = Renewals::new(p.lease_stale_after).ok_or_else(|| {
            err(
                "policy.lease_stale_after",
                format!(
                    "{} is not a number of kubelet renewal intervals between 1.5 and 100 (2.5 rides out one missed renewal)",
                    p.lease_stale_after
                ),
            )
        })?;
        let policy = Policy {
            not_ready_grace: p.not_ready_grace,
            confirm_reads: p.confirm_reads,
            confirm_interval: p.confirm_interval,
            read_max_age: p.read_max_age,
            recheck_interval: p.recheck_interval,
            action: p.action,
            on_terminated: p.on_terminated,
            untaint_on_recovery: p.untaint_on_recovery,
            dry_run: p.dry_run,
            flap_limit: p.flap_limit,
            flap_window: p.flap_window,
            pre_attest_after: p.pre_attest.then_some(lease_stale_after),
            release_at_attestation: p.release_at_attestation,
            actuation: None,
        };

        let listen: SocketAddr = self.server.listen.parse().map_err(|_| {
            err(
                "server.listen",
                format!(
                    "{:?} is not an IP:port address (example: \"127.0.0.1:9464\")",
                    self.server.listen
                ),
            )
        })?;

        let node_selector = match self.kubernetes.node_selector.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(sel) => {
                if sel.contains(['\n', '\r']) {
                    return Err(err(
                        "kubernetes.node_selector",
                        "must be a single-line label selector such as \"topology.kubernetes.io/zone=dc1\"".into(),
                    ));
                }
                selector::check(sel).map_err(|problem| {
                    err(
                        "kubernetes.node_selector",
                        format!("{sel:?} is not a label selector: {problem}"),
                    )
                })?;
                Some(sel.to_string())
            }
        };

        let mut bmc: Vec<BmcEntry> = Vec::with_capacity(self.bmc.len());
        for (index, raw) in self.bmc.into_iter().enumerate() {
            let entry = raw.validate(index, path, secrets)?;
            // Two entries naming one fixed machine would fence both nodes when it is off.
            if let Some(target) = entry.fixed_target()
                && let Some(other) = bmc
                    .iter()
                    .find(|b| b.fixed_target().as_ref() == Some(&target))
            {
                let key = match entry.protocol {
                    super::Protocol::FenceAgent => "options",
                    _ => "address",
                };
                return Err(err(
                    &format!("bmc[{index}].{key}"),
                    format!(
                        "reads the same machine as bmc[{}] ({target}): one machine cannot be two nodes, and its being off would fence both",
                        other.index
                    ),
                ));
            }
            bmc.push(entry);
        }

        let aws = self.aws.map(|a| a.validate(path)).transpose()?;

        let journal_path = match self.journal.path {
            None => default_journal_path(dc),
            Some(p) if !p.is_absolute() => {
                return Err(err(
                    "journal.path",
                    format!(
                        "{:?} must be an absolute path (example: \"/var/lib/oobfence/{dc}.journal.jsonl\")",
                        p.display().to_string()
                    ),
                ));
            }
            Some(p) if p.is_dir() => {
                return Err(err(
                    "journal.path",
                    format!("{} is a directory; name a file in it", p.display()),
                ));
            }
            Some(p) => p,
        };

        let guard_record = match self.guards.record.as_deref().map(str::trim) {
            None => Some(DEFAULT_GUARD_RECORD),
            Some("") => None,
            Some(c) => Some(c),
        }
        .map(|c| {
            ConfigMapRef::parse(c).ok_or_else(|| ConfigError {
                file: path.to_owned(),
                key: "guards.record".into(),
                problem: format!(
                    "{c:?} must be NAMESPACE/NAME (example: \"{DEFAULT_GUARD_RECORD}\"), or \"\" for none"
                ),
            })
        })
        .transpose()?;
        let guards = self.guards.validate(path)?;
        let ha = match self.ha {
            Some(h) => h.validate(path)?,
            None => None,
        };
        let pause = self.pause.validate(path, dc, ha.is_some())?;
        let actuation = self.actuation.validate(path, policy.not_ready_grace)?;
        let policy = Policy {
            actuation: actuation.as_ref().map(|a| a.policy),
            ..policy
        };

        Ok(Config {
            source: path.to_owned(),
            datacenter: dc.to_string(),
            kubernetes: KubernetesConfig {
                kubeconfig: self.kubernetes.kubeconfig,
                context: self.kubernetes.context,
                node_selector,
            },
            policy,
            max_concurrent_reads: p.max_concurrent_reads,
            health_read_interval: p.health_read_interval,
            server: ServerConfig { listen },
            bmc,
            aws,
            journal: JournalConfig { path: journal_path },
            guards,
            guard_record,
            pause,
            ha,
            actuation,
            digest: String::new(),
        })
    }
}
