//! The notify protocol itself: READY=1 only after a sync with a reachable API server, STATUS=
//! saying what the daemon does, WATCHDOG=1 steady from the decision loop and silent while it
//! is stuck.

use super::*;

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
