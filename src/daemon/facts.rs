//! Facts for one node: what the core is given to decide it. The Node and its Lease as cached,
//! the power source and mapping the config gives it, the holds the guards put on it, and what
//! its tracker remembers (signs of life by oobfence's clock, the identity binding, an Off read
//! while it lived, when a person's confirmation was first seen). Nothing here decides.

use std::sync::Arc;

use jiff::Timestamp;

use super::guards::failure_domain;
use super::state::Daemon;
use super::tracker::{SeenConfirmation, Tracker};
use crate::cluster;
use crate::cluster::{EventType, NodeView, reasons};
use crate::decision::holds::Holds;
use crate::decision::{NodeFacts, confirmation};

/// A node's facts, and each of its power sources' (indexed like the tracker's `sources`).
pub(super) struct Gathered {
    /// The node's own, without any source's: what a node of no source is decided on.
    pub(super) facts: NodeFacts,
    /// The node's facts with each source's own ([`super::sources::member_facts`]).
    pub(super) members: Vec<NodeFacts>,
}

impl Daemon {
    /// The node's facts as of `now`, and its power sources'. The tracker learns from them too:
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
        self.build_sources(&name, provider_id.as_deref());
        let lease = self.leases.get(&name);
        let mut facts = cluster::node_facts(node, lease, self.cluster.actor());
        facts.identity.uuid_shared_with = self.shared_uuids.of(&name);
        let tracker = self.trackers.get(&name).expect("inserted above");
        facts.has_power_source = !tracker.sources.is_empty();
        facts.mapping_conflict = self.conflicts.get(&name).cloned();
        // Opt-in actuation: only a down node's mapping is asked whether it may act.
        let actuation =
            self.cfg.actuation.is_some() && facts.readiness != crate::decision::Readiness::Ready;
        if actuation && tracker.sources.is_empty() {
            facts.actuation.source_refuses = Some("no power source maps this node".into());
        }
        let feeds_others: Vec<Option<String>> = tracker
            .sources
            .iter()
            .map(|s| {
                let key = s.shared_key.as_ref().filter(|_| actuation)?;
                self.outlet_feeds_a_live_node(key, &name, &s.label, now)
            })
            .collect();
        facts.holds = self.holds_of(node, now);
        let tracker = self.trackers.get_mut(&name).expect("inserted above");
        tracker.observe(&mut facts, now);
        // A person's word: dated from this daemon's first sight of the annotation's value.
        let value = node.annotations.get(confirmation::ANNOTATION);
        let invalid =
            SeenConfirmation::observe(&mut tracker.confirmation, value.map(String::as_str), now)
                .then(|| {
                    tracker
                        .confirmation
                        .as_ref()
                        .and_then(|c| c.note.clone().err())
                })
                .flatten();
        facts.confirmation = tracker
            .confirmation
            .as_ref()
            .and_then(SeenConfirmation::confirmation);
        let mut proven = Vec::new();
        let members: Vec<NodeFacts> = tracker
            .sources
            .iter_mut()
            .zip(feeds_others)
            .map(|(s, feeds)| {
                let mut member = super::sources::member_facts(&facts, s, actuation);
                if let Some(why) = feeds {
                    member.actuation.source_refuses = Some(why);
                }
                if let Some(o) = s.off_while_alive.as_mut()
                    && !o.reported
                    && member.off_while_alive.as_ref().is_some_and(|f| f.proven())
                {
                    o.reported = true;
                    proven.push((o.read_at, o.signs, o.gone));
                }
                member
            })
            .collect();
        tracker.lease_duration = facts.lease_duration;
        for (read_at, signs, gone) in proven {
            self.report_off_while_alive(node, read_at, signs, gone);
        }
        if let Some(problem) = invalid {
            self.report_invalid_confirmation(node, problem);
        }
        Gathered { facts, members }
    }

    /// Why an outlet that feeds `node` and other nodes may not be switched: one of the others
    /// is not NotReady and silent (its kubelet spoke within a Lease duration, or it is Ready,
    /// or oobfence has not seen it).
    fn outlet_feeds_a_live_node(
        &self,
        key: &str,
        node: &str,
        label: &str,
        now: Timestamp,
    ) -> Option<String> {
        let fed = self.outlets.get(key)?;
        super::sources::feeds_a_live_node(fed, node, label, |other| {
            let down = self
                .nodes
                .get(other)
                .is_some_and(|n| cluster::readiness(&n) != crate::decision::Readiness::Ready);
            let silent = self.trackers.get(other).is_some_and(|t| {
                let duration = t
                    .lease_duration
                    .unwrap_or(crate::decision::DEFAULT_LEASE_DURATION);
                t.last_alive().is_none_or(|alive| {
                    std::time::Duration::try_from(now.duration_since(alive))
                        .is_ok_and(|d| d >= duration)
                })
            });
            down && silent
        })
    }

    /// A confirmation annotation that is not one: logged and an Event, once per value (`why`
    /// shows it as long as it is there).
    fn report_invalid_confirmation(&self, node: &NodeView, problem: String) {
        tracing::warn!(node = %node.name, problem = %problem, "a person's confirmation is not valid; it is never acted on");
        let cluster = self.cluster.clone();
        let name = node.name.clone();
        let message = format!("{problem}; it is never acted on");
        tokio::spawn(async move {
            cluster
                .event(
                    &name,
                    EventType::Warning,
                    reasons::CONFIRMATION_INVALID,
                    &message,
                )
                .await;
        });
    }

    /// The holds the guards as they stand put on the node, kept where the writer checks them
    /// right before a write.
    pub(super) fn holds_of(&mut self, node: &NodeView, now: Timestamp) -> Holds {
        let domain = failure_domain(node, self.cfg.guards.failure_domain_label.as_deref());
        let mut holds = self
            .calm
            .holds(domain.as_deref(), &node.uid, &self.cfg.guards, now);
        if let Some(a) = &self.cfg.actuation {
            let domain = domain.unwrap_or_default();
            holds.power = self
                .calm
                .power_hold(&node.uid, &domain, a.max_per_hour, now);
        }
        if let Ok(mut h) = self.shared.holds.write() {
            h.insert(node.uid.clone(), holds.clone());
        }
        holds
    }

    /// The node's power sources, built once per providerID (only EC2 uses it) and after a
    /// reload; a source that stays as it was keeps what it read.
    fn build_sources(&mut self, name: &str, provider_id: Option<&str>) {
        let tracker = self.trackers.entry(name.to_string()).or_default();
        let key = provider_id.map(String::from);
        if tracker.sources_for.as_ref() == Some(&key) {
            return;
        }
        let mut fresh = super::sources::build(&self.cfg, &self.sources, name, provider_id);
        super::sources::carry_over(
            &mut tracker.sources,
            &mut fresh,
            &mut tracker.next_generation,
        );
        tracker.sources = fresh;
        tracker.sources_for = Some(key);
    }
}
