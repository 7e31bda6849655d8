//! The daemon: watch Nodes and Leases, read power when the core asks, carry out its decisions.
//!
//! One loop owns all per-node state. Power reads and cluster writes run as tasks that report
//! back over channels, so one node's slow BMC or failing write never holds up another node:
//! reads are bounded in number (a semaphore) and in time (a deadline per read).
//!
//! This file is the loop: it waits for the clock, a wake-up, a changed Node, a read's answer,
//! a write's outcome, a report request or a reload, and hands each to its step:
//!
//! - [`start`]: everything the loop needs, started by named steps; [`state`]: what it owns.
//! - [`pass`]: the tick's pass over all nodes, skipping quiet ones; [`guards`]: the census
//!   and the guards it feeds, counted before any node is decided; [`guard_changes`]: a guard
//!   starting or ending, logged and journalled.
//! - [`evaluate`]: one node decided — [`facts`] gathered, the core asked, the decision
//!   [`carry_out`] (reads sent through [`reads`], writes through [`writer`]).
//! - [`outcomes`]: a read's answer, a write's outcome; [`observe`]: the journal, metrics and
//!   Events about decisions; [`reports`]: `why` and `/nodes`, rendered when asked.
//! - [`tracker`]: what is remembered per node; [`reload`]: a new config, on SIGHUP.

mod action;
mod actuate;
mod cache;
mod carry_out;
mod evaluate;
mod facts;
mod guard_changes;
mod guard_record;
mod guards;
mod leases;
mod nodes;
mod notify;
mod observe;
mod outcomes;
mod pass;
mod reads;
mod release;
mod reload;
mod reports;
mod sources;
mod start;
mod state;
mod tracker;
mod uuids;
mod writer;

pub use crate::status::{LOOP_STALL, Shared};
pub use reads::read_once;
pub use start::DaemonError;
pub use tracker::mapping_conflicts;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kube::Client;
use tokio::sync::mpsc;

use crate::cluster;
use crate::config::Config;
use notify::notify_systemd;

/// How often every node not quiet is decided again even when nothing changed (time passing
/// matters), and the guards counted.
const TICK: Duration = Duration::from_secs(1);

/// Runs the daemon until `shutdown` completes: everything started ([`start::start`]), the
/// caches synced, then the loop.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let start::Started {
        mut daemon,
        mut events,
        background,
    } = start::start(cfg).await?;
    let (nodes, leases) = (daemon.nodes.clone(), daemon.leases.clone());
    let shared = daemon.shared.clone();

    tokio::pin!(shutdown);
    let synced = async {
        let _ = nodes.wait_until_ready().await;
        leases.wait_until_ready().await;
    };
    tokio::pin!(synced);
    loop {
        tokio::select! {
            _ = &mut synced => break,
            // Nothing is decided yet: no node is reported.
            Some(request) = events.reports.recv() => daemon.answer_reports(request),
            _ = &mut shutdown => {
                background.stop(daemon).await;
                return Ok(());
            }
        }
    }
    shared.synced.store(true, Ordering::Relaxed);
    tracing::info!(nodes = daemon.nodes.len(), "node cache synced");
    daemon.restore_guards(crate::clock::now()).await;
    // READY=1 only now: both caches hold a full list, so the API server answered.
    let synced_status = format!(
        "node cache synced: {} nodes; starting the decision loop",
        daemon.nodes.len()
    );
    notify_systemd(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&synced_status),
    ]);

    shared
        .metrics
        .config_reload_time
        .set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
    // `systemctl reload` sends SIGHUP (ExecReload=): the config and its secrets are read again.
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let (reloads_tx, mut reloads_rx) = mpsc::channel(4);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = Instant::now() - Duration::from_secs(3600);
    loop {
        let wake = daemon.next_wakeup();
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep_until(wake) => daemon.wake_due(),
            _ = tick.tick() => {
                daemon.pass();
                if last_status.elapsed() >= Duration::from_secs(10) {
                    last_status = Instant::now();
                    daemon.report_status();
                }
                // The keep-alive comes from this loop only, after a full pass: if a pass
                // hangs, systemd's WatchdogSec= expires and the unit is restarted.
                notify_systemd(&[sd_notify::NotifyState::Watchdog]);
            }
            Some(done) = events.reads.recv() => daemon.read_done(done),
            Some(name) = events.changed.recv() => daemon.node_changed(&name),
            Some(done) = events.actions.recv() => daemon.action_done(done),
            Some(request) = events.reports.recv() => daemon.answer_reports(request),
            Some(()) = async {
                match hangups.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                notify_systemd(&[sd_notify::NotifyState::Reloading]);
                let tx = reloads_tx.clone();
                let (running, stats) = (daemon.cfg.clone(), daemon.shared.metrics.ec2.clone());
                let credentials = daemon.credentials.clone();
                tokio::spawn(async move {
                    let _ = tx.send(reload::prepare(running, stats, credentials).await).await;
                });
            }
            Some(prepared) = reloads_rx.recv() => {
                let digest_before = daemon.cfg.digest.clone();
                let result = prepared.and_then(|p| daemon.apply_reload(p));
                daemon.journal_reload(&digest_before, &result);
                let m = &daemon.shared.metrics;
                match result {
                    Ok(summary) => {
                        m.config_reload_ok.set(1);
                        m.config_reload_time.set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
                        tracing::info!("{summary}");
                    }
                    Err(why) => {
                        m.config_reload_ok.set(0);
                        tracing::error!("config reload refused, the daemon runs on with the config it had: {why}");
                    }
                }
                notify_systemd(&[sd_notify::NotifyState::Ready]);
            }
        }
    }
    tracing::info!("shutting down");
    notify_systemd(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
    background.stop(daemon).await;
    Ok(())
}

/// Used by `check-config --probe`: a client for listing nodes.
pub async fn client_for(cfg: &Config) -> Result<Client, cluster::ClusterError> {
    cluster::connect(&cfg.kubernetes).await
}
