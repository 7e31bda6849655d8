//! What the daemon publishes for the operator: its metrics, a report per node, and whether it
//! is synced and alive. The HTTP endpoints serve this handle and nothing else of the daemon.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::report::NodeReport;

/// `/healthz` fails when the decision loop has not completed a pass for this long.
pub const LOOP_STALL: Duration = Duration::from_secs(30);

/// The daemon's published state, shared with the HTTP server.
pub struct Shared {
    pub datacenter: String,
    pub metrics: Metrics,
    pub reports: RwLock<BTreeMap<String, NodeReport>>,
    /// Both caches (Nodes, Leases) completed their initial list.
    pub synced: AtomicBool,
    /// The last watch call succeeded.
    pub api_ok: AtomicBool,
    pub last_pass: Mutex<Option<Instant>>,
}

impl Shared {
    pub fn new(datacenter: &str) -> Arc<Shared> {
        Arc::new(Shared {
            datacenter: datacenter.to_string(),
            metrics: Metrics::new(),
            reports: RwLock::new(BTreeMap::new()),
            synced: AtomicBool::new(false),
            api_ok: AtomicBool::new(false),
            last_pass: Mutex::new(None),
        })
    }

    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Relaxed) && self.api_ok.load(Ordering::Relaxed)
    }

    pub fn loop_alive(&self) -> bool {
        self.last_pass
            .lock()
            .map(|t| t.is_some_and(|t| t.elapsed() < LOOP_STALL))
            .unwrap_or(false)
    }
}
