//! The daemon speaks systemd's notify protocol (what `Type=notify` and `WatchdogSec=` in
//! systemd/oobfence@.service rely on), checked without systemd: the test binds the Unix
//! datagram socket a service manager would, points NOTIFY_SOCKET at it, runs the real
//! `oobfence run` against the test kube-apiserver, and reads what arrives.
//!
//! READY=1 must come only once the node cache has synced with a reachable API server, STATUS=
//! must say what the daemon is doing, and WATCHDOG=1 must come from the decision loop: steady
//! while the loop runs (also idle), and silent while the loop is stuck.

mod support;

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

/// Largest gap between consecutive instants, and from the last one to `end`.
fn largest_gap(times: &[Instant], end: Instant) -> Duration {
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .chain(times.last().map(|t| end - *t))
        .max()
        .unwrap_or(Duration::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_ready_after_sync_then_status_and_a_steady_watchdog() {
    let s = Scenario::without_machines("notify").await;
    let a = s
        .node_reporting("a", "boot-a", KubeletIdentity::default())
        .await;
    let b = s
        .node_reporting("b", "boot-b", KubeletIdentity::default())
        .await;
    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig_path(), &listen);
    let mut daemon = Daemon::spawn(&cfg, &notify.path, &listen, s.dir());

    let ready = notify
        .until(Duration::from_secs(60), |l| l == "READY=1")
        .await;
    assert!(
        ready.is_some(),
        "no READY=1 within 60s; received {:?}; log:\n{}",
        notify.lines(),
        daemon.log_text()
    );
    // READY=1 means what /readyz means: synced and the API server answering.
    assert_eq!(
        daemon.readyz().await,
        Some(200),
        "/readyz right after READY=1"
    );
    let before_ready: Vec<&str> = notify
        .lines()
        .into_iter()
        .take_while(|l| *l != "READY=1")
        .collect();
    assert!(
        before_ready
            .iter()
            .any(|l| l.starts_with("STATUS=listing nodes and leases")),
        "a STATUS= while syncing: {before_ready:?}"
    );
    assert!(
        !before_ready.contains(&"WATCHDOG=1"),
        "no keep-alive before the decision loop runs: {before_ready:?}"
    );

    let status = notify
        .until(Duration::from_secs(5), |l| l.starts_with("STATUS=watching"))
        .await
        .unwrap_or_else(|| panic!("no STATUS=watching...; received {:?}", notify.lines()));
    assert!(
        status.starts_with("STATUS=watching 2 nodes, 0 fenced, 0 blocked"),
        "{status}"
    );

    // An idle, healthy loop keeps feeding the watchdog: about once a second.
    let from = Instant::now();
    notify.collect(Duration::from_secs(10)).await;
    let pings = notify.watchdogs_since(from);
    assert!(
        pings.len() >= 4,
        "{} WATCHDOG=1 in 10s: {:?}",
        pings.len(),
        notify.lines()
    );
    let gap = largest_gap(&pings, Instant::now());
    assert!(gap < MAX_HEALTHY_GAP, "a {gap:?} gap between keep-alives");

    let exit = daemon.terminate(Duration::from_secs(15)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    notify.collect(Duration::from_millis(200)).await;
    assert!(
        notify.lines().contains(&"STOPPING=1"),
        "STOPPING=1 on SIGTERM: {:?}",
        notify.lines()
    );
    a.delete().await;
    b.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_ready_while_the_api_server_cannot_be_reached() {
    let s = Scenario::without_machines("nowhere").await;
    // The test cluster's kubeconfig, pointed at a loopback port nothing listens on.
    let text = std::fs::read_to_string(kubeconfig_path()).unwrap();
    let dead = format!("https://127.0.0.1:{}", free_port());
    let replaced: Vec<String> = text
        .lines()
        .map(|l| match l.split_once("server:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}server: {dead}"),
            _ => l.to_string(),
        })
        .collect();
    assert!(
        replaced.iter().any(|l| l.ends_with(&dead)),
        "no server: line"
    );
    let kubeconfig = s.dir().join("unreachable.kubeconfig");
    std::fs::write(&kubeconfig, replaced.join("\n")).unwrap();

    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig, &listen);
    let mut daemon = Daemon::spawn(&cfg, &notify.path, &listen, s.dir());

    notify.collect(Duration::from_secs(8)).await;
    let lines = notify.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("STATUS=listing nodes and leases")),
        "it says what it waits for: {lines:?}; log:\n{}",
        daemon.log_text()
    );
    assert!(!lines.contains(&"READY=1"), "READY=1 without an API server");
    assert!(
        !lines.contains(&"WATCHDOG=1"),
        "keep-alives before the loop runs"
    );
    assert!(daemon.is_running(), "it keeps retrying, it does not exit");
    assert_eq!(daemon.readyz().await, Some(503), "/readyz agrees");
    // One line per outage and watch, saying so; none claiming a watch works while every
    // connection is refused, and no library ERROR line besides.
    let log = daemon.log_text();
    for watch in ["nodes", "leases"] {
        let failed = log
            .lines()
            .filter(|l| l.contains("watch failed") && l.contains(&format!("watch=\"{watch}\"")))
            .count();
        assert_eq!(failed, 1, "{watch}: {failed} lines; log:\n{log}");
    }
    assert!(!log.contains("works again"), "log:\n{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains(" ERROR ") && !l.contains(" ERROR oobfence::")),
        "a library's ERROR line; log:\n{log}"
    );
    let exit = daemon.terminate(Duration::from_secs(15)).await;
    assert!(exit.success(), "exit after SIGTERM while syncing: {exit}");
}

