//! Running a fence agent once, as its interface (FenceAgentAPI) asks and as oobfence needs:
//! options on stdin, a scrubbed environment, its own process group killed whole at the
//! deadline, its output capped and every secret it was given (the password, `community`,
//! `secret_key`, ...) scrubbed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::power::ReadErrorKind;
use crate::secret::Secret;

/// What is kept of an agent's stdout and stderr each.
const OUTPUT_CAP: u64 = 16 * 1024;

/// An agent with the options of one endpoint: everything but the plug and the action.
pub struct Agent {
    pub(super) agent: PathBuf,
    pub(super) name: String,
    /// `name=value` pairs for stdin, `{node}` filled in; credentials and plug apart.
    pub(super) options: Vec<(String, String)>,
    /// The names of the options that are secrets: redacted in `Debug`, scrubbed from output.
    pub(super) secret_options: Vec<String>,
    pub(super) username: Option<String>,
    pub(super) password: Option<Secret>,
    pub(super) timeout: Duration,
    /// An SNMP PDU agent (the config's `known::OUTLET_AGENTS`): a plug is found in its outlet
    /// list before its Off is believed.
    pub(super) outlet_plugs: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("agent", &self.agent)
            .field("options", &self.public_options())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// How one run of the agent ended.
pub(super) struct Run {
    /// The exit code; `None` for a signal.
    pub(super) code: Option<i32>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Agent {
    /// The agent's stdin for `action` on `plug`: one `name=value` a line.
    pub(super) fn stdin(&self, action: &str, plug: Option<&str>) -> String {
        let mut lines = vec![format!("action={action}")];
        lines.extend(self.options.iter().map(|(k, v)| format!("{k}={v}")));
        if let Some(plug) = plug {
            lines.push(format!("plug={plug}"));
        }
        if let Some(user) = &self.username {
            lines.push(format!("username={user}"));
        }
        if let Some(pw) = &self.password {
            lines.push(format!("password={}", pw.expose()));
        }
        if self.outlet_plugs {
            // It then logs each SNMP answer: the outlet state it read, checked before an Off.
            lines.push("verbose=1".into());
        }
        lines.join("\n") + "\n"
    }

    /// The options with each secret one's value redacted.
    fn public_options(&self) -> Vec<(&str, &str)> {
        self.options
            .iter()
            .map(|(k, v)| {
                let v = if self.secret_options.contains(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect()
    }

    /// `text` with every secret it was given replaced by the secret's name (`<password>`,
    /// `<community>`), for messages: the longest first, so that a secret containing another
    /// is never half shown.
    pub(super) fn scrub(&self, text: &str) -> String {
        let mut secrets: Vec<(&str, &str)> = self
            .options
            .iter()
            .filter(|(k, _)| self.secret_options.contains(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(self.password.as_ref().map(|pw| ("password", pw.expose())))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        secrets.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let mut text = text.to_string();
        for (name, value) in secrets {
            text = text.replace(value, &format!("<{name}>"));
        }
        text
    }

    /// Runs the agent once for `action` (on `plug`), at most the entry's timeout; the whole
    /// process group is killed then.
    pub(super) async fn run(
        &self,
        action: &str,
        plug: Option<&str>,
    ) -> Result<Run, (ReadErrorKind, String)> {
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
        let input = self.stdin(action, plug);
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

    /// Why a run failed (see [`Agent::failure_words`]). The agents say "Unable to
    /// connect/login" for a host that does not resolve as for a wrong password (fencing.py's
    /// one EC_LOGIN_DENIED, with the resolver's words only at debug level): a login failure
    /// whose endpoint does not resolve here is `Unreachable`, not `Auth`.
    pub(super) async fn failure(&self, action: &str, run: &Run) -> (ReadErrorKind, String) {
        let (kind, detail) = self.failure_words(action, run);
        if kind != ReadErrorKind::Auth {
            return (kind, detail);
        }
        match self.unresolved_host().await {
            Some(why) => (ReadErrorKind::Unreachable, format!("{detail}; {why}")),
            None => (kind, detail),
        }
    }

    /// Why the agent's endpoint (`ip`, `ipaddr`, `hostname`, `server`), a host name, does
    /// not resolve here, if it does not (an answer in time that it does not).
    async fn unresolved_host(&self) -> Option<String> {
        let host = self
            .options
            .iter()
            .find(|(k, _)| ["ip", "ipaddr", "hostname", "server"].contains(&k.as_str()))
            .map(|(_, v)| v.as_str())?;
        if host.parse::<std::net::IpAddr>().is_ok() {
            return None;
        }
        let lookup = tokio::net::lookup_host((host, 0));
        match tokio::time::timeout(Duration::from_secs(10), lookup).await {
            Ok(Err(e)) => Some(format!(
                "its host {host:?} does not resolve ({e}): check the entry's ip option and this host's DNS"
            )),
            Ok(Ok(_)) | Err(_) => None,
        }
    }

    /// Why a run failed, in the agent's words (the last lines of stderr, else stdout).
    fn failure_words(&self, action: &str, run: &Run) -> (ReadErrorKind, String) {
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
        // net-snmp's words for a wrong SNMPv3 key or user (a wrong v1/v2c community gets no
        // answer at all: a timeout).
        // The resolver's words, as curl, ssh, net-snmp and Python's socket say them.
        let unresolved = [
            "could not resolve",
            "name or service not known",
            "unknown host",
            "temporary failure in name resolution",
            "address lookup",
        ];
        let kind = if unresolved.iter().any(|w| lower.contains(w)) {
            ReadErrorKind::Unreachable
        } else if lower.contains("unable to connect/login")
            || lower.contains("login")
            || lower.contains("authentication fail")
            || lower.contains("unknown user name")
        {
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
pub(super) fn last_lines(text: &str) -> String {
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
