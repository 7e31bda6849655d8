//! `oobfence nodes`: the watched nodes as a table, one line each, as `kubectl get` prints
//! objects; and the short words and ages its cells are made of.

use jiff::Timestamp;

use super::{NodeReport, is_fence};
use crate::decision::PowerState;

/// A read's state as a short word for tables.
pub fn short_state(state: &PowerState) -> String {
    match state {
        PowerState::On => "On".into(),
        PowerState::Off => "Off".into(),
        other => other.to_string(),
    }
}

/// How long ago `t` was, short (`12s`, `4m`, `3h`, `2d`), as `kubectl get` shows ages.
pub fn short_age(t: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(t).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `oobfence nodes`: one line per watched node, as `kubectl get` prints objects, then a count
/// by state.
pub fn render_table(reports: &[NodeReport], now: Timestamp) -> String {
    let mut rows = vec![[
        "NODE".to_string(),
        "STATE".to_string(),
        "READY".to_string(),
        "RULE".to_string(),
        "POWER SOURCE".to_string(),
        "LAST ANSWER".to_string(),
        "IDENTITY".to_string(),
    ]];
    let mut sorted: Vec<&NodeReport> = reports.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    for r in &sorted {
        let (source, answer) = match &r.power_source {
            None => ("-".to_string(), "-".to_string()),
            Some(p) => {
                let answer = match (p.last_read, p.last_answer, p.last_read_failed) {
                    (None, _, _) => "not read".to_string(),
                    (Some(_), Some(a), false) => short_age(a, now),
                    (Some(r), _, true) => format!("FAILED {}", short_age(r, now)),
                    (Some(r), None, false) => short_age(r, now),
                };
                let answer = match &p.off_while_alive {
                    Some(o) if o.proven() => format!("{answer}, OFF WHILE ALIVE"),
                    _ => answer,
                };
                (p.backend.clone(), answer)
            }
        };
        let identity = match (&r.identity.mapping_conflict, &r.identity.verdict) {
            (Some(_), _) => "UNTRUSTED".to_string(),
            (None, Some(v)) => v.clone(),
            (None, None) if r.power_source.is_some() => "unknown".to_string(),
            (None, None) => "-".to_string(),
        };
        let ready = match (r.ready.as_str(), r.not_ready_since) {
            ("NotReady", Some(t)) => format!("NotReady {}", short_age(t, now)),
            (other, _) => other.to_string(),
        };
        rows.push([
            r.node.clone(),
            r.shown_state(),
            ready,
            r.rule.clone(),
            source,
            answer,
            identity,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in reports {
        *counts.entry(r.shown_state()).or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    out.push_str(&format!(
        "{} node(s): {}\n",
        reports.len(),
        if summary.is_empty() {
            "none".to_string()
        } else {
            summary.join(", ")
        }
    ));
    if reports.iter().any(|r| r.dry_run) {
        let would: Vec<&str> = sorted
            .iter()
            .filter(|r| r.would.as_deref().is_some_and(is_fence))
            .map(|r| r.node.as_str())
            .collect();
        out.push_str(&format!(
            "dry run (policy.dry_run = true): nothing is written; {} node(s) would be fenced now{}\n",
            would.len(),
            if would.is_empty() {
                String::new()
            } else {
                format!(": {}", would.join(", "))
            }
        ));
    }
    out
}
