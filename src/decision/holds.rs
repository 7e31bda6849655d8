//! Holds: reasons from outside one node to write nothing, or to fence nothing new.
//!
//! A fencer earns trust by what it refuses to do. One node's facts cannot show that 500 machines
//! "went off" at once (a BMC firmware bug, a mis-mapped rack, a cloud API answer), that
//! oobfence's own view of the cluster is stale, or that it is oobfence, not the machines, that is
//! cut off. The daemon counts the datacenter once per pass ([`Census`]); [`Calm`] keeps what must
//! outlive a pass (when a storm began and ended, when a freeze thawed, the fences of the budget
//! window) and hands each node its [`Holds`], which [`super::decide`] applies as rules of their
//! own. Everything here is pure: the clock is passed in.
//!
//! Scopes: the datacenter (every watched node) and, when `failure_domain_label` is set, each
//! failure domain (the label's value: a rack, a zone). A hold in the datacenter scope covers
//! every node; a domain's hold covers that domain's nodes only.
//!
//! Defaults, and why (docs/decisions.md "Storms and partitions" says the same):
//! - `max_unhealthy = "50%"` of the datacenter: a rack losing power is the common real case and
//!   is a minority of a datacenter; more than half NotReady at once is a datacenter-wide event
//!   (the network between nodes and control plane, the control plane itself) that a person must
//!   look at. Pacemaker's quorum and NodeHealthCheck's default `minHealthy: 51%` draw the same
//!   line.
//! - `domain_max_unhealthy = "100%"`: a whole rack may go; set it lower where a domain is large.
//! - `fence_budget = 50` per `fence_budget_window = "1h"`: one full rack (a 48U rack holds
//!   fewer machines). It catches what the NotReady count cannot see: fences whose nodes leave
//!   the count (deleted Nodes, nodes that come back and fail again), and in a large datacenter
//!   it stops an event long before half of it is NotReady.
//! - `cooldown = "5m"`: after a storm ends, the nodes that stayed down are fenced only once the
//!   rest has had time to settle.
//! - a freeze when more than half of the power sources read in a scope fail, and at least 3.
//! - `max_stale_leases = "50%"`: when more than half of the datacenter's Leases go unrenewed at
//!   once (and at least 3), it is the control plane, or oobfence's view of it, that stopped
//!   hearing the kubelets, not the machines that died: no power is read ahead of NotReady then,
//!   so an API blip never becomes a read storm against every BMC. A Lease counts once it is
//!   late ([`super::Renewals::late`]), a renewal interval before it is stale: kubelets renew at
//!   phases spread over one interval, so the storm is counted before the first Lease goes
//!   stale, not after half of the BMCs have been read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use super::{elapsed, plus, secs};

mod census;
pub use census::{Census, CensusNode, ScopeCount};

/// A count, or a share of a scope's nodes (rounded down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Limit {
    Count(u32),
    Percent(u32),
}

