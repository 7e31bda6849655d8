//! Prometheus metrics, served at `/metrics` in OpenMetrics text.
//!
//! Names are prefixed `oobfence_`. Labels stay low-cardinality except `node`, on series that are
//! per node by nature (a node's state, its taint's age, its blocked reason, its volumes). Every
//! metric's HELP text says what it means to the person on call; `docs/runbook.md` says what to
//! do about it, and `deploy/prometheus/oobfence-rules.yaml` alerts on it.
//!
//! This file holds [`Metrics`] itself; beside it, `labels` the label sets and the values they
//! take, `catalogue` every metric registered with its HELP text (most of the module, and
//! read in one go), `nodes` the per-node setters (state, fences, power sources, identity,
//! actions) and `daemon_state` those of the daemon as a whole (config, leadership, guards).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod catalogue;
mod daemon_state;
mod labels;
mod nodes;
#[cfg(test)]
mod tests;

pub use labels::*;

/// The `cause` values of `oobfence_guard_record_repairs_total`.
pub const GUARD_RECORD_REPAIRS: [&str; 2] = ["corrupt", "missing"];

/// Every request oobfence's clients sent to the API server, by HTTP method (GET counts lists,
/// watches and fresh reads alike): what oobfence costs the control plane. Process-wide, since
/// a client exists before the metrics do; `metrics::Metrics` serves it.
pub static KUBERNETES_REQUESTS: std::sync::LazyLock<
    prometheus_client::metrics::family::Family<
        MethodLabels,
        prometheus_client::metrics::counter::Counter,
    >,
> = std::sync::LazyLock::new(Default::default);

type FloatGauge = Gauge<f64, AtomicU64>;

/// Registers a metric so that its HELP and TYPE lines are always served, even before it has
/// a series: an operator (and the check of the dashboard and alert rules) can find every
/// metric on a fresh daemon, not only those something has happened to yet.
#[derive(Debug)]
struct Listed<M>(M);

impl<M: EncodeMetric> EncodeMetric for Listed<M> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A gauge with no sample until it is first set: its HELP and TYPE lines are served from the
/// start, its value only once the daemon knows it. A value that depends on the cluster (the
/// fence budget's limit is a share of the nodes watched) would otherwise read 0 before the
/// first sync and through an outage at start, and an alert comparing it would fire on a
/// number nobody computed.
#[derive(Clone, Debug, Default)]
pub struct KnownGauge {
    gauge: Gauge,
    known: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl KnownGauge {
    pub fn set(&self, v: i64) {
        self.gauge.set(v);
        self.known.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The value, or `None` while it has never been set.
    pub fn get(&self) -> Option<i64> {
        self.known
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| self.gauge.get())
    }
}

impl EncodeMetric for KnownGauge {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        if self.known.load(std::sync::atomic::Ordering::Acquire) {
            self.gauge.encode(encoder)
        } else {
            Ok(())
        }
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

pub struct Metrics {
    pub registry: Registry,
    pub node_state: Family<NodeStateLabels, Gauge>,
    pub nodes: Family<StateLabels, Gauge>,
    pub actions: Family<ActionLabels, Counter>,
    pub power_actions: Family<PowerActionLabels, Counter>,
    /// Fences that landed, by action and what they rest on.
    pub fences: Family<FenceLabels, Counter>,
    pub fence_agent_reads: Family<AgentReadLabels, Counter>,
    pub would_act: Family<WouldActLabels, Counter>,
    pub power_reads: Family<ReadLabels, Counter>,
    pub power_reads_in_flight: Gauge,
    pub power_read_duration: Family<BackendLabels, Histogram>,
    pub blocked: Family<BlockedLabels, Gauge>,
    pub node_blocked: Family<NodeReasonLabels, Gauge>,
    pub power_sources_failing: Family<FailingLabels, Gauge>,
    pub decision_pass_duration: Histogram,
    pub notready_to_fence: Histogram,
    pub power_cut_to_fence: Histogram,
    pub fence_to_volumes_released: Histogram,
    /// EC2 only: from a fence to the instance's EBS data volumes being detached from it.
    pub fence_to_ebs_detached: Histogram,
    pub fence_to_recovery: Histogram,
    pub notready_to_power_off: Histogram,
    pub fenced_since: Family<NodeActionLabels, FloatGauge>,
    pub taint_age: Family<NodeLabels, FloatGauge>,
    pub power_source_last_success: Family<NodeBackendLabels, FloatGauge>,
    pub foreign_taints: Family<ReadyLabels, Gauge>,
    pub fenced_volume_attachments: Family<NodeLabels, Gauge>,
    pub volume_watch_up: Gauge,
    pub guard_record_ok: Gauge,
    /// By cause: [`GUARD_RECORD_REPAIRS`].
    pub guard_record_repairs: Family<CauseLabels, Counter>,
    pub guard_record_pending: Gauge,
    pub journal_records: Family<JournalLabels, Counter>,
    pub last_sync: FloatGauge,
    pub kubeconfig_token_expiry: FloatGauge,
    pub config_reload_ok: Gauge,
    pub config_info: Family<ConfigLabels, Gauge>,
    pub config_reload_time: FloatGauge,
    /// Counters the EC2 reader feeds (registered whether or not [aws] is configured).
    pub ec2: crate::power::ec2::Ec2Stats,
    pub nodes_watched: Gauge,
    pub identity_nodes: Family<VerdictLabels, Gauge>,
    pub identity_unchecked: Gauge,
    pub node_identity_problem: Family<NodeProblemLabels, Gauge>,
    pub node_failure_domain: Family<NodeDomainLabels, Gauge>,
    /// Each node's `node_failure_domain` series, so that it goes when the node is healthy.
    node_domains: Mutex<BTreeMap<String, String>>,
    /// Nodes with an identity problem series, so that fixed ones are removed.
    identity_problems_seen: Mutex<BTreeSet<(String, &'static str)>>,
    pub paused: Gauge,
    pub view_stale: Gauge,
    pub leases_late: Gauge,
    pub leases_stale: Gauge,
    pub lease_storm: Gauge,
    pub scope_hold: Family<ScopeHoldLabels, Gauge>,
    pub scope_nodes: Family<ScopeCountLabels, Gauge>,
    /// Not served before the first pass over a synced view: see [`KnownGauge`].
    pub fence_budget_used: KnownGauge,
    pub fence_budget_limit: KnownGauge,
    pub leader: Family<DatacenterLabels, Gauge>,
    pub lease_term: Family<DatacenterLabels, Gauge>,
    pub ha_duplicate_identity: Family<DatacenterLabels, Gauge>,
    datacenter: String,
    /// Scope series set so far, so that those of a domain gone are removed.
    scopes_seen: Mutex<BTreeSet<String>>,
    /// `power_sources_failing` label sets set so far, so the ones that recover go to 0.
    failing_seen: Mutex<BTreeSet<FailingLabels>>,
    /// Nodes oobfence deleted: node -> (uid of the deleted Node, when).
    deleted_fences: Mutex<BTreeMap<String, (String, Instant)>>,
}

impl Metrics {
    /// The datacenter named in the labels of `leader` and `lease_term`.
    pub fn for_datacenter(mut self, datacenter: &str) -> Metrics {
        self.datacenter = datacenter.to_string();
        self
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
