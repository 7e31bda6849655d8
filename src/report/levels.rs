//! A node's fencing levels as `why` and `/nodes` show them: each source with its level, its
//! last read and what it said, and which one the decision rests on.

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// One power source of a node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LevelSourceReport {
    pub level: u32,
    /// The entry, its backend and target: `[[bmc]] #2 (line 9) (fence-agent fence_ipmilan ...)`.
    pub source: String,
    /// It proves whose machine it reads (`false`: the mapping the config wrote is the proof).
    pub attested: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read: Option<Timestamp>,
    #[serde(default)]
    pub last_read_failed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<Timestamp>,
    /// What its newest read kept as evidence said (`off`, `on`, `unreachable: ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub said: Option<String>,
    /// The decision is this source's (its level spoke).
    #[serde(default)]
    pub chosen: bool,
}

/// The `levels:` lines of `why`, where a node has more than one source or a level above 1.
pub(super) fn render(
    s: &mut String,
    levels: &[LevelSourceReport],
    ago: impl Fn(Timestamp) -> String,
) {
    if levels.len() < 2 && levels.iter().all(|l| l.level == 1) {
        return;
    }
    let _ = writeln!(
        s,
        "  levels:       tried in order; the first that can answer decides"
    );
    for l in levels {
        let last = match (l.last_read, l.last_answer) {
            (None, _) => "not read yet".to_string(),
            (Some(r), _) if !l.last_read_failed => format!("answered {}", ago(r)),
            (Some(r), Some(a)) => format!("last read {} FAILED; last answer {}", ago(r), ago(a)),
            (Some(r), None) => format!("last read {} FAILED; no answer since the start", ago(r)),
        };
        let said = l
            .said
            .as_deref()
            .map_or(String::new(), |x| format!("; said {x}"));
        let _ = writeln!(
            s,
            "    level {}: {}{} ({last}{said}){}",
            l.level,
            l.source,
            if l.attested { "" } else { ", unattested" },
            if l.chosen { " <- decides" } else { "" }
        );
    }
}
