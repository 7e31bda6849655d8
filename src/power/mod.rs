//! Power sources: the out-of-band ways to learn whether a machine is off.
//!
//! Every backend answers one question — "what is this machine's power state right now?" — and
//! reports failures as data, never as "off". The decision core only ever sees [`PowerReading`].

pub mod actions;
pub mod ec2;
pub mod fence_agent;
pub mod ipmi;
pub mod redfish;

use std::time::Duration;

use futures::future::BoxFuture;

use crate::identity::MachineIdentity;
pub use actions::{ActionCheck, ActionOutcome, ActionSupport, PowerAction, checked};

// The core owns these words; sources and their callers use them from here too.
pub use crate::decision::reading::{PowerReading, PowerState, ReadDetail, ReadErrorKind};
pub use crate::decision::witness::{OffWitness, PowerDraw, Watts};

/// Every value [`PowerSource::backend`] takes.
pub const BACKENDS: [&str; 4] = ["redfish", "ipmi", "ec2", "fence-agent"];

/// Everything one read of a power source returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub state: PowerState,
    pub details: Vec<ReadDetail>,
    pub identity: MachineIdentity,
    /// Who answered, where the source knows better than [`PowerSource::reader_id`] (EC2: the
    /// access key id the call was signed with).
    pub reader: Option<String>,
    /// The system's power draw, when the entry asks for it as a second witness for Off
    /// (`corroborate = "power-draw"`) and the state read Off.
    pub power_draw: Option<PowerDraw>,
}

impl Reply {
    /// A reply that carries no identity (`why` says why).
    pub fn without_identity(state: PowerState, reason: impl Into<String>) -> Reply {
        Reply {
            state,
            details: Vec::new(),
            identity: MachineIdentity::unreported(reason),
            reader: None,
            power_draw: None,
        }
    }
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
    /// Who answers this source's reads: where it asks and as whom. A "gone" answer counts only
    /// through the reader that once found the node's machine, so a change of endpoint or
    /// credentials starts that proof again.
    fn reader_id(&self) -> String {
        format!("{} {}", self.backend(), self.address())
    }
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

