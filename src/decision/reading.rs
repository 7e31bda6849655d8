//! The words for what a power read found. They belong to the core, which decides on them;
//! the power sources (`crate::power`) produce them.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::witness::PowerDraw;
use crate::identity::MachineIdentity;

/// What one out-of-band read found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PowerState {
    /// The machine reports it is powered on.
    On,
    /// The machine reports it is powered off. The only state that can ever lead to a fence.
    Off,
    /// Powering on or off, paused, stopping...: not off, and may change soon.
    Transitional { detail: String },
    /// Stopped with its memory kept (EC2 hibernation, a suspended VM): the OS resumes where it
    /// stopped, with the same bootID and the same processes. Never off.
    Suspended { detail: String },
    /// The cloud says the instance is terminated: the machine is gone for good.
    Terminated,
    /// The cloud does not know the instance (EC2 `InvalidInstanceID.NotFound`, or absent from
    /// an answer that lists what exists). Clouds are eventually consistent, so the decision
    /// core never trusts a single one of these.
    NotFound,
    /// The read failed or the answer could not be trusted. Never "off".
    Error { kind: ReadErrorKind, detail: String },
}

impl PowerState {
    pub fn error(kind: ReadErrorKind, detail: impl Into<String>) -> Self {
        PowerState::Error {
            kind,
            detail: detail.into(),
        }
    }

    /// Short label used in metrics and tables: `on`, `off`, `transitional`, `suspended`,
    /// `terminated`, `not_found`, `error`.
    pub fn label(&self) -> &'static str {
        match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::Transitional { .. } => "transitional",
            PowerState::Suspended { .. } => "suspended",
            PowerState::Terminated => "terminated",
            PowerState::NotFound => "not_found",
            PowerState::Error { .. } => "error",
        }
    }

    /// The machine is proven not running: off, terminated, or unknown to the cloud.
    pub fn is_down(&self) -> bool {
        matches!(
            self,
            PowerState::Off | PowerState::Terminated | PowerState::NotFound
        )
    }

    /// The machine no longer exists (as opposed to being powered off).
    pub fn is_gone(&self) -> bool {
        matches!(self, PowerState::Terminated | PowerState::NotFound)
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PowerState::On => f.write_str("On"),
            PowerState::Off => f.write_str("Off"),
            PowerState::Transitional { detail } => write!(f, "transitional ({detail})"),
            PowerState::Suspended { detail } => write!(f, "suspended ({detail})"),
            PowerState::Terminated => f.write_str("terminated"),
            PowerState::NotFound => f.write_str("not found"),
            PowerState::Error { kind, detail } => write!(f, "error: {kind}: {detail}"),
        }
    }
}

/// Why a read failed, coarse enough to be a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadErrorKind {
    /// No answer within the deadline.
    Timeout,
    /// Could not connect (refused, no route, DNS).
    Unreachable,
    /// TLS handshake or certificate verification failed.
    Tls,
    /// Credentials refused.
    Auth,
    /// The BMC answered with an error status.
    Protocol,
    /// The answer could not be parsed or lacked the power state.
    BadReply,
    /// Local problem: the mapping or the backend could not even build a request.
    Config,
}

impl fmt::Display for ReadErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReadErrorKind::Timeout => "timeout",
            ReadErrorKind::Unreachable => "unreachable",
            ReadErrorKind::Tls => "tls",
            ReadErrorKind::Auth => "auth",
            ReadErrorKind::Protocol => "protocol",
            ReadErrorKind::BadReply => "bad_reply",
            ReadErrorKind::Config => "config",
        })
    }
}

/// One completed read: what it said, when it was taken and how long it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PowerReading {
    /// When the request was started (wall clock). Not when the answer arrived: a machine that
    /// answered "Off" after a 5 s wait was known to be off 5 s before its answer came, no later,
    /// so freshness is counted from the start.
    pub at: jiff::Timestamp,
    #[serde(serialize_with = "ser_secs")]
    pub latency: Duration,
    #[serde(flatten)]
    pub state: PowerState,
    /// What else the source reported alongside the state, as evidence for `why`, Events and
    /// the journal (IPMI fault bits, EC2 volumes held...). Never secrets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<ReadDetail>,
    /// What the machine that answered says it is; the core counts a read only when this is the
    /// node's machine (see [`crate::identity`]).
    pub identity: MachineIdentity,
    /// Who answered: the source, where it asked and with which credentials (EC2: region,
    /// endpoint and the access key id the request was signed with, never the secret). "Gone"
    /// only counts through the reader that once knew the node's machine.
    pub reader: String,
    /// The system's power draw, read beside an Off when the entry asks for that second witness
    /// (see [`super::witness`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_draw: Option<PowerDraw>,
}

/// How a reader's id ends when the source could not tell which key signed its call (EC2: no
/// access key id seen, or another one on a retry). Two accounts in that state read as the same
/// words, so such a reader names nobody.
pub const UNKNOWN_KEY: &str = ", key unknown";

/// Whether `reader` ([`PowerReading::reader`]) names who answered; a "gone" answer counts only
/// through a known reader that once found the node's machine.
pub fn reader_is_known(reader: &str) -> bool {
    !reader.ends_with(UNKNOWN_KEY)
}

/// One named piece of evidence from a read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadDetail {
    pub name: String,
    pub value: String,
}

impl fmt::Display for ReadDetail {
    /// `name: value`, as `why`, Events and the journal show it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.value)
    }
}

impl ReadDetail {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        ReadDetail {
            name: name.into(),
            value: value.into(),
        }
    }
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
