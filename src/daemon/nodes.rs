//! The Node cache: each watched Node as oobfence reads it ([`NodeView`]), by name, kept from
//! the Node watch ([`super::cache`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::cache::{Cache, CacheWriter, cache};
use crate::cluster::NodeView;

pub(super) type Nodes = Cache<Arc<NodeView>>;
pub(super) type NodesWriter = CacheWriter<Arc<NodeView>>;

pub(super) fn nodes() -> (Nodes, NodesWriter) {
    cache()
}

/// What the cache keeps of a Node.
pub(super) fn keep(node: Node) -> Arc<NodeView> {
    Arc::new(NodeView::from(node))
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

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
        write.apply(watcher::Event::Init, keep);
        write.apply(watcher::Event::InitApply(node("a", "1")), keep);
        write.apply(watcher::Event::InitApply(node("b", "1")), keep);
        assert!(!read.is_synced(), "not synced before InitDone");
        assert!(read.get("a").is_none(), "a list in progress is not served");
        write.apply(watcher::Event::InitDone, keep);
        assert!(read.is_synced());
        assert_eq!(read.len(), 2);
        assert_eq!(
            write.apply(watcher::Event::Apply(node("a", "2")), keep),
            Some("a".to_string())
        );
        assert_eq!(read.get("a").unwrap().resource_version, "2");
        assert_eq!(
            write.apply(watcher::Event::Delete(node("b", "2")), keep),
            Some("b".to_string())
        );
        assert!(read.get("b").is_none());
        write.apply(watcher::Event::Init, keep);
        write.apply(watcher::Event::InitApply(node("c", "3")), keep);
        write.apply(watcher::Event::InitDone, keep);
        assert!(read.get("a").is_none(), "gone from the relist: gone");
        assert_eq!(read.all().len(), 1);
    }
}
