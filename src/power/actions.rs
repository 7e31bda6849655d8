//! Power actions (opt-in actuation): a power source asked to turn its machine off or on.
//!
//! A source never acts on its own judgement. [`super::PowerSource::act`] reads the machine
//! first, in the same call, hands that reply to the caller's check (is this the node's
//! machine, does it still read On, does everything else still hold) and sends the command only
//! when the check passes: the attestation is the last thing before the write, on the same
//! connection and credentials as the command.

use std::fmt;

use futures::future::BoxFuture;

use super::{PowerState, Reply};

/// What a power action does to the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerAction {
    /// Cut the power at once (Redfish `ForceOff`, IPMI chassis power down, EC2 `StopInstances`
    /// with `Force`): a hung machine does not shut down gracefully.
    Off,
    /// Power the machine on again after its fence.
    On,
}

impl PowerAction {
    pub fn label(self) -> &'static str {
        match self {
            PowerAction::Off => "power_off",
            PowerAction::On => "power_on",
        }
    }
}

impl fmt::Display for PowerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PowerAction::Off => "power off",
            PowerAction::On => "power on",
        })
    }
}

/// The caller's last word before the command, on the reply the source read for it: `Err` says
/// why the command must not be sent. It may ask more itself (the pause switch, read afresh), so
/// it is awaited; a source runs it last, after every other request, right before the command.
/// Its answer owns what it needs, so that a check may be built and lent in one statement.
pub type ActionCheck<'a> =
    &'a (dyn Fn(&Reply) -> BoxFuture<'static, Result<(), String>> + Send + Sync);

/// What an [`ActionCheck`] that needs nothing beyond the reply answers.
pub fn checked(result: Result<(), String>) -> BoxFuture<'static, Result<(), String>> {
    Box::pin(std::future::ready(result))
}

/// What became of a power action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionOutcome {
    /// The command was sent and accepted; `answer` is what the source said (status, task).
    Sent { answer: String },
    /// Nothing was sent: the check refused the reply read just before, or the source cannot
    /// do this action (not offered, not allowed). Not retried until something changes.
    Refused { why: String },
    /// The read or the command failed (timeout, TLS, credentials, an error answer): nothing is
    /// known to have happened. Retried with backoff.
    Failed { error: PowerState },
}

impl ActionOutcome {
    pub fn result_label(&self) -> &'static str {
        match self {
            ActionOutcome::Sent { .. } => "sent",
            ActionOutcome::Refused { .. } => "refused",
            ActionOutcome::Failed { .. } => "failure",
        }
    }
}

impl fmt::Display for ActionOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ActionOutcome::Sent { answer } => write!(f, "sent: {answer}"),
            ActionOutcome::Refused { why } => write!(f, "not sent: {why}"),
            ActionOutcome::Failed { error } => write!(f, "failed: {error}"),
        }
    }
}

/// Whether a source can carry out each action, as the source itself says (for
/// `check-config --probe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionSupport {
    pub off: Result<String, String>,
    pub on: Result<String, String>,
}

impl ActionSupport {
    pub fn unsupported(why: &str) -> ActionSupport {
        ActionSupport {
            off: Err(why.to_string()),
            on: Err(why.to_string()),
        }
    }
}
