//! The per-datacenter TOML config: parsing, validation, and the node → power source mapping.
//!
//! Every error names the file, the key and the problem on one line, because the person reading
//! it is usually an operator fixing a config at 3 a.m. The node → BMC mapping comes only from
//! this file, never from node labels or annotations: whoever can annotate a Node must not be able
//! to point the fencer at a "BMC" that answers Off.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::decision::holds::{GuardPolicy, Limit};
use crate::decision::{FenceAction, Policy, Renewals};
mod bmc;
pub mod checks;
pub mod ipmi;
mod selector;
#[cfg(test)]
mod tests;

use bmc::RawBmc;
pub use bmc::{BmcEntry, BmcTls, Protocol};

pub use crate::identity::IdentityCheck;

/// A config problem: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Dotted key path, with line number when known (`policy.confirm_reads`, `bmc[0].address`).
    pub key: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    /// Always one line: a problem that quotes a value from the file (which may hold a line
    /// break or other control characters) shows them escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let problem: String = self
            .problem
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect();
        if self.key.is_empty() {
            write!(f, "{}: {problem}", self.file.display())
        } else {
            write!(f, "{}: {}: {problem}", self.file.display(), self.key)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A loaded, validated config.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from (for messages).
    pub source: PathBuf,
    pub datacenter: String,
    pub kubernetes: KubernetesConfig,
    pub policy: Policy,
    /// At most this many power reads run at once, so one slow rack cannot starve the rest.
    pub max_concurrent_reads: usize,
    /// Every mapped machine of a healthy node is read about this often (jittered), so that a
    /// broken BMC, a wrong mapping or a BMC that says Off for a running machine shows up
    /// before the node fails, not when it does.
    pub health_read_interval: Duration,
    pub server: ServerConfig,
    pub bmc: Vec<BmcEntry>,
    pub aws: Option<AwsConfig>,
    pub journal: JournalConfig,
    /// `[guards]`: storms, budgets, partitions.
    pub guards: GuardPolicy,
    /// `[guards] record`: the ConfigMap that keeps the fence budget's fences and the storms'
    /// cooldowns across restarts and leader changes (None: nowhere).
    pub guard_record: Option<ConfigMapRef>,
    pub pause: PauseConfig,
    /// `[ha]`: two management hosts, one actor.
    pub ha: Option<HaConfig>,
    /// SHA-256 of the config file text, recorded in every journal record.
    pub digest: String,
}

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

/// `[pause]`: the two switches that stop every write without stopping the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseConfig {
    /// While this file exists, nothing is written (its text is the reason shown). Default
    /// `/etc/oobfence/<datacenter>.paused`; `oobfence pause` and `oobfence resume` manage it.
    pub file: Option<PathBuf>,
    /// While this ConfigMap carries the annotation `oobfence.io/paused` (any value but
    /// "false"), nothing is written. Default `oobfence/oobfence-pause`.
    pub configmap: Option<ConfigMapRef>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `[policy] health_read_interval`: how often a healthy node's machine is read by default.
pub const DEFAULT_HEALTH_READ_INTERVAL: Duration = Duration::from_secs(600);
/// The shortest `health_read_interval` accepted.
pub const MIN_HEALTH_READ_INTERVAL: Duration = Duration::from_secs(10);
/// The longest: the shipped `OobfencePowerSourceSilent` alert fires after 30 minutes without an
/// answer (for 10 more), so a source read every 15m (+ a tenth of jitter) that answers never
/// trips it, and one that stops answering does within two intervals.
pub const MAX_HEALTH_READ_INTERVAL: Duration = Duration::from_secs(900);

/// The default pause file of a datacenter.
pub fn default_pause_file(datacenter: &str) -> PathBuf {
    Path::new("/etc/oobfence").join(format!("{datacenter}.paused"))
}

pub const DEFAULT_PAUSE_CONFIGMAP: &str = "oobfence/oobfence-pause";
/// `[guards] record`'s default: one ConfigMap for every datacenter, a key each.
pub const DEFAULT_GUARD_RECORD: &str = "oobfence/oobfence-guards";

