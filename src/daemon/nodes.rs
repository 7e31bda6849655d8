//! The Node cache: each watched Node as oobfence reads it ([`NodeView`]), by name, kept from
//! the Node watch. Where a reflector store keeps the whole object (and a key of its own for
//! each), this keeps a few hundred bytes a node.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;

use crate::cluster::NodeView;

/// The read side, for the loop.
#[derive(Clone)]
pub(super) struct Nodes {
    nodes: Arc<RwLock<HashMap<String, Arc<NodeView>>>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

/// The write side, for the watch.
pub(super) struct NodesWriter {
    nodes: Arc<RwLock<HashMap<String, Arc<NodeView>>>>,
    /// A relist under way (after a start or an expired watch): the Nodes it has listed so far.
    /// It replaces the cache when complete, so that a Node deleted meanwhile goes.
    relist: Option<HashMap<String, Arc<NodeView>>>,
    synced: tokio::sync::watch::Sender<bool>,
}

pub(super) fn nodes() -> (Nodes, NodesWriter) {
    let nodes = Arc::new(RwLock::new(HashMap::new()));
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    (
        Nodes {
            nodes: nodes.clone(),
            synced,
        },
        NodesWriter {
            nodes,
            relist: None,
            synced: synced_tx,
        },
    )
}

impl Nodes {
    pub(super) fn get(&self, name: &str) -> Option<Arc<NodeView>> {
        self.nodes.read().ok()?.get(name).cloned()
    }

    /// Every cached Node, in no particular order.
    pub(super) fn state(&self) -> Vec<Arc<NodeView>> {
        self.nodes
            .read()
            .map(|n| n.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn len(&self) -> usize {
        self.nodes.read().map(|n| n.len()).unwrap_or(0)
    }

    /// Once a first complete list is in.
    pub(super) async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }
}

impl NodesWriter {
    /// Applies a watch event; the name of the Node it changed (or removed), if any.
    pub(super) fn apply(&mut self, event: watcher::Event<Node>) -> Option<String> {
        match event {
            watcher::Event::Apply(node) => {
                let node = NodeView::from(node);
                let name = node.name.clone();
                if let Ok(mut nodes) = self.nodes.write() {
                    nodes.insert(name.clone(), Arc::new(node));
                }
                Some(name)
            }
            watcher::Event::Delete(node) => {
                let name = node.metadata.name.unwrap_or_default();
                if let Ok(mut nodes) = self.nodes.write() {
                    nodes.remove(&name);
                }
                Some(name)
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(node) => {
                let node = NodeView::from(node);
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(node.name.clone(), Arc::new(node));
                None
            }
            watcher::Event::InitDone => {
                if let Ok(mut nodes) = self.nodes.write() {
                    *nodes = self.relist.take().unwrap_or_default();
                    nodes.shrink_to_fit();
                }
                let _ = self.synced.send(true);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, rv: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some(rv.into());
        n
    }

    /// A relist replaces what was kept (a Node deleted while the watch was down goes), and the
    /// cache reads as synced only once the first list is complete.
    #[test]
    fn a_relist_replaces_the_nodes_and_marks_the_cache_synced() {
        let (read, mut write) = nodes();
        write.apply(watcher::Event::Init);
        write.apply(watcher::Event::InitApply(node("a", "1")));
        write.apply(watcher::Event::InitApply(node("b", "1")));
        assert!(!*read.synced.borrow(), "not synced before InitDone");
        assert!(read.get("a").is_none(), "a list in progress is not served");
        write.apply(watcher::Event::InitDone);
        assert!(*read.synced.borrow());
        assert_eq!(read.len(), 2);
        assert_eq!(
            write.apply(watcher::Event::Apply(node("a", "2"))),
            Some("a".to_string())
        );
        assert_eq!(read.get("a").unwrap().resource_version, "2");
        assert_eq!(
            write.apply(watcher::Event::Delete(node("b", "2"))),
            Some("b".to_string())
        );
        assert!(read.get("b").is_none());
        write.apply(watcher::Event::Init);
        write.apply(watcher::Event::InitApply(node("c", "3")));
        write.apply(watcher::Event::InitDone);
        assert!(read.get("a").is_none(), "gone from the relist: gone");
        assert_eq!(read.state().len(), 1);
    }
}
