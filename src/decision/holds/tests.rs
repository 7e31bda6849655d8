//! The guards' ledger: storms, cooldowns, freezes, the view, the pause and the budget, each
//! pinned by a test; then a property over random passes: the budget is never overspent.

use proptest::prelude::*;

use super::*;
use crate::decision::LeaseState;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn fresh_view(at: i64) -> View {
    View {
        broken_watches: Vec::new(),
        last_round_trip: Some(t(at)),
    }
}

fn node(domain: &str, unhealthy: bool, source_failing: Option<bool>) -> CensusNode<'static> {
    CensusNode {
        uid: "".into(),
        domain: Some(domain.to_string().into()),
        unhealthy,
        source_failing,
        lease: None,
    }
}

/// `n` nodes in `domain`, the first `down` of them NotReady.
fn rack(domain: &str, n: usize, down: usize) -> Vec<CensusNode<'static>> {
    (0..n).map(|i| node(domain, i < down, None)).collect()
}

fn policy() -> GuardPolicy {
    GuardPolicy {
        failure_domain_label: Some("rack".into()),
        ..GuardPolicy::default()
    }
}

fn pass(calm: &mut Calm, nodes: &[CensusNode<'_>], p: &GuardPolicy, at: i64) {
    let census = Census::count(nodes, p.failure_domain_label.is_some());
    calm.update(&census, &fresh_view(at), Pause::default(), p, t(at));
}

fn fence_kind(calm: &Calm, domain: &str, p: &GuardPolicy, at: i64) -> Option<HoldKind> {
    calm.holds(Some(domain), "uid-x", p, t(at))
        .fence
        .map(|h| h.kind)
}

#[test]
fn limits_are_counts_or_shares_rounded_down() {
    assert_eq!(Limit::Percent(50).of(3), 1);
    assert_eq!(Limit::Percent(50).of(2), 1);
    assert_eq!(Limit::Percent(50).of(1), 0);
    assert_eq!(Limit::Percent(100).of(7), 7);
    assert_eq!(Limit::Count(4).of(1000), 4);
}

/// With release at attestation a node may be fenced while it still shows Ready: a rack whose
/// Leases all went stale together is a storm then, before any of it is written, as it would be
/// once NotReady; without it, only NotReady counts.
#[test]
fn with_release_at_attestation_a_rack_gone_silent_is_a_storm_before_not_ready() {
    use LeaseState as L;
    assert!(CensusNode::counts_unhealthy(true, None, false));
    assert!(CensusNode::counts_unhealthy(false, Some(L::Stale), true));
    assert!(!CensusNode::counts_unhealthy(false, Some(L::Stale), false));
    assert!(!CensusNode::counts_unhealthy(false, Some(L::Late), true));
    assert!(!CensusNode::counts_unhealthy(false, None, true));
    let p = GuardPolicy {
        domain_max_unhealthy: Limit::Percent(50),
        ..policy()
    };
    for release in [true, false] {
        let mut calm = Calm::default();
        // Rack a's four machines lose power; all still show Ready, their Leases stale.
        let mut nodes: Vec<CensusNode<'static>> = (0..4)
            .map(|_| CensusNode {
                unhealthy: CensusNode::counts_unhealthy(false, Some(L::Stale), release),
                lease: Some(L::Stale),
                ..node("a", false, None)
            })
            .collect();
        nodes.extend(rack("b", 4, 0));
        pass(&mut calm, &nodes, &p, 0);
        let held = fence_kind(&calm, "a", &p, 0);
        assert_eq!(
            held,
            release.then_some(HoldKind::Storm),
            "release {release}"
        );
        assert_eq!(fence_kind(&calm, "b", &p, 0), None);
    }
}

/// The defaults let one rack of a datacenter of several go dark entirely, and hold a
/// datacenter-wide event.
#[test]
fn defaults_let_a_whole_rack_through_and_stop_a_datacenter_wide_event() {
    let p = policy();
    let mut calm = Calm::default();
    // Four racks of 10; rack a loses power.
    let mut nodes = rack("a", 10, 10);
    for r in ["b", "c", "d"] {
        nodes.extend(rack(r, 10, 0));
    }
    pass(&mut calm, &nodes, &p, 0);
    assert_eq!(fence_kind(&calm, "a", &p, 0), None);
    // Racks a, b and c: 30 of 40 NotReady, more than half: nothing new anywhere.
    let mut nodes = rack("a", 10, 10);
    nodes.extend(rack("b", 10, 10));
    nodes.extend(rack("c", 10, 10));
    nodes.extend(rack("d", 10, 0));
    pass(&mut calm, &nodes, &p, 10);
    for r in ["a", "d"] {
        assert_eq!(fence_kind(&calm, r, &p, 10), Some(HoldKind::Storm), "{r}");
    }
    let h = calm.holds(Some("a"), "u", &p, t(10)).fence.unwrap();
    assert!(
        h.reason.contains("30 of 40 nodes in the datacenter"),
        "{}",
        h.reason
    );
    assert!(h.reason.contains("max_unhealthy = 50%"), "{}", h.reason);
}

/// A storm in one failure domain holds that domain only; the others fence as usual. It ends
/// when the count drops, and a cooldown follows.
#[test]
fn a_storm_in_one_domain_holds_that_domain_then_cools_down() {
    let p = GuardPolicy {
        domain_max_unhealthy: Limit::Percent(50),
        ..policy()
    };
    let mut calm = Calm::default();
    let mut nodes = rack("a", 4, 3);
    nodes.extend(rack("b", 4, 1));
    nodes.extend(rack("c", 4, 0));
    pass(&mut calm, &nodes, &p, 0);
    assert_eq!(fence_kind(&calm, "a", &p, 0), Some(HoldKind::Storm));
    assert_eq!(fence_kind(&calm, "b", &p, 0), None);
    // The storm drops to 2 of 4 (not above 50%): cooldown for 5 minutes from then.
    let mut nodes = rack("a", 4, 2);
    nodes.extend(rack("b", 4, 1));
    nodes.extend(rack("c", 4, 0));
    pass(&mut calm, &nodes, &p, 100);
    assert_eq!(
        fence_kind(&calm, "a", &p, 100),
        Some(HoldKind::StormCooldown)
    );
    assert_eq!(
        fence_kind(&calm, "a", &p, 399),
        Some(HoldKind::StormCooldown)
    );
    pass(&mut calm, &nodes, &p, 400);
    assert_eq!(fence_kind(&calm, "a", &p, 400), None);
    assert_eq!(fence_kind(&calm, "b", &p, 400), None);
}

/// Without a failure domain label the datacenter is the only scope.
#[test]
fn no_domain_label_no_domain_scopes() {
    let p = GuardPolicy {
        failure_domain_label: None,
        domain_max_unhealthy: Limit::Count(0),
        ..policy()
    };
    let mut calm = Calm::default();
    pass(&mut calm, &rack("a", 4, 1), &p, 0);
    assert_eq!(calm.scopes.len(), 1);
    assert_eq!(fence_kind(&calm, "a", &p, 0), None);
}

/// More than half of the power sources read in a scope fail, and at least 3: oobfence is the
/// one cut off; the scope freezes. When they answer again it thaws, and reads from before
/// the thaw never count.
#[test]
fn a_scope_freezes_when_most_of_its_sources_fail_and_thaws_by_itself() {
    let p = policy();
    let mut calm = Calm::default();
    let sources = |failing: usize, ok: usize| -> Vec<CensusNode<'static>> {
        let mut v: Vec<CensusNode<'static>> =
            (0..failing).map(|_| node("a", false, Some(true))).collect();
        v.extend((0..ok).map(|_| node("a", false, Some(false))));
        v.push(node("a", true, None));
        // Domain b's sources answer: the datacenter as a whole is not cut off.
        v.extend((0..8).map(|_| node("b", false, Some(false))));
        v
    };
    // 2 of 3 failing: more than half but fewer than 3: no freeze (one dead rack's BMCs).
    pass(&mut calm, &sources(2, 1), &p, 0);
    assert_eq!(fence_kind(&calm, "a", &p, 0), None);
    // 6 of 10 failing: frozen, in domain a only.
    pass(&mut calm, &sources(6, 4), &p, 10);
    assert_eq!(
        fence_kind(&calm, "a", &p, 10),
        Some(HoldKind::SelfPartition)
    );
    assert_eq!(fence_kind(&calm, "b", &p, 10), None);
    assert_eq!(
        calm.holds(Some("a"), "u", &p, t(10)).evidence_not_before,
        None
    );
    // A person's word rests on no read: the freeze does not hold it.
    assert_eq!(calm.holds(Some("a"), "u", &p, t(10)).fence_on_word, None);
    // 5 of 10: not more than half: thawed, and reads from before t(20) do not count.
    pass(&mut calm, &sources(5, 5), &p, 20);
    let h = calm.holds(Some("a"), "u", &p, t(20));
    assert_eq!(h.fence, None);
    assert_eq!(h.evidence_not_before, Some(t(20)));
    assert_eq!(
        calm.holds(Some("b"), "u", &p, t(20)).evidence_not_before,
        None
    );
}