impl ConfigMapRef {
    /// `NAMESPACE/NAME`, each a DNS subdomain name; `None` for anything else.
    pub fn parse(c: &str) -> Option<ConfigMapRef> {
        let dns = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
        };
        match c.split_once('/') {
            Some((ns, name)) if dns(ns) && dns(name) => Some(ConfigMapRef {
                namespace: ns.into(),
                name: name.into(),
            }),
            _ => None,
        }
    }
}

/// `[journal]`: the append-only decision journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// Default: `/var/lib/oobfence/<datacenter>.journal.jsonl`.
    pub path: PathBuf,
}

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
}

impl AwsConfig {
    pub fn matches(&self, node: &str) -> bool {
        self.nodes.iter().any(|p| p.matches(node))
    }
}

/// Where a node's power state comes from.
#[derive(Debug, Clone, Copy)]
pub enum Mapping<'a> {
    Bmc(&'a BmcEntry),
    Aws(&'a AwsConfig),
}

impl Mapping<'_> {
    pub fn identity(&self) -> IdentityCheck {
        match self {
            Mapping::Bmc(b) => b.identity,
            Mapping::Aws(a) => a.identity,
        }
    }

    /// The second witness an Off read of this mapping needs (`corroborate`), if any.
    pub fn off_witness(&self) -> Option<crate::decision::OffWitness> {
        match self {
            Mapping::Bmc(b) => b.corroborate,
            Mapping::Aws(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// `None`: the standard lookup ($KUBECONFIG, then ~/.kube/config).
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Label selector limiting the watched Nodes (a cluster spanning datacenters).
    pub node_selector: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

/// `StateDirectory=oobfence`.
pub const DEFAULT_JOURNAL_DIR: &str = "/var/lib/oobfence";

/// The default journal file for a datacenter.
pub fn default_journal_path(datacenter: &str) -> PathBuf {
    Path::new(DEFAULT_JOURNAL_DIR).join(format!("{datacenter}.journal.jsonl"))
}

/// SHA-256 of `data` as lowercase hex: the config digest, so a journal record says which
/// config was in force without copying it.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            key: String::new(),
            problem: format!("cannot read config file: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Reads and validates a config file without reading any password: for commands that
    /// only talk to the running daemon or read its journal (`why`), so an operator can run
    /// them from a shell without the daemon's credentials. Every password is left empty.
    pub fn load_without_secrets(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            key: String::new(),
            problem: format!("cannot read config file: {e}"),
        })?;
        Config::parse_with(&text, path, Secrets::Skip)
    }

    /// Validates config text; `path` is only used for messages and relative paths stay as given.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::parse_with(text, path, Secrets::Load)
    }

    fn parse_with(text: &str, path: &Path, secrets: Secrets) -> Result<Config, ConfigError> {
        let raw = parse_raw(text, path)?;
        let mut cfg = raw.validate(path, secrets)?;
        cfg.digest = sha256_hex(text.as_bytes());
        Ok(cfg)
    }

    /// The first `[[bmc]]` entry whose `nodes` globs match `node`.
    pub fn bmc_for(&self, node: &str) -> Option<&BmcEntry> {
        self.bmc.iter().find(|b| b.matches(node))
    }

    /// Where `node`'s power state comes from: a matching `[[bmc]]` entry first, then `[aws]`.
    pub fn mapping_for(&self, node: &str) -> Option<Mapping<'_>> {
        if let Some(b) = self.bmc_for(node) {
            return Some(Mapping::Bmc(b));
        }
        self.aws
            .as_ref()
            .filter(|a| a.matches(node))
            .map(Mapping::Aws)
    }
}

/// Whether validation reads the passwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Secrets {
    Load,
    Skip,
}

