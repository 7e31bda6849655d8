//! `inventory = "FILE"` in a `[[bmc]]` entry: the nodes of a datacenter whose BMC names do not
//! follow their node names, one `node = address` line each, every other key of the entry
//! (protocol, username, password, TLS, identity) applying to all of them. And the check of a
//! BMC address, the same for the entry's `address` and an inventory's lines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{ConfigError, Protocol, ipmi, redfish};

/// An inventory file, read: each node's BMC address and line.
pub struct Inventory {
    pub file: PathBuf,
    nodes: HashMap<String, (String, usize)>,
    /// SHA-256 of the file's text: part of the config's digest.
    pub digest: String,
}

impl std::fmt::Debug for Inventory {
    /// The file and its size, not thousands of lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("file", &self.file)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Inventory {
    /// The BMC address of `node`, if the inventory lists it.
    pub fn address(&self, node: &str) -> Option<&str> {
        self.nodes.get(node).map(|(a, _)| a.as_str())
    }

    /// Every node listed, with its line, in the file's order.
    pub fn nodes(&self) -> Vec<(&str, usize)> {
        let mut all: Vec<(&str, usize)> = self
            .nodes
            .iter()
            .map(|(n, (_, l))| (n.as_str(), *l))
            .collect();
        all.sort_by_key(|(_, l)| *l);
        all
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Where an entry's `inventory` is: relative to the config file's directory unless absolute.
pub(super) fn resolve(config: &Path, inventory: &Path) -> PathBuf {
    match config.parent() {
        Some(dir) if inventory.is_relative() => dir.join(inventory),
        _ => inventory.to_owned(),
    }
}

/// Reads an inventory of `node = address` lines (blank lines and `#` comments skipped; the
/// address may be quoted): its good lines, and every bad line's problem with the file and line
/// (`None`: the file cannot be read).
pub(super) fn load(file: &Path, protocol: Protocol) -> (Option<Inventory>, Vec<ConfigError>) {
    let err = |line: Option<usize>, key: &str, problem: String| ConfigError {
        file: file.to_owned(),
        key: key.to_string(),
        line,
        problem,
    };
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            return (
                None,
                vec![err(
                    None,
                    "",
                    format!(
                        "cannot read the inventory file: {e} (a relative inventory path is relative to the config file's directory)"
                    ),
                )],
            );
        }
    };
    let mut nodes: HashMap<String, (String, usize)> = HashMap::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let Some((node, address)) = l.split_once('=') else {
            errors.push(err(
                Some(line),
                "",
                format!(
                    "{l:?} is not a `node = address` line (example: rack1-07 = https://10.1.7.7)"
                ),
            ));
            continue;
        };
        let node = node.trim().trim_matches('"');
        let address = address.trim().trim_matches('"');
        if let Some(problem) = bad_node_name(node) {
            errors.push(err(Some(line), "", format!("{node:?} {problem}")));
            continue;
        }
        if let Err(problem) = check_address(protocol, address) {
            errors.push(err(Some(line), node, problem));
            continue;
        }
        if let Some((_, first)) = nodes.get(node) {
            errors.push(err(
                Some(line),
                node,
                format!("listed twice: first on line {first}; give each node one line"),
            ));
            continue;
        }
        nodes.insert(node.to_string(), (address.to_string(), line));
    }
    if nodes.is_empty() && errors.is_empty() {
        errors.push(err(
            None,
            "",
            "lists no node: write one `node = address` line per node".into(),
        ));
    }
    let inventory = Inventory {
        file: file.to_owned(),
        nodes,
        digest: super::sha256_hex(text.as_bytes()),
    };
    (Some(inventory), errors)
}

/// Why `node` is not a Kubernetes node name (a DNS subdomain), if it is not.
fn bad_node_name(node: &str) -> Option<&'static str> {
    if node.is_empty() {
        return Some("is not a node name: the line needs one before `=`");
    }
    if node.len() > 253
        || !node
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
    {
        return Some(
            "is not a Kubernetes node name (lowercase letters, digits, '-' and '.'): write the name `kubectl get nodes` shows",
        );
    }
    None
}