/// A broken watch, no API call yet, or the last one too old: every write is held; when the
/// view is fresh again, reads from before do not count.
#[test]
fn a_stale_view_holds_every_write_until_it_is_fresh() {
    let p = policy();
    let mut calm = Calm::default();
    let census = Census::count(&rack("a", 3, 1), true);
    let update = |calm: &mut Calm, view: View, at: i64| {
        calm.update(&census, &view, Pause::default(), &p, t(at))
    };
    update(
        &mut calm,
        View {
            broken_watches: Vec::new(),
            last_round_trip: None,
        },
        0,
    );
    let h = calm.holds(Some("a"), "u", &p, t(0)).write.unwrap();
    assert_eq!(h.kind, HoldKind::StaleView);
    assert!(
        h.reason.contains("no successful Kubernetes API call yet"),
        "{}",
        h.reason
    );
    update(&mut calm, fresh_view(5), 5);
    assert_eq!(calm.holds(Some("a"), "u", &p, t(5)).write, None);
    // The last round trip 31 s ago (max 30 s).
    update(&mut calm, fresh_view(5), 36);
    let h = calm.holds(Some("a"), "u", &p, t(36)).write.unwrap();
    assert!(h.reason.contains("31s ago"), "{}", h.reason);
    update(
        &mut calm,
        View {
            broken_watches: vec!["nodes"],
            last_round_trip: Some(t(40)),
        },
        40,
    );
    let h = calm.holds(Some("a"), "u", &p, t(40)).write.unwrap();
    assert!(h.reason.contains("watch"), "{}", h.reason);
    update(&mut calm, fresh_view(50), 50);
    let h = calm.holds(Some("a"), "u", &p, t(50));
    assert_eq!(h.write, None);
    assert_eq!(h.evidence_not_before, Some(t(50)));
}