impl Limit {
    /// The largest number allowed out of `total`.
    pub fn of(self, total: usize) -> usize {
        match self {
            Limit::Count(n) => n as usize,
            Limit::Percent(p) => total.saturating_mul(p as usize) / 100,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Count(n) => write!(f, "{n}"),
            Limit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// The `[guards]` knobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GuardPolicy {
    /// NotReady nodes allowed in the datacenter before no new fence is made anywhere.
    pub max_unhealthy: Limit,
    /// The node label naming a node's failure domain; `None`: the datacenter is the only scope.
    pub failure_domain_label: Option<String>,
    /// NotReady nodes allowed in one failure domain before no new fence is made in it.
    pub domain_max_unhealthy: Limit,
    /// Fences allowed in any `fence_budget_window` (a share: of the datacenter's nodes).
    pub fence_budget: Limit,
    pub fence_budget_window: Duration,
    /// After a storm ends, no new fence in its scope for this long.
    pub cooldown: Duration,
    /// oobfence's view of the cluster is stale when its last successful API round trip is
    /// older than this, or a watch is broken: then nothing is written.
    pub max_view_age: Duration,
    /// A scope freezes when more than this share of the power sources read in it fail...
    pub freeze_failing_share: u32,
    /// ...and at least this many do.
    pub freeze_min_failing: u32,
    /// Stale Leases allowed in the datacenter (a share of the nodes with a Lease) before
    /// pre-attestation stops everywhere.
    pub max_stale_leases: Limit,
}

/// A lease storm needs at least this many stale Leases: in a small cluster two nodes dying at
/// once is no sign of a control plane problem.
pub const LEASE_STORM_MIN: usize = 3;

impl Default for GuardPolicy {
    fn default() -> Self {
        GuardPolicy {
            max_unhealthy: Limit::Percent(50),
            failure_domain_label: Some("topology.kubernetes.io/zone".into()),
            domain_max_unhealthy: Limit::Percent(100),
            fence_budget: Limit::Count(50),
            fence_budget_window: Duration::from_secs(3600),
            cooldown: Duration::from_secs(300),
            max_view_age: Duration::from_secs(30),
            freeze_failing_share: 50,
            freeze_min_failing: 3,
            max_stale_leases: Limit::Percent(50),
        }
    }
}

/// Where a hold applies.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "scope", content = "domain", rename_all = "snake_case")]
pub enum Scope {
    Datacenter,
    /// A failure domain: the value of `failure_domain_label` ("" for nodes without the label).
    Domain(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Datacenter => f.write_str("the datacenter"),
            Scope::Domain(d) if d.is_empty() => f.write_str("the nodes without a domain label"),
            Scope::Domain(d) => write!(f, "failure domain {d}"),
        }
    }
}

impl Scope {
    /// The value used as a metric label: `datacenter`, or `domain=VALUE`.
    pub fn label(&self) -> String {
        match self {
            Scope::Datacenter => "datacenter".into(),
            Scope::Domain(d) => format!("domain={d}"),
        }
    }
}

/// Why writes are held. Each kind is a rule of [`super::decide`] and a `blocked{reason}` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldKind {
    /// An operator paused every write (pause file or ConfigMap annotation).
    Paused,
    /// oobfence's view of the cluster is stale: nothing is decided on it.
    StaleView,
    /// Too many power sources in the scope fail at once: oobfence is the one cut off.
    SelfPartition,
    /// More NotReady nodes in the scope than `max_unhealthy` allows.
    Storm,
    /// A storm in the scope ended less than `cooldown` ago.
    StormCooldown,
    /// `fence_budget` fences already made in the window.
    FenceBudget,
    /// The power actions' own budget is spent, or one is in flight in the failure domain.
    PowerBudget,
    /// `[ha]`: another instance holds the Lease (or this one could not renew it in time).
    Standby,
}

impl HoldKind {
    /// The name of the rule it becomes in [`super::decide`].
    pub fn name(self) -> &'static str {
        match self {
            HoldKind::Paused => "paused",
            HoldKind::StaleView => "stale-view",
            HoldKind::SelfPartition => "self-partition",
            HoldKind::Storm => "storm",
            HoldKind::StormCooldown => "storm-cooldown",
            HoldKind::FenceBudget => "fence-budget",
            HoldKind::Standby => "standby",
            HoldKind::PowerBudget => "power-budget",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hold {
    pub kind: HoldKind,
    pub reason: String,
}

/// Whether a freeze holds the fence asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Freezes {
    Hold,
    /// A fence on a person's word: it rests on no read.
    Pass,
}

/// What holds back one node's writes now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Holds {
    /// Holds every write to the node: fence, unfence, clearing a record.
    pub write: Option<Hold>,
    /// Holds a new fence of the node.
    pub fence: Option<Hold>,
    /// Holds a new fence on a person's confirmation: `fence` but for a freeze, which
    /// distrusts power reads, and such a fence rests on none. A dark rack freezes its domain;
    /// a person who looked may still fence its nodes one by one.
    pub fence_on_word: Option<Hold>,
    /// Reads taken before this do not count: they predate a freeze's thaw or the view's
    /// recovery, and a decision is never made on inputs from before either.
    pub evidence_not_before: Option<Timestamp>,
    /// Why power is not read ahead of NotReady now (a lease storm, a stale view, or whatever
    /// holds a new fence): the node is then judged as if it had no Lease to go stale.
    pub pre_attest: Option<String>,
    /// The last count of the datacenter's Leases did not see this node's Lease stale: it is
    /// read ahead only once a count has (so that a storm is counted before it is read).
    pub lease_not_yet_counted: bool,
    /// Holds a power action (opt-in actuation): its own budget, one in flight per failure
    /// domain. A power-off is held by the fence holds too.
    pub power: Option<Hold>,
}

