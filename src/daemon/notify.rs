//! What the daemon tells systemd (readiness, the watchdog, a status line) and, at start and on
//! every reload, the config's warnings.

use crate::config::{self, Config};

pub(super) fn notify_systemd(states: &[sd_notify::NotifyState<'_>]) {
    // Outside systemd there is no NOTIFY_SOCKET and this does nothing.
    let _ = sd_notify::notify(states);
}

pub(super) fn log_startup_warnings(cfg: &Config) {
    // The same findings `check-config` prints, one line each: WARN, or INFO for a note.
    for f in config::checks::warnings(cfg) {
        if f.severity == config::checks::Severity::Note {
            tracing::info!("{}: {}", f.key, f.problem);
        } else {
            tracing::warn!("{}: {}", f.key, f.problem);
        }
    }
}
