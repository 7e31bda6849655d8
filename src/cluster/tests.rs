use super::events::truncate;
use super::*;
use crate::decision::Readiness;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

const ME: &str = "oobfence/dc1@mgmt1";

// The readers take the view the daemon keeps of a Node; these tests write whole Nodes, as the
// API server sends them, and read them through it.
fn node_facts(n: &Node, lease: Option<LeaseTimes>, me: &str) -> crate::decision::NodeFacts {
    super::node_facts(&NodeView::from(n), lease, me)
}
fn opted_out(n: &Node) -> Option<String> {
    super::opted_out(&NodeView::from(n))
}
fn other_remediator(n: &Node) -> Option<String> {
    super::other_remediator(&NodeView::from(n))
}

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

/// The cache keeps a view of each Node: whatever a decision reads of a whole Node it reads of
/// the view, and nothing else is kept (foreign annotations, other conditions, images,
/// capacity, the node info but the boot ID and system UUID).
#[test]
fn a_node_view_keeps_what_decisions_read_and_nothing_else() {
    use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut full = node(
        "False",
        vec![oos()],
        &[
            (ANNOTATION_FENCED_AT, "2026-01-01T00:01:00Z"),
            (ANNOTATION_FENCED_BOOT_ID, "b1"),
            (ANNOTATION_FENCED_BY, ME),
            (ANNOTATION_CAPI_MACHINE, "m-1"),
            ("node.alpha.kubernetes.io/ttl", "0"),
            (
                "volumes.kubernetes.io/controller-managed-attach-detach",
                "true",
            ),
        ],
    );
    full.metadata.uid = Some("uid-1".into());
    full.metadata.labels = Some(
        [
            ("topology.kubernetes.io/zone".to_string(), "r1".to_string()),
            (LABEL_MEDIK8S_EXCLUDE.to_string(), "true".to_string()),
        ]
        .into(),
    );
    let spec = full.spec.as_mut().unwrap();
    spec.provider_id = Some("aws:///us-east-1a/i-0123456789abcdef0".into());
    spec.unschedulable = Some(true);
    spec.pod_cidr = Some("10.244.1.0/24".into());
    let status = full.status.as_mut().unwrap();
    status.conditions.as_mut().unwrap().push(NodeCondition {
        type_: "MemoryPressure".into(),
        status: "False".into(),
        ..Default::default()
    });
    status.addresses = Some(vec![NodeAddress {
        type_: "InternalIP".into(),
        address: "10.0.0.5".into(),
    }]);
    let info = status.node_info.as_mut().unwrap();
    info.system_uuid = "4C4C4544-0038-4B10-8052-B4C04F4A4E32".into();
    info.kernel_version = "6.1.0".into();
    status.images = Some(vec![
        ContainerImage {
            names: Some(vec!["registry.example/app@sha256:0123".into()]),
            size_bytes: Some(1 << 30),
        };
        40
    ]);
    status.capacity = Some([("cpu".to_string(), Quantity("64".into()))].into());
    let view = NodeView::from(&full);
    let facts = super::node_facts(&view, None, ME);
    assert_eq!(facts.boot_id, "b1");
    assert!(
        facts
            .fence
            .as_ref()
            .is_some_and(|f| f.ours && f.taint_present)
    );
    assert_eq!(
        facts.identity.system_uuid,
        "4C4C4544-0038-4B10-8052-B4C04F4A4E32"
    );
    assert_eq!(facts.identity.addresses, vec!["10.0.0.5".to_string()]);
    assert!(matches!(facts.readiness, Readiness::NotReady { .. }));
    assert!(facts.opted_out.is_some());
    assert_eq!(
        super::provider_id(&view),
        Some("aws:///us-east-1a/i-0123456789abcdef0")
    );
    assert!(
        super::other_remediator(&view).is_some(),
        "cordoned under a CAPI Machine"
    );
    assert_eq!(
        view.annotations
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        vec![
            ANNOTATION_CAPI_MACHINE,
            ANNOTATION_FENCED_AT,
            ANNOTATION_FENCED_BOOT_ID,
            ANNOTATION_FENCED_BY
        ],
        "foreign annotations are not kept"
    );
    assert_eq!(view.labels.len(), 2);
    assert_eq!(
        view.labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("r1")
    );
    assert_eq!(view.labels.get("topology.kubernetes.io/region"), None);
    assert_eq!(view.taints.len(), 1);
}
