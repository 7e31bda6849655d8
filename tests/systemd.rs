//! The daemon speaks systemd's notify protocol (what `Type=notify` and `WatchdogSec=` in
//! systemd/oobfence@.service rely on), checked without systemd: the test binds the Unix
//! datagram socket a service manager would, points NOTIFY_SOCKET at it, runs the real
//! `oobfence run` against the test kube-apiserver, and reads what arrives.
//!
//! READY=1 must come only once the node cache has synced with a reachable API server, STATUS=
//! must say what the daemon is doing, and WATCHDOG=1 must come from the decision loop: steady
//! while the loop runs (also idle), and silent while the loop is stuck.
//!
//! This file is the rig (the notify socket, the daemon run under it); the tests live by family
//! in `tests/systemd/`: notify (READY, STATUS, the watchdog), unit (the packaged unit's
//! settings, its log), reload (SIGHUP, journalled), sessions (Redfish logins across reload and
//! stop), logrotate (the packaged rule and the journal files it leaves).

mod support;

#[path = "systemd/logrotate.rs"]
mod logrotate;
#[path = "systemd/notify.rs"]
mod notify;
#[path = "systemd/reload.rs"]
mod reload;
#[path = "systemd/sessions.rs"]
mod sessions;
#[path = "systemd/unit.rs"]
mod unit;

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::k8s::{KubeletIdentity, free_port, kubeconfig_path};
use support::scenario::Scenario;

/// What WatchdogSec=30s hands a service: the daemon must ping well within half of it.
const WATCHDOG_USEC: &str = "30000000";
/// Longest gap between two keep-alives of a healthy loop: it ticks every second; a quarter of
/// WatchdogSec leaves room for a loaded machine's stalls and is well within the half that
/// systemd's watchdog needs.
const MAX_HEALTHY_GAP: Duration = Duration::from_millis(7500);

/// The scenario's daemon run as `oobfence run` under a notify socket, with the test cluster's
/// kubeconfig, once it said READY=1: the socket, the daemon, its config file and its listen
/// address.
async fn ready_daemon(s: &Scenario) -> (NotifySocket, Daemon, PathBuf, String) {
    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig_path(), &listen);
    let daemon = Daemon::spawn(&cfg, &notify.path, &listen, s.dir());
    notify.wait_ready(&daemon).await;
    (notify, daemon, cfg, listen)
}

/// The service manager's end of NOTIFY_SOCKET: every assignment received, with its arrival.
struct NotifySocket {
    socket: tokio::net::UnixDatagram,
    path: PathBuf,
    seen: Vec<(Instant, String)>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = tokio::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        NotifySocket {
            socket,
            path,
            seen: Vec::new(),
        }
    }

    /// Receives until an assignment satisfies `want` (returned) or `limit` passes (None).
    async fn until(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let Ok(received) = tokio::time::timeout(left, self.socket.recv(&mut buf)).await else {
                return None;
            };
            let n = received.expect("receive from the notify socket");
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let now = Instant::now();
            let mut hit = None;
            for line in text.lines().filter(|l| !l.is_empty()) {
                self.seen.push((now, line.to_string()));
                if hit.is_none() && want(line) {
                    hit = Some(line.to_string());
                }
            }
            if hit.is_some() {
                return hit;
            }
        }
    }

    /// Waits (a minute at most) for READY=1 from `daemon`; its log on failure.
    async fn wait_ready(&mut self, daemon: &Daemon) {
        let ready = self
            .until(Duration::from_secs(60), |l| l == "READY=1")
            .await;
        assert!(ready.is_some(), "no READY=1; log:\n{}", daemon.log_text());
    }

    /// Sends SIGHUP to `daemon` and waits (15 s at most) for its READY=1 after the reload; its
    /// log on failure. Returns where the reload's assignments start in `seen`.
    async fn reloaded(&mut self, daemon: &Daemon) -> usize {
        let from = self.seen.len();
        daemon.hangup();
        self.until(Duration::from_secs(15), |l| l == "READY=1")
            .await
            .unwrap_or_else(|| panic!("no READY=1 after the reload; log:\n{}", daemon.log_text()));
        from
    }

    /// Receives everything for `span`.
    async fn collect(&mut self, span: Duration) {
        let _ = self.until(span, |_| false).await;
    }

    fn lines(&self) -> Vec<&str> {
        self.seen.iter().map(|(_, l)| l.as_str()).collect()
    }

    fn watchdogs_since(&self, since: Instant) -> Vec<Instant> {
        self.seen
            .iter()
            .filter(|(t, l)| *t >= since && l == "WATCHDOG=1")
            .map(|(t, _)| *t)
            .collect()
    }
}

/// `oobfence run` as a child process with NOTIFY_SOCKET set; killed (by PID) on drop.
struct Daemon {
    child: tokio::process::Child,
    log: PathBuf,
    listen: String,
}

impl Daemon {
    fn spawn(config: &Path, notify: &Path, listen: &str, dir: &Path) -> Daemon {
        Daemon::spawn_with_env(config, notify, listen, dir, &[])
    }

    fn spawn_with_env(
        config: &Path,
        notify: &Path,
        listen: &str,
        dir: &Path,
        env: &[(&str, &Path)],
    ) -> Daemon {
        let log = dir.join("daemon.log");
        let out = std::fs::File::create(&log).expect("create the daemon log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .arg("run")
            .arg("--config")
            .arg(config)
            .env("NOTIFY_SOCKET", notify)
            .env("WATCHDOG_USEC", WATCHDOG_USEC)
            .env("OOBFENCE_LOG", oobfence::DEFAULT_LOG_FILTER)
            .env_remove("CREDENTIALS_DIRECTORY")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("start oobfence run");
        Daemon {
            child,
            log,
            listen: listen.to_string(),
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    async fn readyz(&self) -> Option<u16> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        client
            .get(format!("http://{}/readyz", self.listen))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// SIGTERM, as `systemctl stop` sends; the exit status within `limit`.
    async fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().expect("daemon still has a PID");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid}");
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("wait for the daemon"),
            Err(_) => panic!(
                "the daemon did not exit within {limit:?} of SIGTERM; log:\n{}",
                self.log_text()
            ),
        }
    }
}

impl Daemon {
    /// SIGHUP, as `systemctl reload` sends (ExecReload=).
    fn hangup(&self) {
        let pid = self.child.id().expect("daemon still has a PID");
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP {pid}");
    }

    /// Waits (15 s at most) until /metrics contains `line`; the log on failure.
    async fn wait_metric(&self, what: &str, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.get("/metrics").await.contains(line) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({line}); log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn get(&self, path: &str) -> String {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        match client
            .get(format!("http://{}{path}", self.listen))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }
}