fn parse_raw(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
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
struct RawConfig {
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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHa {
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
    fn validate(self, path: &Path) -> Result<Option<HaConfig>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPause {
    file: Option<PathBuf>,
    configmap: Option<String>,
}

/// A limit as written: a count (`12` or `"12"`) or a share (`"50%"`).
#[derive(Deserialize)]
#[serde(untagged)]
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
struct RawGuards {
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
    record: Option<String>,
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
    fn validate(self, path: &Path) -> Result<GuardPolicy, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
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

impl RawPause {
    fn validate(self, path: &Path, dc: &str, ha: bool) -> Result<PauseConfig, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            key: format!("pause.{key}"),
            problem,
        };
        let file = match self.file {
            // With [ha] a pause is the group's: the ConfigMap, which every instance reads.
            None if ha => None,
            None => Some(default_pause_file(dc)),
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) if ha => {
                return Err(err(
                    "file",
                    format!(
                        "{:?}: with [ha] a pause file is read only by the instance on its own host, so a failover would resume every write on the other; remove it: under [ha] `oobfence pause` writes the pause ConfigMap, which every instance reads",
                        p.display().to_string()
                    ),
                ));
            }
            Some(p) if !p.is_absolute() => {
                return Err(err(
                    "file",
                    format!(
                        "{:?} must be an absolute path, or \"\" for none",
                        p.display().to_string()
                    ),
                ));
            }
            Some(p) => Some(p),
        };
        let configmap = match self.configmap.as_deref().map(str::trim) {
            None => Some(DEFAULT_PAUSE_CONFIGMAP),
            Some("") => None,
            Some(c) => Some(c),
        }
        .map(|c| {
            let dns = |s: &str| {
                !s.is_empty()
                    && s.len() <= 253
                    && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
            };
            match c.split_once('/') {
                Some((ns, name)) if dns(ns) && dns(name) => Ok(ConfigMapRef {
                    namespace: ns.into(),
                    name: name.into(),
                }),
                _ => Err(err(
                    "configmap",
                    format!("{c:?} must be NAMESPACE/NAME (example: \"{DEFAULT_PAUSE_CONFIGMAP}\"), or \"\" for none"),
                )),
            }
        })
        .transpose()?;
        if ha {
            // An annotation's name is at most 63 characters.
            let key = crate::pause::datacenter_annotation(dc);
            let name = key.split_once('/').map_or(key.as_str(), |(_, n)| n);
            if name.len() > 63 || name.ends_with('-') {
                return Err(ConfigError {
                    file: path.to_owned(),
                    key: "datacenter".into(),
                    problem: format!(
                        "{dc:?}: with [ha] the group's pause annotation {key} must be a valid annotation name (at most 63 characters after the '/', ending in a letter or digit): use a shorter datacenter name"
                    ),
                });
            }
        }
        Ok(PauseConfig { file, configmap })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawJournal {
    path: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAws {
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
}

fn default_aws_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_volume_release_warning() -> Duration {
    Duration::from_secs(600)
}

impl RawAws {
    fn validate(self, path: &Path) -> Result<AwsConfig, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
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
        })
    }
}

/// Compiles node-name globs, naming the bad one.
fn compile_globs(globs: &[String]) -> Result<Vec<glob::Pattern>, String> {
    if globs.is_empty() {
        return Err("needs at least one node name or glob (\"rack1-*\")".into());
    }
    globs
        .iter()
        .map(|g| {
            if g.trim().is_empty() {
                return Err("contains an empty pattern".to_string());
            }
            glob::Pattern::new(g).map_err(|e| format!("bad glob {g:?}: {}", e.msg))
        })
        .collect()
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
    fn validate(self, path: &Path, secrets: Secrets) -> Result<Config, ConfigError> {
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
                return Err(err(
                    &format!("bmc[{index}].address"),
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
            digest: String::new(),
        })
    }
}

/// `serde(with = ...)` for human durations: "60s", "5m", "1h 30m".
mod humantime_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "{s:?} is not a duration ({e}); examples: \"500ms\", \"5s\", \"2m\""
            ))
        })
    }
}
