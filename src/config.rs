//! The per-datacenter TOML config: parsing, validation, and the node → power source mapping.
//!
//! Every error names the file, the key and the problem on one line, because the person reading
//! it is usually an operator fixing a config at 3 a.m. The node → BMC mapping comes only from
//! this file, never from node labels or annotations: whoever can annotate a Node must not be able
//! to point the fencer at a "BMC" that answers Off.
//!
//! This file holds the loaded `Config`, its error and the node → source mapping; each section
//! with rules of its own lives beside it (`bmc`, `aws`, `ha`, `pause`, `guards`), and `raw`
//! reads the file as written and validates it into a `Config`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::decision::Policy;
use crate::decision::holds::GuardPolicy;

pub mod actuation;
mod agent_entry;
mod aws;
mod bmc;
pub mod checks;
pub mod fence_agent;
mod guards;
mod ha;
mod inventory;
pub mod ipmi;
mod located;
mod pause;
mod raw;
pub mod redfish;
mod selector;
#[cfg(test)]
mod tests;

pub use aws::AwsConfig;
pub use bmc::{BmcEntry, BmcTls, Protocol};
pub use guards::DEFAULT_GUARD_RECORD;
pub use ha::HaConfig;
pub use inventory::Inventory;
pub use pause::{
    ANNOTATION_PAUSED, DEFAULT_PAUSE_CONFIGMAP, PauseConfig, datacenter_annotation,
    default_pause_file,
};

pub use crate::identity::IdentityCheck;

/// A config problem: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Dotted key path (`policy.confirm_reads`, `bmc[0].address`: the index 0-based as in
    /// the code, shown 1-based as `[[bmc]] #1 address`).
    pub key: String,
    /// The 1-based line of the key in `file`, when known.
    pub line: Option<usize>,
    pub problem: String,
}

/// A key as an operator reads it: a `[[bmc]]` entry by its 1-based number in the file.
pub fn display_key(key: &str) -> String {
    if let Some(rest) = key.strip_prefix("bmc[")
        && let Some((n, rest)) = rest.split_once(']')
        && let Ok(n) = n.parse::<usize>()
    {
        let rest = rest.strip_prefix('.').unwrap_or(rest);
        let sep = if rest.is_empty() { "" } else { " " };
        return format!("[[bmc]] #{}{sep}{rest}", n + 1);
    }
    key.to_string()
}

impl fmt::Display for ConfigError {
    /// Always one line, `FILE:LINE: KEY: PROBLEM`: a problem that quotes a value from the file
    /// (which may hold a line break or other control characters) shows them escaped.
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
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.key.is_empty() {
            write!(f, ": {problem}")
        } else {
            write!(f, ": {}: {problem}", display_key(&self.key))
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem of a config file found in one pass (at least one), in the file's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    pub file: PathBuf,
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// The closing line of a list of them: how many, in which file.
    pub fn count_line(&self) -> String {
        match self.errors.len() {
            1 => format!("1 error in {}", self.file.display()),
            n => format!("{n} errors in {}", self.file.display()),
        }
    }
}

impl fmt::Display for ConfigErrors {
    /// One line: one error as itself, several joined by "; " after their count (a log
    /// line); `check-config` prints each on its own line instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.errors.as_slice() {
            [one] => write!(f, "{one}"),
            all => {
                write!(f, "{}: ", self.count_line())?;
                for (i, e) in all.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigErrors {}

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
    /// `[actuation]`, when enabled: opt-in power actions.
    pub actuation: Option<actuation::ActuationConfig>,
    /// SHA-256 of the config file text, recorded in every journal record.
    pub digest: String,
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

/// The highest fencing level a `[[bmc]]` entry may take (Pacemaker's topology has 9 too).
pub const MAX_LEVEL: u32 = 9;

/// Where a node's power state comes from.
#[derive(Debug, Clone, Copy)]
pub enum Mapping<'a> {
    Bmc(&'a BmcEntry),
    Aws(&'a AwsConfig),
}

impl Mapping<'_> {
    /// The fencing level its reads prove at; `[aws]` is level 1.
    pub fn level(&self) -> u32 {
        match self {
            Mapping::Bmc(b) => b.level,
            Mapping::Aws(_) => 1,
        }
    }

    /// A source that reads the machine itself and can prove which one it is (a Redfish
    /// system, an IPMI BMC, an EC2 instance), as opposed to a fence agent's plug or outlet.
    pub fn reads_the_machine(&self) -> bool {
        match self {
            Mapping::Bmc(b) => matches!(b.protocol, Protocol::Redfish | Protocol::Ipmi),
            Mapping::Aws(_) => true,
        }
    }

    /// How messages name it: `[[bmc]] #4 (line 31)`, `[aws]`.
    pub fn label(&self) -> String {
        match self {
            Mapping::Bmc(b) => b.label(),
            Mapping::Aws(_) => "[aws]".into(),
        }
    }

    pub fn identity(&self) -> IdentityCheck {
        match self {
            Mapping::Bmc(b) => b.identity,
            Mapping::Aws(a) => a.identity,
        }
    }

    /// Why this mapping's machines may not be powered off or on (`None`: `actuate = true`).
    pub fn actuation_refused(&self) -> Option<String> {
        let (actuate, what) = match self {
            Mapping::Bmc(b) => (b.actuate, format!("its entry {}", b.label())),
            Mapping::Aws(a) => (a.actuate, "[aws]".to_string()),
        };
        (!actuate).then(|| format!("{what} does not say actuate = true"))
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
    /// Reads and validates a config file, finding every problem in one pass.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = read_config(path)?;
        Config::parse_all(&text, path, Secrets::Load)
    }

    /// Reads and validates a config file without reading any password: for commands that
    /// only talk to the running daemon or read its journal (`why`), so an operator can run
    /// them from a shell without the daemon's credentials. Every password is left empty.
    pub fn load_without_secrets(path: &Path) -> Result<Config, ConfigErrors> {
        let text = read_config(path)?;
        Config::parse_all(&text, path, Secrets::Skip)
    }

    /// The `[kubernetes]` section of a config file that may not load (see
    /// [`raw::kubernetes_of`]); `None` when the file is unreadable, not TOML, or the section
    /// is in error.
    pub fn kubernetes_section(path: &Path) -> Option<KubernetesConfig> {
        raw::kubernetes_of(&std::fs::read_to_string(path).ok()?, path)
    }

    /// Validates config text; `path` is used for messages and for the files it names relative
    /// to it. The first problem only: [`Config::load`] finds them all.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::parse_all(text, path, Secrets::Load).map_err(|mut e| e.errors.swap_remove(0))
    }

    fn parse_all(text: &str, path: &Path, secrets: Secrets) -> Result<Config, ConfigErrors> {
        let all = |errors| ConfigErrors {
            file: path.to_owned(),
            errors,
        };
        let (raw, lines, errors) = raw::parse_raw(text, path).map_err(|e| all(vec![e]))?;
        let mut cfg = raw.validate(path, secrets, errors, &lines).map_err(all)?;
        // An inventory is part of the config: a changed line is a changed config.
        let mut hashed = text.to_string();
        for inv in cfg.bmc.iter().filter_map(|b| b.inventory.as_ref()) {
            hashed.push_str(&format!("\n# inventory {}\n", inv.digest));
        }
        cfg.digest = sha256_hex(hashed.as_bytes());
        Ok(cfg)
    }

    /// The first `[[bmc]]` entry whose `nodes` globs match `node`.
    pub fn bmc_for(&self, node: &str) -> Option<&BmcEntry> {
        self.bmc.iter().find(|b| b.matches(node))
    }

    /// `node`'s first power source: the first of [`Config::mappings_for`].
    pub fn mapping_for(&self, node: &str) -> Option<Mapping<'_>> {
        self.mappings_for(node).into_iter().next()
    }

