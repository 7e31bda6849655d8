//! `oobfence run` as a process of its own, for what only a process can be given: SIGHUP (what
//! `systemctl reload` sends) and an environment of its own (AWS credentials from a file).
//! Stopped by its PID: SIGTERM, then SIGKILL if it does not exit in time.
//! [`write_bare_config`] writes the config of a daemon with no power source, for what needs
//! a daemon and no machine (who answers on an address, the CLI beside it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub struct DaemonProcess {
    child: tokio::process::Child,
    pub listen: String,
    log: PathBuf,
}

impl DaemonProcess {
    /// Starts `oobfence run --config CONFIG` (serving HTTP on `listen`) with `env` set and
    /// `env_remove` unset, its output in `dir`/daemon.log; returns once `/readyz` answers.
    pub async fn start(
        config: &Path,
        listen: &str,
        dir: &Path,
        env: &[(&str, &str)],
        env_remove: &[&str],
    ) -> DaemonProcess {
        let d = DaemonProcess::spawn(config, listen, dir, env, env_remove);
        let url = format!("http://{listen}/readyz");
        let started = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(&url).await
                && r.status().is_success()
            {
                return d;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "oobfence run never became ready; log:\n{}",
                d.log_text()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// As [`DaemonProcess::start`], but returns at once: for what a daemon serves before it
    /// is ready (its caches not synced yet).
    pub fn spawn(
        config: &Path,
        listen: &str,
        dir: &Path,
        env: &[(&str, &str)],
        env_remove: &[&str],
    ) -> DaemonProcess {
        let log = dir.join("daemon.log");
        let out = std::fs::File::create(&log).expect("create the daemon log");
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .env("OOBFENCE_LOG", oobfence::DEFAULT_LOG_FILTER)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("CREDENTIALS_DIRECTORY")
            .envs(env.iter().copied());
        for k in env_remove {
            cmd.env_remove(k);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone the log handle"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("start oobfence run");
        DaemonProcess {
            child,
            listen: listen.to_string(),
            log,
        }
    }

    /// The process's id, as the daemon names itself on `/whoami`.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the daemon has not been waited for")
    }

    /// Waits for the process to exit by itself (a start that must fail): its status and log;
    /// panics with the log if it still runs after `limit`.
    pub async fn wait_exit(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => (status.expect("wait for oobfence run"), self.log_text()),
            Err(_) => panic!(
                "oobfence run still runs after {limit:?}; log:\n{}",
                self.log_text()
            ),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }

    /// SIGHUP, as `systemctl reload` sends: waits until the log says the reload took (a new
    /// "reloaded" line), and panics with the log if it was refused or never came.
    pub async fn reload(&self) {
        let before = self.log_text().matches("reloaded").count();
        self.signal("-HUP");
        let started = Instant::now();
        loop {
            let log = self.log_text();
            if log.matches("reloaded").count() > before {
                return;
            }
            assert!(
                !log.contains("config reload refused")
                    && started.elapsed() < Duration::from_secs(30),
                "the reload did not take; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGHUP with a config the daemon must refuse: waits until the log says so, and returns
    /// that line; panics with the log if the reload took or nothing came within 30 s.
    pub async fn reload_refused(&self) -> String {
        let before = self.log_text().matches("config reload refused").count();
        let reloaded = self.log_text().matches("reloaded").count();
        self.signal("-HUP");
        let started = Instant::now();
        loop {
            let log = self.log_text();
            if log.matches("config reload refused").count() > before {
                return log
                    .lines()
                    .rfind(|l| l.contains("config reload refused"))
                    .unwrap_or_default()
                    .to_string();
            }
            assert!(
                log.matches("reloaded").count() == reloaded
                    && started.elapsed() < Duration::from_secs(30),
                "the reload was not refused; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the report of `node` satisfies `reached`; on a timeout the panic shows the
    /// last report and the log.
    pub async fn wait_report(
        &self,
        node: &str,
        what: &str,
        limit: Duration,
        reached: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        super::k8s::wait_node_report(&self.listen, node, what, limit, reached, || {
            format!("\nlog:\n{}", self.log_text())
        })
        .await
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        self.signal("-TERM");
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Writes `dir/DATACENTER.toml`: datacenter `datacenter`, serving HTTP on `listen`, watching
/// the nodes labelled with `group` and mapping none of them; its journal and pause file in
/// `dir` (`DATACENTER.paused`). Returns its path.
pub fn write_bare_config(dir: &Path, datacenter: &str, listen: &str, group: &str) -> PathBuf {
    let path = dir.join(format!("{datacenter}.toml"));
    let text = format!(
        "datacenter = \"{datacenter}\"\n\
         [kubernetes]\nkubeconfig = \"{}\"\nnode_selector = \"{}={group}\"\n\
         [server]\nlisten = \"{listen}\"\n\
         [journal]\npath = \"{}\"\n\
         [pause]\nfile = \"{}\"\n",
        super::k8s::kubeconfig_path().display(),
        super::k8s::TEST_LABEL,
        dir.join(format!("{datacenter}.journal.jsonl")).display(),
        dir.join(format!("{datacenter}.paused")).display(),
    );
    std::fs::write(&path, text).expect("write the config");
    path
}