/// What a scope's state is across passes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScopeState {
    pub count: ScopeCount,
    /// In a storm since.
    pub storm_since: Option<Timestamp>,
    /// The last storm ended then.
    pub storm_ended: Option<Timestamp>,
    /// Frozen (too many power sources failing) since.
    pub frozen_since: Option<Timestamp>,
    /// The last freeze thawed then: reads from before do not count.
    pub thawed: Option<Timestamp>,
}

/// The view of the cluster, as the daemon measures it each pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The watches whose last call failed, by name (`nodes`, `leases`): each watch its own
    /// flag, so that one answering again never clears another's failure.
    pub broken_watches: Vec<&'static str>,
    /// The last successful API round trip (None: none yet).
    pub last_round_trip: Option<Timestamp>,
}

/// Whether an operator paused writes, and how they said so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// Each source that says "paused", with its words (`file /etc/oobfence/dc1.paused: reason`).
    pub by: Vec<String>,
}

impl Pause {
    pub fn is_paused(&self) -> bool {
        !self.by.is_empty()
    }
}

/// What the guards remember between passes. The daemon calls [`Calm::update`] at the start of
/// every pass, asks [`Calm::holds`] for each node, and [`Calm::record_fence`] for each fence it
/// starts (so that a fence decided earlier in the same pass counts against the budget).
/// `/guards` renders it (scopes as a list: a map keyed by [`Scope`] is no JSON object).
#[derive(Clone, Debug, Default)]
pub struct Calm {
    pub scopes: BTreeMap<Scope, ScopeState>,
    pub pause: Pause,
    /// Why the view is stale now, if it is.
    pub stale: Option<String>,
    /// `[ha]`: why this instance may not write now, if it may not.
    pub standby: Option<String>,
    /// The view was stale, and recovered then.
    pub view_recovered: Option<Timestamp>,
    /// Fences in the budget window (started or done), by node uid, oldest first.
    pub fences: Vec<(Timestamp, String)>,
    /// Nodes with a Lease and how many of those are stale, as last counted.
    pub leases: (usize, usize),
    /// How many Leases are late (stale ones included), as last counted: what a storm counts.
    pub leases_late: usize,
    /// Most Leases have been late at once since then: no pre-attestation anywhere.
    pub lease_storm_since: Option<Timestamp>,
    /// The nodes whose stale Lease the last count saw: only those are read ahead, so that a
    /// Lease going stale between two counts waits for the count that may call it a storm.
    pub stale_uids: BTreeSet<String>,
    /// The guards' record of the instance before this one is being read (after a start or a
    /// takeover), or cannot be read: its fences are not counted yet ([`record`]).
    pub record_pending: bool,
    /// Power actions of the last hour (opt-in actuation), by node uid, oldest first.
    pub power_actions: Vec<(Timestamp, String)>,
    /// The node of each failure domain ("" without the label) whose machine oobfence powered
    /// off and has not fenced yet: one at a time per domain.
    pub powering_off: BTreeMap<String, String>,
}

impl Calm {
    pub fn update(
        &mut self,
        census: &Census,
        view: &View,
        pause: Pause,
        policy: &GuardPolicy,
        now: Timestamp,
    ) {
        self.pause = pause;
        let stale = match view.last_round_trip {
            _ if !view.broken_watches.is_empty() => Some(format!(
                "the watch of {} is broken and retrying",
                view.broken_watches.join(" and ")
            )),
            None => Some("no successful Kubernetes API call yet".to_string()),
            Some(t) if elapsed(t, now) > policy.max_view_age => Some(format!(
                "the last successful Kubernetes API call was {} ago (max_view_age {})",
                secs(elapsed(t, now)),
                secs(policy.max_view_age)
            )),
            Some(_) => None,
        };
        if self.stale.is_some() && stale.is_none() {
            self.view_recovered = Some(now);
        }
        self.stale = stale;

        // Scopes no longer present keep nothing (a domain whose last node left).
        self.scopes.retain(|s, _| census.scopes.contains_key(s));
        for (scope, count) in &census.scopes {
            let limit = match scope {
                Scope::Datacenter => policy.max_unhealthy,
                Scope::Domain(_) => policy.domain_max_unhealthy,
            };
            let st = self.scopes.entry(scope.clone()).or_default();
            st.count = count.clone();
            let storm = count.unhealthy > limit.of(count.nodes);
            match (storm, st.storm_since) {
                (true, None) => st.storm_since = Some(now),
                (false, Some(_)) => {
                    st.storm_since = None;
                    st.storm_ended = Some(now);
                }
                _ => {}
            }
            let frozen = count.sources_failing >= policy.freeze_min_failing as usize
                && count.sources_failing * 100
                    > count.sources_read * policy.freeze_failing_share as usize;
            match (frozen, st.frozen_since) {
                (true, None) => st.frozen_since = Some(now),
                (false, Some(_)) => {
                    st.frozen_since = None;
                    st.thawed = Some(now);
                }
                _ => {}
            }
        }
        self.fences
            .retain(|(at, _)| elapsed(*at, now) < policy.fence_budget_window);

        self.leases = (census.leases, census.leases_stale);
        self.leases_late = census.leases_late;
        self.stale_uids.clone_from(&census.stale_uids);
        let lease_storm = census.leases_late >= LEASE_STORM_MIN
            && census.leases_late > policy.max_stale_leases.of(census.leases);
        match (lease_storm, self.lease_storm_since) {
            (true, None) => self.lease_storm_since = Some(now),
            (false, Some(_)) => self.lease_storm_since = None,
            _ => {}
        }
    }

