//! Leader election on a `coordination.k8s.io/v1` Lease: of the instances running one
//! datacenter's config (`[ha] enabled = true`), exactly one writes to the cluster.
//!
//! A small elector of our own rather than a crate: what matters here is not holding the Lease
//! but knowing, at the moment of a write, that nobody else can hold it yet — and an elector
//! that keeps saying "leader" while it cannot renew is the one failure that makes two actors.
//! So leadership is a deadline, not a flag: [`Leadership::may_write`] is true only until
//! (start of the last successful renewal) + `lease_duration` − `safety_margin`
//! ([`HaConfig::safety_margin`] argues the margin). A leader cut off from the API server stops
//! writing on its own, by its own clock, before any other instance may take the Lease.
//!
//! Another instance takes the Lease over only when it has seen the Lease's holder and
//! renewTime unchanged for `lease_duration` by its own clock (never by comparing clocks with
//! the writer of renewTime), counted from the arrival of the answer that first showed them,
//! as client-go's elector does. A Lease naming this instance is its own only if this process
//! wrote its renewTime: another process under the same `[ha] identity` is followed like any
//! other holder, and reported ([`decide`] argues both rules). Each takeover adds one to
//! `leaseTransitions`: the term, which every write records (`oobfence.io/fenced-by`, the
//! journal), so two actors never both claim one fence.

use crate::api_error::ApiError;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

use crate::config::HaConfig;

mod decide;
mod server_bound;

pub use self::decide::{Core, Record, Step};
pub use self::server_bound::server_bounded;

/// This instance's standing, as of the last attempt.
#[derive(Clone, Debug)]
pub struct Leadership {
    /// This instance's name in the Lease.
    pub identity: String,
    /// The Lease's current holder as last seen (None: nobody, or not read yet).
    pub holder: Option<String>,
    /// `leaseTransitions` of the Lease as last seen: the term.
    pub term: i32,
    /// While we hold the Lease: writes may start until then.
    pub writable_until: Option<Instant>,
    /// Leadership changes seen by this instance (for the metric).
    pub changes: u64,
    /// The last error talking to the Lease, if the last attempt failed.
    pub error: Option<String>,
    /// Another process has renewed the Lease under this instance's identity within the last
    /// `lease_duration` (the same `[ha] identity` on two hosts): this one writes nothing.
    pub duplicate_identity: bool,
}

impl Leadership {
    pub fn new(identity: &str) -> Leadership {
        Leadership {
            identity: identity.to_string(),
            holder: None,
            term: 0,
            writable_until: None,
            changes: 0,
            error: None,
            duplicate_identity: false,
        }
    }

    /// Whether this instance may start a write now.
    pub fn may_write(&self) -> bool {
        self.writable_until.is_some_and(|t| Instant::now() < t)
    }

    /// Why this instance may not write, if it may not.
    pub fn standby_reason(&self) -> Option<String> {
        if self.may_write() {
            return None;
        }
        if self.duplicate_identity {
            return Some(format!(
                "another process renews the Lease under this instance's identity ({}): [ha] identity must differ on every host; this one writes nothing until the other has stopped renewing for a lease duration",
                self.identity
            ));
        }
        Some(match (&self.holder, &self.error) {
            (Some(h), _) if *h == self.identity => format!(
                "the Lease names this instance ({}) but this process has not renewed it in time{}: it writes nothing until it renews (a Lease left by an earlier run: once it has gone unrenewed for a lease duration)",
                self.identity,
                self.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
            (Some(h), _) => format!("standby: {h} holds the Lease and is the one that writes"),
            (None, Some(e)) => format!("standby: the Lease cannot be read ({e})"),
            (None, None) => "standby: no instance holds the Lease yet".to_string(),
        })
    }
}

pub type LeadershipHandle = Arc<RwLock<Leadership>>;

/// Runs the elector for the daemon's lifetime; its standing is published in the handle.
/// The elector stops when nobody holds the handle any more (the daemon is gone).
pub fn spawn(client: Client, ha: &HaConfig, datacenter: &str) -> LeadershipHandle {
    let handle = Arc::new(RwLock::new(Leadership::new(&ha.identity)));
    let weak = Arc::downgrade(&handle);
    let mut elector = Elector::new(client, ha, datacenter);
    let pause = ha.renew_interval;
    tokio::spawn(async move {
        while let Some(out) = weak.upgrade() {
            elector.attempt(&out).await;
            drop(out);
            tokio::time::sleep(pause).await;
        }
    });
    handle
}

/// One instance's elector: the I/O around [`decide::Core`], which decides.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    ha: HaConfig,
    core: Core,
}