/// `n` nodes in `domain` (uids `DOMAIN-i`), each with a Lease, the first `stale` of those
/// stale.
fn leases(domain: &str, n: usize, stale: usize) -> Vec<CensusNode<'static>> {
    (0..n)
        .map(|i| CensusNode {
            uid: format!("{domain}-{i}").into(),
            lease: Some(if i < stale {
                LeaseState::Stale
            } else {
                LeaseState::Renewing
            }),
            ..node(domain, false, None)
        })
        .collect()
}

/// Most Leases stale at once is the control plane's problem (or oobfence's view of it), not
/// the machines': nothing is read ahead of NotReady anywhere until it passes. A rack going
/// silent is not that, nor are two nodes of a small cluster.
#[test]
fn most_leases_stale_at_once_stops_reading_ahead_everywhere() {
    let p = policy();
    let mut calm = Calm::default();
    let ahead = |calm: &Calm, uid: &str, at: i64| {
        let domain = &uid[..1];
        calm.holds(Some(domain), uid, &p, t(at)).pre_attest
    };
    // A rack of 10 of 40 goes silent: read ahead.
    let mut dc: Vec<CensusNode<'static>> = leases("a", 10, 10);
    dc.extend(leases("b", 30, 0));
    pass(&mut calm, &dc, &p, 0);
    assert_eq!(ahead(&calm, "a-0", 0), None);
    assert_eq!(calm.leases, (40, 10));
    // 21 of 40: the control plane stopped hearing the kubelets.
    let mut dc: Vec<CensusNode<'static>> = leases("a", 10, 10);
    dc.extend(leases("b", 30, 11));
    pass(&mut calm, &dc, &p, 5);
    let why = ahead(&calm, "a-0", 5).expect("a lease storm holds reading ahead");
    assert!(why.contains("21 of 40 Leases"), "{why}");
    assert!(why.contains("control plane"), "{why}");
    assert_eq!(calm.lease_storm_since, Some(t(5)));
    // The other rack's nodes are held too: it is not about one domain.
    assert!(ahead(&calm, "b-0", 5).unwrap().contains("21 of 40"));
    // Nodes without a Lease do not count either way.
    pass(&mut calm, &leases("a", 2, 2), &p, 10);
    assert_eq!(ahead(&calm, "a-0", 10), None, "2 of 2 is fewer than 3");
    let mut small = leases("a", 4, 3);
    small.push(node("a", false, None));
    pass(&mut calm, &small, &p, 15);
    assert!(ahead(&calm, "a-0", 15).is_some(), "3 of 4 Leases");
    pass(&mut calm, &leases("a", 4, 1), &p, 20);
    assert_eq!(calm.lease_storm_since, None, "over once the Leases renew");
    assert_eq!(ahead(&calm, "a-0", 20), None);
}

