//! A watched kind as the loop keeps it: one small value per object, by name, kept from the
//! watch (the Node cache keeps [`crate::cluster::NodeView`]s, the Lease cache two timestamps
//! each). A cached `k8s-openapi` object costs a kilobyte or more and its key in a reflector
//! store as much again: at 20,000 nodes those were most of the daemon's memory.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::runtime::watcher;

/// The read side, for the loop.
pub(super) struct Cache<V> {
    values: Arc<RwLock<HashMap<String, V>>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

impl<V> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Cache {
            values: self.values.clone(),
            synced: self.synced.clone(),
        }
    }
}

/// The write side, for the watch.
pub(super) struct CacheWriter<V> {
    values: Arc<RwLock<HashMap<String, V>>>,
    /// A relist under way (after a start or an expired watch): what it has listed so far. It
    /// replaces the cache when complete, so that an object deleted meanwhile goes.
    relist: Option<HashMap<String, V>>,
    synced: tokio::sync::watch::Sender<bool>,
}

pub(super) fn cache<V>() -> (Cache<V>, CacheWriter<V>) {
    let values = Arc::new(RwLock::new(HashMap::new()));
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    (
        Cache {
            values: values.clone(),
            synced,
        },
        CacheWriter {
            values,
            relist: None,
            synced: synced_tx,
        },
    )
}

impl<V: Clone> Cache<V> {
    pub(super) fn get(&self, name: &str) -> Option<V> {
        self.values.read().ok()?.get(name).cloned()
    }

    /// Every cached value, in no particular order.
    pub(super) fn all(&self) -> Vec<V> {
        self.values
            .read()
            .map(|v| v.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn len(&self) -> usize {
        self.values.read().map(|v| v.len()).unwrap_or(0)
    }

    /// Whether a first complete list is in.
    #[cfg(test)]
    pub(super) fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Once a first complete list is in.
    pub(super) async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }
}

impl<V> CacheWriter<V> {
    /// Applies a watch event, keeping `keep(object)` of each object; the name of the object it
    /// changed or removed, if any (a relist's objects are announced by none).
    pub(super) fn apply<K: kube::Resource>(
        &mut self,
        event: watcher::Event<K>,
        keep: impl Fn(K) -> V,
    ) -> Option<String> {
        match event {
            watcher::Event::Apply(object) => {
                let name = object.name_any();
                let value = keep(object);
                if let Ok(mut values) = self.values.write() {
                    values.insert(name.clone(), value);
                }
                Some(name)
            }
            watcher::Event::Delete(object) => {
                let name = object.name_any();
                if let Ok(mut values) = self.values.write() {
                    values.remove(&name);
                }
                Some(name)
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(object) => {
                let name = object.name_any();
                let value = keep(object);
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(name, value);
                None
            }
            watcher::Event::InitDone => {
                if let Ok(mut values) = self.values.write() {
                    *values = self.relist.take().unwrap_or_default();
                    values.shrink_to_fit();
                }
                let _ = self.synced.send(true);
                None
            }
        }
    }
}
