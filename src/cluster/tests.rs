use super::*;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};

const ME: &str = "oobfence/dc1@mgmt1";

fn node(ready: &str, taints: Vec<Taint>, annotations: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_transition_time: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                boot_id: "b1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn oos() -> Taint {
    Taint {
        key: OUT_OF_SERVICE_KEY.into(),
        value: Some(OUT_OF_SERVICE_VALUE.into()),
        effect: OUT_OF_SERVICE_EFFECT.into(),
        time_added: None,
    }
}

#[test]
fn facts_from_a_node() {
    let f = node_facts(&node("Unknown", vec![], &[]), None, ME);
    assert_eq!(
        f.readiness,
        Readiness::NotReady {
            since: "2026-01-01T00:00:00Z".parse().unwrap()
        }
    );
    assert_eq!(f.boot_id, "b1");
    assert!(f.fence.is_none() && !f.foreign_out_of_service);
    assert_eq!(
        node_facts(&node("True", vec![], &[]), None, ME).readiness,
        Readiness::Ready
    );
    assert!(matches!(
        node_facts(&node("False", vec![], &[]), None, ME).readiness,
        Readiness::NotReady { .. }
    ));
}

#[test]
fn an_out_of_service_taint_without_our_record_is_foreign() {
    let f = node_facts(&node("Unknown", vec![oos()], &[]), None, ME);
    assert!(f.foreign_out_of_service);
    assert!(f.fence.is_none());
}

#[test]
fn our_record_is_read_back() {
    let ann = [
        (ANNOTATION_FENCED_AT, "2026-01-01T00:05:00Z"),
        (ANNOTATION_FENCED_BOOT_ID, "b0"),
        (ANNOTATION_FENCED_BY, ME),
    ];
    let f = node_facts(&node("Unknown", vec![oos()], &ann), None, ME);
    let r = f.fence.unwrap();
    assert!(r.taint_present);
    assert_eq!(r.boot_id, "b0");
    assert!(!f.foreign_out_of_service);
    let f = node_facts(&node("Unknown", vec![], &ann), None, ME);
    assert!(!f.fence.unwrap().taint_present);
}

#[test]
fn node_labels_or_annotations_cannot_supply_a_power_source() {
    // The mapping comes only from the config: facts carry what the caller says.
    let n = node("Unknown", vec![], &[("oobfence.io/bmc", "https://evil")]);
    assert!(!node_facts(&n, None, ME).has_power_source);
}

#[test]
fn a_record_is_ours_only_when_fenced_by_names_this_daemon() {
    let at = (ANNOTATION_FENCED_AT, "2026-01-01T00:05:00Z");
    for (by, ours) in [
        (Some(ME), true),
        (Some("oobfence/dc2@mgmt1"), false),
        (Some("oobfence/dc1@mgmt2"), false),
        (Some("oobfence/dc1"), false),
        (None, false),
    ] {
        let mut ann = vec![at];
        if let Some(by) = by {
            ann.push((ANNOTATION_FENCED_BY, by));
        }
        let f = node_facts(&node("Unknown", vec![oos()], &ann), None, ME);
        assert_eq!(f.fence.unwrap().ours, ours, "{by:?}");
    }
}

#[test]
fn opt_outs_and_other_remediators_are_read_from_the_node() {
    let plain = node("Unknown", vec![], &[]);
    assert_eq!(opted_out(&plain), None);
    assert_eq!(other_remediator(&plain), None);
    let n = node("Unknown", vec![], &[(ANNOTATION_EXCLUDE, "true")]);
    assert!(opted_out(&n).unwrap().contains(ANNOTATION_EXCLUDE));
    assert_eq!(
        opted_out(&node("Unknown", vec![], &[(ANNOTATION_EXCLUDE, "yes")])),
        None
    );
    let mut n = node("Unknown", vec![], &[]);
    n.metadata.labels = Some([(LABEL_MEDIK8S_EXCLUDE.to_string(), "true".to_string())].into());
    assert!(opted_out(&n).unwrap().contains(LABEL_MEDIK8S_EXCLUDE));
    for (key, value, effect) in [
        (
            "medik8s.io/remediation",
            "self-node-remediation",
            "NoExecute",
        ),
        (
            "medik8s.io/remediation",
            "fence-agents-remediation",
            "NoExecute",
        ),
        (
            "remediation.medik8s.io/fence-agents-remediation",
            "",
            "NoSchedule",
        ),
        ("medik8s.io/fence-agents-remediation", "", "NoExecute"),
    ] {
        let t = Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        };
        let f = node_facts(&node("Unknown", vec![t], &[]), None, ME);
        assert!(f.other_remediator.unwrap().contains(key));
    }
    // Cluster API: a Machine's Node that is cordoned is being drained by its deletion; a
    // cordoned node without a Machine, or a Machine's node not cordoned, is not.
    let capi = node(
        "Unknown",
        vec![],
        &[(ANNOTATION_CAPI_MACHINE, "md-0-7f9c4-x2x5q")],
    );
    assert_eq!(other_remediator(&capi), None);
    let mut cordoned = capi.clone();
    cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    let why = other_remediator(&cordoned).unwrap();
    assert!(
        why.contains("md-0-7f9c4-x2x5q") && why.contains("cordoned"),
        "{why}"
    );
    let mut plain_cordoned = node("Unknown", vec![], &[]);
    plain_cordoned.spec.get_or_insert_default().unschedulable = Some(true);
    assert_eq!(other_remediator(&plain_cordoned), None);
}

#[test]
fn truncate_keeps_char_boundaries() {
    assert_eq!(truncate("abc", 5), "abc");
    assert_eq!(truncate("ééé", 3), "é…");
}