/// A BMC address for `protocol` (with any `{node}` already filled in), checked.
pub(super) fn check_address(protocol: Protocol, address: &str) -> Result<(), String> {
    match protocol {
        Protocol::Redfish => {
            let url = reqwest::Url::parse(address).map_err(|e| {
                format!(
                    "{address:?} is not a URL ({e}); example: \"https://{{node}}-bmc.dc1.example\""
                )
            })?;
            if url.scheme() != "https" {
                return Err(format!(
                    "{address:?} must use https:// (Redfish is served over TLS)"
                ));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(format!("{address:?} has no host"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err("must not contain credentials; use username and password_file".into());
            }
            if url.query().is_some() || url.fragment().is_some() {
                return Err(format!(
                    "{address:?} must be scheme://host[:port][/prefix] without ?query or #fragment"
                ));
            }
            redfish::check_address_path(url.path()).map_err(|e| format!("{address:?} {e}"))
        }
        Protocol::Ipmi => ipmi::parse_address(address).map(|_| ()),
        Protocol::FenceAgent => Ok(()),
    }
}

/// A node or a machine named twice where an inventory is one of the two: a node listed in an
/// inventory and named by another entry (or inventory), or two nodes of which one is an
/// inventory's reading the same machine. `entries` in the file's order.
pub(super) fn conflicts(entries: &[super::BmcEntry], config: &Path) -> Vec<ConfigError> {
    // Where each node name and machine was first seen: its entry, and the inventory line.
    struct Seen {
        entry: String,
        at: Option<(PathBuf, usize)>,
    }
    impl Seen {
        fn describe(&self) -> String {
            match &self.at {
                Some((file, line)) => format!("{}:{line} ({})", file.display(), self.entry),
                None => self.entry.clone(),
            }
        }
    }
    // A node is named once per level: its BMC at level 1, the outlets that feed it above.
    let mut names: HashMap<(u32, String), Seen> = HashMap::new();
    let mut machines: HashMap<String, Seen> = HashMap::new();
    let mut errors = Vec::new();
    for b in entries {
        let here = |node: &str, line: Option<usize>, problem: String| match (&b.inventory, line) {
            (Some(inv), Some(line)) => ConfigError {
                file: inv.file.clone(),
                key: node.to_string(),
                line: Some(line),
                problem,
            },
            _ => ConfigError {
                file: config.to_owned(),
                key: format!("bmc[{}].nodes", b.index),
                line: None,
                problem,
            },
        };
        let listed: Vec<(String, Option<usize>)> = match &b.inventory {
            Some(inv) => inv
                .nodes()
                .into_iter()
                .map(|(n, l)| (n.to_string(), Some(l)))
                .collect(),
            None => b
                .nodes
                .iter()
                .map(glob::Pattern::as_str)
                .filter(|p| !p.contains(['*', '?', '[']))
                .map(|p| (p.to_string(), None))
                .collect(),
        };
        for (node, line) in &listed {
            let seen = Seen {
                entry: b.label(),
                at: b
                    .inventory
                    .as_ref()
                    .zip(*line)
                    .map(|(inv, l)| (inv.file.clone(), l)),
            };
            match names.get(&(b.level, node.clone())) {
                Some(first) if first.at.is_some() || seen.at.is_some() => errors.push(here(
                    node,
                    *line,
                    format!(
                        "node {node:?} is named twice: first by {}; a node has one BMC, name it once",
                        first.describe()
                    ),
                )),
                Some(_) => {}
                None => {
                    names.insert((b.level, node.clone()), seen);
                }
            }
        }
        let Some(inv) = &b.inventory else {
            if let Some(target) = b.fixed_target() {
                machines.entry(target).or_insert(Seen {
                    entry: b.label(),
                    at: None,
                });
            }
            continue;
        };
        for (node, line) in inv.nodes() {
            let key = b.machine_key(node);
            match machines.get(&key) {
                Some(first) => errors.push(here(
                    node,
                    Some(line),
                    format!(
                        "reads the same machine as {} ({key}): one machine cannot be two nodes, and its being off would fence both",
                        first.describe()
                    ),
                )),
                None => {
                    machines.insert(
                        key,
                        Seen {
                            entry: b.label(),
                            at: Some((inv.file.clone(), line)),
                        },
                    );
                }
            }
        }
    }
    errors
}
