//! A `[[bmc]]` entry: its keys, their checks, and which machine it reads for a node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::inventory::{self, Inventory};

mod limits;
mod machine;
mod outlet;
use super::{
    ConfigError, IdentityCheck, Secrets, compile_globs, fence_agent, humantime_serde, ipmi, redfish,
};
use crate::secret::Secret;
#[cfg(test)]
pub(super) use limits::DEFAULT_MAX_OFF_WATTS;
pub(super) use limits::check_timeout;
use limits::off_witness;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    Redfish,
    Ipmi,
    /// A ClusterLabs fence agent run as a process (`fence_ipmilan`, `fence_redfish`, ...).
    FenceAgent,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Redfish => "redfish",
            Protocol::Ipmi => "ipmi",
            Protocol::FenceAgent => "fence-agent",
        }
    }
}

/// How to verify a BMC's TLS certificate.
#[derive(Clone, PartialEq, Eq)]
pub enum BmcTls {
    /// The system roots.
    System,
    /// Certificates the operator gave: `ca_file`'s (read at load), as roots and each also as a
    /// pinned BMC certificate, and `tls_fingerprint`'s SHA-256 pins. See
    /// [`crate::pinning`].
    Pinned {
        ca_file: Option<PathBuf>,
        ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
        fingerprints: Vec<crate::pinning::Fingerprint>,
        /// `tls_pin_validity`: whether a pinned certificate outside its validity period is
        /// read (with a warning) or refused.
        validity: crate::pinning::PinValidity,
    },
    /// Accept any certificate. Logged loudly at start-up.
    Insecure,
}

impl std::fmt::Debug for BmcTls {
    /// Counts, not certificate bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BmcTls::System => f.write_str("System"),
            BmcTls::Insecure => f.write_str("Insecure"),
            BmcTls::Pinned {
                ca_file,
                ca_certs,
                fingerprints,
                validity,
            } => f
                .debug_struct("Pinned")
                .field("ca_file", ca_file)
                .field("ca_certs", &ca_certs.len())
                .field("fingerprints", &fingerprints.len())
                .field("validity", validity)
                .finish(),
        }
    }
}

/// `tls_fingerprint = "sha256:…"` or a list of them.
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "must be a certificate fingerprint such as \"sha256:AB:CD:…\" (quoted), or a list of them"
)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// One `[[bmc]]` entry: which nodes it covers and how to reach their BMCs.
#[derive(Debug, Clone)]
pub struct BmcEntry {
    /// Position in the file, 0-based (`bmc[3]` in metrics; `[[bmc]] #4` in messages).
    pub index: usize,
    /// The line of its `[[bmc]]` header in the config file.
    pub line: Option<usize>,
    /// Empty for an entry with an inventory.
    pub nodes: Vec<glob::Pattern>,
    /// `inventory`: each node's address from a file (`nodes` and `address` unset then).
    pub inventory: Option<std::sync::Arc<Inventory>>,
    pub protocol: Protocol,
    /// Address template; `{node}` is replaced by the node name.
    pub address: String,
    /// Redfish system path; `None` means "the single member of /redfish/v1/Systems".
    pub system: Option<String>,
    /// Redfish PDU outlet path (`outlet`), read instead of a system: the outlet feeding the
    /// node's machine.
    pub outlet: Option<String>,
    pub username: String,
    pub password: Secret,
    /// Where the password came from (`password_file`), for the check of its permissions.
    pub password_file: Option<std::path::PathBuf>,
    pub tls: BmcTls,
    pub timeout: Duration,
    /// `protocol = "ipmi"` only: cipher suite and privilege.
    pub ipmi: Option<ipmi::IpmiOptions>,
    /// `protocol = "redfish"` only: how it logs in.
    pub redfish: Option<redfish::RedfishOptions>,
    /// `protocol = "fence-agent"` only: the agent, its options and plug.
    pub fence_agent: Option<fence_agent::FenceAgentOptions>,
    /// Whether an Off read must come from a machine that proves it is the node's.
    pub identity: IdentityCheck,
    /// `corroborate`: the second witness an Off read needs to count (the system's power draw
    /// at most `max_off_watts`), if any.
    pub corroborate: Option<crate::decision::OffWitness>,
    /// This entry's machines may be powered off and on (`actuate = true`), where
    /// `[actuation]` is enabled too.
    pub actuate: bool,
    /// `level`: the fencing level this entry's reads prove at (1 first; see
    /// [`crate::decision::levels`]).
    pub level: u32,
}

impl BmcEntry {
    /// The address for one node, with `{node}` filled in.
    pub fn address_for(&self, node: &str) -> String {
        match &self.inventory {
            Some(inv) => inv.address(node).unwrap_or_default().to_string(),
            None => self.address.replace("{node}", node),
        }
    }

