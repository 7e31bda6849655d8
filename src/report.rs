//! What the daemon thinks of a node, as served on `/nodes/NAME` and printed by `oobfence why`.

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::decision::PowerReading;
use crate::decision::{Decision, NodeFacts, Readiness};
use crate::identity::IdentityCheck;

mod confirmation;
mod table;

pub use confirmation::ConfirmationReport;
pub use table::{render_table, short_age, short_state};
mod levels;
pub use levels::LevelSourceReport;

/// One node's facts, reads and decision. Owned strings only, so the CLI can parse it back
/// without knowing the daemon's internal types.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeReport {
    pub node: String,
    pub datacenter: String,
    pub evaluated_at: Timestamp,
    /// healthy, suspect, confirming, blocked, fenced, recovering.
    pub state: String,
    /// idle, fence, would_fence, unfence, would_unfence, clear_record.
    pub step: String,
    pub rule: String,
    pub reason: String,
    pub dry_run: bool,
    /// Dry run only: the write announced for the node's current outage (taint, delete_node,
    /// untaint, power_off, power_on), which oobfence would have made had `dry_run` been off.
    /// Kept while the decision is re-made (its reads age out and are taken again) until the
    /// node is healthy again or boots anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would: Option<String>,
    /// Ready, NotReady or NoCondition.
    pub ready: String,
    pub not_ready_since: Option<Timestamp>,
    /// When oobfence (by its own clock) last saw the node's Lease renewed.
    pub lease_renewed: Option<Timestamp>,
    /// Whether that is a renewal oobfence watched happen, not the Lease as it first found it
    /// (after a start or a takeover): only a silence watched begin is a hang to power off.
    #[serde(default)]
    pub lease_watched: bool,
    /// When oobfence (by its own clock) last saw a new Ready heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_seen: Option<Timestamp>,
    /// After how long without a sign of life the Lease is stale and power is read ahead of
    /// NotReady (none: no Lease, or pre-attestation off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_stale_after_seconds: Option<f64>,
    pub boot_id: String,
    pub power_source: Option<PowerSourceReport>,
    /// Whether the power source's machine is proven to be this node's.
    #[serde(default)]
    pub identity: IdentityReport,
    pub fence: Option<FenceReport>,
    /// Newest last.
    pub reads: Vec<ReadReport>,
    pub read_in_flight: bool,
    pub next_read_at: Option<Timestamp>,
    /// The last action's outcome, if it failed.
    pub last_action_error: Option<String>,
    /// When a failed action is tried again, if it is waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_retry_at: Option<Timestamp>,
    /// Holds from outside the node in force now (pause, stale view, storm, freeze, budget),
    /// as `rule: reason`, whether or not the node is at the point of a write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<String>,
    /// A person's confirmation on the Node (`oobfence.io/confirmed-off`), and whether it
    /// stands, whether or not the decision consulted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<ConfirmationReport>,
    /// Every power source of the node, level by level.
    #[serde(default)]
    pub levels: Vec<LevelSourceReport>,
    /// What the decision rests on: `none`, `attested`, `unattested`, `person`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PowerSourceReport {
    pub backend: String,
    pub address: String,
    /// When it last answered a read (any answer but an error), if it has since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<Timestamp>,
    /// When it was last read, and whether that read failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read: Option<Timestamp>,
    #[serde(default)]
    pub last_read_failed: bool,
    /// It read Off while the node was Ready: when, and the kubelet's signs of life since
    /// (two prove it wrong: rule off-while-alive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_while_alive: Option<crate::decision::OffWhileAlive>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FenceReport {
    pub at: Timestamp,
    pub boot_id: String,
    pub taint_present: bool,
    /// Placed by this daemon (`oobfence.io/fenced-by`), not another oobfence.
    #[serde(default)]
    pub ours: bool,
}

