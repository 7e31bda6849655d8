//! What a fence rests on: the machine's power, or a person's confirmation, which the write
//! checks on its fresh read of the Node and records there (`oobfence.io/fenced-on`).

use k8s_openapi::api::core::v1::Node;

use super::ClusterError;
use crate::decision::confirmation;

/// What a fence rests on, as the write checks it and records it on the Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FencedOn<'a> {
    /// The machine's power, proven off by its sources.
    Power,
    /// A person's confirmation: the exact `oobfence.io/confirmed-off` value the decision
    /// rested on, which the fresh read must still carry (withdrawn or changed: not written).
    Person(&'a str),
}

impl FencedOn<'_> {
    /// The value of `oobfence.io/fenced-on`.
    pub fn label(&self) -> &'static str {
        match self {
            FencedOn::Power => "power",
            FencedOn::Person(_) => "person",
        }
    }

    /// Whether the Node as just read still carries the confirmation the decision rested on.
    pub(super) fn still_stands(&self, node: &Node) -> Result<(), ClusterError> {
        let FencedOn::Person(value) = self else {
            return Ok(());
        };
        let now = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(confirmation::ANNOTATION));
        if now.map(String::as_str) != Some(*value) {
            return Err(ClusterError::Abandoned(format!(
                "the person's confirmation ({}) was withdrawn or changed since the decision",
                confirmation::ANNOTATION
            )));
        }
        Ok(())
    }
}