    /// Why no power is read ahead of NotReady in the datacenter now, if a lease storm is why.
    pub fn lease_storm(&self, policy: &GuardPolicy) -> Option<String> {
        let since = self.lease_storm_since?;
        Some(format!(
            "{} of {} Leases went unrenewed at once (more than max_stale_leases = {}, since {}): the control plane or oobfence's view of it stopped hearing the kubelets, not the machines; no power is read ahead of NotReady",
            self.leases_late,
            self.leases.0,
            policy.max_stale_leases,
            since.strftime("%Y-%m-%dT%H:%M:%SZ")
        ))
    }

    /// A fence of node `uid` started at `now`: it counts against the budget (once per node).
    pub fn record_fence(&mut self, uid: &str, now: Timestamp) {
        if !self.fences.iter().any(|(_, u)| u == uid) {
            self.fences.push((now, uid.to_string()));
        }
    }

    /// The budget's fence count once it is spent, `None` below it: all a node's holds can show
    /// of the budget. Below it no node is held by the budget, so a fence that leaves it unspent
    /// changes no node's holds (and a storm's fences need not have every healthy node decided
    /// again, pass after pass).
    pub fn budget_spent(&self, policy: &GuardPolicy) -> Option<usize> {
        let used = self.fences.len();
        (used >= self.budget(policy).0).then_some(used)
    }

    /// The fences of the budget window and the budget now: (used, allowed).
    pub fn fence_budget(&self, policy: &GuardPolicy) -> (usize, usize) {
        (self.fences.len(), self.budget(policy).0)
    }

    /// The fence budget now, and the datacenter's node count it is a share of.
    fn budget(&self, policy: &GuardPolicy) -> (usize, usize) {
        let total = self
            .scopes
            .get(&Scope::Datacenter)
            .map(|s| s.count.nodes)
            .unwrap_or(0);
        (policy.fence_budget.of(total), total)
    }

    /// A fence that wrote nothing (abandoned, failed) gives its place in the budget back.
    pub fn forget_fence(&mut self, uid: &str) {
        self.fences.retain(|(_, u)| u != uid);
    }

    /// The holds on a node in failure domain `domain` (None: no label) with uid `uid`.
    pub fn holds(
        &self,
        domain: Option<&str>,
        uid: &str,
        policy: &GuardPolicy,
        now: Timestamp,
    ) -> Holds {
        let domain_scope = policy
            .failure_domain_label
            .as_ref()
            .map(|_| Scope::Domain(domain.unwrap_or_default().to_string()));
        let scopes: Vec<(&Scope, &ScopeState)> = std::iter::once(Scope::Datacenter)
            .chain(domain_scope)
            .filter_map(|s| self.scopes.get_key_value(&s))
            .collect();

        let write = self.write_hold();
        let fence = self.fence_hold(&scopes, uid, policy, now, Freezes::Hold);
        let fence_on_word = self.fence_hold(&scopes, uid, policy, now, Freezes::Pass);
        let evidence_not_before = scopes
            .iter()
            .filter_map(|(_, st)| st.thawed)
            .chain(self.view_recovered)
            .max();
        // Reading ahead is for a fence that could follow: not while nothing new may be fenced,
        // nor on a view that cannot see renewals.
        let pre_attest = self
            .lease_storm(policy)
            .or_else(|| {
                write
                    .as_ref()
                    .filter(|h| h.kind == HoldKind::StaleView)
                    .map(|h| h.reason.clone())
            })
            .or_else(|| fence.as_ref().map(|h| h.reason.clone()));
        Holds {
            write,
            fence,
            fence_on_word,
            evidence_not_before,
            pre_attest,
            lease_not_yet_counted: !self.stale_uids.contains(uid),
            power: None,
        }
    }

