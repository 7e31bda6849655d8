//! Power sources: the out-of-band ways to learn whether a machine is off.
//!
//! Every backend answers one question — "what is this machine's power state right now?" — and
//! reports failures as data, never as "off". The decision core only ever sees [`PowerReading`].

pub mod ec2;
pub mod ipmi;
pub mod redfish;

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Serialize;

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
}

/// Everything one read of a power source returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub state: PowerState,
    pub details: Vec<ReadDetail>,
    pub identity: MachineIdentity,
}

impl Reply {
    /// A reply that carries no identity (`why` says why).
    pub fn without_identity(state: PowerState, reason: impl Into<String>) -> Reply {
        Reply {
            state,
            details: Vec::new(),
            identity: MachineIdentity::unreported(reason),
        }
    }
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

    /// Read once, with the machine's identity and whatever evidence the backend has beyond
    /// the state. Backends override this (and implement `read` on top of it); the default
    /// reports no identity, so its reads never count towards a fence.
    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        Box::pin(async move {
            Reply::without_identity(self.read().await, "this power source cannot report one")
        })
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
        crate::config::Protocol::Ipmi => {
            Ok(std::sync::Arc::new(ipmi::IpmiSource::new(entry, node)?))
        }
    }
}

/// A node's power source with the hard bound for one read (above the backend's own timeout).
#[derive(Clone)]
pub struct MappedSource {
    pub source: std::sync::Arc<dyn PowerSource>,
    pub deadline: Duration,
}

/// A mapped node whose source cannot be built (bad providerID, unusable CA file...): every
/// read is that error, so the node shows as power-unknown with the reason, never as off.
struct BrokenSource {
    backend: &'static str,
    address: String,
    error: String,
}

impl PowerSource for BrokenSource {
    fn backend(&self) -> &'static str {
        self.backend
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { PowerState::error(ReadErrorKind::Config, self.error.clone()) })
    }
}

/// Builds each node's power source from the config (the only place the mapping comes from).
pub struct PowerSources {
    cfg: std::sync::Arc<crate::config::Config>,
    ec2: Option<std::sync::Arc<ec2::Ec2Reader>>,
}

impl PowerSources {
    /// Sets up shared clients (EC2) once; `ec2_stats` are the counters its calls feed.
    pub async fn new(
        cfg: std::sync::Arc<crate::config::Config>,
        ec2_stats: ec2::Ec2Stats,
    ) -> PowerSources {
        let ec2 = match &cfg.aws {
            Some(aws) => Some(ec2::Ec2Reader::new(aws, ec2_stats).await),
            None => None,
        };
        PowerSources { cfg, ec2 }
    }

    pub fn ec2(&self) -> Option<&std::sync::Arc<ec2::Ec2Reader>> {
        self.ec2.as_ref()
    }

    /// Whether the node's source needs the Node object (EC2: its providerID).
    pub fn needs_node_data(&self, node: &str) -> bool {
        matches!(
            self.cfg.mapping_for(node),
            Some(crate::config::Mapping::Aws(_))
        )
    }

    /// The source for `node`; `None` when the config maps it nowhere. `provider_id` is the
    /// Node's `spec.providerID`, used only for EC2-mapped nodes.
    pub fn for_node(&self, node: &str, provider_id: Option<&str>) -> Option<MappedSource> {
        use crate::config::Mapping;
        let broken = |backend, address, error| MappedSource {
            source: std::sync::Arc::new(BrokenSource {
                backend,
                address,
                error,
            }),
            deadline: Duration::from_secs(1),
        };
        match self.cfg.mapping_for(node)? {
            Mapping::Bmc(entry) => Some(match source_for(entry, node) {
                Ok(source) => MappedSource {
                    source,
                    deadline: entry.timeout + Duration::from_secs(2),
                },
                Err(e) => broken(
                    entry.protocol.as_str(),
                    entry.address_for(node),
                    format!("bmc[{}]: {e}", entry.index),
                ),
            }),
            Mapping::Aws(aws) => {
                let Some(reader) = &self.ec2 else {
                    return Some(broken(
                        "ec2",
                        aws.region.clone(),
                        "EC2 client not set up".into(),
                    ));
                };
                // The region check lives in the source: a providerID of another region is an
                // error read, never "not found".
                let source = provider_id
                    .ok_or_else(|| "node has no spec.providerID".to_string())
                    .and_then(|p| ec2::Ec2Source::for_provider_id(reader.clone(), p));
                Some(match source {
                    Ok(source) => MappedSource {
                        source: std::sync::Arc::new(source),
                        // A read may wait for its batch and for the SDK's retries.
                        deadline: aws.timeout * 2 + Duration::from_secs(2),
                    },
                    Err(e) => broken("ec2", aws.region.clone(), e),
                })
            }
        }
    }
}
