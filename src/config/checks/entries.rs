//! Warnings about the `[[bmc]]` entries as a whole and the server: an entry an earlier one
//! hides, one that matches no Node of the cluster, a password file of several lines, a
//! listener off loopback.

use super::{Finding, Severity, finding};
use crate::config::{BmcEntry, Config, Mapping};

/// Glob characters: a pattern without them names one node.
const GLOB: [char; 3] = ['*', '?', '['];

/// Level-1 Redfish and IPMI entries the first-match rule never reaches: every node each of
/// their patterns could match is matched first by an earlier one (a machine has one BMC, see
/// [`Config::mappings_for`]; other entries matching a node are all its sources).
pub(super) fn shadowed(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    // Earlier names (one node each) and earlier globs, with the entry they belong to.
    let mut names: std::collections::HashMap<&str, &BmcEntry> = Default::default();
    let mut globs: Vec<(&glob::Pattern, &BmcEntry)> = Vec::new();
    for b in cfg
        .bmc
        .iter()
        .filter(|b| b.level == 1 && Mapping::Bmc(b).reads_the_machine())
    {
        let listed: Vec<&str> = match &b.inventory {
            Some(inv) => inv.nodes().into_iter().map(|(n, _)| n).collect(),
            None => b.nodes.iter().map(glob::Pattern::as_str).collect(),
        };
        let by: Vec<Option<&BmcEntry>> = listed
            .iter()
            .map(|&text| {
                if !text.contains(GLOB) {
                    names
                        .get(text)
                        .copied()
                        .or_else(|| globs.iter().find(|(g, _)| g.matches(text)).map(|(_, e)| *e))
                } else {
                    globs
                        .iter()
                        .find(|(g, _)| covers(g.as_str(), text))
                        .map(|(_, e)| *e)
                }
            })
            .collect();
        let hidden = by.iter().filter(|e| e.is_some()).count();
        if let Some(inv) = b
            .inventory
            .as_ref()
            .filter(|_| hidden > 0 && hidden < by.len())
        {
            let (first, by_entry) = listed
                .iter()
                .zip(&by)
                .find_map(|(n, e)| e.map(|e| (*n, e)))
                .expect("some are hidden");
            out.push(finding(
                Severity::Warning,
                format!("bmc[{}].inventory", b.index),
                format!(
                    "{hidden} of the {} nodes of {} are matched first by an earlier entry (the first: {first}, by {}), so their lines are never used; move this entry above, or narrow the earlier one",
                    by.len(),
                    inv.file.display(),
                    by_entry.label()
                ),
            ));
        }
        if !by.is_empty() && by.iter().all(Option::is_some) {
            let mut earlier: Vec<String> = by.iter().flatten().map(|e| e.label()).collect();
            earlier.dedup();
            out.push(finding(
                Severity::Warning,
                format!("bmc[{}].nodes", b.index),
                format!(
                    "{} is never used: every node its nodes {} match is matched first by {} (a machine has one BMC: of the level-1 Redfish and IPMI entries that match a node, the first is its only one); move this entry above, or narrow the earlier one",
                    b.label(),
                    describe_nodes(b),
                    earlier.join(" and ")
                ),
            ));
        }
        for p in &b.nodes {
            if p.as_str().contains(GLOB) {
                globs.push((p, b));
            } else {
                names.entry(p.as_str()).or_insert(b);
            }
        }
        for n in listed.iter().filter(|_| b.inventory.is_some()) {
            names.entry(n).or_insert(b);
        }
    }
    out
}

/// An entry's nodes as written: its patterns, or its inventory file.
fn describe_nodes(b: &BmcEntry) -> String {
    match &b.inventory {
        Some(inv) => format!("listed in {}", inv.file.display()),
        None => format!(
            "{:?}",
            b.nodes
                .iter()
                .map(glob::Pattern::as_str)
                .collect::<Vec<_>>()
        ),
    }
}

