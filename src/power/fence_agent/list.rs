//! One `list-status` call for every plug of an endpoint read at about the same time: a vCenter,
//! a PVE cluster, a cloud API answers all its machines in one call, where one `status` process
//! per plug would start as many agents. Reads that arrive while a call runs wait for the next
//! one; one call is in flight per endpoint. A plug the list does not name is an error read,
//! never Off; a plug it lists as neither on nor off (`UNKNOWN`: agents whose list has no power
//! state, such as `fence_kubevirt`) is read with its own `status` run instead. A plug the list
//! names twice (two VMs of one name) is an error for that plug, never either line's state nor
//! a `status` run, which would pick one of them. An SNMP PDU agent's plug is an outlet's number
//! or its name (`outlets.rs`); read plug by plug, its Off still needs the outlet listed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};

use super::listing::{Listed, parse_list_status};
use super::plug_status;
use super::process::Agent;
use crate::power::{PowerState, ReadErrorKind};

/// Reads arriving within this long of the first one share its call.
const GATHER: Duration = Duration::from_millis(50);

/// `status` runs at once per endpoint for plugs its list left unknown.
const FALLBACK_RUNS: usize = 4;

type Waiting = Vec<(String, oneshot::Sender<PowerState>)>;

/// The `list-status` batch of one endpoint (an agent with one set of options).
#[derive(Debug)]
pub struct Lister {
    agent: Arc<Agent>,
    state: Mutex<BatchState>,
    fallback: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct BatchState {
    waiting: Vec<(String, oneshot::Sender<PowerState>)>,
    running: bool,
    /// The agent answered `list-status` with no list (a notice such as "List option is not
    /// working on this device yet"): each plug is read with its own `status` from then on.
    cannot_list: bool,
    /// `list-status` calls made, for tests and the benchmark.
    calls: u64,
}

impl Lister {
    pub fn new(agent: Agent) -> Lister {
        Lister {
            agent: Arc::new(agent),
            state: Mutex::new(BatchState::default()),
            fallback: Arc::new(Semaphore::new(FALLBACK_RUNS)),
        }
    }

    /// How many `list-status` calls this endpoint made.
    pub fn calls(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).calls
    }

    /// `plug`'s state from the next `list-status` call of the endpoint.
    pub async fn read(self: &Arc<Self>, plug: &str) -> PowerState {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if s.cannot_list {
                None
            } else {
                s.waiting.push((plug.to_string(), tx));
                Some(!std::mem::replace(&mut s.running, true))
            }
        };
        let Some(start) = start else {
            let _permit = self.fallback.acquire().await;
            return plug_status(&self.agent, Some(plug)).await;
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.drain().await });
        }
        rx.await.unwrap_or_else(|_| {
            PowerState::error(
                ReadErrorKind::Config,
                "the list-status batch ended without an answer",
            )
        })
    }

    /// Calls `list-status` while reads wait, one call at a time.
    async fn drain(self: Arc<Self>) {
        // Bounded: each round answers everything that waited; a round with nothing waiting ends.
        loop {
            tokio::time::sleep(GATHER).await;
            let batch: Waiting = {
                let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if s.waiting.is_empty() {
                    s.running = false;
                    return;
                }
                s.calls += 1;
                std::mem::take(&mut s.waiting)
            };
            let listed = match self.agent.run("list-status", None).await {
                Err((kind, detail)) => Err(PowerState::error(kind, detail)),
                Ok(run) if run.code == Some(0) => match parse_list_status(&run.stdout) {
                    Ok(plugs) => Ok((plugs, run.stdout)),
                    Err(e) => {
                        // No list at all: this endpoint is read plug by plug from now on.
                        tracing::info!(agent = %self.agent.name, "list-status gives no list ({e}); reading each plug with status instead");
                        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                        s.cannot_list = true;
                        s.waiting.extend(batch);
                        s.running = false;
                        let rest = std::mem::take(&mut s.waiting);
                        drop(s);
                        for (plug, tx) in rest {
                            let agent = self.agent.clone();
                            let permits = self.fallback.clone();
                            tokio::spawn(async move {
                                let _permit = permits.acquire_owned().await;
                                let _ = tx.send(plug_status(&agent, Some(&plug)).await);
                            });
                        }
                        return;
                    }
                },
                Ok(run) => {
                    let (kind, detail) = self.agent.failure("list-status", &run).await;
                    Err(PowerState::error(kind, detail))
                }
            };
            for (plug, tx) in batch {
                let name = &self.agent.name;
                let found = match &listed {
                    Err(e) => Err(e.clone()),
                    // An SNMP PDU agent's plug is an outlet's number or its name.
                    Ok((_, text)) if self.agent.outlet_plugs => {
                        super::outlets::find_outlet(text, &plug).map_err(|why| {
                            PowerState::error(
                                ReadErrorKind::BadReply,
                                format!("{name} list-status {why}"),
                            )
                        })
                    }
                    Ok((plugs, _)) => match plugs.get(&plug) {
                        Some(listed) => Ok(*listed),
                        None => Err(PowerState::error(
                            ReadErrorKind::BadReply,
                            format!(
                                "{name} list-status does not name plug {plug:?} (it lists {} plugs)",
                                plugs.len()
                            ),
                        )),
                    },
                };
                let state = match found {
                    Ok(Listed::On) => PowerState::On,
                    Ok(Listed::Off) => PowerState::Off,
                    Ok(Listed::Twice) => PowerState::error(
                        ReadErrorKind::BadReply,
                        format!(
                            "{name} list-status names plug {plug:?} twice: two machines answer to that name, so neither's state is this node's (rename one)"
                        ),
                    ),
                    Ok(Listed::Unknown) => {
                        // The list gives no state for it: its own status run says (listed
                        // once, so the agent's own lookup of the plug finds that one).
                        let agent = self.agent.clone();
                        let permits = self.fallback.clone();
                        tokio::spawn(async move {
                            let _permit = permits.acquire_owned().await;
                            let _ = tx.send(plug_status(&agent, Some(&plug)).await);
                        });
                        continue;
                    }
                    Err(error) => error,
                };
                let _ = tx.send(state);
            }
        }
    }
}
