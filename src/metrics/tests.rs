use std::time::Duration;

use super::*;
use crate::decision::{NodeState, Rule};

/// Metric family names and their HELP text from an OpenMetrics exposition.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# HELP "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect()
}

#[test]
fn every_metric_is_prefixed_and_explained() {
    let m = Metrics::new();
    let text = m.encode();
    let fams = families(&text);
    assert!(fams.len() >= 20, "{fams:?}");
    for (name, help) in &fams {
        assert!(name.starts_with("oobfence_"), "{name}");
        assert!(
            help.split_whitespace().count() >= 8,
            "{name}: HELP too thin for an operator: {help:?}"
        );
    }
    for name in [
        "oobfence_node_state",
        "oobfence_actions",
        "oobfence_would_act",
        "oobfence_power_reads",
        "oobfence_power_read_duration_seconds",
        "oobfence_notready_to_fence_seconds",
        "oobfence_fence_to_volumes_released_seconds",
        "oobfence_fence_to_recovery_seconds",
        "oobfence_notready_to_power_off_seconds",
        "oobfence_power_actions",
        "oobfence_out_of_service_taint_age_seconds",
        "oobfence_foreign_out_of_service_taints",
        "oobfence_blocked",
        "oobfence_last_successful_sync_timestamp_seconds",
        "oobfence_build_info",
    ] {
        assert!(fams.contains_key(name), "{name} missing:\n{text}");
    }
    assert!(text.ends_with("# EOF\n"), "not OpenMetrics: {text}");
}

/// A healthy node has no series of its own (20,000 of them would say nothing the count does
/// not); one that is not healthy has exactly one, for its state; the count lists every state.
#[test]
fn only_nodes_that_are_not_healthy_have_a_state_series() {
    let m = Metrics::new();
    m.set_node_state("n1", NodeState::Healthy);
    m.set_node_state("n2", NodeState::Confirming);
    m.set_node_counts(&[("healthy", 1), ("confirming", 1)].into());
    let text = m.encode();
    assert!(!text.contains("oobfence_node_state{node=\"n1\""), "{text}");
    assert!(
        text.contains("oobfence_node_state{node=\"n2\",state=\"confirming\"} 1"),
        "{text}"
    );
    for (state, n) in [
        ("healthy", 1),
        ("confirming", 1),
        ("fenced", 0),
        ("suspect", 0),
    ] {
        assert!(
            text.contains(&format!("oobfence_nodes{{state=\"{state}\"}} {n}")),
            "{state}: {text}"
        );
    }
    m.set_node_state("n2", NodeState::Fenced);
    m.set_node_state("n2", NodeState::Healthy);
    assert!(!m.encode().contains("node=\"n2\""), "{}", m.encode());
}

#[test]
fn per_node_series_come_and_go() {
    let m = Metrics::new();
    m.set_node_blocked("n1", Some("power-unknown"));
    m.set_taint_age("n2", Some(12.5));
    m.set_fenced_volume_attachments("n2", Some(2));
    let text = m.encode();
    assert!(
        text.contains("oobfence_node_blocked{node=\"n1\",reason=\"power-unknown\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("oobfence_out_of_service_taint_age_seconds{node=\"n2\"} 12.5"),
        "{text}"
    );
    assert!(
        text.contains("oobfence_fenced_volume_attachments{node=\"n2\"} 2"),
        "{text}"
    );
    m.set_node_blocked("n1", Some("power-on"));
    m.set_fenced_volume_attachments("n2", Some(0));
    m.forget_node("n2");
    let text = m.encode();
    assert!(!text.contains("reason=\"power-unknown\"} 1"), "{text}");
    assert!(text.contains("reason=\"power-on\"} 1"), "{text}");
    assert!(!text.contains("node=\"n2\""), "{text}");
}

#[test]
fn a_deleted_nodes_fence_outlives_the_stale_cache_but_not_its_return() {
    let m = Metrics::new();
    m.node_deleted_by_fence("n1", "uid-old", 100.0);
    // The cache still shows the deleted object, without a fence record.
    m.set_fenced_since("n1", "uid-old", None);
    assert!(m.encode().contains(
        "oobfence_fenced_since_timestamp_seconds{node=\"n1\",action=\"delete_node\"} 100.0"
    ));
    // The node registered again: a new object, no fence.
    m.set_fenced_since("n1", "uid-new", None);
    assert!(!m.encode().contains("node=\"n1\""));
    m.node_deleted_by_fence("n2", "u", 5.0);
    m.prune_deleted_fences(Duration::ZERO);
    assert!(!m.encode().contains("node=\"n2\""));
    m.set_fenced_since("n3", "u3", Some(7.0));
    assert!(
        m.encode()
            .contains("oobfence_fenced_since_timestamp_seconds{node=\"n3\",action=\"taint\"} 7.0")
    );
    m.forget_node("n3");
    assert!(!m.encode().contains("node=\"n3\""));
}

#[test]
fn only_refusals_of_not_ready_nodes_are_blocked_reasons() {
    assert_eq!(blocked_reason(Rule::PowerUnknown), Some("power-unknown"));
    assert_eq!(
        blocked_reason(Rule::PowerTransitional),
        Some("power-transitional")
    );
    assert_eq!(blocked_reason(Rule::RecoveredSameBootId), None);
    assert_eq!(blocked_reason(Rule::ConfirmedOff), None);
}

#[test]
fn failing_power_sources_go_back_to_zero() {
    let m = Metrics::new();
    let key = FailingLabels {
        backend: "redfish",
        error_kind: "unreachable".into(),
    };
    m.set_power_sources_failing(&BTreeMap::from([(key.clone(), 3)]));
    assert!(m.encode().contains(
        "oobfence_power_sources_failing{backend=\"redfish\",error_kind=\"unreachable\"} 3"
    ));
    m.set_power_sources_failing(&BTreeMap::new());
    assert!(m.encode().contains(
        "oobfence_power_sources_failing{backend=\"redfish\",error_kind=\"unreachable\"} 0"
    ));
}

#[test]
fn a_nodes_failure_domain_follows_it_while_it_is_not_healthy() {
    let m = Metrics::new();
    m.set_node_failure_domain("n1", Some("rack-a"));
    let text = m.encode();
    assert!(
        text.contains("oobfence_node_failure_domain{node=\"n1\",domain=\"rack-a\"} 1"),
        "{text}"
    );
    m.set_node_failure_domain("n1", Some("rack-b"));
    let text = m.encode();
    assert!(!text.contains("rack-a"), "{text}");
    assert!(text.contains("domain=\"rack-b\"} 1"), "{text}");
    m.forget_node("n1");
    assert!(!m.encode().contains("node=\"n1\""), "{}", m.encode());
}

#[test]
fn the_fence_budget_has_no_sample_until_it_is_known() {
    let m = Metrics::new();
    let text = m.encode();
    assert!(
        text.contains("# HELP oobfence_fence_budget_limit "),
        "{text}"
    );
    assert!(!text.contains("\noobfence_fence_budget_limit "), "{text}");
    assert_eq!(m.fence_budget_limit.get(), None);
    m.fence_budget_limit.set(0);
    assert!(m.encode().contains("\noobfence_fence_budget_limit 0\n"));
    assert_eq!(m.fence_budget_limit.get(), Some(0));
}
