//! Records of the daemon's own changes (kind `daemon`): a pause and its resume, a reload, a
//! leadership change, a storm or freeze beginning and ending, a fence or power budget spent.
//! Before these were journalled they went to journald only, which rotates away before the
//! morning after; now `oobfence timeline` tells them in order with the nodes' records.
//!
//! Each is written once per transition, never per pass. The record's `rule` names the topic
//! ([`Topic`]), `result` what happened (`began`, `ended`, `ok`, `refused`...), `message` the
//! same words the log line says, and `change` the details a script wants.

use serde::{Deserialize, Serialize};

use super::{Journal, Record, RecordKind};

/// What a daemon record is about: its `rule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    /// Writes paused by an operator (file or ConfigMap), or resumed.
    Pause,
    /// `systemctl reload`: the config read again, applied or refused.
    Reload,
    /// `[ha]`: this instance became the one that writes, or stopped being it.
    Leadership,
    /// Too many NotReady nodes in a scope: no new fence there.
    Storm,
    /// Too many power sources failing at once in a scope: no new fence there.
    Freeze,
    /// Most Leases unrenewed at once: no power read ahead of NotReady.
    LeaseStorm,
    /// The view of the cluster too old to write on.
    StaleView,
    /// A fence started and counted against the fence budget.
    FenceBudget,
    /// A power action started and counted against the power budget.
    PowerBudget,
}

impl Topic {
    pub fn name(self) -> &'static str {
        match self {
            Topic::Pause => "pause",
            Topic::Reload => "reload",
            Topic::Leadership => "leadership",
            Topic::Storm => "storm",
            Topic::Freeze => "freeze",
            Topic::LeaseStorm => "lease-storm",
            Topic::StaleView => "stale-view",
            Topic::FenceBudget => "fence-budget",
            Topic::PowerBudget => "power-budget",
        }
    }
}

/// The details of a daemon record; every field is optional, each topic fills its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The guard's scope: `datacenter` or `domain=VALUE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Pause: each switch that says "paused", with its words (who and why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
    /// Pause: `file`, `configmap`, or both (`file+configmap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
    /// Reload: the config digest before and after (the same when refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest_after: Option<String>,
    /// Leadership: this instance's `[ha] identity`, the Lease's holder as last seen, the term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<i32>,
    /// Budgets: how many of the window's allowance are used, with this one, and the allowance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl Change {
    /// What a budget record says is left.
    pub fn left(&self) -> Option<usize> {
        Some(self.limit?.saturating_sub(self.used?))
    }
}

/// Which switches a pause's words come from (the words begin with `file` or `ConfigMap`).
pub fn pause_switch(by: &[String]) -> Option<String> {
    let file = by.iter().any(|b| b.starts_with("file "));
    let configmap = by.iter().any(|b| b.starts_with("ConfigMap "));
    match (file, configmap) {
        (true, true) => Some("file+configmap".into()),
        (true, false) => Some("file".into()),
        (false, true) => Some("configmap".into()),
        (false, false) => None,
    }
}

impl Journal {
    /// A record of the daemon's own change: about no node (`node` empty) unless `node` names
    /// the one it concerns (a budget spent on it).
    pub fn daemon_record(
        &self,
        topic: Topic,
        node: &str,
        result: &str,
        message: String,
        change: Change,
    ) -> Record {
        let mut r = self.record(
            node,
            "",
            RecordKind::Daemon,
            topic.name(),
            Default::default(),
        );
        r.result = result.to_string();
        r.message = message;
        r.change = Some(change);
        r
    }
}
