//! What the loop owns: every node's tracker, the caches, the guards, the channels its tasks
//! answer on. What it does with them is beside it, a file per step (see [`super`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use jiff::Timestamp;
use tokio::sync::mpsc;

use super::action::ActionDone;
use super::guard_record;
use super::leases::Leases;
use super::nodes::Nodes;
use super::reads::{ReadDone, ReadSlots};
use super::tracker::Tracker;
use super::uuids;
use crate::cluster::{self, Cluster};
use crate::config::Config;
use crate::decision::MappingConflict;
use crate::decision::holds::Calm;
use crate::journal::Journal;
use crate::power::PowerSources;
use crate::status::Shared;
use crate::volumes::VolumeWatch;

/// Power reads kept per node: enough for any confirmation plus what `why` shows.
pub(super) const READS_KEPT: usize = 16;
/// After a failed write, wait this long before trying again.
pub(super) const ACTION_RETRY: Duration = Duration::from_secs(10);
/// The first retry of a power command that was not sent or failed; each failure in a row
/// doubles the wait, up to [`POWER_RETRY_MAX`]. A BMC refusing or failing a power-off is not
/// hammered: its machine stays as it is, fenced only if it reads Off.
pub(super) const POWER_RETRY_MIN: Duration = Duration::from_secs(30);
pub(super) const POWER_RETRY_MAX: Duration = Duration::from_secs(15 * 60);

/// How long to wait before the next power command after `failures` in a row (1 or more):
/// exponential from [`POWER_RETRY_MIN`] to [`POWER_RETRY_MAX`], jittered so that a rack's
/// retries do not fall together.
pub(super) fn power_action_retry(failures: u32) -> Duration {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(POWER_RETRY_MIN)
        .with_max_delay(POWER_RETRY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(failures.saturating_sub(1).min(16) as usize)
        .unwrap_or(POWER_RETRY_MAX)
}

/// A failed power read counts towards `power_sources_failing` for this long.
pub(super) const FAILING_WINDOW: Duration = Duration::from_secs(600);
/// A delete_node fence stays in `fenced_since_timestamp_seconds` this long after the delete.
pub(super) const DELETED_FENCE_KEPT: Duration = Duration::from_secs(3600);
/// Every node's mapping is checked against the cache at least this often (in passes), whatever
/// the node watch said.
pub(super) const MAPPING_CHECK_PASSES: u32 = 30;
/// A healthy node's power source whose last read failed is read again this soon: a freeze
/// (too many sources failing) thaws once they answer, and a broken BMC shows before its node
/// fails.
pub(super) const FAILED_SOURCE_RETRY: Duration = Duration::from_secs(15);

pub(super) struct Daemon {
    pub(super) cfg: Arc<Config>,
    pub(super) cluster: Cluster,
    pub(super) shared: Arc<Shared>,
    pub(super) nodes: Nodes,
    pub(super) leases: Leases,
    pub(super) trackers: HashMap<String, Tracker>,
    pub(super) sources: Arc<PowerSources>,
    pub(super) read_slots: ReadSlots,
    pub(super) reads_tx: mpsc::Sender<ReadDone>,
    pub(super) actions_tx: mpsc::Sender<ActionDone>,
    pub(super) journal: Journal,
    pub(super) volumes: VolumeWatch,
    /// Nodes whose mapping cannot be trusted, recomputed whenever the node names or their
    /// providerIDs change (`conflicts_of`: the names and providerIDs they were computed on).
    pub(super) conflicts: HashMap<String, MappingConflict>,
    pub(super) conflicts_of: HashMap<String, Option<String>>,
    /// The outlets above level 1 that feed several nodes, and the nodes each feeds (computed
    /// with `conflicts`).
    pub(super) outlets: HashMap<String, Vec<String>>,
    /// The mapping's conflicts and the shared UUIDs must be checked against the nodes again: a
    /// Node changed its name, providerID or system UUID, came or went. `changes_missed`: the
    /// node watch could not say which (its channel was full, or it listed everything again).
    /// Checked anyway every [`MAPPING_CHECK_PASSES`] passes.
    pub(super) mapping_check_due: bool,
    pub(super) changes_missed: Arc<AtomicBool>,
    pub(super) passes_since_mapping_check: u32,
    /// Nodes that report another Node's system UUID: it proves neither machine.
    pub(super) shared_uuids: uuids::SharedUuids,
    /// The guards' memory: storms, freezes, the fence budget.
    pub(super) calm: Calm,
    /// Its record on the cluster, for a restart or a new leader.
    pub(super) guard_keeper: guard_record::Keeper,
    /// `[ha]`: whether this instance may write.
    pub(super) leadership: Option<crate::leader::LeadershipHandle>,
    /// Counts the passes where what the guards hold changed (pause, view, standby, a storm,
    /// a freeze, the budget, a lease storm): every node is then decided again.
    pub(super) guards_epoch: u64,
    /// `[ha]`: whether the journal last said this instance writes (`None`: said nothing yet,
    /// so that the first pass tells how it starts, leader or standby).
    pub(super) told_leader: Option<bool>,
    /// Within a pass: the guards were counted on the very nodes the pass decides. Outside
    /// one, the cache may have moved since the last count.
    pub(super) census_current: bool,
    /// Nodes to decide again at a set time (a grace ends, a confirming read is due), soonest
    /// first: so that a node becomes eligible when its waits end, not at the next tick.
    /// An entry no longer its tracker's `wake_at` is stale and skipped.
    pub(super) wakeups: BinaryHeap<Reverse<(Timestamp, String)>>,
    /// The token every request carries; a reload replaces it.
    pub(super) credentials: cluster::Credentials,
}
