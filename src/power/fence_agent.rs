//! A ClusterLabs fence agent as a power source (`protocol = "fence-agent"`), through the
//! agent's own interface (FenceAgentAPI): one process per call, its options as `name=value`
//! lines on stdin (never on the command line, where `ps` would show the password), `action=
//! status` answered by the exit status (0 on, 2 off, anything else a failure). The process runs
//! in its own process group with a scrubbed environment, and the whole group is killed at the
//! deadline; what it printed is kept (capped, the password redacted) to say why it failed.
//!
//! An agent reports no machine identity: its Off reads count only under `identity =
//! "unchecked"`, which the config requires of these entries.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{
    ActionCheck, ActionOutcome, ActionSupport, PowerAction, PowerSource, PowerState, ReadErrorKind,
    Reply,
};
use crate::config::BmcEntry;
use crate::secret::Secret;

/// What is kept of an agent's stdout and stderr each.
const OUTPUT_CAP: u64 = 16 * 1024;

/// The FenceAgentAPI's exit status for `status`: the plug is on.
const STATUS_ON: i32 = 0;
/// ... and off.
const STATUS_OFF: i32 = 2;

/// One node's fence agent: the agent, its options for that node, the credentials.
pub struct FenceAgentSource {
    agent: PathBuf,
    name: String,
    /// `name=value` pairs for stdin, `{node}` filled in; credentials and plug apart.
    options: Vec<(String, String)>,
    plug: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    timeout: Duration,
    endpoint: String,
    actions: Vec<String>,
}

impl std::fmt::Debug for FenceAgentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceAgentSource")
            .field("agent", &self.agent)
            .field("options", &self.options)
            .field("plug", &self.plug)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// How one run of the agent ended.
struct Run {
    /// The exit code; `None` for a signal.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl FenceAgentSource {
    pub fn new(entry: &BmcEntry, node: &str) -> Result<FenceAgentSource, String> {
        let fa = entry
            .fence_agent
            .as_ref()
            .ok_or("not a fence-agent entry")?;
        Ok(FenceAgentSource {
            agent: fa.agent.clone(),
            name: fa.name.clone(),
            options: fa.options_for(node),
            plug: fa.plug_for(node),
            username: (!entry.username.is_empty()).then(|| entry.username.clone()),
            password: (!entry.password.expose().is_empty()).then(|| entry.password.clone()),
            timeout: entry.timeout,
            endpoint: fa.endpoint_for(node),
            actions: fa.actions.clone(),
        })
    }

    /// The agent's stdin for `action`: one `name=value` a line.
    fn stdin(&self, action: &str) -> String {
        let mut lines = vec![format!("action={action}")];
        lines.extend(self.options.iter().map(|(k, v)| format!("{k}={v}")));
        if let Some(plug) = &self.plug {
            lines.push(format!("plug={plug}"));
        }
        if let Some(user) = &self.username {
            lines.push(format!("username={user}"));
        }
        if let Some(pw) = &self.password {
            lines.push(format!("password={}", pw.expose()));
        }
        lines.join("\n") + "\n"
    }

