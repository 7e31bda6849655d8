//! The file as written: TOML into `RawConfig` (errors naming key and line), the top-level
//! sections without a module of their own (`[kubernetes]`, `[policy]`, `[server]`,
//! `[journal]`), and the validation that turns it all into a `Config`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::MAX_LEVEL;
use super::actuation::RawActuation;
use super::aws::RawAws;
use super::bmc::RawBmc;
use super::guards::{DEFAULT_GUARD_RECORD, RawGuards};
use super::ha::RawHa;
use super::located::{self, Lines, section};
use super::pause::RawPause;
use super::{
    BmcEntry, Config, ConfigError, ConfigMapRef, DEFAULT_HEALTH_READ_INTERVAL, DEFAULT_LISTEN,
    JournalConfig, KubernetesConfig, MAX_HEALTH_READ_INTERVAL, MIN_HEALTH_READ_INTERVAL, Secrets,
    ServerConfig, default_journal_path, humantime_serde, selector,
};
use crate::decision::{FenceAction, Policy, Renewals};

/// The top-level keys a config file may have: `datacenter` and the sections.
const SECTIONS: [&str; 11] = [
    "datacenter",
    "kubernetes",
    "policy",
    "server",
    "bmc",
    "aws",
    "journal",
    "guards",
    "pause",
    "ha",
    "actuation",
];

/// The file as written, and the line of each key. A TOML syntax error stops here (the one
/// error); every section is read on its own, so the errors of all of them come back together
/// with what could be read (a section in error left at its default, an entry left out).
pub(super) fn parse_raw(
    text: &str,
    path: &Path,
) -> Result<(RawConfig, Lines, Vec<ConfigError>), ConfigError> {
    let doc = toml::de::DeTable::parse(text).map_err(|e| located::syntax_error(&e, text, path))?;
    let mut lines = Lines::new(text);
    lines.index("", doc.get_ref());
    let mut errors = Vec::new();
    let mut raw = RawConfig::default();
    for (key, value) in doc.get_ref() {
        let name: &str = key.get_ref();
        let errs = &mut errors;
        let lines = &lines;
        match name {
            "datacenter" => raw.datacenter = section(value, name, path, lines, errs),
            "kubernetes" => {
                raw.kubernetes = section(value, name, path, lines, errs).unwrap_or_default()
            }
            "policy" => raw.policy = section(value, name, path, lines, errs).unwrap_or_default(),
            "server" => raw.server = section(value, name, path, lines, errs).unwrap_or_default(),
            "aws" => raw.aws = section(value, name, path, lines, errs),
            "journal" => raw.journal = section(value, name, path, lines, errs).unwrap_or_default(),
            "guards" => raw.guards = section(value, name, path, lines, errs).unwrap_or_default(),
            "pause" => raw.pause = section(value, name, path, lines, errs).unwrap_or_default(),
            "ha" => raw.ha = section(value, name, path, lines, errs),
            "actuation" => {
                raw.actuation = section(value, name, path, lines, errs).unwrap_or_default()
            }
            "bmc" => match value.get_ref().as_array() {
                Some(entries) => {
                    for (i, entry) in entries.iter().enumerate() {
                        if let Some(b) = section(entry, &format!("bmc[{i}]"), path, lines, errs) {
                            raw.bmc.push((i, b));
                        }
                    }
                }
                None => errs.push(ConfigError {
                    file: path.to_owned(),
                    key: "bmc".into(),
                    line: Some(lines.line_of(key.span().start)),
                    problem:
                        "must be [[bmc]] entries (an array of tables), not a single value or [bmc]"
                            .into(),
                }),
            },
            other => {
                let known: Vec<&str> = SECTIONS.to_vec();
                let hint = match located::nearest(other, &known) {
                    Some(near) => format!(": did you mean {near}?"),
                    None => String::new(),
                };
                errs.push(ConfigError {
                    file: path.to_owned(),
                    key: other.to_string(),
                    line: Some(lines.line_of(key.span().start)),
                    problem: format!(
                        "unknown key{hint} (the top level takes `datacenter` and the sections [kubernetes], [policy], [server], [[bmc]], [aws], [journal], [guards], [pause], [ha], [actuation])"
                    ),
                });
            }
        }
    }
    if !doc.get_ref().keys().any(|k| k.get_ref() == "datacenter") {
        errors.push(ConfigError {
            file: path.to_owned(),
            key: "datacenter".into(),
            line: None,
            problem: "missing: the datacenter's name (datacenter = \"dc1\"), at the top of the file before any [section]".into(),
        });
    }
    Ok((raw, lines, errors))
}