/// Serves a PEM through a named pipe, or stops serving: a reader of the pipe then blocks in
/// open(2) until serving resumes, like a read from a hung network file system.
struct PemPipe {
    path: PathBuf,
    serving: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PemPipe {
    fn start(path: PathBuf, pem: Vec<u8>) -> PemPipe {
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo {}", path.display());
        let serving = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, st) = (path.clone(), serving.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // O_NONBLOCK: opening for writing fails at once (ENXIO) while nobody reads, so
            // the flags are looked at every few milliseconds. Bounded by the test's lifetime.
            const O_NONBLOCK: i32 = 0o4000;
            while !st.load(Ordering::Relaxed) {
                if s.load(Ordering::Relaxed)
                    && let Ok(mut f) = std::fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(O_NONBLOCK)
                        .open(&p)
                {
                    let _ = f.write_all(&pem);
                    continue;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        PemPipe {
            path,
            serving,
            stop,
            thread: Some(thread),
        }
    }

    fn serve(&self, on: bool) {
        self.serving.store(on, Ordering::Relaxed);
    }
}

impl Drop for PemPipe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_decision_loop_stops_the_keepalives() {
    let s = Scenario::without_machines("wedge").await;
    let (cert, _key) = support::sushy::self_signed_cert(s.dir(), "wedge");
    let pipe = PemPipe::start(
        s.dir().join("system-roots.pem"),
        std::fs::read(&cert).unwrap(),
    );
    // The loop builds a node's power source the first time it evaluates the node, and a
    // Redfish entry without ca_file loads the system's roots then (SSL_CERT_FILE, a pipe
    // here): with the pipe not serving, that read blocks the loop. (ca_file and the secrets are
    // read at load, never on the loop.)
    s.map_unreachable_with_system_roots("a");
    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig_path(), &listen);
    let mut daemon = Daemon::spawn_with_env(
        &cfg,
        &notify.path,
        &listen,
        s.dir(),
        &[("SSL_CERT_FILE", pipe.path.as_path())],
    );

    notify.wait_ready(&daemon).await;
    let from = Instant::now();
    notify.collect(Duration::from_secs(5)).await;
    assert!(
        notify.watchdogs_since(from).len() >= 2,
        "keep-alives flow before the loop is stuck: {:?}",
        notify.lines()
    );

    pipe.serve(false);
    let node = s
        .node_reporting("a", "boot-1", KubeletIdentity::default())
        .await;
    // The node reaches the cache and the loop's next pass blocks on the pipe: within a few
    // seconds the keep-alives stop, and stay stopped (a healthy loop pings every second).
    notify.collect(Duration::from_secs(12)).await;
    let during = notify.watchdogs_since(Instant::now() - Duration::from_secs(7));
    assert!(
        during.is_empty(),
        "the loop is stuck on the system roots, yet {} WATCHDOG=1 arrived: the keep-alive must \
         come from the decision loop (if the loop no longer loads them, this test needs another \
         way to stop it); log:\n{}",
        during.len(),
        daemon.log_text()
    );
    assert!(daemon.is_running(), "the process itself is alive");

    pipe.serve(true);
    let resumed = notify
        .until(Duration::from_secs(5), |l| l == "WATCHDOG=1")
        .await;
    assert!(
        resumed.is_some(),
        "keep-alives resume once the loop can go on: {:?}",
        notify.lines()
    );
    let exit = daemon.terminate(Duration::from_secs(15)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    node.delete().await;
}

/// The `[Service]` settings of systemd/oobfence@.service, as (key, value) in order.
fn unit_service_settings() -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/oobfence@.service"),
    )
    .expect("read the unit");
    let mut section = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[Service]"
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// The values of one `[Service]` setting of the unit, in order.
fn unit_values(key: &str) -> Vec<String> {
    unit_service_settings()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect()
}

/// A bad config must stop the unit, not restart it every RestartSec forever. systemd.service(5):
/// Restart= covers the processes of ExecStartPre= as well as the main one, but
/// RestartPreventExitStatus= looks at the main process only. So the config is checked by the
/// main process (`oobfence run` exits 2 on a bad config, shown here), and no other process of the
/// start may fail it.
#[test]
fn a_bad_config_stops_the_unit_instead_of_restarting_it_forever() {
    let settings = unit_service_settings();
    let get = |key: &str| {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("Restart"), ["on-failure"]);
    assert_eq!(get("RestartPreventExitStatus"), ["2"]);
    for key in ["ExecStartPre", "ExecStartPost", "ExecCondition"] {
        assert!(
            get(key).is_empty(),
            "{key}={:?}: its failure would be restarted whatever its exit status",
            get(key)
        );
    }
    let start = get("ExecStart");
    assert_eq!(start.len(), 1);
    assert!(start[0].contains("oobfence run --config"), "{start:?}");

    // The main process's answer to a bad config: exit status 2, at once, one clear line.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.toml");
    std::fs::write(
        &path,
        "datacenter = \"dc1\"\n[policy]\nnot_ready_grace = \"soon\"\n",
    )
    .unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not_ready_grace"), "{err}");

    // A kubeconfig that cannot work will not mend itself between two restarts either: the
    // same exit status, not a connection failure restarted every 5 s.
    let kubeconfig = dir.path().join("absent-kubeconfig");
    std::fs::write(
        &path,
        format!(
            "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = {:?}\n",
            kubeconfig.display().to_string()
        ),
    )
    .unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kubernetes.kubeconfig") && err.contains("absent-kubeconfig"),
        "{err}"
    );
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [\n").unwrap();
    let o = support::cli::oobfence(&["run"], &path);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("kubernetes.kubeconfig"), "{err}");
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

/// `systemctl reload` (ExecReload=, SIGHUP): a whole new config and its secrets take over, with
/// RELOADING=1 then READY=1; a broken one, or one that changes what only a restart applies, is
/// refused with one ERROR line and a metric while the old one runs on. What the daemon knows
/// about a node whose mapping did not change (its identity binding) carries over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_whole_config_and_refuses_a_broken_one() {
    let s = Scenario::redfish("reload", 1).await;
    s.set_policy("health_read_interval = \"10s\"\n");
    let node = s.node("a", 0).await;
    let _kubelet = support::k8s::FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig_path(), &listen);
    let original = std::fs::read_to_string(&cfg).unwrap();
    let mut daemon = Daemon::spawn(&cfg, &notify.path, &listen, s.dir());
    notify.wait_ready(&daemon).await;
    let report_path = format!("/nodes/{}", node.name);
    let report =
        |text: String| serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default();
    support::k8s::wait_for("the identity read", Duration::from_secs(30), || async {
        let r = report(daemon.get(&report_path).await);
        (r["identity"]["verdict"] == "match").then_some(())
    })
    .await;
    let digest = |cfg: &str| -> String {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(cfg.as_bytes());
        d.iter().take(6).map(|b| format!("{b:02x}")).collect()
    };
    let metrics = daemon.get("/metrics").await;
    assert!(
        metrics.contains(&format!(
            "dry_run=\"false\",pre_attest=\"true\",ha=\"false\",config_sha256=\"{}\"}} 1",
            digest(&original)
        )),
        "{metrics}"
    );