    /// `text` with the password replaced, for messages.
    fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(pw) if !pw.expose().is_empty() => text.replace(pw.expose(), "<password>"),
            _ => text.to_string(),
        }
    }

    /// Runs the agent once for `action`, at most the entry's timeout; the whole process group
    /// is killed then.
    async fn run(&self, action: &str) -> Result<Run, (ReadErrorKind, String)> {
        let mut cmd = tokio::process::Command::new(&self.agent);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            (
                ReadErrorKind::Config,
                format!("{} could not be started: {e}", self.agent.display()),
            )
        })?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok());
        let input = self.stdin(action);
        let mut stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let work = async {
            // An agent that exits without reading its stdin breaks the pipe: what it printed
            // says why, so a failed write is not the error.
            let _ = stdin.write_all(input.as_bytes()).await;
            drop(stdin);
            let (out, err, status) = tokio::join!(capped(stdout), capped(stderr), child.wait());
            (out, err, status)
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok((stdout, stderr, Ok(status))) => {
                // The agent may have left children behind (ipmitool, ssh): none outlives it.
                kill_group(pgid);
                Ok(Run {
                    code: status.code(),
                    stdout: self.scrub(&stdout),
                    stderr: self.scrub(&stderr),
                })
            }
            Ok((_, _, Err(e))) => {
                kill_group(pgid);
                Err((
                    ReadErrorKind::Config,
                    format!("waiting for {}: {e}", self.name),
                ))
            }
            Err(_) => {
                kill_group(pgid);
                Err((
                    ReadErrorKind::Timeout,
                    format!(
                        "{} did not finish within {:?}; its process group was killed",
                        self.name, self.timeout
                    ),
                ))
            }
        }
    }

    /// Why a run failed, in the agent's words (the last lines of stderr, else stdout).
    fn failure(&self, action: &str, run: &Run) -> (ReadErrorKind, String) {
        let said = last_lines(if run.stderr.trim().is_empty() {
            &run.stdout
        } else {
            &run.stderr
        });
        let status = match run.code {
            Some(c) => format!("exit status {c}"),
            None => "killed by a signal".into(),
        };
        let lower = said.to_ascii_lowercase();
        let kind = if lower.contains("unable to connect/login") || lower.contains("login") {
            ReadErrorKind::Auth
        } else if lower.contains("timed out") || lower.contains("timeout") {
            ReadErrorKind::Timeout
        } else if lower.contains("connect") || lower.contains("unreachable") {
            ReadErrorKind::Unreachable
        } else {
            ReadErrorKind::Protocol
        };
        (
            kind,
            format!("{} {action} failed ({status}): {said}", self.name),
        )
    }
}

/// Reads `r` to its end, keeping the first [`OUTPUT_CAP`] bytes.
async fn capped(r: impl AsyncRead + Unpin) -> String {
    let mut kept = Vec::new();
    let mut r = r;
    let _ = (&mut r).take(OUTPUT_CAP).read_to_end(&mut kept).await;
    // Drain the rest so that the agent never blocks on a full pipe.
    let _ = tokio::io::copy(&mut r, &mut tokio::io::sink()).await;
    String::from_utf8_lossy(&kept).into_owned()
}

/// SIGKILL to the process group `pgid` (the agent's own: it was started as its leader).
fn kill_group(pgid: Option<i32>) {
    if let Some(pgid) = pgid.filter(|p| *p > 1) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The last three non-empty lines of `text`, joined: what an agent says last is why.
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let said = lines[lines.len().saturating_sub(3)..].join(" / ");
    if said.is_empty() {
        "it printed nothing".into()
    } else {
        said
    }
}

impl PowerSource for FenceAgentSource {
    fn backend(&self) -> &'static str {
        "fence-agent"
    }

    fn address(&self) -> String {
        let mut a = self.name.clone();
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
            let state = match self.run("status").await {
                Err((kind, detail)) => PowerState::error(kind, detail),
                Ok(run) => match run.code {
                    Some(STATUS_ON) => PowerState::On,
                    Some(STATUS_OFF) => PowerState::Off,
                    Some(1) | None => {
                        let (kind, detail) = self.failure("status", &run);
                        PowerState::error(kind, detail)
                    }
                    Some(other) => PowerState::error(
                        ReadErrorKind::BadReply,
                        format!(
                            "{} status exited {other}, which the fence agent API does not define (0 on, 2 off, 1 failure): {}",
                            self.name,
                            last_lines(&format!("{}\n{}", run.stdout, run.stderr))
                        ),
                    ),
                },
            };
            Reply::without_identity(
                state,
                format!(
                    "{} reports no machine identity; this entry's mapping is trusted (identity = \"unchecked\")",
                    self.name
                ),
            )
        })
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
                    why: format!("{} lists no {verb} action in its metadata", self.name),
                };
            }
            let reply = self.read_reply().await;
            if let Err(why) = check(&reply) {
                return ActionOutcome::Refused { why };
            }
            match self.run(verb).await {
                Ok(run) if run.code == Some(0) => ActionOutcome::Sent {
                    answer: format!("{} {verb}: exit status 0", self.name),
                },
                Ok(run) => ActionOutcome::Failed {
                    error: PowerState::error(
                        self.failure(verb, &run).0,
                        self.failure(verb, &run).1,
                    ),
                },
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
                    Ok(format!("{} lists the {verb} action", self.name))
                } else {
                    Err(format!("{} lists no {verb} action", self.name))
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
