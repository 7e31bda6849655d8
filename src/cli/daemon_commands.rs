//! The commands an operator runs beside a running daemon: `why` and `nodes` ask it (and fall
//! back on the journal), `pause` and `resume` set the pause file or, with `[ha]`, the group's
//! pause ConfigMap.

use std::path::Path;
use std::process::ExitCode;

use super::{fail, say_error};
use crate::config::Config;
use crate::report::NodeReport;

/// Where to reach the daemon: its listen address, with a wildcard turned into loopback.
pub(super) fn daemon_url(cfg: &Config) -> String {
    crate::whoami::url_of(cfg.server.listen)
}

/// `pause` (with a reason) and `resume` (without): the pause file; with `[ha]`, the group's
/// annotation on the pause ConfigMap.
pub(super) async fn pause(path: &Path, reason: Option<&str>) -> Result<ExitCode, ExitCode> {
    let cfg = Config::load_without_secrets(path).map_err(super::say_config_errors)?;
    if cfg.ha.is_some() {
        return pause_group(&cfg, path, reason).await;
    }
    let Some(file) = &cfg.pause.file else {
        say_error(format!(
            "{}: [pause] file = \"\": this datacenter has no pause file; use the ConfigMap instead: kubectl annotate configmap ... {}=\"reason\"",
            path.display(),
            crate::pause::ANNOTATION_PAUSED
        ));
        return Err(ExitCode::from(2));
    };
    let by = operator();
    match reason {
        Some(reason) => match crate::pause::write_file(file, reason, &by) {
            Ok(()) => {
                println!(
                    "paused: {} exists. Resume with: oobfence resume --config {}",
                    file.display(),
                    path.display()
                );
                who_honours(&cfg, path, Switch::PauseFile, true).await
            }
            Err(e) => {
                say_error(format!(
                    "cannot write the pause file {}: {e}",
                    file.display()
                ));
                Err(ExitCode::from(1))
            }
        },
        None => match crate::pause::remove_file(file) {
            Ok(removed) => {
                println!(
                    "{}: writes resume within a second unless the pause ConfigMap ({}) still says paused",
                    if removed {
                        format!("removed {}", file.display())
                    } else {
                        format!("{} did not exist", file.display())
                    },
                    cfg.pause
                        .configmap
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_else(|| "none configured".into())
                );
                who_honours(&cfg, path, Switch::PauseFile, false).await
            }
            Err(e) => {
                say_error(format!(
                    "cannot remove the pause file {}: {e}",
                    file.display()
                ));
                Err(ExitCode::from(1))
            }
        },
    }
}

/// Where a pause was set: what the daemon reads it from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Switch {
    PauseFile,
    /// `[ha]`: every instance reads the group's ConfigMap, this host's among them.
    GroupConfigMap,
}

