//! System UUIDs that more than one Node reports. Cloned VMs and some boards ship one SMBIOS
//! UUID for many machines; a BMC re-cabled to another such machine would then pass the
//! identity check. A UUID several Nodes report proves none of their machines
//! ([`crate::identity::verify`], rule `duplicate-system-uuid`).

use std::collections::HashMap;

use crate::identity::shared_system_uuids;

/// The datacenter's Nodes grouped by the system UUID they report, kept up to date pass by pass.
#[derive(Default)]
pub(super) struct SharedUuids {
    /// The `systemUUID` each Node reported when last worked out: unchanged, nothing is redone.
    reported: HashMap<String, String>,
    /// Node → the other Nodes that report its UUID (only Nodes that share one).
    sharers: HashMap<String, Vec<String>>,
}

impl SharedUuids {
    /// Takes the Nodes' names and `status.nodeInfo.systemUUID`s; returns the Nodes that share a
    /// UUID now and did not before (for an ERROR and an Event, once). Work is done only when a
    /// name or a UUID changed.
    pub(super) fn update<'a>(
        &mut self,
        nodes: impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Vec<String> {
        let unchanged = self.reported.len() == nodes.len()
            && nodes
                .clone()
                .all(|(name, uuid)| self.reported.get(name).map(String::as_str) == Some(uuid));
        if unchanged {
            return Vec::new();
        }
        self.reported = nodes
            .clone()
            .map(|(n, u)| (n.to_string(), u.to_string()))
            .collect();
        let sharers = shared_system_uuids(nodes);
        let mut new: Vec<String> = sharers
            .keys()
            .filter(|n| !self.sharers.contains_key(*n))
            .cloned()
            .collect();
        new.sort();
        self.sharers = sharers;
        new
    }

    /// The system UUID `node` reported when last worked out.
    pub(super) fn reported(&self, node: &str) -> Option<&str> {
        self.reported.get(node).map(String::as_str)
    }

    /// The other Nodes that report `node`'s system UUID (empty: none).
    pub(super) fn of(&self, node: &str) -> Vec<String> {
        self.sharers.get(node).cloned().unwrap_or_default()
    }

    /// Every Node that shares its UUID with another.
    pub(super) fn nodes(&self) -> impl Iterator<Item = &String> {
        self.sharers.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";
    const B: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e33";

    #[test]
    fn nodes_reporting_one_uuid_in_any_spelling_share_it_and_placeholders_do_not_count() {
        let upper = A.to_uppercase();
        let braced = format!("{{{A}}}");
        let zero = "00000000-0000-0000-0000-000000000000";
        let nodes = [
            ("a", A),
            ("b", upper.as_str()),
            ("c", braced.as_str()),
            ("d", B),
            ("e", zero),
            ("f", zero),
            ("g", "not-a-uuid"),
            ("h", "not-a-uuid"),
        ];
        let sharers = shared_system_uuids(nodes);
        assert_eq!(sharers.len(), 3, "{sharers:?}");
        assert_eq!(sharers["a"], ["b", "c"]);
        assert_eq!(sharers["c"], ["a", "b"]);
        assert!(!sharers.contains_key("d"));
    }

    #[test]
    fn a_new_sharer_is_reported_once_and_a_fixed_one_is_forgotten() {
        let mut shared = SharedUuids::default();
        assert!(shared.update([("a", A), ("b", B)].into_iter()).is_empty());
        // A clone of a joins: both are reported, once.
        let nodes = [("a", A), ("b", B), ("clone", A)];
        assert_eq!(shared.update(nodes.into_iter()), ["a", "clone"]);
        assert!(shared.update(nodes.into_iter()).is_empty());
        assert_eq!(shared.of("a"), ["clone"]);
        assert!(shared.of("b").is_empty());
        // The clone gets its own UUID: nobody shares any more.
        let fixed = "4c4c4544-0038-4b10-8052-b4c04f4a4e34";
        assert!(
            shared
                .update([("a", A), ("b", B), ("clone", fixed)].into_iter())
                .is_empty()
        );
        assert!(shared.of("a").is_empty() && shared.nodes().next().is_none());
    }
}
