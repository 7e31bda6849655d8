//! The storm and the write are of one count: whatever the datacenter looks like, a census that
//! calls the node's scope (the datacenter or its failure domain) a storm leaves it no write a
//! storm holds — no fence, with or without its pods' release, and no power-off — and a census
//! that calls nothing a storm holds none of them. The daemon decides a write on a census of
//! the cache as it is at that moment, so this is what holds for every write it makes.

use proptest::prelude::*;

use super::actuation::actuating;
use super::pre_attestation::going_silent;
use super::*;
use crate::decision::holds::{Calm, Census, CensusNode, GuardPolicy, Limit, Pause, Scope, View};

/// A write the node's own rules make: 0 a NotReady node proven Off (fence), 1 a Ready node
/// proven Off while its Lease is stale (fence and release its pods), 2 a hung node whose
/// machine reads On (power-off).
fn writing_node(kind: u8) -> (NodeFacts, Vec<PowerReading>, Policy, Timestamp) {
    match kind {
        0 => (dead(), vec![off(60), off(65)], policy(), t(66)),
        1 => (
            NodeFacts {
                ready_heartbeat: Some(t(-300)),
                ..going_silent()
            },
            vec![off(13), off(18)],
            policy(),
            t(19),
        ),
        _ => (dead(), vec![read(295, PowerState::On)], actuating(), t(296)),
    }
}

proptest! {
    #![proptest_config(crate::fuzz::config())]

    #[test]
    fn no_fence_release_or_power_off_in_a_scope_the_census_calls_a_storm(
        others in proptest::collection::vec((0u8..3, any::<bool>()), 0..12),
        domain in 0u8..3,
        max_unhealthy in 0u32..=100,
        domain_max_unhealthy in 0u32..=100,
        kind in 0u8..3,
    ) {
        let (mut facts, reads, p, now) = writing_node(kind);
        let ready = facts.readiness == Readiness::Ready;
        let me = CensusNode {
            uid: facts.uid.clone().into(),
            domain: Some(format!("d{domain}").into()),
            unhealthy: CensusNode::counts_unhealthy(
                !ready,
                Some(LeaseState::Stale),
                p.release_at_attestation,
            ),
            source_failing: None,
            lease: Some(LeaseState::Stale),
        };
        let nodes: Vec<CensusNode> = others
            .iter()
            .enumerate()
            .map(|(i, (d, unhealthy))| CensusNode {
                uid: format!("other-{i}").into(),
                domain: Some(format!("d{d}").into()),
                unhealthy: *unhealthy,
                source_failing: None,
                lease: Some(if *unhealthy { LeaseState::Stale } else { LeaseState::Renewing }),
            })
            .chain(std::iter::once(me))
            .collect();
        let guards = GuardPolicy {
            max_unhealthy: Limit::Percent(max_unhealthy),
            failure_domain_label: Some("rack".into()),
            domain_max_unhealthy: Limit::Percent(domain_max_unhealthy),
            fence_budget: Limit::Count(1000),
            ..GuardPolicy::default()
        };
        let mut calm = Calm::default();
        let view = View { broken_watches: Vec::new(), last_round_trip: Some(now) };
        calm.update(&Census::count(&nodes, true), &view, Pause::default(), &guards, now);
        let storm = [Scope::Datacenter, Scope::Domain(format!("d{domain}"))]
            .iter()
            .any(|s| calm.scopes[s].storm_since.is_some());
        facts.holds = calm.holds(Some(&format!("d{domain}")), &facts.uid, &guards, now);
        let d = decide(&facts, &reads, &p, now);
        if storm {
            prop_assert!(!d.step.writes(), "a write in a storm: {d:?}");
            if !ready || calm.lease_storm_since.is_none() {
                // Held by the storm itself (a Ready node is then not even read ahead).
                prop_assert!(
                    d.reason.contains("a storm is not fenced node by node"),
                    "{}",
                    d.reason
                );
            }
        } else if calm.lease_storm_since.is_none() || !ready {
            // Nothing else holds it (a lease storm holds only reads ahead of NotReady).
            prop_assert!(
                matches!(d.step, Step::Fence(_) | Step::PowerOff),
                "no storm, yet no write: {d:?}"
            );
        }
    }
}