    /// What the connection to the source negotiated (a BMC's TLS version), for `probe` and
    /// `check-config --probe`; `None` where there is nothing to say. Costs a connection of
    /// its own: never called on the daemon's read path.
    fn transport(&self) -> BoxFuture<'_, Option<String>> {
        Box::pin(async { None })
    }

    /// The fence agent a `protocol = "fence-agent"` source runs (`fence_ipmilan`), for the
    /// per-agent metrics; `None` for the other backends.
    fn agent(&self) -> Option<&str> {
        None
    }

    /// Whether the source folds the reads in flight into shared calls, one call at a time, and
    /// so bounds its own load (EC2). The daemon takes no read slot for such a read: slots bound
    /// BMC sessions, and would cut the source's batches down to their count.
    fn batches_reads(&self) -> bool {
        false
    }

    /// Sends `action` to the machine (opt-in actuation): reads it first, passes that reply to
    /// `check`, and sends the command only if the check passes. Sources that cannot act refuse.
    fn act<'a>(
        &'a self,
        action: PowerAction,
        check: ActionCheck<'a>,
    ) -> BoxFuture<'a, ActionOutcome> {
        let _ = check;
        Box::pin(async move {
            ActionOutcome::Refused {
                why: format!("{} sources cannot {action}", self.backend()),
            }
        })
    }

    /// Whether this source can carry out each action, as it says itself; costs a read.
    fn action_support(&self) -> BoxFuture<'_, ActionSupport> {
        Box::pin(async move {
            ActionSupport::unsupported(&format!(
                "{} sources carry out no power action",
                self.backend()
            ))
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
        crate::config::Protocol::FenceAgent => Ok(std::sync::Arc::new(
            fence_agent::FenceAgentSource::new(entry, node)?,
        )),
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
    /// What each Redfish entry's sources share (by entry index): its HTTP client and its
    /// BMCs' logins, set up when a node first needs it.
    redfish_entries: std::sync::Mutex<
        std::collections::HashMap<usize, Result<std::sync::Arc<redfish::EntryShared>, String>>,
    >,
    /// The `list-status` batch of each fence-agent endpoint (entry index, options), where the
    /// agent lists its plugs.
    fence_agent_listers: std::sync::Mutex<
        std::collections::HashMap<(usize, String), std::sync::Arc<fence_agent::Lister>>,
    >,
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
        PowerSources {
            cfg,
            ec2,
            redfish_entries: Default::default(),
            fence_agent_listers: Default::default(),
        }
    }

    /// A `[[bmc]]` entry's source for `node`; Redfish sources of one entry share its client.
    fn bmc_source(
        &self,
        entry: &crate::config::BmcEntry,
        node: &str,
    ) -> Result<std::sync::Arc<dyn PowerSource>, String> {
        if let Some(fa) = &entry.fence_agent {
            let plug = fa.plug_for(node);
            if plug.is_none() || !fa.actions.iter().any(|a| a == "list-status") {
                return source_for(entry, node);
            }
            let key = (entry.index, format!("{:?}", fa.options_for(node)));
            let lister = {
                let mut listers = self
                    .fence_agent_listers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                match listers.get(&key) {
                    Some(l) => l.clone(),
                    None => {
                        let l = std::sync::Arc::new(fence_agent::Lister::new(
                            fence_agent::agent_for(entry, node)?,
                        ));
                        listers.insert(key, l.clone());
                        l
                    }
                }
            };
            return Ok(std::sync::Arc::new(
                fence_agent::FenceAgentSource::with_lister(entry, node, Some(lister))?,
            ));
        }
        if entry.protocol != crate::config::Protocol::Redfish {
            return source_for(entry, node);
        }
        let shared = {
            let mut entries = self
                .redfish_entries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            entries
                .entry(entry.index)
                .or_insert_with(|| redfish::EntryShared::new(entry).map(std::sync::Arc::new))
                .clone()?
        };
        Ok(std::sync::Arc::new(redfish::RedfishSource::with_shared(
            entry, node, &shared,
        )?))
    }

    /// Logs out of every Redfish session these sources hold (a reload replaced them, or the
    /// daemon stops), waiting a few seconds at most.
    pub async fn close_sessions(&self) {
        let entries: Vec<std::sync::Arc<redfish::EntryShared>> = {
            let entries = self
                .redfish_entries
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            entries
                .values()
                .filter_map(|e| e.as_ref().ok().cloned())
                .collect()
        };
        futures::future::join_all(entries.iter().map(|e| e.logins.close_all())).await;
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

    /// The first source for `node` (its lowest level's first); `None` when the config maps it
    /// nowhere. `provider_id` is the Node's `spec.providerID`, used only for EC2-mapped nodes.
    pub fn for_node(&self, node: &str, provider_id: Option<&str>) -> Option<MappedSource> {
        self.all_for_node(node, provider_id).into_iter().next()
    }

    /// Every source of `node`, in [`crate::config::Config::mappings_for`]'s order.
    pub fn all_for_node(&self, node: &str, provider_id: Option<&str>) -> Vec<MappedSource> {
        self.cfg
            .mappings_for(node)
            .into_iter()
            .filter_map(|m| self.for_mapping(m, node, provider_id))
            .collect()
    }

    /// The source `mapping` gives `node`.
    pub fn for_mapping(
        &self,
        mapping: crate::config::Mapping<'_>,
        node: &str,
        provider_id: Option<&str>,
    ) -> Option<MappedSource> {
        use crate::config::Mapping;
        let broken = |backend, address, error| MappedSource {
            source: std::sync::Arc::new(BrokenSource {
                backend,
                address,
                error,
            }),
            deadline: Duration::from_secs(1),
        };
        match mapping {
            Mapping::Bmc(entry) => Some(match self.bmc_source(entry, node) {
                Ok(source) => MappedSource {
                    source,
                    deadline: entry.timeout + Duration::from_secs(2),
                },
                Err(e) => broken(
                    entry.protocol.as_str(),
                    entry.address_for(node),
                    format!("{}: {e}", entry.label()),
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
