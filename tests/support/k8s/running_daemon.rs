//! An oobfence daemon run in this process against the test cluster, and what tests read of
//! a daemon over HTTP: `/metrics`, `/readyz`, a node's report.

use super::*;

/// The `/nodes/NODE` report of the daemon serving HTTP on `listen`.
pub async fn node_report(listen: &str, node: &str) -> Option<serde_json::Value> {
    let r = reqwest::get(format!("http://{listen}/nodes/{node}"))
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Waits until the daemon serving HTTP on `listen` has watched `node`'s kubelet renew its
/// Lease (not only found it at start): a silence that begins after this is one it saw begin,
/// a hang that opt-in actuation may power off. The kubelet must be renewing
/// (`FakeNode::keep_alive`).
pub async fn wait_lease_watched(listen: &str, node: &str, limit: Duration) -> serde_json::Value {
    wait_node_report(
        listen,
        node,
        "a Lease renewal watched",
        limit,
        |r| r["lease_watched"] == true,
        String::new,
    )
    .await
}

/// The nodes hang under the watch of the daemon serving HTTP on `listen`: their kubelets renew
/// (as `boot_id`) until it has watched each one renew, then stop and post NotReady, the
/// machines left On. A hang oobfence did not see begin is never powered off.
pub async fn hang_under_watch(listen: &str, nodes: &[&FakeNode], boot_id: &str) {
    let kubelets = FakeNode::keep_alive(nodes, boot_id);
    for n in nodes {
        wait_lease_watched(listen, &n.name, Duration::from_secs(120)).await;
    }
    kubelets.stop().await;
    for n in nodes {
        n.die(boot_id).await;
    }
}

/// Waits until the report of `node` from the daemon serving HTTP on `listen` satisfies
/// `reached`; on a timeout the panic shows the last report and `more` (a daemon's log).
pub async fn wait_node_report(
    listen: &str,
    node: &str,
    what: &str,
    limit: Duration,
    reached: impl Fn(&serde_json::Value) -> bool,
    more: impl Fn() -> String,
) -> serde_json::Value {
    let mut last = None;
    let start = Instant::now();
    loop {
        if let Some(r) = node_report(listen, node).await {
            if reached(&r) {
                return r;
            }
            last = Some(r);
        }
        if start.elapsed() > limit {
            panic!(
                "node {node} never reached {what} within {limit:?}; last report: {last:#?}{}",
                more()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An oobfence daemon running in this process against the test cluster.
pub struct RunningDaemon {
    pub listen: String,
    pub config_path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// The `/metrics` text of the daemon serving HTTP on `listen`.
pub async fn scrape(listen: &str) -> String {
    reqwest::get(format!("http://{listen}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap()
}

/// Waits until the daemon serving HTTP on `listen` answers `/readyz` with success.
pub async fn wait_ready(listen: &str, limit: Duration) {
    let url = format!("http://{listen}/readyz");
    wait_for("daemon /readyz", limit, || async {
        match reqwest::get(&url).await {
            Ok(r) if r.status().is_success() => Some(()),
            _ => None,
        }
    })
    .await;
}

impl RunningDaemon {
    /// Starts a daemon from config text; `{kubeconfig}`, `{listen}` are filled in here.
    pub async fn start(config_text: &str, dir: tempfile::TempDir) -> RunningDaemon {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut text = config_text
            .replace("{kubeconfig}", &kubeconfig_path().display().to_string())
            .replace("{listen}", &listen);
        if !text.contains("[journal]") {
            // Each test's journal stays in its own directory.
            text.push_str(&format!(
                "\n[journal]\npath = \"{}\"\n",
                dir.path().join("journal.jsonl").display()
            ));
        }
        let config_path = dir.path().join("dc.toml");
        std::fs::write(&config_path, &text).unwrap();
        let cfg = oobfence::config::Config::load(&config_path).expect("test config is valid");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            oobfence::daemon::run(cfg, async {
                let _ = rx.await;
            })
            .await
            .expect("daemon runs");
        });
        let d = RunningDaemon {
            listen,
            config_path,
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
        };
        wait_ready(&d.listen, crate::support::SERVER_START_BOUND).await;
        d
    }

    pub async fn report(&self, node: &str) -> Option<serde_json::Value> {
        node_report(&self.listen, node).await
    }

    pub async fn metrics(&self) -> String {
        scrape(&self.listen).await
    }

    /// Waits until the daemon's report for `node` has `rule`.
    pub async fn wait_rule(&self, node: &str, rule: &str, limit: Duration) -> serde_json::Value {
        self.wait_report(node, &format!("rule {rule}"), limit, |r| r["rule"] == rule)
            .await
    }

    /// Waits until the daemon's report for `node` shows a fence; on a timeout the panic shows
    /// the last report, which says why not.
    pub async fn wait_fenced(&self, node: &str, limit: Duration) -> serde_json::Value {
        self.wait_report(node, "a fence", limit, |r| !r["fence"].is_null())
            .await
    }

    /// Waits until the daemon's report for `node` shows no fence any more (lifted, or its
    /// record cleared); on a timeout the panic shows the last report, which says why not.
    pub async fn wait_unfenced(&self, node: &str, limit: Duration) -> serde_json::Value {
        self.wait_report(node, "no fence", limit, |r| r["fence"].is_null())
            .await
    }

    /// Waits until the daemon's report for `node` has the identity verdict `verdict`
    /// (`match`, `mismatch`, ...).
    pub async fn wait_identity(
        &self,
        node: &str,
        verdict: &str,
        limit: Duration,
    ) -> serde_json::Value {
        let what = format!("identity verdict {verdict}");
        self.wait_report(node, &what, limit, |r| r["identity"]["verdict"] == verdict)
            .await
    }

    /// Waits until the daemon has watched `node`'s kubelet renew its Lease: see
    /// [`wait_lease_watched`].
    pub async fn wait_lease_watched(&self, node: &str, limit: Duration) -> serde_json::Value {
        wait_lease_watched(&self.listen, node, limit).await
    }

    /// Waits until the daemon's report for `node` satisfies `reached` (`what` names it); on a
    /// timeout the panic shows the last report.
    pub async fn wait_report_where(
        &self,
        node: &str,
        what: &str,
        limit: Duration,
        reached: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.wait_report(node, what, limit, reached).await
    }

    async fn wait_report(
        &self,
        node: &str,
        what: &str,
        limit: Duration,
        reached: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_node_report(&self.listen, node, what, limit, reached, String::new).await
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