    /// The system path for one node, with `{node}` filled in.
    pub fn system_for(&self, node: &str) -> Option<String> {
        self.system.as_ref().map(|s| s.replace("{node}", node))
    }

    /// The outlet path for one node, with `{node}` filled in.
    pub fn outlet_for(&self, node: &str) -> Option<String> {
        self.outlet.as_ref().map(|s| s.replace("{node}", node))
    }

    /// How messages name it: `[[bmc]] #4 (line 31)`, its number in the file counted from 1.
    pub fn label(&self) -> String {
        match self.line {
            Some(line) => format!("[[bmc]] #{} (line {line})", self.index + 1),
            None => format!("[[bmc]] #{}", self.index + 1),
        }
    }

    pub fn matches(&self, node: &str) -> bool {
        match &self.inventory {
            Some(inv) => inv.address(node).is_some(),
            None => self.nodes.iter().any(|p| p.matches(node)),
        }
    }
}

/// Where the decision journal goes unless `[journal] path` says otherwise: the systemd unit's

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBmc {
    #[serde(default)]
    pub(super) nodes: Vec<String>,
    /// A file of `node = address` lines: the nodes and addresses of this entry.
    pub(super) inventory: Option<PathBuf>,
    pub(super) protocol: Protocol,
    pub(super) address: Option<String>,
    pub(super) system: Option<String>,
    pub(super) outlet: Option<String>,
    pub(super) username: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) password_credential: Option<String>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) tls_fingerprint: Option<OneOrMany>,
    #[serde(default)]
    pub(super) tls_insecure: bool,
    pub(super) tls_pin_validity: Option<String>,
    #[serde(default = "default_bmc_timeout", with = "humantime_serde")]
    pub(super) timeout: Duration,
    pub(super) cipher_suite: Option<ipmi::CipherSuiteSetting>,
    pub(super) privilege: Option<String>,
    pub(super) auth: Option<String>,
    #[serde(default)]
    pub(super) identity: IdentityCheck,
    pub(super) corroborate: Option<String>,
    pub(super) max_off_watts: Option<f64>,
    /// Opt-in actuation, this entry's half: `[actuation] enabled` is the other.
    #[serde(default)]
    pub(super) actuate: bool,
    /// `protocol = "fence-agent"`: the agent, its options (`name = "value"`), the plug.
    pub(super) agent: Option<String>,
    pub(super) options: Option<std::collections::BTreeMap<String, String>>,
    pub(super) plug: Option<String>,
    /// `protocol = "fence-agent"`, an agent oobfence does not list: the operator vouches that
    /// its Off means no power and no saved state ([`fence_agent::VOUCH_VALUE`]).
    pub(super) unlisted_agent_off_means: Option<String>,
    /// The fencing level (default 1), checked by the caller.
    pub(super) level: Option<i64>,
}

fn default_bmc_timeout() -> Duration {
    Duration::from_secs(5)
}