/// Whether every name glob `inner` matches is matched by glob `outer`, as far as can be told
/// for sure: `outer` made of plain characters and `*` only, and matching `inner` with each of
/// its wildcards (`*`, `?`, a `[...]` class) put as one stand-in character, which only a `*`
/// of `outer` can match — and a `*` matches whatever that wildcard does.
fn covers(outer: &str, inner: &str) -> bool {
    const STAND_IN: char = '\u{1}';
    if outer.contains(['?', '[', ']', '!', STAND_IN]) {
        return false;
    }
    let mut text = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' | '?' => text.push(STAND_IN),
            '[' => {
                // A class: up to its closing bracket (a `]` first in it is a member).
                let mut first = true;
                for c in chars.by_ref() {
                    if c == ']' && !first {
                        break;
                    }
                    first = false;
                }
                text.push(STAND_IN);
            }
            c => text.push(c),
        }
    }
    glob::Pattern::new(outer).is_ok_and(|p| p.matches(&text))
}

/// A password file of more than one non-empty line: the whole file is the password (one
/// trailing newline left off), line breaks included, which is rarely what was meant.
pub(super) fn password_lines(b: &BmcEntry) -> Option<Finding> {
    let lines = b
        .password
        .expose()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    if lines < 2 {
        return None;
    }
    let (key, what) = match &b.password_file {
        Some(f) => ("password_file", f.display().to_string()),
        None => ("password_credential", "the credential".to_string()),
    };
    Some(finding(
        Severity::Warning,
        format!("bmc[{}].{key}", b.index),
        format!(
            "{what} holds {lines} non-empty lines: the whole file is the password (only one trailing newline is left off), line breaks included, so the BMC will most likely refuse it; write the password alone on one line"
        ),
    ))
}

/// `[server] listen` on an address other hosts can reach.
/// What an entry that reads a PDU outlet proves, and what it does not.
pub(super) fn outlet(b: &BmcEntry) -> Option<Finding> {
    let outlet = b.outlet.as_ref()?;
    Some(finding(
        Severity::Note,
        format!("bmc[{}].outlet", b.index),
        format!(
            "reads the PDU outlet {outlet} (not the machine's BMC): an outlet proves only this entry's mapping of nodes to outlets, and its Off counts only while it draws at most {} (PowerWatts); an unmetered outlet's Off stands on its state alone",
            b.outlet_max_off_watts()
        ),
    ))
}

pub(super) fn listen(cfg: &Config) -> Option<Finding> {
    let addr = cfg.server.listen;
    if addr.ip().is_loopback() {
        return None;
    }
    Some(finding(
        Severity::Warning,
        "server.listen",
        format!(
            "{addr} is reachable from other hosts: it serves, without authentication, /metrics (every node's power state, BMC address and fencing), /nodes (each node's decision, its BMC address and why) and /guards; listen on 127.0.0.1:{} and scrape through a proxy, or firewall the port to the Prometheus hosts",
            addr.port()
        ),
    ))
}

/// `check-config --probe`: entries that match none of the cluster's nodes (a typo in a
/// pattern, a renamed rack, nodes not joined yet), and inventory lines naming no node of it.
pub fn unmatched(cfg: &Config, nodes: &[&str]) -> Vec<Finding> {
    let mut out = Vec::new();
    for b in &cfg.bmc {
        if !nodes.iter().any(|n| b.matches(n)) {
            out.push(finding(
                Severity::Warning,
                format!("bmc[{}].nodes", b.index),
                format!(
                    "{} matches none of the cluster's {} nodes (nodes {}): a typo, a renamed rack, or nodes not joined yet",
                    b.label(),
                    nodes.len(),
                    describe_nodes(b)
                ),
            ));
            continue;
        }
        let Some(inv) = &b.inventory else {
            continue;
        };
        let in_cluster: std::collections::HashSet<&str> = nodes.iter().copied().collect();
        let missing: Vec<(&str, usize)> = inv
            .nodes()
            .into_iter()
            .filter(|(n, _)| !in_cluster.contains(n))
            .collect();
        if let Some((first, line)) = missing.first() {
            out.push(finding(
                Severity::Warning,
                format!("bmc[{}].inventory", b.index),
                format!(
                    "{} of the {} nodes of {} are not in the cluster (the first: {first}, line {line}): a typo, a renamed node, or nodes not joined yet",
                    missing.len(),
                    inv.len(),
                    inv.file.display()
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn a_glob_covers_another_only_when_surely() {
        assert!(covers("*", "rack1-*"));
        assert!(covers("rack*", "rack1-[0-9]?"));
        assert!(covers("rack1-*", "rack1-*"));
        assert!(!covers("rack1-?", "rack1-*"));
        assert!(!covers("rack1-*", "rack*"));
        assert!(!covers("rack2-*", "rack1-*"));
        assert!(!covers("*-a", "[ab]"));
    }
}