/// The `[kubernetes]` section of config text as written, when the file is TOML and the
/// section has no error of its own (the rest of the file may have any): so that `check-config`
/// checks the kubeconfig in the same pass as a broken file's errors.
pub(super) fn kubernetes_of(text: &str, path: &Path) -> Option<KubernetesConfig> {
    let (raw, _, errors) = parse_raw(text, path).ok()?;
    if errors.iter().any(|e| e.key.starts_with("kubernetes")) {
        return None;
    }
    Some(KubernetesConfig {
        kubeconfig: raw.kubernetes.kubeconfig,
        context: raw.kubernetes.context,
        node_selector: None,
    })
}

/// The file as written; a section in error is at its default, an entry in error left out.
#[derive(Default)]
pub(super) struct RawConfig {
    /// `None`: missing or in error (already reported).
    datacenter: Option<String>,
    kubernetes: RawKubernetes,
    policy: RawPolicy,
    server: RawServer,
    /// Each entry with its position in the file.
    bmc: Vec<(usize, RawBmc)>,
    aws: Option<RawAws>,
    journal: RawJournal,
    guards: RawGuards,
    pause: RawPause,
    ha: Option<RawHa>,
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

/// The value of a check that passed; a failed one's error joins the others.
fn keep<T>(errors: &mut Vec<ConfigError>, r: Result<T, ConfigError>) -> Option<T> {
    r.map_err(|e| errors.push(e)).ok()
}

impl RawConfig {
    /// Every check of every section, each error collected (with `errors`, those of reading the
    /// file), located by `lines` and sorted by line.
    pub(super) fn validate(
        self,
        path: &Path,
        secrets: Secrets,
        mut errors: Vec<ConfigError>,
        lines: &Lines,
    ) -> Result<Config, Vec<ConfigError>> {
        let errs = &mut errors;
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: key.to_string(),
            problem,
        };
        let dc = self
            .datacenter
            .as_deref()
            .map(str::trim)
            .unwrap_or_default();
        if self.datacenter.is_some()
            && (dc.is_empty()
                || !dc
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            errs.push(err(
                "datacenter",
                format!("{dc:?} must be a non-empty name of letters, digits, '-', '_' or '.'"),
            ));
        }

