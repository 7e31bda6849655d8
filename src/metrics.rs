//! Prometheus metrics, served at `/metrics` in OpenMetrics text.
//!
//! Names are prefixed `oobfence_`. Labels stay low-cardinality except `node`, on series that are
//! per node by nature.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::decision::NodeState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    pub node: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WouldActLabels {
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    pub backend: &'static str,
    pub result: &'static str,
    pub error_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockedLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
}

pub const ALL_STATES: [NodeState; 6] = [
    NodeState::Healthy,
    NodeState::Suspect,
    NodeState::Confirming,
    NodeState::Blocked,
    NodeState::Fenced,
    NodeState::Recovering,
];

pub struct Metrics {
    pub registry: Registry,
    pub node_state: Family<NodeStateLabels, Gauge>,
    pub actions: Family<ActionLabels, Counter>,
    pub would_act: Family<WouldActLabels, Counter>,
    pub power_reads: Family<ReadLabels, Counter>,
    pub power_read_duration: Family<BackendLabels, Histogram>,
    pub blocked: Family<BlockedLabels, Gauge>,
    pub last_sync: Gauge<f64, AtomicU64>,
    pub nodes_watched: Gauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("oobfence");
        let node_state = Family::<NodeStateLabels, Gauge>::default();
        registry.register(
            "node_state",
            "1 for the state each watched node is in (healthy, suspect = NotReady within grace, confirming = reading power, blocked = NotReady but fencing refused, fenced, recovering = fenced and Ready again), 0 for the others",
            node_state.clone(),
        );
        let actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "actions",
            "Writes oobfence made to the cluster (taint, untaint, delete_node, clear_record) and whether they succeeded",
            actions.clone(),
        );
        let would_act = Family::<WouldActLabels, Counter>::default();
        registry.register(
            "would_act",
            "Actions a dry run decided on but did not write",
            would_act.clone(),
        );
        let power_reads = Family::<ReadLabels, Counter>::default();
        registry.register(
            "power_reads",
            "Out-of-band power reads by backend and result (on, off, transitional, error); error_kind says why a read failed",
            power_reads.clone(),
        );
        let power_read_duration = Family::<BackendLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0])
        });
        registry.register(
            "power_read_duration_seconds",
            "How long one power read took, connection and authentication included",
            power_read_duration.clone(),
        );
        let blocked = Family::<BlockedLabels, Gauge>::default();
        registry.register(
            "blocked",
            "NotReady nodes whose fencing is refused right now, by rule (power-on, power-unknown, no-power-source, ...)",
            blocked.clone(),
        );
        let last_sync = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_successful_sync_timestamp_seconds",
            "Unix time of the last decision pass over a synced node cache; stale means oobfence is not watching",
            last_sync.clone(),
        );
        let nodes_watched = Gauge::default();
        registry.register(
            "nodes_watched",
            "Nodes in oobfence's cache",
            nodes_watched.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("build_info", "oobfence version (always 1)", build_info);
        Metrics {
            registry,
            node_state,
            actions,
            would_act,
            power_reads,
            power_read_duration,
            blocked,
            last_sync,
            nodes_watched,
        }
    }

    pub fn set_node_state(&self, node: &str, state: NodeState) {
        for s in ALL_STATES {
            self.node_state
                .get_or_create(&NodeStateLabels {
                    node: node.to_string(),
                    state: s.as_str(),
                })
                .set(i64::from(s == state));
        }
    }

    pub fn forget_node(&self, node: &str) {
        for s in ALL_STATES {
            self.node_state.remove(&NodeStateLabels {
                node: node.to_string(),
                state: s.as_str(),
            });
        }
    }

    pub fn action(&self, action: &'static str, ok: bool) {
        self.actions
            .get_or_create(&ActionLabels {
                action,
                result: if ok { "success" } else { "failure" },
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