    // 1. A whole new config: applied, the binding kept (same machine), READY=1 again.
    let dry = original.replace("[policy]\n", "[policy]\ndry_run = true\n");
    std::fs::write(&cfg, &dry).unwrap();
    let from = notify.seen.len();
    daemon.hangup();
    notify
        .until(Duration::from_secs(15), |l| l == "READY=1")
        .await
        .unwrap_or_else(|| panic!("no READY=1 after the reload; log:\n{}", daemon.log_text()));
    let after: Vec<&str> = notify.seen[from..]
        .iter()
        .map(|(_, l)| l.as_str())
        .collect();
    assert!(after.contains(&"RELOADING=1"), "{after:?}");
    // The decision loop runs on: its keep-alives keep coming.
    let since = Instant::now();
    notify.collect(Duration::from_secs(5)).await;
    assert!(
        notify.watchdogs_since(since).len() >= 2,
        "{:?}",
        notify.lines()
    );
    let metrics = daemon.get("/metrics").await;
    assert!(
        metrics.contains("oobfence_config_last_reload_successful 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "dry_run=\"true\",pre_attest=\"true\",ha=\"false\",config_sha256=\"{}\"}} 1",
            digest(&dry)
        )),
        "{metrics}"
    );
    assert_eq!(
        metrics.matches("oobfence_config_info{").count(),
        1,
        "one series: the config in force"
    );
    // From here on nobody reads the notify socket: closed, so that the daemon's notifications
    // fail at once instead of filling a queue nobody drains (a service manager always drains
    // it; a full one would block the sender).
    drop(notify);
    let r = report(daemon.get(&report_path).await);
    assert_eq!(
        r["identity"]["verdict"], "match",
        "the binding carries over: {r}"
    );
    assert!(
        daemon.log_text().contains("reloaded"),
        "{}",
        daemon.log_text()
    );

    // 2. The secrets are read again: a wrong password in the file shows in the next read.
    let pw_file = original
        .lines()
        .find_map(|l| l.strip_prefix("password_file = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("a password_file in the scenario's config")
        .to_string();
    let right = std::fs::read_to_string(&pw_file).unwrap();
    std::fs::write(&pw_file, "not-the-password\n").unwrap();
    daemon.hangup();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let r = report(daemon.get(&report_path).await);
        if r["power_source"]["last_read_failed"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no failed read with the new password within 40s: {}\nlog:\n{}",
            r["power_source"],
            daemon.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    std::fs::write(&pw_file, right).unwrap();

    // 3. A broken file and a change only a restart applies: refused, the old config runs on.
    for (what, text, says) in [
        ("broken", "datacenter = \"dc1\n".to_string(), "line 1"),
        (
            "listen changed",
            dry.replace(&listen, &format!("127.0.0.1:{}", free_port())),
            "server.listen changed, which only a restart applies",
        ),
    ] {
        std::fs::write(&cfg, &text).unwrap();
        daemon.hangup();
        daemon
            .wait_metric(what, "oobfence_config_last_reload_successful 0")
            .await;
        let log = daemon.log_text();
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("config reload refused"))
            .collect();
        assert!(
            refused
                .last()
                .is_some_and(|l| l.contains("ERROR") && l.contains(says)),
            "{what}: {refused:?}"
        );
        assert!(daemon.is_running(), "{what}: the daemon runs on");
        assert_eq!(daemon.readyz().await, Some(200), "{what}");
        let metrics = daemon.get("/metrics").await;
        assert!(
            metrics.contains(&format!("config_sha256=\"{}\"}} 1", digest(&dry))),
            "{what}: still the config that was in force: {metrics}"
        );
        // Back to a good file: the next reload succeeds again.
        std::fs::write(&cfg, &dry).unwrap();
        daemon.hangup();
        daemon
            .wait_metric("a good reload", "oobfence_config_last_reload_successful 1")
            .await;
    }
    let exit = daemon.terminate(Duration::from_secs(15)).await;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    node.delete().await;
}

/// The unit reloads by SIGHUP, which the daemon handles (above).
#[test]
fn the_unit_reloads_with_sighup() {
    assert_eq!(unit_values("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
}

/// The unit's log filter is the daemon's default, which keeps library noise (a TLS verifier's
/// own ERROR line for a refused BMC certificate) out of the journal.
#[test]
fn the_units_log_filter_is_the_default_one() {
    let env = unit_values("Environment");
    let wanted = format!("OOBFENCE_LOG={}", oobfence::DEFAULT_LOG_FILTER);
    assert!(env.contains(&wanted), "{env:?}");
    assert!(oobfence::DEFAULT_LOG_FILTER.contains("rustls_platform_verifier=off"));
}

/// A BMC certificate the system roots do not know (a BMC's own self-signed one, and no
/// `ca_file`): the log has one line of oobfence's own naming the node and the refusal, and
/// never the TLS verifier's ERROR line beside it, however often the read is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bmc_certificate_is_one_line_of_ours_not_the_tls_librarys() {
    let s = Scenario::redfish("certlog", 1).await;
    let emu = s.redfish_emulator();
    s.map_redfish(
        "a",
        &emu.base_url(),
        support::sushy::PASSWORD,
        &format!("system = \"{}\"\ntimeout = \"5s\"", emu.system_path(0)),
    );
    let node = s
        .node_reporting("a", support::scenario::FIRST_BOOT, s.identity(0).await)
        .await;
    let _kubelet = support::k8s::FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let mut notify = NotifySocket::bind(s.dir());
    let listen = format!("127.0.0.1:{}", free_port());
    let cfg = s.write_config(&kubeconfig_path(), &listen);
    let mut daemon = Daemon::spawn(&cfg, &notify.path, &listen, s.dir());
    notify.wait_ready(&daemon).await;
    drop(notify);
    let report_path = format!("/nodes/{}", node.name);
    support::k8s::wait_for("the refused read", Duration::from_secs(30), || async {
        let r: serde_json::Value =
            serde_json::from_str(&daemon.get(&report_path).await).unwrap_or_default();
        (r["power_source"]["last_read_failed"] == true).then_some(())
    })
    .await;
    // A failing source is read again every 15 s: let one retry pass.
    tokio::time::sleep(Duration::from_secs(17)).await;
    let log = daemon.log_text();
    let ours: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&node.name) && l.contains("power source read failed"))
        .collect();
    assert!(
        ours.iter().all(|l| l.contains(" WARN ")),
        "at WARN: {ours:?}"
    );
    // (A first read that timed out under load would be a line of its own kind: not a retry.)
    let tls = ours.iter().filter(|l| l.contains("error=tls")).count();
    assert_eq!(
        tls, 1,
        "one line for the refusal, none per retry; log:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" ERROR ") && !l.contains(" ERROR oobfence")),
        "a library's ERROR line; log:\n{log}"
    );
    assert!(daemon.is_running());
    daemon.terminate(Duration::from_secs(15)).await;
    node.delete().await;
}
