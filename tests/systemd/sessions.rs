//! Redfish sessions across the daemon's life: a BMC with HTTP Basic turned off is read through
//! one session; `systemctl reload` logs it out (a reload may bring new credentials) and the
//! next read logs in anew; `systemctl stop` logs out every session before the process exits,
//! so that no slot of the BMC's few is left to its session timeout.

use support::session_bmc::{self, Basic, SessionBmc};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_sessions_are_logged_out_at_reload_and_at_stop() {
    let bmc = SessionBmc::start(Basic::Refused);
    let s = Scenario::without_machines("sessions").await;
    s.set_policy("health_read_interval = \"10s\"\n");
    s.map_redfish(
        "a",
        &bmc.address(),
        session_bmc::PASSWORD,
        &format!("system = \"/redfish/v1/Systems/1\"\n{}", bmc.pinned()),
    );
    let node = s
        .node_reporting(
            "a",
            support::scenario::FIRST_BOOT,
            KubeletIdentity::uuid(session_bmc::UUID),
        )
        .await;
    let _kubelet = support::k8s::FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let (mut notify, mut daemon, _, _) = ready_daemon(&s).await;

    let stats = stats_until(&bmc, &mut notify, |s| s.token_reads >= 1).await;
    assert_eq!(
        (stats.logins, stats.open),
        (1, 1),
        "{stats:?}\n{}",
        daemon.log_text()
    );
    // The switch from Basic is logged, once.
    let log = daemon.log_text();
    assert_eq!(
        log.matches("the BMC refuses HTTP Basic; oobfence logs in with a Redfish session")
            .count(),
        1,
        "{log}"
    );

    // Reload: the session is logged out; the next read logs in again.
    let from = notify.reloaded(&daemon).await;
    assert!(notify.seen.len() > from);
    let stats = stats_until(&bmc, &mut notify, |s| s.token_reads >= 2).await;
    assert_eq!(
        (stats.logins, stats.deletes, stats.open, stats.token_reads),
        (2, 1, 1, 2),
        "{stats:?}\n{}",
        daemon.log_text()
    );

    // Stop: every session is logged out before the process exits.
    let status = daemon.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}\n{}", daemon.log_text());
    let stats = bmc.stats().await;
    assert_eq!(stats.open, 0, "{stats:?}\n{}", daemon.log_text());
    assert_eq!(stats.deletes, stats.logins, "{stats:?}");
}

/// The BMC's stats once `done` holds (30 s at most), reading the notify socket meanwhile: a
/// service manager drains it, and a daemon whose keep-alives pile up unread blocks on the next.
async fn stats_until(
    bmc: &SessionBmc,
    notify: &mut NotifySocket,
    done: impl Fn(&session_bmc::Stats) -> bool,
) -> session_bmc::Stats {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = bmc.stats().await;
        if done(&stats) || Instant::now() >= until {
            return stats;
        }
        notify.collect(Duration::from_millis(250)).await;
    }
}