/// The control plane stops hearing every kubelet at once. Kubelets renew at phases spread over
/// one renewal interval, so their Leases go stale one by one over that interval: counting stale
/// Leases, the storm would begin only once half of them were, after the first half of the
/// BMCs had been read ahead. Late Leases are counted instead, and every one is late before the
/// first is stale: no node is ever read ahead. And a healthy datacenter, renewing at those
/// phases, never counts as a storm.
#[test]
fn kubelets_unheard_at_once_are_a_storm_before_any_lease_is_stale() {
    use crate::decision::{Policy, lease_state};
    let (p, policy) = (policy(), Policy::default());
    let lease = Some(std::time::Duration::from_secs(40));
    let interval_ms = 10_000;
    // 40 kubelets, their renewals 250 ms apart: phases over the whole interval.
    let phase = |i: i64| jiff::SignedDuration::from_millis(i * interval_ms / 40);
    let census_at = |now: Timestamp, last_renewal: &dyn Fn(i64) -> Timestamp| {
        (0..40)
            .map(|i| CensusNode {
                uid: format!("a-{i}").into(),
                lease: lease_state(Some(last_renewal(i)), lease, &policy, now),
                ..node("a", false, None)
            })
            .collect::<Vec<_>>()
    };
    // A pass on a fresh view at `now`.
    let count = |calm: &mut Calm, census: &[CensusNode<'_>], now: Timestamp| {
        let view = View {
            broken_watches: Vec::new(),
            last_round_trip: Some(now),
        };
        calm.update(
            &Census::count(census, true),
            &view,
            Pause::default(),
            &p,
            now,
        );
    };
    let mut calm = Calm::default();
    // Healthy for 60 s, a pass every 250 ms: never a storm, never a stale Lease.
    for step in 0..240 {
        let now = t(0) + jiff::SignedDuration::from_millis(step * 250);
        let renewed = |i: i64| {
            let since_phase = (now - phase(i)).as_millisecond() - t(0).as_millisecond();
            now - jiff::SignedDuration::from_millis(since_phase.rem_euclid(interval_ms))
        };
        let census = census_at(now, &renewed);
        count(&mut calm, &census, now);
        assert_eq!(
            calm.lease_storm_since, None,
            "a healthy datacenter at {now}"
        );
        assert_eq!(calm.leases.1, 0);
    }
    // At t(60) every kubelet goes unheard; each last renewed at its phase in the interval before.
    let unheard = t(60);
    let last = |i: i64| unheard - jiff::SignedDuration::from_millis(interval_ms) + phase(i);
    let mut stale_seen = false;
    for step in 0..160 {
        let now = unheard + jiff::SignedDuration::from_millis(step * 250);
        let census = census_at(now, &last);
        count(&mut calm, &census, now);
        for n in census.iter().filter(|n| n.lease == Some(LeaseState::Stale)) {
            stale_seen = true;
            let held = calm.holds(Some("a"), &n.uid, &p, now).pre_attest;
            assert!(
                held.is_some(),
                "{} read ahead at {now}: {} of 40 Leases late, {} stale",
                n.uid,
                calm.leases_late,
                calm.leases.1
            );
        }
    }
    assert!(stale_seen, "the Leases went stale within the 40 s watched");
}

