//! What the daemon publishes for the operator: its metrics, a report per node on request, and
//! whether it is synced and alive. The HTTP endpoints serve this handle and nothing else of the
//! daemon.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::decision::holds::{Calm, Holds, Pause};
use crate::metrics::Metrics;
use crate::report::NodeReport;

mod watches;
pub use watches::Watches;

/// `/healthz` fails when the decision loop has not completed a pass for this long.
pub const LOOP_STALL: Duration = Duration::from_secs(30);

/// A request for node reports. The decision loop answers it: it alone holds what a report is
/// made of, and renders one only when asked (at 20,000 nodes, rendering every node's report
/// at every decision cost more than all the rest).
pub struct ReportRequest {
    /// One node's report, or (None) every node's, by name.
    pub node: Option<String>,
    pub reply: tokio::sync::oneshot::Sender<Vec<NodeReport>>,
}

/// Report requests waiting for the loop at most: more are refused (busy) rather than queued.
const REPORT_REQUESTS_QUEUED: usize = 64;

/// The daemon's published state, shared with the HTTP server.
pub struct Shared {
    pub datacenter: String,
    pub metrics: Metrics,
    /// Where report requests go (to the decision loop).
    pub reports: tokio::sync::mpsc::Sender<ReportRequest>,
    /// Their receiving end, until the loop takes it.
    pub report_requests: Mutex<Option<tokio::sync::mpsc::Receiver<ReportRequest>>>,
    /// Both caches (Nodes, Leases) completed their initial list.
    pub synced: AtomicBool,
    /// Whether each watch (Nodes, Leases) works: one flag each.
    pub watches: Watches,
    pub last_pass: Mutex<Option<Instant>>,
    /// The pause switches as last read (the writer also reads the file itself, last thing).
    pub pause: RwLock<Pause>,
    /// The last successful Kubernetes API round trip (the pause ConfigMap's GET).
    pub last_round_trip: Mutex<Option<Timestamp>>,
    /// The holds on each node as of the last pass, by node uid: the writer re-checks them.
    pub holds: RwLock<HashMap<String, Holds>>,
    /// The guards' state as of the last pass, served on `/guards`.
    pub calm: RwLock<Calm>,
    /// `[ha]`: this instance's standing, read live for `oobfence_leader` at every scrape.
    pub leadership: RwLock<Option<crate::leader::LeadershipHandle>>,
    /// Who this daemon is, served on `/whoami`: set at start, its digest renewed by a reload.
    pub whoami: RwLock<Option<crate::whoami::Whoami>>,
}

impl Shared {
    pub fn new(datacenter: &str) -> Arc<Shared> {
        let (reports, report_requests) = tokio::sync::mpsc::channel(REPORT_REQUESTS_QUEUED);
        Arc::new(Shared {
            datacenter: datacenter.to_string(),
            metrics: Metrics::new().for_datacenter(datacenter),
            reports,
            report_requests: Mutex::new(Some(report_requests)),
            synced: AtomicBool::new(false),
            watches: Watches::default(),
            last_pass: Mutex::new(None),
            pause: RwLock::new(Pause::default()),
            last_round_trip: Mutex::new(None),
            holds: RwLock::new(HashMap::new()),
            calm: RwLock::new(Calm::default()),
            leadership: RwLock::new(None),
            whoami: RwLock::new(None),
        })
    }

    /// Who this daemon is from now on: the config it runs, as loaded last.
    pub fn set_whoami(&self, cfg: &crate::config::Config) {
        if let Ok(mut w) = self.whoami.write() {
            *w = Some(crate::whoami::Whoami::of(cfg));
        }
    }

    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && self.watches.all_ok()
    }

    pub fn loop_alive(&self) -> bool {
        self.last_pass
            .lock()
            .map(|t| t.is_some_and(|t| t.elapsed() < LOOP_STALL))
            .unwrap_or(false)
    }
}