    /// Every power source of `node`, by level (within a level, in the file's order, `[aws]`
    /// after the `[[bmc]]` entries): each matching entry is one, and a level proves the
    /// machine off only when all of its sources do (a machine fed by two outlets). One
    /// exception keeps configs written before levels as they were: of the level-1 sources
    /// that read the machine itself (Redfish, IPMI, `[aws]`), only the first that matches is
    /// the node's — a machine has one BMC, so a second one is an entry written for other
    /// nodes whose globs reach this one too, and `check-config` warns of it
    /// ([`Config::shadowed_sources`]).
    pub fn mappings_for(&self, node: &str) -> Vec<Mapping<'_>> {
        let matching = self.matching(node);
        let mut machine_read = false;
        let mut out: Vec<Mapping<'_>> = Vec::new();
        for m in matching {
            if m.level() == 1 && m.reads_the_machine() {
                if machine_read {
                    continue;
                }
                machine_read = true;
            }
            out.push(m);
        }
        // Stable: the file's order within a level.
        out.sort_by_key(Mapping::level);
        out
    }

    /// Every entry whose names match `node`, `[[bmc]]` in the file's order, then `[aws]`.
    fn matching<'a, 'n>(
        &'a self,
        node: &'n str,
    ) -> impl Iterator<Item = Mapping<'a>> + use<'a, 'n> {
        self.bmc
            .iter()
            .filter(move |b| b.matches(node))
            .map(Mapping::Bmc)
            .chain(
                self.aws
                    .iter()
                    .filter(move |a| a.matches(node))
                    .map(Mapping::Aws),
            )
    }

    /// The level-1 sources that read the machine itself and match `node` after the first one
    /// that does: never its sources (see [`Config::mappings_for`]), each with the one that is.
    pub fn shadowed_sources(&self, node: &str) -> Vec<(Mapping<'_>, Mapping<'_>)> {
        let mut first: Option<Mapping<'_>> = None;
        let mut out = Vec::new();
        let matching = self
            .matching(node)
            .filter(|m| m.level() == 1 && m.reads_the_machine());
        for m in matching {
            match first {
                None => first = Some(m),
                Some(f) => out.push((m, f)),
            }
        }
        out
    }
}

fn read_config(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        file: path.to_owned(),
        errors: vec![ConfigError {
            file: path.to_owned(),
            line: None,
            key: String::new(),
            problem: format!("cannot read config file: {e}"),
        }],
    })
}

/// Whether validation reads the passwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Secrets {
    Load,
    Skip,
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

/// `serde(with = ...)` for human durations: "60s", "5m", "1h 30m". A bare number (`60`, which
/// TOML reads as an integer) gets the very words its quoted form (`"60"`) gets: it needs a unit.
mod humantime_serde {
    use std::fmt;
    use std::time::Duration;

    use serde::Deserializer;
    use serde::de::{self, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationText)
    }

    /// The text of a duration as written, quoted or not.
    struct DurationText;

    impl Visitor<'_> for DurationText {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as \"5s\"")
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
            humantime::parse_duration(s).map_err(|e| {
                E::custom(format!(
                    "{s:?} is not a duration ({e}); examples: \"500ms\", \"5s\", \"2m\""
                ))
            })
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
            self.visit_str(&n.to_string())
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Duration, E> {
            self.visit_str(&n.to_string())
        }

        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Duration, E> {
            self.visit_str(&n.to_string())
        }
    }
}