/// A Lease that goes stale between two counts is read ahead only once a count has seen it:
/// otherwise a decision between passes could read a BMC the next count would call part of a
/// storm.
#[test]
fn a_lease_is_read_ahead_only_once_counted_stale() {
    let p = policy();
    let mut calm = Calm::default();
    pass(&mut calm, &leases("a", 4, 1), &p, 0);
    assert!(!calm.holds(Some("a"), "a-0", &p, t(0)).lease_not_yet_counted);
    assert!(calm.holds(Some("a"), "a-1", &p, t(0)).lease_not_yet_counted);
}

/// Reading ahead is for a fence that could follow: a stale view (renewals cannot be seen) or a
/// hold on new fences holds it too; a pause or a standby does not (reads are harmless, and the
/// evidence is ready when the hold lifts).
#[test]
fn whatever_holds_a_new_fence_or_blinds_the_view_holds_reading_ahead() {
    let p = policy();
    let mut calm = Calm::default();
    let census = Census::count(&leases("a", 4, 1), true);
    calm.update(
        &census,
        &View {
            broken_watches: vec!["nodes"],
            last_round_trip: Some(t(0)),
        },
        Pause::default(),
        &p,
        t(0),
    );
    let h = calm.holds(Some("a"), "a-0", &p, t(0));
    assert!(h.pre_attest.unwrap().contains("stale"));
    calm.update(&census, &fresh_view(1), Pause::default(), &p, t(1));
    assert_eq!(calm.holds(Some("a"), "a-0", &p, t(1)).pre_attest, None);
    // A storm in the domain.
    let mut storm = leases("a", 4, 1);
    for n in &mut storm {
        n.unhealthy = true;
    }
    pass(&mut calm, &storm, &p, 2);
    let h = calm.holds(Some("a"), "a-0", &p, t(2));
    assert_eq!(h.pre_attest, h.fence.map(|f| f.reason));
    assert!(h.pre_attest.is_some());
    // A pause, or a standby: still read ahead.
    let mut calm = Calm::default();
    calm.update(
        &census,
        &fresh_view(3),
        Pause {
            by: vec!["file x: test".into()],
        },
        &p,
        t(3),
    );
    calm.standby = Some("another instance holds the Lease".into());
    let h = calm.holds(Some("a"), "a-0", &p, t(3));
    assert!(h.write.is_some());
    assert_eq!(h.pre_attest, None);
}

#[test]
fn a_pause_holds_every_write_and_names_who_paused() {
    let p = policy();
    let mut calm = Calm::default();
    let census = Census::count(&rack("a", 3, 0), true);
    let pause = Pause {
        by: vec!["file /etc/oobfence/dc1.paused: rack 7 rewiring".into()],
    };
    calm.update(&census, &fresh_view(0), pause, &p, t(0));
    let h = calm.holds(Some("a"), "u", &p, t(0)).write.unwrap();
    assert_eq!(h.kind, HoldKind::Paused);
    assert!(h.reason.contains("rack 7 rewiring"), "{}", h.reason);
    calm.update(&census, &fresh_view(1), Pause::default(), &p, t(1));
    assert_eq!(calm.holds(Some("a"), "u", &p, t(1)).write, None);
}

