//! Facts for one node: what the core is given to decide it. The Node and its Lease as cached,
//! the power source and mapping the config gives it, the holds the guards put on it, and what
//! its tracker remembers (signs of life by oobfence's clock, the identity binding, an Off read
//! while it lived). Nothing here decides.

use std::sync::Arc;

use jiff::Timestamp;

use super::guards::failure_domain;
use super::state::Daemon;
use super::tracker::Tracker;
use crate::cluster;
use crate::cluster::NodeView;
use crate::decision::NodeFacts;
use crate::power::MappedSource;

/// A node's facts, and the power source they were gathered with.
pub(super) struct Gathered {
    pub(super) facts: NodeFacts,
    pub(super) source: Option<MappedSource>,
}

impl Daemon {
    /// The node's facts as of `now`, and its power source. The tracker learns from them too:
    /// a new object under the name starts afresh, signs of life are dated, an Off read of a
    /// living node is counted (and reported once proven).
    pub(super) fn gather_facts(&mut self, node: &Arc<NodeView>, now: Timestamp) -> Gathered {
        let name = node.name.clone();
        let uid = node.uid.clone();
        {
            let t = self.trackers.entry(name.clone()).or_default();
            if t.uid != uid {
                // A new object under this name: nothing from the old one carries over.
                *t = Tracker {
                    uid: uid.clone(),
                    ..Default::default()
                };
            }
        }
        let provider_id = node.provider_id.clone();
        let source = self.source_for(&name, provider_id.as_deref());
        let lease = self.leases.get(&name);
        let mut facts = cluster::node_facts(node, lease, self.cluster.actor());
        facts.identity.uuid_shared_with = self.shared_uuids.of(&name);
        facts.has_power_source = source.is_some();
        facts.identity_check = self
            .trackers
            .get_mut(&name)
            .and_then(|t| {
                *t.mapping_identity
                    .get_or_insert_with(|| self.cfg.mapping_for(&name).map(|m| m.identity()))
            })
            .unwrap_or_default();
        facts.off_witness = self.trackers.get_mut(&name).and_then(|t| {
            *t.mapping_witness
                .get_or_insert_with(|| self.cfg.mapping_for(&name).and_then(|m| m.off_witness()))
        });
        facts.mapping_conflict = self.conflicts.get(&name).cloned();
        // Opt-in actuation: only a down node's mapping is asked whether it may act.
        if self.cfg.actuation.is_some() && facts.readiness != crate::decision::Readiness::Ready {
            facts.actuation.source_refuses = match self.cfg.mapping_for(&name) {
                Some(m) => m.actuation_refused(),
                None => Some("no power source maps this node".into()),
            };
        }
        facts.holds = self.calm.holds(
            failure_domain(node, self.cfg.guards.failure_domain_label.as_deref()).as_deref(),
            &uid,
            &self.cfg.guards,
            now,
        );
        if let Some(a) = &self.cfg.actuation {
            let domain = failure_domain(node, self.cfg.guards.failure_domain_label.as_deref())
                .unwrap_or_default();
            facts.holds.power = self.calm.power_hold(&uid, &domain, a.max_per_hour, now);
        }
        if let Ok(mut h) = self.shared.holds.write() {
            h.insert(uid.clone(), facts.holds.clone());
        }
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.observe(&mut facts, now);
        let newly_proven = match tracker.off_while_alive.as_mut() {
            Some(o)
                if !o.reported && facts.off_while_alive.as_ref().is_some_and(|f| f.proven()) =>
            {
                o.reported = true;
                Some((o.read_at, o.signs, o.gone))
            }
            _ => None,
        };
        if let Some((read_at, signs, gone)) = newly_proven {
            self.report_off_while_alive(node, read_at, signs, gone);
        }
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.lease_duration = facts.lease_duration;
        Gathered { facts, source }
    }

    /// The node's power source, built once per providerID (only EC2 uses it).
    fn source_for(&mut self, name: &str, provider_id: Option<&str>) -> Option<MappedSource> {
        let tracker = self.trackers.entry(name.to_string()).or_default();
        let key = provider_id.map(String::from);
        match &tracker.source {
            Some((k, s)) if *k == key => s.clone(),
            _ => {
                let s = self.sources.for_node(name, provider_id);
                tracker.source = Some((key, s.clone()));
                s
            }
        }
    }
}
