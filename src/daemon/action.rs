//! A write's outcome as the loop receives it, and the names its metrics and Events give a
//! fence: shared by the writers that produce it and the observers that report it.

use jiff::Timestamp;

use crate::decision::{FenceAction, Step};

/// A write the loop started (taint, untaint, delete, clear a record), done or given up.
pub(super) struct ActionDone {
    pub(super) node: String,
    pub(super) uid: String,
    pub(super) result: Result<(), String>,
    /// The write-time re-check refused: nothing was written; decide again at once.
    pub(super) abandoned: bool,
    pub(super) step: Step,
    /// When a fence landed.
    pub(super) fenced_at: Option<Timestamp>,
    /// VolumeAttachments pointing at the node when the fence was written.
    pub(super) volume_attachments: Option<Vec<String>>,
}

/// The `action` label of a fence in metrics and the journal.
pub(super) fn action_label(a: FenceAction) -> &'static str {
    match a {
        FenceAction::Taint => "taint",
        FenceAction::DeleteNode => "delete_node",
    }
}
