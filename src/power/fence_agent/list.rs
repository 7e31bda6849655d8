//! One `list-status` call for every plug of an endpoint read at about the same time: a vCenter,
//! a PVE cluster, a cloud API answers all its machines in one call, where one `status` process
//! per plug would start as many agents. Reads that arrive while a call runs wait for the next
//! one; one call is in flight per endpoint. A plug the list does not name is an error read,
//! never Off; a plug it lists as neither on nor off (`UNKNOWN`: agents whose list has no power
//! state, such as `fence_kubevirt`) is read with its own `status` run instead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};

use super::process::{Agent, last_lines};
use super::status_of;
use crate::power::{PowerState, ReadErrorKind};

/// Reads arriving within this long of the first one share its call.
const GATHER: Duration = Duration::from_millis(50);

/// `status` runs at once per endpoint for plugs its list left unknown.
const FALLBACK_RUNS: usize = 4;

/// A plug's state as an agent's list gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listed {
    On,
    Off,
    Unknown,
}

/// Parses `list-status` output: one `plug,alias,status` line per plug (fencing.py's format, `,`
/// its default separator). Lines that are not such a line (a notice, `N/A`) are skipped; output
/// with no such line at all is an error: the agent cannot list.
pub fn parse_list_status(text: &str) -> Result<BTreeMap<String, Listed>, String> {
    let mut plugs = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((front, status)) = line.rsplit_once(',') else {
            continue;
        };
        let Some((plug, _alias)) = front.split_once(',') else {
            continue;
        };
        let listed = match status.trim().to_ascii_lowercase().as_str() {
            "on" => Listed::On,
            "off" => Listed::Off,
            "unknown" => Listed::Unknown,
            _ => continue,
        };
        if plugs.insert(plug.trim().to_string(), listed).is_some() {
            return Err(format!("the list names plug {:?} twice", plug.trim()));
        }
    }
    if plugs.is_empty() {
        return Err(format!(
            "the list-status output has no plug,alias,status line: {}",
            last_lines(text)
        ));
    }
    Ok(plugs)
}

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
            return status_of(&self.agent, Some(plug)).await;
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
                    Ok(plugs) => Ok(plugs),
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
                                let _ = tx.send(status_of(&agent, Some(&plug)).await);
                            });
                        }
                        return;
                    }
                },
                Ok(run) => {
                    let (kind, detail) = self.agent.failure("list-status", &run);
                    Err(PowerState::error(kind, detail))
                }
            };
            for (plug, tx) in batch {
                let state = match &listed {
                    Err(e) => e.clone(),
                    Ok(plugs) => match plugs.get(&plug) {
                        Some(Listed::On) => PowerState::On,
                        Some(Listed::Off) => PowerState::Off,
                        Some(Listed::Unknown) => {
                            // The list gives no state for it: its own status run says.
                            let agent = self.agent.clone();
                            let permits = self.fallback.clone();
                            tokio::spawn(async move {
                                let _permit = permits.acquire_owned().await;
                                let _ = tx.send(status_of(&agent, Some(&plug)).await);
                            });
                            continue;
                        }
                        None => PowerState::error(
                            ReadErrorKind::BadReply,
                            format!(
                                "{} list-status does not name plug {plug:?} (it lists {} plugs)",
                                self.agent.name,
                                plugs.len()
                            ),
                        ),
                    },
                };
                let _ = tx.send(state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_status_lines_are_plug_alias_and_state() {
        let out = "NOTICE: something\nvm-1,db one,ON\nvm-2,,off\n7,Outlet 7,UNKNOWN\nN/A\n";
        let plugs = parse_list_status(out).unwrap();
        assert_eq!(plugs.get("vm-1"), Some(&Listed::On));
        assert_eq!(plugs.get("vm-2"), Some(&Listed::Off));
        assert_eq!(plugs.get("7"), Some(&Listed::Unknown));
        assert_eq!(plugs.len(), 3);
        // An alias with a comma in it keeps plug and state apart.
        let plugs = parse_list_status("vm-3,web, front,on\n").unwrap();
        assert_eq!(plugs.get("vm-3"), Some(&Listed::On));
    }

    #[test]
    fn output_without_a_list_or_with_a_plug_twice_is_an_error() {
        let e = parse_list_status("N/A\n").unwrap_err();
        assert!(e.contains("no plug,alias,status line"), "{e}");
        let e = parse_list_status("vm-1,,on\nvm-1,,off\n").unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
