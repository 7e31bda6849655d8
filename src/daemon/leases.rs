//! The node Leases as the loop needs them: each one's renewTime and duration by node name
//! ([`LeaseTimes`]), kept from the Lease watch. A cached `Lease` object costs about a
//! kilobyte, its key in a reflector store as much again: at 20,000 nodes those were tens of
//! megabytes for two timestamps each.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::watcher;

use crate::cluster::LeaseTimes;

/// The read side, for the loop.
#[derive(Clone)]
pub(super) struct Leases {
    times: Arc<RwLock<HashMap<String, LeaseTimes>>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

/// The write side, for the watch.
pub(super) struct LeasesWriter {
    times: Arc<RwLock<HashMap<String, LeaseTimes>>>,
    /// A relist under way (after a start or an expired watch): the Leases it has listed so
    /// far. It replaces the map when complete, so that a Lease deleted meanwhile goes.
    relist: Option<HashMap<String, LeaseTimes>>,
    synced: tokio::sync::watch::Sender<bool>,
}

pub(super) fn leases() -> (Leases, LeasesWriter) {
    let times = Arc::new(RwLock::new(HashMap::new()));
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    (
        Leases {
            times: times.clone(),
            synced,
        },
        LeasesWriter {
            times,
            relist: None,
            synced: synced_tx,
        },
    )
}

impl Leases {
    /// The Lease of node `name` (in the node lease namespace), if it has one.
    pub(super) fn get(&self, name: &str) -> Option<LeaseTimes> {
        self.times.read().ok()?.get(name).copied()
    }

    /// Once a first complete list is in.
    pub(super) async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }
}

impl LeasesWriter {
    pub(super) fn apply(&mut self, event: &watcher::Event<Lease>) {
        let Ok(mut times) = self.times.write() else {
            return;
        };
        match event {
            watcher::Event::Apply(l) => {
                times.insert(l.name_any(), LeaseTimes::of(l));
            }
            watcher::Event::Delete(l) => {
                times.remove(&l.name_any());
            }
            watcher::Event::Init => self.relist = Some(HashMap::new()),
            watcher::Event::InitApply(l) => {
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(l.name_any(), LeaseTimes::of(l));
            }
            watcher::Event::InitDone => {
                *times = self.relist.take().unwrap_or_default();
                times.shrink_to_fit();
                let _ = self.synced.send(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, renewed: i64) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                jiff::Timestamp::from_second(renewed).unwrap(),
            )),
            lease_duration_seconds: Some(40),
            ..Default::default()
        });
        l
    }

    /// A relist replaces what was kept (a Lease deleted while the watch was down goes), and
    /// the cache reads as synced only once the first list is complete.
    #[test]
    fn a_relist_replaces_the_leases_and_marks_the_cache_synced() {
        let (read, mut write) = leases();
        write.apply(&watcher::Event::Init);
        write.apply(&watcher::Event::InitApply(lease("a", 10)));
        write.apply(&watcher::Event::InitApply(lease("b", 10)));
        assert!(!*read.synced.borrow(), "not synced before InitDone");
        assert_eq!(read.get("a"), None, "a list in progress is not served");
        write.apply(&watcher::Event::InitDone);
        assert!(*read.synced.borrow());
        assert_eq!(
            read.get("a"),
            Some(LeaseTimes {
                renewed: Some(jiff::Timestamp::from_second(10).unwrap()),
                duration: Some(std::time::Duration::from_secs(40)),
            })
        );
        write.apply(&watcher::Event::Apply(lease("a", 20)));
        assert_eq!(
            read.get("a").and_then(|t| t.renewed),
            Some(jiff::Timestamp::from_second(20).unwrap())
        );
        write.apply(&watcher::Event::Delete(lease("b", 10)));
        assert_eq!(read.get("b"), None);
        write.apply(&watcher::Event::Init);
        write.apply(&watcher::Event::InitApply(lease("c", 30)));
        write.apply(&watcher::Event::InitDone);
        assert_eq!(read.get("a"), None, "gone from the relist: gone");
        assert!(read.get("c").is_some());
    }
}