    /// What holds every write now, whatever the node: a pause, a stale view, standby. The
    /// writer asks it for an object no pass holds a node's holds for (the VolumeAttachments of
    /// a Node just deleted).
    pub fn write_hold(&self) -> Option<Hold> {
        if self.pause.is_paused() {
            Some(Hold {
                kind: HoldKind::Paused,
                reason: format!(
                    "writes are paused by an operator ({}); resume with `oobfence resume` or by removing the annotation",
                    self.pause.by.join("; ")
                ),
            })
        } else if let Some(why) = &self.stale {
            Some(Hold {
                kind: HoldKind::StaleView,
                reason: format!(
                    "oobfence's view of the cluster is stale ({why}): nothing is decided on it until the API answers again"
                ),
            })
        } else {
            self.standby.as_ref().map(|why| Hold {
                kind: HoldKind::Standby,
                reason: format!("{why} ([ha]: one instance of a datacenter writes)"),
            })
        }
    }

    fn fence_hold(
        &self,
        scopes: &[(&Scope, &ScopeState)],
        uid: &str,
        policy: &GuardPolicy,
        now: Timestamp,
        freezes: Freezes,
    ) -> Option<Hold> {
        for (scope, st) in scopes.iter().filter(|_| freezes == Freezes::Hold) {
            if let Some(since) = st.frozen_since {
                return Some(Hold {
                    kind: HoldKind::SelfPartition,
                    reason: format!(
                        "{} of {} power sources read in {scope} fail (since {}): oobfence is likely the one cut off, so no new fence there until they answer again",
                        st.count.sources_failing,
                        st.count.sources_read,
                        since.strftime("%Y-%m-%dT%H:%M:%SZ")
                    ),
                });
            }
        }
        for (scope, st) in scopes {
            if let Some(since) = st.storm_since {
                let limit = match scope {
                    Scope::Datacenter => ("max_unhealthy", policy.max_unhealthy),
                    Scope::Domain(_) => ("domain_max_unhealthy", policy.domain_max_unhealthy),
                };
                return Some(Hold {
                    kind: HoldKind::Storm,
                    reason: format!(
                        "{} of {} nodes in {scope} are NotReady (or, with release_at_attestation, silent with a stale Lease), more than {} = {} allows (since {}): a storm is not fenced node by node; no new fence there until it drops, then a {} cooldown",
                        st.count.unhealthy,
                        st.count.nodes,
                        limit.0,
                        limit.1,
                        since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        secs(policy.cooldown)
                    ),
                });
            }
        }
        for (scope, st) in scopes {
            if let Some(ended) = st.storm_ended
                && elapsed(ended, now) < policy.cooldown
            {
                return Some(Hold {
                    kind: HoldKind::StormCooldown,
                    reason: format!(
                        "a storm in {scope} ended at {}; no new fence there until {} (cooldown {})",
                        ended.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        plus(ended, policy.cooldown).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        secs(policy.cooldown)
                    ),
                });
            }
        }
        if self.record_pending {
            return Some(Hold {
                kind: HoldKind::FenceBudget,
                reason: "the guards' record (the fences, storm cooldowns and power actions of the instance before this one) is being read, or cannot be read (see the log and oobfence_guard_record_ok): no new fence until they are counted; an unreadable record is not taken as an empty one".into(),
            });
        }
        let (budget, total) = self.budget(policy);
        let used = self
            .fences
            .iter()
            .filter(|(at, u)| u != uid && elapsed(*at, now) < policy.fence_budget_window)
            .count();
        if used >= budget {
            let next = self
                .fences
                .iter()
                .map(|(at, _)| plus(*at, policy.fence_budget_window))
                .min();
            return Some(Hold {
                kind: HoldKind::FenceBudget,
                reason: format!(
                    "{used} fences in the last {} already use the fence budget ({} = {budget} of {total} nodes){}",
                    secs(policy.fence_budget_window),
                    policy.fence_budget,
                    next.map(|t| format!(
                        "; the next place frees at {}",
                        t.strftime("%Y-%m-%dT%H:%M:%SZ")
                    ))
                    .unwrap_or_default()
                ),
            });
        }
        None
    }
}

pub mod power;
pub mod record;

#[cfg(test)]
mod tests;