impl Elector {
    pub fn new(client: Client, ha: &HaConfig, datacenter: &str) -> Elector {
        Elector {
            api: Api::namespaced(client, &ha.namespace),
            name: ha.lease_name(datacenter),
            ha: ha.clone(),
            core: Core::new(&ha.identity, ha.lease_duration, ha.safety_margin()),
        }
    }

    /// One round: read the Lease; renew it if ours, take it if free or expired (by our own
    /// observation), else follow. Bounded like a write: a round that takes longer cannot
    /// extend anything anyway, since the deadline counts from its start.
    pub async fn attempt(&mut self, out: &RwLock<Leadership>) {
        let started = Instant::now();
        let bound = self.ha.write_timeout().max(Duration::from_secs(1));
        let result = tokio::time::timeout(bound, self.round()).await;
        let duplicate = self.core.duplicate(Instant::now());
        let mut out = out.write().expect("leadership lock");
        let was_writing = out.may_write();
        match result {
            Ok(Ok(round)) => {
                out.error = None;
                out.holder = round.holder;
                out.term = round.term;
                out.writable_until = round.ours.then(|| self.core.writable_until(started));
            }
            // A failed round never extends the deadline: the last one still stands, and runs
            // out by itself.
            Ok(Err(e)) => out.error = Some(e),
            Err(_) => out.error = Some(format!("no answer within {bound:?}")),
        }
        if duplicate != out.duplicate_identity {
            out.duplicate_identity = duplicate;
            if duplicate {
                tracing::error!(identity = %out.identity, lease = %self.name, "another process renews the Lease under this instance's identity: [ha] identity must differ on every host (a copied config, cloned host names?); this instance writes nothing while the other renews");
            } else {
                tracing::warn!(identity = %out.identity, lease = %self.name, "no other process has renewed the Lease under this instance's identity for a lease duration");
            }
        }
        let writing = out.may_write();
        if writing != was_writing {
            out.changes += 1;
            // Losing it is logged by the daemon, which also sees a deadline run out with no
            // round to say so.
            if writing {
                tracing::warn!(identity = %out.identity, term = out.term, lease = %self.name, "LEADER: this instance holds the Lease and writes");
            }
        }
    }

    async fn round(&mut self) -> Result<Round, String> {
        let me = self.ha.identity.clone();
        // renewTime as the API server keeps it (microseconds), so that we know it again.
        let now = Timestamp::now();
        let now = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let duration_s = self.ha.lease_duration.as_secs().max(1) as i32;
        let lease = self.api.get_opt(&self.name).await.map_err(|e| {
            format!(
                "cannot read Lease {}/{}: {}",
                self.ha.namespace,
                self.name,
                ApiError(&e)
            )
        })?;
        // Observed when the answer arrived, not when the round began (see `decide`).
        let answered = Instant::now();
        let record = lease.as_ref().map(record_of);
        let step = self.core.read(record.as_ref(), answered);
        let Some(lease) = lease else {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.ha.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_s),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            self.core.sending(now);
            return match self.api.create(&PostParams::default(), &fresh).await {
                Ok(l) => {
                    self.core.wrote(record_of(&l), Instant::now());
                    Ok(Round::ours(me, 0))
                }
                // Someone else created it first: follow them, next round.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::theirs(None, 0)),
                Err(e) => Err(format!(
                    "cannot create Lease {}: {}",
                    self.name,
                    ApiError(&e)
                )),
            };
        };
        let record = record.unwrap_or(Record {
            holder: None,
            renew: None,
            term: 0,
        });
        let spec = lease.spec.clone().unwrap_or_default();
        let (new_term, acquire) = match step {
            Step::Renew => (record.term, spec.acquire_time.clone()),
            Step::TakeOver => (record.term + 1, Some(MicroTime(now))),
            Step::Follow => return Ok(Round::theirs(record.holder, record.term)),
        };
        let mut updated = lease.clone();
        updated.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(duration_s),
            acquire_time: acquire,
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(new_term),
            ..Default::default()
        });
        // The resourceVersion of what we read: if anyone wrote in between, this fails (409)
        // and we follow them.
        self.core.sending(now);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(l) => {
                self.core.wrote(record_of(&l), Instant::now());
                Ok(Round::ours(me, new_term))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Ok(Round::theirs(record.holder, record.term))
            }
            Err(e) => Err(format!(
                "cannot update Lease {}: {}",
                lease.name_any(),
                ApiError(&e)
            )),
        }
    }
}

fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        renew: spec.renew_time.map(|t| t.0),
        term: spec.lease_transitions.unwrap_or(0),
    }
}

struct Round {
    ours: bool,
    holder: Option<String>,
    term: i32,
}

impl Round {
    fn ours(me: String, term: i32) -> Round {
        Round {
            ours: true,
            holder: Some(me),
            term,
        }
    }

    fn theirs(holder: Option<String>, term: i32) -> Round {
        Round {
            ours: false,
            holder,
            term,
        }
    }
}
