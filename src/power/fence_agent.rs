//! A ClusterLabs fence agent as a power source (`protocol = "fence-agent"`), through the
//! agent's own interface (FenceAgentAPI): one process per call, its options as `name=value`
//! lines on stdin (never on the command line, where `ps` would show the password), `action=
//! status` answered by the exit status (0 on, 2 off, anything else a failure). The process runs
//! in its own process group with a scrubbed environment, and the whole group is killed at the
//! deadline; what it printed is kept (capped, every secret option scrubbed) to say why it
//! failed.
//!
//! An agent reports no machine identity: its Off reads count only under `identity =
//! "unchecked"`, which the config requires of these entries, and only from an agent whose Off
//! means no power and no saved state (the config's table of known agents, or the operator's
//! `unlisted_agent_off_means`, which every reply names).

mod list;
mod listing;
mod outlets;
pub mod process;

use std::sync::Arc;

use futures::future::BoxFuture;

pub use list::Lister;
pub use listing::parse_list_status;
pub use process::Agent;
use process::last_lines;

use super::{
    ActionCheck, ActionOutcome, ActionSupport, PowerAction, PowerSource, PowerState, ReadErrorKind,
    Reply,
};
use crate::config::BmcEntry;

/// The FenceAgentAPI's exit status for `status`: the plug is on.
const STATUS_ON: i32 = 0;
/// ... and off.
const STATUS_OFF: i32 = 2;

/// One node's fence agent: the agent with its options for that node, and the plug.
#[derive(Debug)]
pub struct FenceAgentSource {
    agent: Arc<Agent>,
    plug: Option<String>,
    endpoint: String,
    actions: Vec<String>,
    /// An agent oobfence does not list, vouched for by the operator: every reply says so.
    vouched: bool,
    /// The endpoint's `list-status` batch, where the agent lists its plugs with their state.
    lister: Option<Arc<Lister>>,
}

impl FenceAgentSource {
    /// The source for `node` with its own agent process per read.
    pub fn new(entry: &BmcEntry, node: &str) -> Result<FenceAgentSource, String> {
        FenceAgentSource::with_lister(entry, node, None)
    }

    /// The source for `node`; its reads go through `lister` (the batch of the node's
    /// endpoint) when there is one.
    pub fn with_lister(
        entry: &BmcEntry,
        node: &str,
        lister: Option<Arc<Lister>>,
    ) -> Result<FenceAgentSource, String> {
        let fa = entry
            .fence_agent
            .as_ref()
            .ok_or("not a fence-agent entry")?;
        Ok(FenceAgentSource {
            agent: Arc::new(agent_for(entry, node)?),
            plug: fa.plug_for(node),
            endpoint: fa.endpoint_for(node),
            actions: fa.actions.clone(),
            vouched: fa.vouched,
            lister,
        })
    }

    /// One `status` run for this node's plug.
    async fn status(&self) -> PowerState {
        plug_status(&self.agent, self.plug.as_deref()).await
    }
}

/// The agent of `entry` with its options for `node` (what the node's endpoint is).
pub fn agent_for(entry: &BmcEntry, node: &str) -> Result<Agent, String> {
    let fa = entry
        .fence_agent
        .as_ref()
        .ok_or("not a fence-agent entry")?;
    Ok(Agent {
        agent: fa.agent.clone(),
        name: fa.name.clone(),
        options: fa.options_for(node),
        secret_options: fa.secret_options.clone(),
        username: (!entry.username.is_empty()).then(|| entry.username.clone()),
        password: (!entry.password.expose().is_empty()).then(|| entry.password.clone()),
        timeout: entry.timeout,
        outlet_plugs: fa.outlet_plugs,
    })
}

/// One `status` run of `agent` for `plug`, read by its exit status.
pub(super) async fn status_of(agent: &Agent, plug: Option<&str>) -> PowerState {
    match agent.run("status", plug).await {
        Err((kind, detail)) => PowerState::error(kind, detail),
        Ok(run) => read_status(agent, &run).await,
    }
}

/// What a `status` run's exit status says.
async fn read_status(agent: &Agent, run: &process::Run) -> PowerState {
    match run.code {
        Some(STATUS_ON) => PowerState::On,
        Some(STATUS_OFF) => PowerState::Off,
        Some(1) | None => {
            let (kind, detail) = agent.failure("status", run).await;
            PowerState::error(kind, detail)
        }
        Some(other) => PowerState::error(
            ReadErrorKind::BadReply,
            format!(
                "{} status exited {other}, which the fence agent API does not define (0 on, 2 off, 1 failure): {}",
                agent.name,
                last_lines(&format!("{}\n{}", run.stdout, run.stderr))
            ),
        ),
    }
}