/// The node's identity as the kubelet reported it, and the last verification of its machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IdentityReport {
    /// `status.nodeInfo.systemUUID`.
    pub system_uuid: String,
    /// InternalIP, Hostname and InternalDNS addresses.
    pub addresses: Vec<String>,
    /// `checked` or `unchecked` (the entry's `identity`).
    pub check: String,
    /// `match`, `mismatch` or `unverifiable`; none before the first read.
    pub verdict: Option<String>,
    pub detail: Option<String>,
    pub verified_at: Option<Timestamp>,
    /// Who answered the read that verified it: a "gone" answer counts only through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_through: Option<String>,
    /// Other Nodes that report the same system UUID (it then proves no machine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uuid_shared_with: Vec<String>,
    /// Why the mapping cannot be trusted (region mismatch, machine shared with another node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping_conflict: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReadReport {
    pub at: Timestamp,
    /// on, off, transitional, error.
    pub result: String,
    /// The full state as text (`Off`, `error: timeout: ...`).
    pub value: String,
    pub latency_seconds: f64,
    /// Evidence beyond the state (`name: value`), e.g. IPMI fault bits or EC2 volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// What the machine that answered says it is.
    #[serde(default)]
    pub identity: String,
    /// Who answered: the source, where it asked and as whom.
    #[serde(default)]
    pub reader: String,
}

impl From<&PowerReading> for ReadReport {
    fn from(r: &PowerReading) -> Self {
        ReadReport {
            at: r.at,
            result: r.state.label().to_string(),
            value: r.state.to_string(),
            latency_seconds: r.latency.as_secs_f64(),
            details: r.details.iter().map(ToString::to_string).collect(),
            identity: r.identity.to_string(),
            reader: r.reader.clone(),
        }
    }
}

/// Inputs for [`NodeReport::new`], grouped to keep the call readable.
pub struct ReportInputs<'a> {
    pub node: &'a str,
    pub datacenter: &'a str,
    pub now: Timestamp,
    pub facts: &'a NodeFacts,
    pub decision: &'a Decision,
    pub reads: &'a [PowerReading],
    pub power_source: Option<PowerSourceReport>,
    pub dry_run: bool,
    /// See [`NodeReport::would`].
    pub would: Option<&'static str>,
    pub read_in_flight: bool,
    pub last_action_error: Option<String>,
    pub action_retry_at: Option<Timestamp>,
    /// `lease_stale_after` renewal intervals of the node's Lease (none: pre-attestation off).
    pub lease_stale_after: Option<std::time::Duration>,
    pub confirmation: Option<ConfirmationReport>,
    pub levels: Vec<LevelSourceReport>,
    pub basis: Option<String>,
}

impl NodeReport {
    /// The state `nodes` shows: in a dry run, what the node would be had oobfence written
    /// (`would-fence`, `would-untaint`, `would-power-off`, `would-power-on`), else its state.
    pub fn shown_state(&self) -> String {
        match self.would.as_deref() {
            Some(a) if is_fence(a) => "would-fence".to_string(),
            Some(a) => format!("would-{}", a.replace('_', "-")),
            None => self.state.clone(),
        }
    }

    pub fn new(i: ReportInputs<'_>) -> NodeReport {
        let (ready, since) = match i.facts.readiness {
            Readiness::Ready => ("Ready", None),
            Readiness::NotReady { since } => ("NotReady", Some(since)),
            Readiness::NoCondition => ("NoCondition", None),
        };
        let step = serde_json::to_value(i.decision.step)
            .ok()
            .and_then(|v| v.get("step").and_then(|s| s.as_str()).map(String::from))
            .unwrap_or_default();
        const SHOWN_READS: usize = 8;
        NodeReport {
            node: i.node.to_string(),
            datacenter: i.datacenter.to_string(),
            evaluated_at: i.now,
            state: i.decision.state.as_str().to_string(),
            step,
            rule: i.decision.rule.name().to_string(),
            reason: i.decision.reason.clone(),
            dry_run: i.dry_run,
            would: i.would.map(String::from),
            ready: ready.to_string(),
            not_ready_since: since,
            lease_renewed: i.facts.lease_renewal_seen,
            lease_watched: i.facts.lease_renewal_seen.is_some() && !i.facts.lease_first_sight,
            heartbeat_seen: i.facts.heartbeat_seen,
            lease_stale_after_seconds: i
                .lease_stale_after
                .filter(|_| i.facts.lease_renewal_seen.is_some())
                .map(|d| d.as_secs_f64()),
            boot_id: i.facts.boot_id.clone(),
            power_source: i.power_source,
            identity: IdentityReport {
                system_uuid: i.facts.identity.system_uuid.clone(),
                addresses: i.facts.identity.addresses.clone(),
                check: match i.facts.identity_check {
                    IdentityCheck::Checked => "checked",
                    IdentityCheck::Unchecked => "unchecked",
                }
                .into(),
                verdict: i
                    .facts
                    .identity_binding
                    .as_ref()
                    .map(|b| b.verdict.label().to_string()),
                detail: i
                    .facts
                    .identity_binding
                    .as_ref()
                    .map(|b| b.verdict.detail().to_string()),
                verified_at: i.facts.identity_binding.as_ref().map(|b| b.at),
                verified_through: i.facts.identity_binding.as_ref().map(|b| b.reader.clone()),
                uuid_shared_with: i.facts.identity.uuid_shared_with.clone(),
                mapping_conflict: i.facts.mapping_conflict.as_ref().map(ToString::to_string),
            },
            fence: i.facts.fence.as_ref().map(|f| FenceReport {
                at: f.at,
                boot_id: f.boot_id.clone(),
                taint_present: f.taint_present,
                ours: f.ours,
            }),
            reads: i
                .reads
                .iter()
                .skip(i.reads.len().saturating_sub(SHOWN_READS))
                .map(ReadReport::from)
                .collect(),
            read_in_flight: i.read_in_flight,
            next_read_at: i.decision.next_read_at,
            last_action_error: i.last_action_error,
            action_retry_at: i.action_retry_at,
            holds: describe_holds(&i.facts.holds),
            confirmation: i.confirmation,
            levels: i.levels,
            basis: i.basis,
        }
    }

