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
//! the writer of renewTime), as client-go's elector does. Each takeover adds one to
//! `leaseTransitions`: the term, which every write records (`oobfence.io/fenced-by`, the
//! journal), so two actors never both claim one fence.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

use crate::config::HaConfig;

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
}

impl Leadership {
    fn new(identity: &str) -> Leadership {
        Leadership {
            identity: identity.to_string(),
            holder: None,
            term: 0,
            writable_until: None,
            changes: 0,
            error: None,
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
        Some(match (&self.holder, &self.error) {
            (Some(h), _) if *h == self.identity => format!(
                "this instance ({}) holds the Lease but has not renewed it in time{}: it writes nothing until it renews",
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
    let (api, name, ha) = (
        Api::namespaced(client, &ha.namespace),
        ha.lease_name(datacenter),
        ha.clone(),
    );
    tokio::spawn(async move {
        let mut observed = None;
        while let Some(out) = weak.upgrade() {
            let mut elector = Elector {
                api: api.clone(),
                name: name.clone(),
                ha: ha.clone(),
                out,
                observed: observed.take(),
            };
            elector.attempt().await;
            observed = elector.observed.take();
            drop(elector);
            tokio::time::sleep(ha.renew_interval).await;
        }
    });
    handle
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    ha: HaConfig,
    out: LeadershipHandle,
    /// The Lease's record as last observed, and when (our clock).
    observed: Option<(LeaseRecord, Instant)>,
}

/// The Lease's holder, renewTime and transitions: what changes whenever anyone renews it or
/// takes it over.
type LeaseRecord = (Option<String>, Option<Timestamp>, i32);

impl Elector {
    pub fn new(client: Client, ha: &HaConfig, datacenter: &str, out: LeadershipHandle) -> Elector {
        Elector {
            api: Api::namespaced(client, &ha.namespace),
            name: ha.lease_name(datacenter),
            ha: ha.clone(),
            out,
            observed: None,
        }
    }

    /// One round: read the Lease; renew it if ours, take it if free or expired (by our own
    /// observation), else follow. Bounded like a write: a round that takes longer cannot
    /// extend anything anyway, since the deadline counts from its start.
    pub async fn attempt(&mut self) {
        let started = Instant::now();
        let bound = self.ha.write_timeout().max(Duration::from_secs(1));
        let result = tokio::time::timeout(bound, self.round(started)).await;
        let mut out = self.out.write().expect("leadership lock");
        let was_writing = out.may_write();
        match result {
            Ok(Ok(round)) => {
                out.error = None;
                out.holder = round.holder;
                out.term = round.term;
                if round.ours {
                    out.writable_until = Some(
                        started
                            + self
                                .ha
                                .lease_duration
                                .saturating_sub(self.ha.safety_margin()),
                    );
                } else {
                    out.writable_until = None;
                }
            }
            // A failed round never extends the deadline: the last one still stands, and runs
            // out by itself.
            Ok(Err(e)) => out.error = Some(e),
            Err(_) => out.error = Some(format!("no answer within {bound:?}")),
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

    async fn round(&mut self, started: Instant) -> Result<Round, String> {
        let me = self.ha.identity.clone();
        let now = Timestamp::now();
        let duration_s = self.ha.lease_duration.as_secs().max(1) as i32;
        let Some(lease) =
            self.api.get_opt(&self.name).await.map_err(|e| {
                format!("cannot read Lease {}/{}: {e}", self.ha.namespace, self.name)
            })?
        else {
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
            return match self.api.create(&PostParams::default(), &fresh).await {
                Ok(_) => Ok(Round::ours(me, 0)),
                // Someone else created it first: follow them, next round.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::theirs(None, 0)),
                Err(e) => Err(format!("cannot create Lease {}: {e}", self.name)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let renew = spec.renew_time.as_ref().map(|t| t.0);
        let term = spec.lease_transitions.unwrap_or(0);
        let key = (holder.clone(), renew, term);
        let observed_at = match &self.observed {
            Some((k, at)) if *k == key => *at,
            _ => {
                self.observed = Some((key, started));
                started
            }
        };
        let expired = started.duration_since(observed_at) >= self.ha.lease_duration;
        let (new_term, acquire) = match &holder {
            Some(h) if *h == me => (term, spec.acquire_time.clone()),
            None => (term + 1, Some(MicroTime(now))),
            Some(_) if expired => (term + 1, Some(MicroTime(now))),
            Some(_) => return Ok(Round::theirs(holder, term)),
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
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(l) => {
                let spec = l.spec.unwrap_or_default();
                self.observed = Some((
                    (
                        spec.holder_identity.clone(),
                        spec.renew_time.map(|t| t.0),
                        spec.lease_transitions.unwrap_or(0),
                    ),
                    started,
                ));
                let _ = l.metadata.resource_version;
                Ok(Round::ours(me, new_term))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::theirs(holder, term)),
            Err(e) => Err(format!("cannot update Lease {}: {e}", lease.name_any())),
        }
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