/// One `status` run of `agent` for `plug`. An SNMP PDU agent's Off counts only for an outlet
/// its list names once, whose state the PDU answered with its table's off value (the agent,
/// run verbose, logs what it read).
pub(super) async fn plug_status(agent: &Agent, plug: Option<&str>) -> PowerState {
    let Some(plug) = plug.filter(|_| agent.outlet_plugs) else {
        return status_of(agent, plug).await;
    };
    let run = match agent.run("status", Some(plug)).await {
        Err((kind, detail)) => return PowerState::error(kind, detail),
        Ok(run) => run,
    };
    match read_status(agent, &run).await {
        PowerState::Off => match outlets::confirm_off(agent, plug).await {
            PowerState::Off => match outlets::off_as_read(&run.stderr) {
                Ok(()) => PowerState::Off,
                Err(why) => PowerState::error(
                    ReadErrorKind::BadReply,
                    format!("{} read plug {plug:?} off, but {why}", agent.name),
                ),
            },
            not_confirmed => not_confirmed,
        },
        state => state,
    }
}

impl PowerSource for FenceAgentSource {
    fn backend(&self) -> &'static str {
        "fence-agent"
    }

    fn address(&self) -> String {
        let mut a = self.agent.name.clone();
        if !self.endpoint.is_empty() {
            a.push(' ');
            a.push_str(&self.endpoint);
        }
        if let Some(plug) = &self.plug {
            a.push_str(" plug ");
            a.push_str(plug);
        }
        a
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { self.read_reply().await.state })
    }

    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        Box::pin(async move {
            let state = match (&self.lister, &self.plug) {
                (Some(lister), Some(plug)) => lister.read(plug).await,
                _ => self.status().await,
            };
            let mut detail = format!(
                "{} reports no machine identity; this entry's mapping is trusted (identity = \"unchecked\")",
                self.agent.name
            );
            if self.vouched {
                detail.push_str(&format!(
                    "; oobfence does not list {}: its Off counts because the operator vouched that it means no power and no saved state (unlisted_agent_off_means)",
                    self.agent.name
                ));
            }
            Reply::without_identity(state, detail)
        })
    }

    fn batches_reads(&self) -> bool {
        self.lister.is_some()
    }

    fn agent(&self) -> Option<&str> {
        Some(&self.agent.name)
    }

    fn act<'a>(
        &'a self,
        action: PowerAction,
        check: ActionCheck<'a>,
    ) -> BoxFuture<'a, ActionOutcome> {
        Box::pin(async move {
            let verb = match action {
                PowerAction::Off => "off",
                PowerAction::On => "on",
            };
            if !self.actions.iter().any(|a| a == verb) {
                return ActionOutcome::Refused {
                    why: format!("{} lists no {verb} action in its metadata", self.agent.name),
                };
            }
            // The source's own read right before the command: one status run of the plug.
            let reply = Reply::without_identity(
                self.status().await,
                format!("{} reports no machine identity", self.agent.name),
            );
            if let Err(why) = check(&reply).await {
                return ActionOutcome::Refused { why };
            }
            match self.agent.run(verb, self.plug.as_deref()).await {
                Ok(run) if run.code == Some(0) => ActionOutcome::Sent {
                    answer: format!("{} {verb}: exit status 0", self.agent.name),
                },
                Ok(run) => {
                    let (kind, detail) = self.agent.failure(verb, &run).await;
                    ActionOutcome::Failed {
                        error: PowerState::error(kind, detail),
                    }
                }
                Err((kind, detail)) => ActionOutcome::Failed {
                    error: PowerState::error(kind, detail),
                },
            }
        })
    }

    fn action_support(&self) -> BoxFuture<'_, ActionSupport> {
        Box::pin(async move {
            let says = |verb: &str| {
                if self.actions.iter().any(|a| a == verb) {
                    Ok(format!("{} lists the {verb} action", self.agent.name))
                } else {
                    Err(format!("{} lists no {verb} action", self.agent.name))
                }
            };
            ActionSupport {
                off: says("off"),
                on: says("on"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_agent_says_last_is_kept_short() {
        assert_eq!(last_lines(""), "it printed nothing");
        assert_eq!(last_lines("a\n\nb\nc\nd\n"), "b / c / d");
    }
}