/// After a pause (`paused`) or resume: says whether the daemon of this config answers to
/// honour it. None answering is no failure (the switch is read at start); another daemon
/// answering is: the command cannot tell that this datacenter's daemon honours it.
async fn who_honours(
    cfg: &Config,
    path: &Path,
    switch: Switch,
    paused: bool,
) -> Result<ExitCode, ExitCode> {
    use crate::whoami::Answer;
    let url = daemon_url(cfg);
    let answer = super::right_daemon::answer(cfg).await;
    match (&answer, switch) {
        (Answer::Ours { who, .. }, Switch::PauseFile) => println!(
            "the daemon of datacenter {} answers at {url} (pid {}): {}",
            cfg.datacenter,
            who.pid,
            if paused {
                "it writes nothing within a second; `oobfence why NODE` shows the hold"
            } else {
                "its writes resume within a second, unless another switch still says paused"
            }
        ),
        (Answer::Ours { who, .. }, Switch::GroupConfigMap) => println!(
            "this host's instance of datacenter {} answers at {url} (pid {}{}); every other              instance reads the same ConfigMap",
            cfg.datacenter,
            who.pid,
            who.ha_identity
                .as_ref()
                .map(|i| format!(", [ha] identity {i}"))
                .unwrap_or_default()
        ),
        (Answer::Nobody(_), Switch::PauseFile) => println!(
            "no daemon answers at {url} (server.listen in {}): {}",
            path.display(),
            if paused {
                "the pause takes effect when it starts (it reads the pause file before any write)"
                    .to_string()
            } else {
                format!(
                    "nothing writes until it starts (systemctl start oobfence@{})",
                    cfg.datacenter
                )
            }
        ),
        (Answer::Nobody(_), Switch::GroupConfigMap) => println!(
            "no instance answers on this host at {url} (server.listen in {}); each instance of              datacenter {}, wherever it runs, reads the ConfigMap, at start too",
            path.display(),
            cfg.datacenter
        ),
        (other, _) => {
            say_error(format!(
                "{} is {}, but whether datacenter {}'s daemon honours it cannot be told: {}",
                if paused { "the pause" } else { "the resume" },
                if switch == Switch::PauseFile {
                    "written"
                } else {
                    "in the ConfigMap"
                },
                cfg.datacenter,
                super::right_daemon::not_ours(cfg, path, other).unwrap_or_default()
            ));
            return Err(ExitCode::from(super::right_daemon::EXIT_OTHER_DAEMON));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Who runs the command: the login name behind `sudo`, then the user.
pub(super) fn operator() -> String {
    std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "unknown".into())
}

/// `pause` / `resume` under `[ha]`: every instance of the datacenter reads the pause
/// ConfigMap, so the pause holds whichever instance leads, before and after a failover.
async fn pause_group(
    cfg: &Config,
    path: &Path,
    reason: Option<&str>,
) -> Result<ExitCode, ExitCode> {
    let Some(cm) = &cfg.pause.configmap else {
        say_error(format!(
            "{}: [pause] configmap = \"\" with [ha]: this datacenter has no switch every instance reads; set [pause] configmap (default {})",
            path.display(),
            crate::config::DEFAULT_PAUSE_CONFIGMAP
        ));
        return Err(ExitCode::from(2));
    };
    let client = crate::cluster::connect(&cfg.kubernetes)
        .await
        .map_err(|e| {
            say_error(e);
            ExitCode::from(2)
        })?;
    let key = crate::pause::datacenter_annotation(&cfg.datacenter);
    match crate::pause::set_group_pause(&client, cm, &cfg.datacenter, reason, &operator()).await {
        Ok(()) if reason.is_some() => {
            println!(
                "paused: ConfigMap {cm} carries {key}; every instance of datacenter {}, whichever leads, writes nothing from now on (each reads it again right before a write). Resume with: oobfence resume --config {}",
                cfg.datacenter,
                path.display()
            );
            who_honours(cfg, path, Switch::GroupConfigMap, true).await
        }
        Ok(()) => {
            println!(
                "removed {key} from ConfigMap {cm}: writes resume within 5 seconds unless it still carries {}",
                crate::pause::ANNOTATION_PAUSED
            );
            who_honours(cfg, path, Switch::GroupConfigMap, false).await
        }
        Err(e) => {
            say_error(e);
            Err(ExitCode::from(1))
        }
    }
}

pub(super) async fn why(
    path: &Path,
    node: &str,
    json: bool,
    records: usize,
) -> Result<ExitCode, ExitCode> {
    // `why` needs the daemon's address and journal, never a password.
    let cfg = Config::load_without_secrets(path).map_err(super::say_config_errors)?;
    let live = ask_daemon(&cfg, path, node, json).await;
    if !json {
        print_journal(&cfg, node, live.is_ok(), records);
    }
    live
}

/// The node's last `shown` decision journal records, read from the file named in the config
/// (and the rotated ones): there even when the daemon is down.
fn print_journal(cfg: &Config, node: &str, daemon_answered: bool, shown: usize) {
    let path = &cfg.journal.path;
    if !daemon_answered {
        println!(
            "node {node} (datacenter {}): no live report from the daemon; its decision journal says:",
            cfg.datacenter
        );
    }
    match crate::journal::tail(path, node, shown) {
        Ok(t) if t.records.is_empty() => {
            println!(
                "  journal:      no record about this node in {}",
                path.display()
            );
        }
        Ok(t) => {
            println!("  journal ({}, newest last):", path.display());
            print!("{}", crate::journal::render(&t.records));
            if t.records.len() == shown {
                println!(
                    "    (the last {shown}; more with --records N, the whole story with: oobfence timeline --config {} --node {node})",
                    cfg.source.display()
                );
            }
            if t.unreadable > 0 {
                println!("    ({} unreadable line(s) skipped)", t.unreadable);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "  journal:      {} does not exist yet: nothing acted on or refused so far",
                path.display()
            );
        }
        Err(e) => {
            println!("  journal:      cannot read {}: {e}", path.display());
        }
    }
}

/// Prints what the running daemon thinks of the node.
pub(super) async fn nodes(
    path: &Path,
    state: Option<&str>,
    json: bool,
) -> Result<ExitCode, ExitCode> {
    const STATES: [&str; 10] = [
        "healthy",
        "suspect",
        "confirming",
        "blocked",
        "fenced",
        "recovering",
        "would-fence",
        "would-untaint",
        "would-power-off",
        "would-power-on",
    ];
    if let Some(s) = state
        && !STATES.contains(&s)
    {
        eprintln!(
            "oobfence: --state {s:?}: not a state ({})",
            STATES.join(", ")
        );
        return Err(ExitCode::from(2));
    }
    let cfg = Config::load_without_secrets(path).map_err(super::say_config_errors)?;
    let base = daemon_url(&cfg);
    let (status, body) = daemon_get(&cfg, path, "/nodes").await?;
    if !status.is_success() {
        return Err(fail(format!("daemon at {base} answered {status}: {body}")));
    }
    let mut reports: Vec<NodeReport> = serde_json::from_str(&body).map_err(|e| {
        fail(format!(
            "daemon at {base} sent reports this version cannot read: {e}"
        ))
    })?;
    if let Some(s) = state {
        reports.retain(|r| r.shown_state() == s);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&reports).map_err(fail)?);
    } else {
        print!(
            "{}",
            crate::report::render_table(&reports, jiff::Timestamp::now())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// GET `path` from the running daemon of `cfg` (read from `config_path`): its status and
/// body, or the one line that says no daemon answers.
async fn daemon_get(
    cfg: &Config,
    config_path: &Path,
    path: &str,
) -> Result<(reqwest::StatusCode, String), ExitCode> {
    // Believe nothing until the daemon answering says it is this config's.
    super::right_daemon::the_daemon(cfg, config_path).await?;
    let base = daemon_url(cfg);
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .no_proxy()
        .build()
        .map_err(fail)?;
    let resp = client
        .get(format!("{base}{path}"))
        .send()
        .await
        .map_err(|e| {
            fail(format!(
                "the daemon at {base} (server.listen in {}) stopped answering: {}. Is it \
                 running? (systemctl status oobfence@{})",
                config_path.display(),
                root_cause(&e),
                cfg.datacenter
            ))
        })?;
    let status = resp.status();
    let body = resp.text().await.map_err(fail)?;
    Ok((status, body))
}

async fn ask_daemon(
    cfg: &Config,
    path: &Path,
    node: &str,
    json: bool,
) -> Result<ExitCode, ExitCode> {
    let base = daemon_url(cfg);
    let (status, body) = daemon_get(cfg, path, &format!("/nodes/{node}")).await?;
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(fail(format!(
            "unknown node {node:?}: the daemon of datacenter {} watches no node of that name \
             (check it with `kubectl get node {node}`, and the config's [kubernetes] node_selector)",
            cfg.datacenter
        )));
    }
    if !status.is_success() {
        let msg = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from))
            .unwrap_or(body);
        return Err(fail(format!("daemon at {base} answered {status}: {msg}")));
    }
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let report: NodeReport = serde_json::from_str(&body).map_err(|e| {
        fail(format!(
            "daemon at {base} sent a report this version cannot read: {e}"
        ))
    })?;
    print!("{}", report.render(jiff::Timestamp::now()));
    Ok(ExitCode::SUCCESS)
}

pub(super) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    crate::whoami::root_cause(e)
}
