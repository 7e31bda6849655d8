//! The census: the datacenter counted once per pass, before any node is decided — nodes and
//! unhealthy ones, power sources read and failing, per scope, and the Leases late and stale.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::Scope;
use serde::Serialize;

use crate::decision::LeaseState;

/// One node, as the census counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CensusNode<'a> {
    /// Borrowed from the cached Node where it can be: a pass counts every node, every second.
    pub uid: Cow<'a, str>,
    /// The failure domain label's value (None: no label; counted as the domain "").
    pub domain: Option<Cow<'a, str>>,
    /// NotReady (Ready=False or Unknown), fenced or not; with `release_at_attestation`, also
    /// silent with its Lease stale ([`CensusNode::counts_unhealthy`]).
    pub unhealthy: bool,
    /// Whether its power source's last read (within the failing window) failed; `None`: not
    /// read recently, or no power source.
    pub source_failing: Option<bool>,
    /// Where its Lease stands ([`super::lease_state`]); `None`: no Lease.
    pub lease: Option<LeaseState>,
}

impl CensusNode<'_> {
    /// Whether a node counts toward a storm: NotReady; or, where a node still showing Ready
    /// may be fenced on its proof alone (`release_at_attestation`), silent long enough that
    /// its power is read ahead (its Lease stale). A rack that loses power is then a storm
    /// before any of it is written, as it would be once NotReady.
    pub fn counts_unhealthy(
        not_ready: bool,
        lease: Option<LeaseState>,
        release_at_attestation: bool,
    ) -> bool {
        not_ready || (release_at_attestation && lease == Some(LeaseState::Stale))
    }
}

/// One pass's count of a scope.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScopeCount {
    pub nodes: usize,
    pub unhealthy: usize,
    pub sources_read: usize,
    pub sources_failing: usize,
}

/// The datacenter counted once per pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub scopes: BTreeMap<Scope, ScopeCount>,
    /// Nodes with a Lease, and how many of those Leases are late (stale ones included) and
    /// stale (the datacenter only: a control plane problem is never one rack's).
    pub leases: usize,
    pub leases_late: usize,
    pub leases_stale: usize,
    /// The uids of the nodes whose Lease is stale.
    pub stale_uids: BTreeSet<String>,
}

impl Census {
    pub fn count<'a, 'n: 'a>(
        nodes: impl IntoIterator<Item = &'a CensusNode<'n>>,
        by_domain: bool,
    ) -> Census {
        let mut scopes: BTreeMap<Scope, ScopeCount> = BTreeMap::new();
        let (mut leases, mut leases_late, mut leases_stale) = (0, 0, 0);
        let mut stale_uids = BTreeSet::new();
        // Counted by domain name first: one hash per node, no Scope built per node.
        let mut datacenter = ScopeCount::default();
        let mut domains: std::collections::HashMap<&str, ScopeCount> = Default::default();
        for n in nodes {
            if let Some(lease) = n.lease {
                leases += 1;
                leases_late += (lease != LeaseState::Renewing) as usize;
                if lease == LeaseState::Stale {
                    leases_stale += 1;
                    stale_uids.insert(n.uid.to_string());
                }
            }
            let add = |c: &mut ScopeCount| {
                c.nodes += 1;
                c.unhealthy += n.unhealthy as usize;
                if let Some(failing) = n.source_failing {
                    c.sources_read += 1;
                    c.sources_failing += failing as usize;
                }
            };
            add(&mut datacenter);
            if by_domain {
                add(domains
                    .entry(n.domain.as_deref().unwrap_or_default())
                    .or_default());
            }
        }
        scopes.insert(Scope::Datacenter, datacenter);
        for (domain, count) in domains {
            scopes.insert(Scope::Domain(domain.to_string()), count);
        }
        Census {
            scopes,
            leases,
            leases_late,
            leases_stale,
            stale_uids,
        }
    }
}
