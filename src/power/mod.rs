//! Power sources: the out-of-band ways to learn whether a machine is off.
//!
//! Every backend answers one question — "what is this machine's power state right now?" — and
//! reports failures as data, never as "off". The decision core only ever sees [`PowerReading`].

pub mod redfish;

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;

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

    /// Short label used in metrics and tables: `on`, `off`, `transitional`, `error`.
    pub fn label(&self) -> &'static str {
        match self {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::Transitional { .. } => "transitional",
            PowerState::Error { .. } => "error",
        }
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PowerState::On => f.write_str("On"),
            PowerState::Off => f.write_str("Off"),
            PowerState::Transitional { detail } => write!(f, "transitional ({detail})"),
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
    /// When the answer arrived (wall clock).
    pub at: jiff::Timestamp,
    #[serde(serialize_with = "ser_secs")]
    pub latency: Duration,
    #[serde(flatten)]
    pub state: PowerState,
    /// What else the source reported alongside the state, as evidence for `why`, Events and
    /// the journal (IPMI fault bits, EC2 volumes held...). Never secrets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<ReadDetail>,
}

/// One named piece of evidence from a read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadDetail {
    pub name: String,
    pub value: String,
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

/// A way to read one machine's power state. One value per mapped node.
///
/// Implementations must bound their own time (each read has a deadline) and must map every
/// failure to [`PowerState::Error`]; they never panic and never return `Off` unless the
/// hardware or cloud said so in a well-formed answer.
pub trait PowerSource: Send + Sync {
    /// Backend name for metrics and tables: `redfish`, `ipmi`, `ec2`.
    fn backend(&self) -> &'static str;
    /// Where the read goes (URL or host:port), for operators. Never contains secrets.
    fn address(&self) -> String;
    /// Read the power state once.
    fn read(&self) -> BoxFuture<'_, PowerState>;

    /// Read once, with whatever evidence the backend has beyond the state. Backends that
    /// report more than the state override this (and implement `read` on top of it).
    fn read_detailed(&self) -> BoxFuture<'_, (PowerState, Vec<ReadDetail>)> {
        Box::pin(async move { (self.read().await, Vec::new()) })
    }
}

/// Builds the power source a `[[bmc]]` entry describes for one node.
pub fn source_for(
    entry: &crate::config::BmcEntry,
    node: &str,
) -> Result<std::sync::Arc<dyn PowerSource>, String> {
    match entry.protocol {
        crate::config::Protocol::Redfish => Ok(std::sync::Arc::new(redfish::RedfishSource::new(
            entry, node,
        )?)),
    }
}