/// The budget counts each node once, a fence that wrote nothing gives its place back, and a
/// place frees when its fence leaves the window.
/// What the daemon compares to know whether any node's holds may have changed: below the
/// budget no node, with or without a fence of its own in the window, is held by it.
#[test]
fn no_node_is_held_by_the_budget_while_it_is_not_spent() {
    let p = GuardPolicy {
        fence_budget: Limit::Count(3),
        ..policy()
    };
    let mut calm = Calm::default();
    pass(&mut calm, &rack("a", 10, 0), &p, 0);
    let budget_hold = |calm: &Calm, uid: &str| {
        calm.holds(Some("a"), uid, &p, t(5))
            .fence
            .is_some_and(|h| h.kind == HoldKind::FenceBudget)
    };
    for (i, uid) in ["n1", "n2"].into_iter().enumerate() {
        calm.record_fence(uid, t(i as i64));
        assert_eq!(calm.budget_spent(&p), None);
        for other in ["n1", "n2", "n3", "uid-x"] {
            assert!(!budget_hold(&calm, other), "{other} held after {uid}");
        }
    }
    calm.record_fence("n3", t(2));
    assert_eq!(calm.budget_spent(&p), Some(3));
    assert!(budget_hold(&calm, "uid-x"));
    calm.record_fence("n4", t(3));
    assert_eq!(calm.budget_spent(&p), Some(4), "each fence past it shows");
}

#[test]
fn the_fence_budget_counts_fences_in_its_window() {
    let p = GuardPolicy {
        fence_budget: Limit::Count(2),
        ..policy()
    };
    let nodes = rack("a", 10, 3);
    let mut calm = Calm::default();
    pass(&mut calm, &nodes, &p, 0);
    calm.record_fence("n1", t(0));
    calm.record_fence("n1", t(1));
    assert_eq!(fence_kind(&calm, "a", &p, 1), None);
    calm.record_fence("n2", t(2));
    let h = calm.holds(Some("a"), "n3", &p, t(2)).fence.unwrap();
    assert_eq!(h.kind, HoldKind::FenceBudget);
    assert!(h.reason.contains("2 fences in the last 1h"), "{}", h.reason);
    // A node already counted is not held by its own place (its write's retries).
    assert_eq!(calm.holds(Some("a"), "n2", &p, t(2)).fence, None);
    calm.forget_fence("n2");
    assert_eq!(fence_kind(&calm, "a", &p, 3), None);
    calm.record_fence("n2", t(3));
    // n1 leaves the window at t(3600).
    pass(&mut calm, &nodes, &p, 3600);
    assert_eq!(fence_kind(&calm, "a", &p, 3600), None);
    assert_eq!(calm.fences.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property: however many nodes want a fence in however many passes, the fences started
    /// through the ledger in any window never exceed the budget, and none starts while a
    /// storm or a freeze holds its scope.
    #[test]
    fn property_the_budget_is_never_overspent(
        budget in 0u32..6,
        passes in proptest::collection::vec((0usize..12, 0usize..12, 1i64..900, 0usize..4), 1..40),
    ) {
        let p = GuardPolicy {
            fence_budget: Limit::Count(budget),
            fence_budget_window: Duration::from_secs(3600),
            domain_max_unhealthy: Limit::Percent(50),
            ..policy()
        };
        let mut calm = Calm::default();
        let mut started: Vec<Timestamp> = Vec::new();
        let mut now = 0i64;
        let mut next_uid = 0usize;
        for (down_a, wanting, gap, failing) in passes {
            now += gap;
            let mut nodes = rack("a", 12, down_a);
            nodes.extend(rack("b", 12, 0));
            for n in nodes.iter_mut().take(failing.min(12)) {
                n.source_failing = Some(true);
            }
            pass(&mut calm, &nodes, &p, now);
            for _ in 0..wanting {
                next_uid += 1;
                let uid = format!("n{next_uid}");
                let domain = if next_uid.is_multiple_of(2) { "a" } else { "b" };
                let holds = calm.holds(Some(domain), &uid, &p, t(now));
                if holds.fence.is_none() && holds.write.is_none() {
                    let st = &calm.scopes[&Scope::Domain(domain.into())];
                    prop_assert!(st.storm_since.is_none() && st.frozen_since.is_none());
                    calm.record_fence(&uid, t(now));
                    started.push(t(now));
                }
            }
            let in_window = started
                .iter()
                .filter(|s| elapsed(**s, t(now)) < p.fence_budget_window)
                .count();
            prop_assert!(in_window <= budget as usize, "{in_window} > {budget}");
        }
    }
}
