//! Scenarios of the daemon and the API server failing under it: a config broken while it
//! runs, the daemon killed after its fence, writes that meet 409 Conflict, the API server
//! killed before the write.

use super::*;

/// The config file deleted, then replaced by garbage, under a running daemon: it keeps the
/// config it started with and goes on fencing by it.
pub(super) fn config_broken_under_a_running_daemon() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-config", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        std::fs::remove_file(&daemon.config_path).unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        std::fs::write(&daemon.config_path, "datacenter = [[[\n").unwrap();
        power_cut(&s, &node, 0).await;
        wait_taint(&node, EVENT_BOUND).await;
        conclude(
            "config file deleted and corrupted under a running daemon",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// The daemon is killed right after its fence lands and started again: the new one finds its
/// own fence, writes nothing more, and its journal, the Node's annotations and the fence
/// budget all say one fence.
pub(super) fn daemon_killed_after_its_fence_and_restarted() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-kill", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        power_cut(&s, &node, 0).await;
        wait_taint(&node, EVENT_BOUND).await;
        // Killed: no shutdown, no journal flush beyond what was already synced.
        drop(daemon);
        let daemon: RunningDaemon = s.daemon().await;
        daemon
            .wait_rule(&node.name, "fenced-awaiting-recovery", EVENT_BOUND)
            .await;
        wait_for("the fence budget restored", EVENT_BOUND, || async {
            (sample(&daemon.metrics().await, "oobfence_fence_budget_used") == Some(1.0))
                .then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let m = daemon.metrics().await;
        assert_eq!(
            sample(
                &m,
                "oobfence_actions_total{action=\"taint\",result=\"success\"}"
            ),
            None,
            "the restarted daemon wrote a fence again: {m}"
        );
        daemon.stop().await;
        let records: Vec<_> = journal::tail(&s.journal(), &node.name, 100)
            .unwrap()
            .records
            .into_iter()
            .filter(|r| r.action == "taint" && r.result == "success")
            .collect();
        assert_eq!(records.len(), 1, "{records:?}");
        // The Node's record and the journal's tell of the same fence: fenced-at is stamped
        // before the write, the journal's record after it returns (a write may take its 20 s
        // bound on a loaded API server).
        let n = node.get().await;
        let at: jiff::Timestamp = n.annotations()["oobfence.io/fenced-at"].parse().unwrap();
        let gap = records[0].ts.duration_since(at).abs();
        assert!(
            gap < jiff::SignedDuration::from_secs(30),
            "journal {} vs node {at}",
            records[0].ts
        );
        assert!(n.annotations().contains_key("oobfence.io/fenced-by"));
        // Killed before its journal record reached the disk, it would find the fence on the
        // Node alone: the budget still counts it.
        std::fs::rename(s.journal(), s.dir().join("journal.moved")).unwrap();
        let daemon: RunningDaemon = s.daemon().await;
        wait_for(
            "the fence budget restored from the Node",
            EVENT_BOUND,
            || async {
                (sample(&daemon.metrics().await, "oobfence_fence_budget_used") == Some(1.0))
                    .then_some(())
            },
        )
        .await;
        conclude(
            "daemon killed after its fence and restarted",
            vec![Write::Taint(node.name.clone())],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// Another writer changes the Node without pause while oobfence fences it: the fence lands
/// once, with every other change kept. Whether a given write of the daemon's meets 409 Conflict
/// here is a race, so this reports the 409s it met; `tests/cluster.rs` makes them happen on
/// every write (`client_racing_a_writer`) and asserts the retry and the giving up.
pub(super) fn conflicts_on_every_write_for_a_while() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-409", 1).await;
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hammer = {
            let (api, name, stop) = (node.nodes(), node.name.clone(), stop.clone());
            tokio::spawn(async move {
                let mut writes = 0u64;
                // Bounded: at most 60 s or 100,000 writes.
                let started = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(60)
                    && writes < 100_000
                {
                    let patch = json!({"metadata": {"labels": {"oobfence.test/churn": writes.to_string()}}});
                    if api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .is_ok()
                    {
                        writes += 1;
                    }
                }
                writes
            })
        };
        power_cut(&s, &node, 0).await;
        // The churn goes on until the fence has landed or a fence write has given up on it
        // (5 conflicts in a row), at most 30 s.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let m = daemon.metrics().await;
            let gave_up = sample(
                &m,
                "oobfence_actions_total{action=\"taint\",result=\"failure\"}",
            )
            .is_some();
            if gave_up || FakeNode::has_oos_taint(&node.get().await) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let churn = hammer.await.unwrap();
        wait_taint(&node, EVENT_BOUND).await;
        let n = node.get().await;
        assert_eq!(
            n.labels().get("oobfence.test/churn").map(String::as_str),
            Some((churn - 1).to_string().as_str()),
            "the other writer's last change was lost"
        );
        let m = daemon.metrics().await;
        let failures = sample(
            &m,
            "oobfence_actions_total{action=\"taint\",result=\"failure\"}",
        );
        daemon.stop().await;
        // What the race gave: a taint write that gave up after its retries, or the one that
        // landed saying how many 409s it met.
        let records = journal::tail(&s.journal(), &node.name, 100)
            .unwrap()
            .records;
        let retried = records
            .iter()
            .filter(|r| r.action == "taint" && r.result == "success")
            .any(|r| r.message.contains("409 Conflict"));
        report(&format!(
            "fault matrix: 409 scenario: {churn} competing writes; taint writes that gave up: {failures:?}; the landed one met 409s: {retried}"
        ));
        let expected = vec![Write::Taint(node.name.clone())];
        let seen = rec.writes_once_seen(&expected).await;
        node.delete().await;
        Outcome {
            name: "409 Conflict on the writes for a while",
            expected,
            seen,
        }
    })
}

/// A control plane of the scenario's own (the shared one must not go down under the other
/// scenarios): `scripts/test-cluster` in a directory, stopped on drop.
pub(super) struct OwnCluster {
    pub(super) dir: tempfile::TempDir,
    /// An API server started again by the test: its child, waited for on drop.
    pub(super) restarted: Mutex<Option<std::process::Child>>,
}

impl OwnCluster {
    pub(super) async fn start() -> OwnCluster {
        let dir = tempfile::tempdir().unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster");
        let out = tokio::process::Command::new(&script)
            .arg("start")
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run scripts/test-cluster");
        assert!(
            out.status.success(),
            "scripts/test-cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        OwnCluster {
            dir,
            restarted: Mutex::new(None),
        }
    }

    pub(super) fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }

    pub(super) async fn client(&self) -> Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Client::try_from(cfg).unwrap()
    }

    pub(super) fn apiserver_pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// SIGKILLs the API server and returns its command line, to start it again.
    pub(super) fn kill_apiserver(&self) -> Vec<String> {
        let pid = self.apiserver_pid();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        args
    }

    /// Starts the API server again with the same arguments (same port, same etcd).
    pub(super) fn restart_apiserver(&self, args: &[String]) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("kube-apiserver.log"))
            .unwrap();
        let child = std::process::Command::new(&args[0])
            .args(&args[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver again");
        std::fs::write(
            self.dir.path().join("kube-apiserver.pid"),
            child.id().to_string(),
        )
        .unwrap();
        *self.restarted.lock().unwrap() = Some(child);
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster");
        // Seconds of waiting for processes to exit, aside from the other scenarios' tasks.
        support::blocking(|| {
            let _ = std::process::Command::new(script)
                .arg("stop")
                .arg(self.dir.path())
                .stdin(std::process::Stdio::null())
                .output();
            if let Some(mut child) = self.restarted.lock().unwrap().take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        });
    }
}

/// The API server is killed (SIGKILL) as a node dies, before oobfence can write, and started
/// again 8 s later: nothing is written while it is gone, and the node is fenced once it is
/// back, on reads taken after the view is fresh again.
pub(super) fn apiserver_killed_before_the_write() -> ScenarioFuture {
    Box::pin(async {
        let cluster = OwnCluster::start().await;
        let mut s = Scenario::redfish("fm-apikill", 1).await;
        s.client = cluster.client().await;
        s.set_guards("max_unhealthy = \"100%\"\nmax_view_age = \"5s\"\n");
        let node = s.node("a", 0).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon_with_kubeconfig(&cluster.kubeconfig()).await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", EVENT_BOUND).await;
        node.die(FIRST_BOOT).await;
        let args = cluster.kill_apiserver();
        wait_for("oobfence_view_stale 1", EVENT_BOUND, || async {
            (sample(&daemon.metrics().await, "oobfence_view_stale") == Some(1.0)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let restarted = Instant::now();
        cluster.restart_apiserver(&args);
        wait_taint(&node, EVENT_BOUND).await;
        let taint = Write::Taint(node.name.clone());
        assert!(rec.seen(&taint).await > restarted);
        let outcome = conclude(
            "API server killed before the write, then restarted",
            vec![taint],
            daemon,
            &rec,
            &[&node],
        )
        .await;
        drop(cluster);
        outcome
    })
}