    /// The `oobfence why` text: what the daemon thinks and the rule that made it.
    pub fn render(&self, now: Timestamp) -> String {
        let ago = |t: Timestamp| -> String {
            let secs = now.duration_since(t).as_secs();
            if secs < 0 {
                format!("{t} (in the future: clock skew?)")
            } else {
                let d = std::time::Duration::from_secs(secs as u64);
                format!("{t} ({} ago)", humantime::format_duration(d))
            }
        };
        let mut s = String::new();
        let _ = writeln!(s, "node {} (datacenter {})", self.node, self.datacenter);
        let _ = writeln!(s, "  state:        {}", self.state);
        let _ = writeln!(
            s,
            "  decision:     {}{} — rule {}",
            self.step,
            if self.dry_run { " (dry run)" } else { "" },
            self.rule
        );
        let _ = writeln!(s, "  why:          {}", self.reason);
        match self.not_ready_since {
            Some(t) => {
                let _ = writeln!(s, "  ready:        NotReady since {}", ago(t));
            }
            None => {
                let _ = writeln!(s, "  ready:        {}", self.ready);
            }
        }
        let _ = writeln!(
            s,
            "  lease:        {}",
            match (self.lease_renewed, self.lease_watched) {
                (Some(t), true) => format!("renewal last seen by oobfence {}", ago(t)),
                (Some(t), false) => format!(
                    "first seen by oobfence {}, no renewal watched since (a silence that began before is not one oobfence saw begin)",
                    ago(t)
                ),
                (None, _) => "none in kube-node-lease".into(),
            }
        );
        if let Some(t) = self.heartbeat_seen {
            let _ = writeln!(
                s,
                "  heartbeat:    new Ready heartbeat last seen {}",
                ago(t)
            );
        }
        if let Some(after) = self.lease_stale_after_seconds {
            let _ = writeln!(
                s,
                "  pre-attest:   power is read ahead of NotReady after {after}s without a sign of life (lease_stale_after)"
            );
        }
        let _ = writeln!(
            s,
            "  boot id:      {}",
            if self.boot_id.is_empty() {
                "(not reported)"
            } else {
                &self.boot_id
            }
        );
        let _ = writeln!(
            s,
            "  power source: {}",
            self.power_source
                .as_ref()
                .map(|p| {
                    let last = match (p.last_read, p.last_answer) {
                        (None, _) => "not read yet".to_string(),
                        (Some(r), _) if !p.last_read_failed => format!("answered {}", ago(r)),
                        (Some(r), Some(a)) => {
                            format!("last read {} FAILED; last answer {}", ago(r), ago(a))
                        }
                        (Some(r), None) => {
                            format!("last read {} FAILED; no answer since the start", ago(r))
                        }
                    };
                    format!("{} {} ({last})", p.backend, p.address)
                })
                .unwrap_or_else(|| "none: no [[bmc]] entry matches this node".into())
        );
        levels::render(&mut s, &self.levels, ago);
        if let Some(o) = self
            .power_source
            .as_ref()
            .and_then(|p| p.off_while_alive.as_ref())
        {
            let verdict = if o.proven() {
                "UNTRUSTED: the kubelet went on living"
            } else {
                "watching the kubelet"
            };
            let _ = writeln!(
                s,
                "  power source: read Off {} while the node was Ready; {} sign(s) of life since ({verdict})",
                ago(o.read_at),
                o.signs_of_life_after
            );
        }
        let id = &self.identity;
        let _ = writeln!(
            s,
            "  identity:     node reports system UUID {}, addresses {} (identity {})",
            if id.system_uuid.is_empty() {
                "(none)"
            } else {
                &id.system_uuid
            },
            if id.addresses.is_empty() {
                "(none)".to_string()
            } else {
                id.addresses.join(", ")
            },
            id.check
        );
        match (&id.verdict, &id.detail, id.verified_at) {
            (Some(v), Some(d), Some(t)) => {
                let through = id
                    .verified_through
                    .as_deref()
                    .map(|r| format!(" through {r}"))
                    .unwrap_or_default();
                let _ = writeln!(s, "  machine:      {v}: {d} (read {}{through})", ago(t));
            }
            _ => {
                let _ = writeln!(s, "  machine:      not read yet");
            }
        }
        if let Some(c) = &id.mapping_conflict {
            let _ = writeln!(s, "  mapping:      UNTRUSTED: {c}");
        }
        if !id.uuid_shared_with.is_empty() {
            let _ = writeln!(
                s,
                "  system UUID:  UNTRUSTED: node(s) {} report it too (or in another byte order); it proves no machine",
                id.uuid_shared_with.join(", ")
            );
        }
        if let Some(f) = &self.fence {
            let _ = writeln!(
                s,
                "  fenced:       at {}, boot id then {}, taint {}{}",
                ago(f.at),
                f.boot_id,
                if f.taint_present { "present" } else { "gone" },
                if f.ours {
                    ""
                } else {
                    ", placed by ANOTHER oobfence (never lifted here)"
                }
            );
        }
        if let Some(c) = &self.confirmation {
            c.render(&mut s);
        }
        for h in &self.holds {
            let _ = writeln!(s, "  held:         {h}");
        }
        if let Some(e) = &self.last_action_error {
            let _ = writeln!(s, "  last action:  FAILED: {e}");
            if let Some(at) = self.action_retry_at {
                let _ = writeln!(s, "  next attempt: {}", at.strftime("%Y-%m-%dT%H:%M:%SZ"));
            }
        }
        if self.reads.is_empty() {
            let _ = writeln!(s, "  power reads:  none");
        } else {
            let _ = writeln!(s, "  power reads (newest last):");
            for r in &self.reads {
                let _ = writeln!(
                    s,
                    "    {}  {:<40} {:>7.3}s",
                    r.at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ"),
                    r.value,
                    r.latency_seconds
                );
                if !r.identity.is_empty() {
                    let _ = writeln!(s, "        from: {}", r.identity);
                }
                if !r.reader.is_empty() {
                    let _ = writeln!(s, "        through: {}", r.reader);
                }
                for d in &r.details {
                    let _ = writeln!(s, "        {d}");
                }
            }
        }
        if self.read_in_flight {
            let _ = writeln!(s, "  a power read is in progress");
        } else if let Some(t) = self.next_read_at {
            let _ = writeln!(s, "  next read:    not before {t}");
        }
        s
    }
}

/// The holds in force on a node, as `rule: reason` (the rule names of [`crate::decision::Rule`]).
fn describe_holds(h: &crate::decision::Holds) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(w) = &h.write {
        out.push(format!("{} (every write): {}", w.kind.name(), w.reason));
    }
    if let Some(f) = &h.fence {
        out.push(format!("{} (new fences): {}", f.kind.name(), f.reason));
    }
    if let Some(p) = &h.power {
        out.push(format!("{} (power actions): {}", p.kind.name(), p.reason));
    }
    if let Some(t) = h.evidence_not_before {
        out.push(format!(
            "power reads from before {} do not count (a freeze thawed or the view recovered then)",
            t.strftime("%Y-%m-%dT%H:%M:%SZ")
        ));
    }
    out
}

/// A fencing write (what `would-fence` stands for), of the names [`NodeReport::would`] takes.
fn is_fence(action: &str) -> bool {
    matches!(action, "taint" | "delete_node")
}
