//! Did the fence free the node's volumes? Watches `storage.k8s.io/v1` VolumeAttachments.
//!
//! The point of a fence is that Kubernetes detaches the dead node's volumes so their pods can
//! run elsewhere. At fence time the daemon records which VolumeAttachments have
//! `spec.nodeName` equal to the node; from then on it checks, once a second against a watch
//! cache, whether they are gone. The wait is reported as a gauge per node while it lasts and as
//! a histogram once it ends.
//!
//! This is Kubernetes' own view, independent of any power source: it works the same for
//! Redfish, IPMI or cloud machines. A watch that fails (typically RBAC without
//! `volumeattachments` list/watch) is reported, never fatal.

use crate::cluster::WatchError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

/// One fenced node whose volumes are not all released yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub fenced_at: Timestamp,
    /// VolumeAttachment names that pointed at the node at fence time and still exist.
    pub remaining: BTreeSet<String>,
}

/// A fenced node whose recorded VolumeAttachments are now all gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub node: String,
    pub fenced_at: Timestamp,
    /// From the fence to noticing the last one gone.
    pub after: Duration,
    pub names: Vec<String>,
}

/// The VolumeAttachment watch and the fenced nodes waiting on it.
pub struct VolumeWatch {
    store: Store<VolumeAttachment>,
    /// The last watch call succeeded.
    healthy: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
    pending: BTreeMap<String, Pending>,
    /// Names and count recorded at fence time, for the release record.
    recorded: BTreeMap<String, Vec<String>>,
    /// Nodes already looked at after a restart (see [`VolumeWatch::resume`]).
    resumed: BTreeSet<String>,
}

impl VolumeWatch {
    /// Starts watching every VolumeAttachment in the cluster.
    pub fn start(client: Client) -> VolumeWatch {
        let (reader, writer) = reflector::store();
        let healthy = Arc::new(AtomicBool::new(false));
        let flag = healthy.clone();
        let stream = watcher(
            Api::<VolumeAttachment>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer);
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            let mut failing = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    // The watcher says Init before it asks the API server anything: no proof.
                    Ok(watcher::Event::Init) => {}
                    Ok(_) => {
                        flag.store(true, Ordering::Relaxed);
                        if failing {
                            tracing::info!("VolumeAttachment watch works again");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        flag.store(false, Ordering::Relaxed);
                        if !failing {
                            if crate::cluster::watch_forbidden(&e) {
                                tracing::warn!(error = %WatchError(&e), "VolumeAttachment watch refused: RBAC needs list/watch on volumeattachments (deploy/rbac.yaml); volume release is not tracked until it works; retrying with backoff");
                            } else {
                                tracing::warn!(error = %WatchError(&e), "VolumeAttachment watch failed; volume release is not tracked until it works; retrying with backoff");
                            }
                        }
                        failing = true;
                    }
                }
            }
        });
        VolumeWatch {
            store: reader,
            healthy,
            task: Some(task),
            pending: BTreeMap::new(),
            recorded: BTreeMap::new(),
            resumed: BTreeSet::new(),
        }
    }

    /// The cache holds a complete, current list.
    pub fn ready(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
            && matches!(
                futures::FutureExt::now_or_never(self.store.wait_until_ready()),
                Some(Ok(()))
            )
    }

    /// Names of the VolumeAttachments pointing at `node`, sorted; `None` when the watch is
    /// not working, so "none" and "unknown" are not confused.
    pub fn attached_to(&self, node: &str) -> Option<Vec<String>> {
        if !self.ready() {
            return None;
        }
        let mut names: Vec<String> = self
            .store
            .state()
            .iter()
            .filter(|va| va.spec.node_name == node)
            .map(|va| va.name_any())
            .collect();
        names.sort();
        Some(names)
    }

    /// Starts waiting for `names` (recorded when `node` was fenced at `fenced_at`) to go.
    /// Nothing to wait for when the node had no VolumeAttachments.
    pub fn track(&mut self, node: &str, fenced_at: Timestamp, names: &[String]) {
        self.resumed.insert(node.to_string());
        if names.is_empty() {
            self.forget(node);
            self.resumed.insert(node.to_string());
            return;
        }
        self.recorded.insert(node.to_string(), names.to_vec());
        self.pending.insert(
            node.to_string(),
            Pending {
                fenced_at,
                remaining: names.iter().cloned().collect(),
            },
        );
    }

    /// After a restart the daemon finds nodes it fenced earlier: take the VolumeAttachments
    /// pointing at them now as the ones to wait for. Once per node per process, and only when
    /// the watch works.
    pub fn resume(&mut self, node: &str, fenced_at: Timestamp) {
        if self.resumed.contains(node) || self.pending.contains_key(node) {
            return;
        }
        let Some(names) = self.attached_to(node) else {
            return;
        };
        self.track(node, fenced_at, &names);
    }

    /// Stops waiting on `node` (its fence was lifted or cleared).
    pub fn forget(&mut self, node: &str) {
        self.pending.remove(node);
        self.recorded.remove(node);
        self.resumed.remove(node);
    }

    /// Drops the VolumeAttachments that are gone; returns the nodes whose last one went.
    /// Does nothing while the watch is not working (a failed watch is not a release).
    pub fn check(&mut self, now: Timestamp) -> Vec<Released> {
        if !self.ready() {
            return Vec::new();
        }
        let mut released = Vec::new();
        for (node, p) in self.pending.iter_mut() {
            p.remaining.retain(|name| {
                self.store
                    .get(&ObjectRef::new(name))
                    .is_some_and(|va| va.spec.node_name == *node)
            });
            if p.remaining.is_empty() {
                released.push(Released {
                    node: node.clone(),
                    fenced_at: p.fenced_at,
                    after: Duration::try_from(now.duration_since(p.fenced_at))
                        .unwrap_or(Duration::ZERO),
                    names: self.recorded.get(node).cloned().unwrap_or_default(),
                });
            }
        }
        for r in &released {
            self.pending.remove(&r.node);
            self.recorded.remove(&r.node);
        }
        released
    }

    /// Fenced nodes still waiting, with how many of their VolumeAttachments remain.
    pub fn pending(&self) -> impl Iterator<Item = (&str, usize)> {
        self.pending
            .iter()
            .map(|(n, p)| (n.as_str(), p.remaining.len()))
    }

    pub fn watch_up(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

impl Drop for VolumeWatch {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