        let p = &self.policy;
        if p.confirm_reads == 0 {
            errs.push(err(
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
                errs.push(err(key, "must be longer than 0s".into()));
            }
        }
        if p.max_concurrent_reads == 0 {
            errs.push(err(
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
            errs.push(err(
                "policy.health_read_interval",
                format!(
                    "{} is {word} than {}: {why}",
                    humantime::format_duration(p.health_read_interval),
                    humantime::format_duration(bound)
                ),
            ));
        }
        let lease_stale_after = keep(
            errs,
            Renewals::new(p.lease_stale_after).ok_or_else(|| {
                err(
                    "policy.lease_stale_after",
                    format!(
                        "{} is not a number of kubelet renewal intervals between 1.5 and 100 (2.5 rides out one missed renewal)",
                        p.lease_stale_after
                    ),
                )
            }),
        );
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
            pre_attest_after: if p.pre_attest {
                lease_stale_after
            } else {
                None
            },
            release_at_attestation: p.release_at_attestation,
            actuation: None,
        };

        let listen: Option<SocketAddr> = keep(
            errs,
            self.server.listen.parse().map_err(|_| {
                err(
                    "server.listen",
                    format!(
                        "{:?} is not an IP:port address (example: \"127.0.0.1:9464\")",
                        self.server.listen
                    ),
                )
            }),
        );

        let node_selector = match self.kubernetes.node_selector.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(sel) if sel.contains(['\n', '\r']) => {
                errs.push(err(
                    "kubernetes.node_selector",
                    "must be a single-line label selector such as \"topology.kubernetes.io/zone=dc1\"".into(),
                ));
                None
            }
            Some(sel) => keep(
                errs,
                selector::check(sel)
                    .map(|()| sel.to_string())
                    .map_err(|problem| {
                        err(
                            "kubernetes.node_selector",
                            format!("{sel:?} is not a label selector: {problem}"),
                        )
                    }),
            ),
        };

        let mut bmc: Vec<BmcEntry> = Vec::with_capacity(self.bmc.len());
        let mut fixed: std::collections::HashMap<String, usize> = Default::default();
        for (index, raw) in self.bmc {
            let inventory = raw.inventory.clone();
            let level = match raw.level {
                None => Some(1),
                Some(n) if (1..=i64::from(MAX_LEVEL)).contains(&n) => u32::try_from(n).ok(),
                Some(n) => {
                    errs.push(err(
                        &format!("bmc[{index}].level"),
                        format!(
                            "{n} is not a fencing level: write an integer from 1 (tried first; the default) to {MAX_LEVEL}, e.g. level = 2 for the PDU outlets that feed a machine whose BMC is level 1"
                        ),
                    ));
                    None
                }
            };
            let mut entry = match raw.validate(index, path, secrets) {
                Ok(entry) => entry,
                Err(problems) => {
                    errs.extend(problems);
                    continue;
                }
            };
            entry.line = lines.lookup(&format!("bmc[{index}]"));
            let Some(level) = level else { continue };
            entry.level = level;
            if let Some(file) = inventory {
                // Its good lines are kept, so that the checks across entries see them too.
                let file = super::inventory::resolve(path, &file);
                let (inventory, problems) = super::inventory::load(&file, entry.protocol);
                errs.extend(problems);
                match inventory {
                    Some(inv) => entry.inventory = Some(std::sync::Arc::new(inv)),
                    None => continue,
                }
            }
            // Two entries naming one fixed machine would fence both nodes when it is off.
            // (Looked up by machine, so that thousands of entries take no time.)
            let target = entry.fixed_target();
            // An outlet above level 1 may feed several nodes: one source for all of them.
            if let Some(target) = &target
                && let Some(other) = fixed.get(target).map(|&i| &bmc[i])
                && (entry.level == 1 || other.level == 1)
            {
                let key = match entry.protocol {
                    super::Protocol::FenceAgent => "options",
                    _ => "address",
                };
                errs.push(err(
                    &format!("bmc[{index}].{key}"),
                    format!(
                        "reads the same machine as {} ({target}): one machine cannot be two nodes, and its being off would fence both",
                        other.label()
                    ),
                ));
                continue;
            }
            if let Some(target) = target {
                fixed.insert(target, bmc.len());
            }
            bmc.push(entry);
        }

        errs.extend(super::inventory::conflicts(&bmc, path));

        let aws = self.aws.and_then(|a| keep(errs, a.validate(path)));

        let journal_path = match self.journal.path {
            None => Some(default_journal_path(dc)),
            Some(p) if !p.is_absolute() => {
                errs.push(err(
                    "journal.path",
                    format!(
                        "{:?} must be an absolute path (example: \"/var/lib/oobfence/{dc}.journal.jsonl\")",
                        p.display().to_string()
                    ),
                ));
                None
            }
            Some(p) if p.is_dir() => {
                errs.push(err(
                    "journal.path",
                    format!("{} is a directory; name a file in it", p.display()),
                ));
                None
            }
            Some(p) => Some(p),
        };

        let guard_record = match self.guards.record.as_deref().map(str::trim) {
            None => Some(DEFAULT_GUARD_RECORD),
            Some("") => None,
            Some(c) => Some(c),
        }
        .map(|c| {
            ConfigMapRef::parse(c).ok_or_else(|| {
                err(
                    "guards.record",
                    format!(
                        "{c:?} must be NAMESPACE/NAME (example: \"{DEFAULT_GUARD_RECORD}\"), or \"\" for none"
                    ),
                )
            })
        })
        .transpose();
        let guard_record = keep(errs, guard_record);
        let guards = keep(errs, self.guards.validate(path));
        let ha = match self.ha {
            Some(h) => keep(errs, h.validate(path)),
            None => Some(None),
        };
        let has_ha = !matches!(ha, Some(None));
        let pause = keep(errs, self.pause.validate(path, dc, has_ha));
        let actuation = keep(errs, self.actuation.validate(path, policy.not_ready_grace));

        lines.locate(&mut errors);
        // The config file's errors first, in its order; then those of the files it names.
        errors.sort_by_key(|e| (e.file != path, e.line.unwrap_or(usize::MAX)));
        let (
            Some(listen),
            Some(journal_path),
            Some(guard_record),
            Some(guards),
            Some(ha),
            Some(pause),
            Some(actuation),
            true,
        ) = (
            listen,
            journal_path,
            guard_record,
            guards,
            ha,
            pause,
            actuation,
            errors.is_empty(),
        )
        else {
            return Err(errors);
        };
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