impl RawBmc {
    /// Every check of the entry: each of its problems (an error in one key does not hide the
    /// others'), or the entry.
    pub(super) fn validate(
        self,
        index: usize,
        path: &Path,
        secrets: Secrets,
    ) -> Result<BmcEntry, Vec<ConfigError>> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("bmc[{index}].{key}"),
            problem,
        };
        let mut errs: Vec<ConfigError> = Vec::new();
        // The value of a check that passed; a failed one's error joins the others.
        macro_rules! check {
            ($r:expr) => {
                match $r {
                    Ok(v) => Some(v),
                    Err(e) => {
                        errs.push(e);
                        None
                    }
                }
            };
        }
        let nodes = match self.inventory {
            Some(_) => Vec::new(),
            None => {
                check!(compile_globs(&self.nodes).map_err(|e| err("nodes", e))).unwrap_or_default()
            }
        };

        if self.protocol == Protocol::FenceAgent {
            if self.inventory.is_some() {
                errs.push(err(
                    "inventory",
                    "applies to protocol = \"redfish\" or \"ipmi\": a fence agent's entry names its machines with options and plug".into(),
                ));
                return Err(errs);
            }
            return match self.validate_fence_agent(index, nodes, path, secrets) {
                Ok(entry) if errs.is_empty() => Ok(entry),
                Ok(_) => Err(errs),
                Err(e) => {
                    errs.push(e);
                    Err(errs)
                }
            };
        }
        for (key, set) in [
            ("agent", self.agent.is_some()),
            ("options", self.options.is_some()),
            ("plug", self.plug.is_some()),
            (
                "unlisted_agent_off_means",
                self.unlisted_agent_off_means.is_some(),
            ),
        ] {
            if set {
                errs.push(err(
                    key,
                    "applies to protocol = \"fence-agent\" only".into(),
                ));
            }
        }
        if self.inventory.is_some() {
            for (key, set) in [
                ("nodes", !self.nodes.is_empty()),
                ("address", self.address.is_some()),
            ] {
                if set {
                    errs.push(err(
                        key,
                        "does not go with inventory: the inventory file lists the nodes and their BMC addresses (`node = address` lines); remove it from this entry".into(),
                    ));
                }
            }
        }
        let address = match &self.inventory {
            Some(_) => Some(String::new()),
            None => check!(self.address.as_deref().map(|a| a.trim().to_string()).ok_or_else(|| {
                err(
                    "address",
                    "missing: the BMC's address (\"https://{node}-bmc.dc1.example\" for Redfish, \"{node}-ipmi.dc1.example\" for IPMI), or an inventory file of `node = address` lines".into(),
                )
            })),
        };
        let username = check!(self.username.clone().ok_or_else(|| {
            err(
                "username",
                "missing: the BMC account oobfence logs in as".into(),
            )
        }));
        if let Some(address) = address.as_deref().filter(|_| self.inventory.is_none()) {
            let probe = address.replace("{node}", "node");
            check!(
                inventory::check_address(self.protocol, &probe).map_err(|e| {
                    err(
                        "address",
                        e.replace(&format!("{probe:?}"), &format!("{address:?}")),
                    )
                })
            );
        }
        if self.protocol == Protocol::Ipmi {
            for (key, set) in [
                ("system", self.system.is_some()),
                ("ca_file", self.ca_file.is_some()),
                ("tls_fingerprint", self.tls_fingerprint.is_some()),
                ("tls_insecure", self.tls_insecure),
                ("auth", self.auth.is_some()),
                ("tls_pin_validity", self.tls_pin_validity.is_some()),
            ] {
                if set {
                    errs.push(err(
                        key,
                        "applies to protocol = \"redfish\" only (IPMI over LAN has no TLS, no system path and its own login)".into(),
                    ));
                }
            }
            if let Some(u) = &username {
                check!(ipmi::check_username(u).map_err(|e| err("username", e)));
            }
        }
        let ipmi_options = match self.protocol {
            Protocol::Ipmi => {
                let defaults = ipmi::IpmiOptions::default();
                let cipher_suites = match &self.cipher_suite {
                    None => Some(defaults.cipher_suites),
                    Some(s) => {
                        check!(ipmi::check_cipher_suites(s).map_err(|e| err("cipher_suite", e)))
                    }
                };
                let privilege = match self.privilege.as_deref() {
                    None => Some(defaults.privilege),
                    Some(p) => check!(ipmi::check_privilege(p).map_err(|e| err("privilege", e))),
                };
                cipher_suites
                    .zip(privilege)
                    .map(|(cipher_suites, privilege)| {
                        Some(ipmi::IpmiOptions {
                            cipher_suites,
                            privilege,
                        })
                    })
            }
            _ => {
                for (key, set) in [
                    ("cipher_suite", self.cipher_suite.is_some()),
                    ("privilege", self.privilege.is_some()),
                ] {
                    if set {
                        errs.push(err(key, "applies to protocol = \"ipmi\" only".into()));
                    }
                }
                Some(None)
            }
        };
        let redfish_options = match self.protocol {
            Protocol::Redfish => match self.auth.as_deref() {
                None => Some(Some(redfish::RedfishOptions {
                    auth: redfish::RedfishAuth::default(),
                })),
                Some(a) => check!(redfish::check_auth(a).map_err(|e| err("auth", e)))
                    .map(|auth| Some(redfish::RedfishOptions { auth })),
            },
            _ => Some(None),
        };
        // One entry for many nodes must address each node's own machine: otherwise every node
        // it matches reads the same BMC, and one machine being off would fence them all. Above
        // level 1 it may be an outlet that feeds them all (a twin server on one feed): off,
        // it is off for every one of them.
        let covers_many = self.inventory.is_none()
            && self.level.is_none_or(|l| l <= 1)
            && (self.nodes.len() > 1 || self.nodes.iter().any(|g| g.contains(['*', '?', '['])));
        let per_node = address.as_deref().is_some_and(|a| a.contains("{node}"))
            || self.system.as_deref().is_some_and(|s| s.contains("{node}"))
            || self.outlet.as_deref().is_some_and(|s| s.contains("{node}"));
        if covers_many && address.is_some() && !per_node {
            errs.push(err(
                "address",
                format!(
                    "this entry matches several nodes ({:?}) but neither address, system nor outlet contains {{node}}: every one of them would read the same machine's power; write one entry per node or use {{node}}",
                    self.nodes
                ),
            ));
        }
        if let Some(system) = &self.system
            && !system.starts_with('/')
        {
            errs.push(err(
                "system",
                format!("{system:?} must be a path such as \"/redfish/v1/Systems/1\""),
            ));
        }
        for (key, problem) in self.outlet_problems() {
            errs.push(err(key, problem));
        }
        if username.as_deref() == Some("") {
            errs.push(err("username", "must not be empty".into()));
        }
        let password = check!(self.password(secrets, &err)).and_then(|p| {
            check!(p.ok_or_else(|| {
                err(
                    "password_file",
                    "missing: set password_file = \"/etc/oobfence/secrets/NAME\" or password_credential = \"NAME\"".into(),
                )
            }))
        });
        if self.protocol == Protocol::Ipmi
            && let Some(password) = &password
        {
            let key = if self.password_file.is_some() {
                "password_file"
            } else {
                "password_credential"
            };
            check!(ipmi::check_password(password).map_err(|e| err(key, e)));
        }
        let fingerprints = match &self.tls_fingerprint {
            None => Vec::new(),
            Some(OneOrMany::One(f)) => vec![f.clone()],
            Some(OneOrMany::Many(fs)) => fs.clone(),
        };
        let fingerprints = check!(
            fingerprints
                .iter()
                .map(|f| crate::pinning::parse_fingerprint(f))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err("tls_fingerprint", e))
        );
        let validity = match self.tls_pin_validity.as_deref() {
            None | Some("warn") => Some(crate::pinning::PinValidity::Warn),
            Some("enforce") => Some(crate::pinning::PinValidity::Enforce),
            Some(other) => {
                errs.push(err(
                    "tls_pin_validity",
                    format!(
                        "{other:?} is not a setting: use \"warn\" (a pinned certificate is read past its validity period, with a warning; the default) or \"enforce\" (refused then)"
                    ),
                ));
                None
            }
        };
        // Pins given (an empty list is none); a list in error counts as given.
        let pinned = fingerprints
            .as_ref()
            .map_or(self.tls_fingerprint.is_some(), |f| !f.is_empty());
        if self.tls_pin_validity.is_some() && self.ca_file.is_none() && !pinned {
            errs.push(err(
                "tls_pin_validity",
                "applies to a pinned certificate only: set tls_fingerprint or ca_file too, or remove it".into(),
            ));
        }
        let tls = match (self.ca_file.clone(), pinned, self.tls_insecure) {
            (Some(_), _, true) | (_, true, true) => {
                errs.push(err(
                    "tls_insecure",
                    "set ca_file or tls_fingerprint, or tls_insecure = true, not both".into(),
                ));
                None
            }
            (None, false, true) => Some(BmcTls::Insecure),
            (None, false, false) => Some(BmcTls::System),
            (ca_file, _, false) => {
                let ca_certs = match &ca_file {
                    None => Some(Vec::new()),
                    Some(ca) => check!(
                        std::fs::read(ca)
                            .map_err(|e| err(
                                "ca_file",
                                format!("cannot read {}: {e}", ca.display())
                            ))
                            .and_then(|pem| {
                                crate::pinning::certificates_of_pem(&pem)
                                    .map_err(|e| err("ca_file", format!("{} {e}", ca.display())))
                            })
                    ),
                };
                match (ca_certs, fingerprints, validity) {
                    (Some(ca_certs), Some(fingerprints), Some(validity)) => Some(BmcTls::Pinned {
                        ca_file,
                        ca_certs,
                        fingerprints,
                        validity,
                    }),
                    _ => None,
                }
            }
        };
        check!(check_timeout(self.timeout).map_err(|e| err("timeout", e)));
        let corroborate = check!(
            off_witness(self.corroborate.as_deref(), self.max_off_watts)
                .map_err(|(key, problem)| err(key, problem))
        );
        let (
            Some(address),
            Some(username),
            Some(ipmi_options),
            Some(redfish_options),
            Some(password),
            Some(tls),
            Some(corroborate),
            true,
        ) = (
            address,
            username,
            ipmi_options,
            redfish_options,
            password,
            tls,
            corroborate,
            errs.is_empty(),
        )
        else {
            return Err(errs);
        };
        Ok(BmcEntry {
            index,
            line: None,
            nodes,
            inventory: None,
            protocol: self.protocol,
            address,
            system: self.system,
            outlet: self.outlet,
            username,
            password,
            password_file: self.password_file.clone(),
            tls,
            timeout: self.timeout,
            ipmi: ipmi_options,
            redfish: redfish_options,
            fence_agent: None,
            identity: self.identity,
            actuate: self.actuate,
            corroborate,
            level: 1,
        })
    }
}
