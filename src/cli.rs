//! Command line: `run`, `check-config`, `probe`, `why`, `nodes`, `pause`, `resume`,
//! `confirm-off`, `timeline`, `make-kubeconfig`, `completions`.
//!
//! Exit codes: 0 success, 1 a runtime failure (cluster, BMC, no daemon), 2 a bad config, 3 the
//! daemon answering on `[server] listen` is not the daemon of the config given
//! (`right_daemon`).
//!
//! This file holds the arguments and the dispatch, and `run`; beside it, `logging` sets up
//! the daemon's log lines, `check` is `check-config` and `probe`, `daemon_commands` the
//! commands an operator runs beside a running daemon (`why`, `nodes`, `pause`, `resume`),
//! `confirm` a person's word that a node's machine is off (`confirm-off`), `timeline` the
//! journal as one story, `setup` is `make-kubeconfig`, and `man` the man pages and shell
//! completions.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::Config;
use crate::daemon;

mod check;
mod confirm;
mod daemon_commands;
mod drill;
mod logging;
mod man;
mod right_daemon;
mod setup;
mod timeline;

use check::{check_config, probe};
use confirm::{ConfirmOff, confirm_off};
use daemon_commands::{nodes, pause, why};
use drill::drill;
use logging::{init_logging, stderr_is_journal};
use man::{completions, man_pages};
use setup::make_kubeconfig;
use timeline::timeline;

#[derive(Parser, Debug)]
#[command(
    name = "oobfence",
    version = crate::VERSION_LONG,
    about = "Out-of-band node fencing for Kubernetes: proves a NotReady node is powered off \
             before letting Kubernetes release its volumes"
)]
pub struct Cli {
    /// Log format for stderr: text for people, json for log shippers.
    #[arg(long, value_enum, global = true, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level of oobfence's own lines on stderr (default: info for `run`; warn for the
    /// other commands, which print their own words and no library's). $OOBFENCE_LOG, a full
    /// filter ("info,kube=warn"), wins when set.
    #[arg(long, value_enum, global = true)]
    pub log_level: Option<LogLevel>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

#[derive(Copy, Clone, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon for one datacenter.
    Run {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
    },
    /// Parse and validate a config file: every error, each as FILE:LINE: KEY: PROBLEM (exit 2),
    /// with those of the kubeconfig and of the files it names (checked as the daemon's user
    /// `oobfence` when run as root), and the warnings (exit 1 with --strict); with --probe, also read every mapped node's power once and name the
    /// entries no Node matches.
    CheckConfig {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Also list the cluster's nodes and read the power state of each mapped one.
        #[arg(long)]
        probe: bool,
        /// The user the daemon runs as (the unit's User=). Run as root, check-config checks
        /// that it can read every file the config names; "root" skips that.
        #[arg(long, env = "OOBFENCE_DAEMON_USER", default_value = crate::config::checks::DAEMON_USER)]
        daemon_user: String,
        /// Exit 1 on any warning (a setting that works but weakens the proof, an entry an
        /// earlier glob hides), as a CI gate or a deploy step does.
        #[arg(long)]
        strict: bool,
        /// Print one JSON document (errors with their lines, warnings, and with --probe the
        /// cluster's version, permissions and every node's read) instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Read one node's power state once, from the config alone.
    Probe {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
        /// Print JSON (where it was read, the reading as the journal records it).
        #[arg(long)]
        json: bool,
    },
    /// A fire drill for one real node: everything a fence of it needs short of the write
    /// (mapping, identity, a power read, the exact write as a server-side dry run, the pause,
    /// leadership, the running daemon), and what oobfence would do if it lost power now.
    /// Exit 0: it would be fenced; 1: something stands in the way (the FAIL lines).
    Drill {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
        /// Print JSON (each check, the verdict) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Ask the running daemon what it thinks of a node, and why: only the daemon of this config
    /// (same datacenter, same file) is believed; another answering is refused, exit 3.
    Why {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
        /// Print the daemon's JSON instead of text.
        #[arg(long)]
        json: bool,
        /// How many of the node's journal records to show, newest last (older ones are read
        /// from the rotated files when the current one holds fewer).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
        records: u16,
    },
    /// The decision journal as one story, in time order: the power reads decisions rested on,
    /// refusals, writes and releases, power actions, and the daemon's own changes (pause and
    /// resume, reloads, leadership, storms and freezes, budgets spent). Reads the journal
    /// files of the config (rotated ones too), with or without a running daemon.
    Timeline {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Only events since then: a duration back from now (2h, 90m, 1d) or a time
        /// (2026-11-28T03:00:00Z).
        #[arg(long)]
        since: Option<String>,
        /// Only this node's events, with the datacenter's (pause, storm, reload...).
        #[arg(long)]
        node: Option<String>,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every node the running daemon watches, one line each (state, rule, power source, its
    /// last answer, identity), like `kubectl get`; only from the daemon of this config (exit 3
    /// when another answers).
    Nodes {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Only nodes in this state (healthy, suspect, confirming, blocked, fenced, recovering;
        /// in a dry run would-fence, would-untaint, would-power-off, would-power-on).
        #[arg(long)]
        state: Option<String>,
        /// Print the daemon's JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages (oobfence.1, one per command, oobfence.toml.5) into a directory:
    /// what the packages ship.
    #[command(hide = true)]
    Man {
        /// The directory to write them into (created if missing).
        #[arg(long, short)]
        output: PathBuf,
    },
    /// Stop every write of this datacenter's daemon (fence, unfence, delete) without stopping
    /// it: writes the pause file named in the config; with `[ha]`, the datacenter's annotation
    /// on the pause ConfigMap, which every instance reads (so a failover does not lift it).
    /// Decisions, reads, Events and metrics go on; `why` shows the pause. Then says whether the
    /// daemon of this config answers to honour it (none: it reads the file when it starts; exit
    /// 3 when another daemon answers on its address).
    Pause {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Why, shown in logs, `why` and Events.
        #[arg(long, default_value = "paused by an operator")]
        reason: String,
    },
    /// Remove the pause file (with `[ha]`, the datacenter's annotation on the pause
    /// ConfigMap): writes resume within seconds (unless another switch still says paused).
    Resume {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
    },
    /// A person's word on record that a node's machine is off (you looked: the power cord is
    /// out, the rack is dark), for the boot it reports now: writes the Node annotation
    /// oobfence.io/confirmed-off with your own kubeconfig, so the API server's audit log names
    /// you. Refused unless the node is NotReady and its Lease unrenewed for the Lease's
    /// duration. The daemon then fences it where no power source can answer, every hold still
    /// in force. Exit 1: refused or not written.
    ConfirmOff {
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
        /// Who looked at what, and what they saw (shown in `why`, the journal and the Event).
        #[arg(long, required_unless_present = "withdraw")]
        reason: Option<String>,
        /// Who confirms (default: $SUDO_USER, then $USER); the audit log has the identity the
        /// API server checked.
        #[arg(long)]
        by: Option<String>,
        /// The datacenter's config file, for what to run next (its kubeconfig is the
        /// daemon's and is not used: the write carries yours).
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: Option<PathBuf>,
        /// Your kubeconfig (default: $KUBECONFIG, then ~/.kube/config); it needs `patch
        /// nodes`.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Context of that kubeconfig (default: its current context).
        #[arg(long)]
        context: Option<String>,
        /// Remove the confirmation instead.
        #[arg(long, conflicts_with_all = ["reason", "by"])]
        withdraw: bool,
    },
    /// Print the shell completion script for bash, zsh or fish (the packages install them).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write a kubeconfig for oobfence's ServiceAccount (deploy/rbac.yaml), with a token from
    /// the TokenRequest API; run it with an administrator's kubeconfig.
    MakeKubeconfig {
        /// The administrator's kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Context of that kubeconfig (default: its current context).
        #[arg(long)]
        context: Option<String>,
        /// Namespace of the ServiceAccount.
        #[arg(long, default_value = "oobfence")]
        namespace: String,
        /// The ServiceAccount that deploy/rbac.yaml binds.
        #[arg(long, default_value = "oobfence")]
        service_account: String,
        /// Token lifetime ("720h", "1y"); at least 10m. The daemon stops seeing the cluster
        /// when it runs out: mint a new one before then.
        #[arg(long, default_value = "8760h", value_parser = humantime::parse_duration)]
        duration: std::time::Duration,
        /// Where to write the kubeconfig (mode 0600, replaced atomically).
        #[arg(long, short)]
        output: PathBuf,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let daemon = matches!(cli.command, Command::Run { .. });
    init_logging(cli.log_format, cli.log_level, daemon);
    if spawns_nothing(&cli.command) {
        quit_quietly_on_a_closed_pipe();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("oobfence: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(dispatch(cli.command))
}

/// The commands that start no process of their own (a fence agent, a power tool): only those
/// may die of SIGPIPE, for an agent that exits before it reads its options must not kill the
/// command that runs it.
fn spawns_nothing(command: &Command) -> bool {
    matches!(
        command,
        Command::Why { .. }
            | Command::Timeline { .. }
            | Command::Nodes { .. }
            | Command::Pause { .. }
            | Command::Resume { .. }
            | Command::Completions { .. }
            | Command::Man { .. }
            | Command::ConfirmOff { .. }
            | Command::MakeKubeconfig { .. }
    )
}

/// `oobfence why NODE | head -1`: once the reader is gone, the next line printed ends the
/// process quietly, as it ends `cat` (the default action of SIGPIPE, which Rust programs
/// ignore, so that printing fails and panics instead). Sockets are not concerned: they are
/// written with MSG_NOSIGNAL.
fn quit_quietly_on_a_closed_pipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: the default action installs no handler code; nothing else sets SIGPIPE.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

/// An error line on stderr, at error priority in the journal.
fn say_error(message: impl std::fmt::Display) {
    eprintln!("{}", error_line(message));
}

/// `oobfence: MESSAGE`, at error priority when stderr is the journal.
fn error_line(message: impl std::fmt::Display) -> String {
    let prefix = if stderr_is_journal() { "<3>" } else { "" };
    format!("{prefix}oobfence: {message}")
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(say_config_errors)
}

/// Every problem of a config file, each on its own line, then how many (exit code 2: a config
/// that will not work).
fn say_config_errors(e: crate::config::ConfigErrors) -> ExitCode {
    for one in &e.errors {
        say_error(one);
    }
    if e.errors.len() > 1 {
        say_error(format!(
            "{}: fix them and run `{}` again",
            e.count_line(),
            check_config_command(&e.file)
        ));
    }
    ExitCode::from(2)
}

/// The `check-config` command line for `file`, as a shell takes it (pasted, it runs).
fn check_config_command(file: &Path) -> String {
    command_line(&[
        "oobfence",
        "check-config",
        "--config",
        &file.to_string_lossy(),
    ])
}

/// Words as one shell command line, each quoted where the shell would split or expand it.
fn command_line(words: &[&str]) -> String {
    shlex::try_join(words.iter().copied()).unwrap_or_else(|_| words.join(" "))
}

async fn dispatch(command: Command) -> ExitCode {
    let result = match command {
        Command::Run { config } => run(&config).await,
        Command::CheckConfig {
            config,
            probe,
            daemon_user,
            strict,
            json,
        } => {
            let options = check::Options {
                probe,
                strict,
                json,
                daemon_user,
            };
            check_config(&config, &options).await
        }
        Command::Probe { config, node, json } => probe(&config, &node, json).await,
        Command::Why {
            config,
            node,
            json,
            records,
        } => why(&config, &node, json, records.into()).await,
        Command::Timeline {
            config,
            since,
            node,
            json,
        } => timeline(&config, since.as_deref(), node, json),
        Command::Drill { config, node, json } => drill(&config, &node, json).await,
        Command::Nodes {
            config,
            state,
            json,
        } => nodes(&config, state.as_deref(), json).await,
        Command::Man { output } => man_pages(&output),
        Command::Completions { shell } => completions(shell),
        Command::Pause { config, reason } => pause(&config, Some(&reason)).await,
        Command::Resume { config } => pause(&config, None).await,
        Command::ConfirmOff {
            node,
            reason,
            by,
            config,
            kubeconfig,
            context,
            withdraw,
        } => {
            confirm_off(ConfirmOff {
                node,
                reason: if withdraw { None } else { reason },
                by,
                config,
                kubeconfig,
                context,
            })
            .await
        }
        Command::MakeKubeconfig {
            kubeconfig,
            context,
            namespace,
            service_account,
            duration,
            output,
        } => {
            make_kubeconfig(&crate::kubeconfig::Request {
                admin_kubeconfig: kubeconfig,
                context,
                namespace,
                service_account,
                duration,
                output,
            })
            .await
        }
    };
    result.unwrap_or_else(|code| code)
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    say_error(message);
    ExitCode::from(1)
}

async fn run(path: &Path) -> Result<ExitCode, ExitCode> {
    use crate::config::checks::{self, Severity};
    let cfg = load(path)?;
    // A kubeconfig that check-config calls an error (missing, unparsable, an unknown context,
    // an expired token) does not mend itself between two restarts: exit 2 like a bad config,
    // which the unit does not restart, rather than fail to connect and restart every 5 s.
    // (Its warnings are the daemon's to log: the token's expiry by its watcher.)
    let errors: Vec<_> = checks::kubeconfig(&cfg.kubernetes, jiff::Timestamp::now())
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .collect();
    for f in &errors {
        say_error(format!("{}: {f}", path.display()));
    }
    if !errors.is_empty() {
        return Err(ExitCode::from(2));
    }
    tracing::info!(
        datacenter = %cfg.datacenter,
        config = %path.display(),
        bmc_entries = cfg.bmc.len(),
        action = %cfg.policy.action,
        version = env!("CARGO_PKG_VERSION"),
        "starting"
    );
    daemon::run(cfg, shutdown_signal())
        .await
        .map_err(|e| match e {
            // Another process holds the address, or it is not this host's: a restart would
            // fail the same way, so exit 2, which the unit does not restart.
            daemon::DaemonError::Listen { ref holder, .. } => {
                let what_to_do = if holder.is_empty() {
                    "; free the address or change [server] listen"
                } else {
                    ""
                };
                say_error(format!(
                    "{}: {e}{what_to_do} (the unit is not restarted for this)",
                    path.display()
                ));
                ExitCode::from(2)
            }
            other => fail(other),
        })?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod help_tests {
    use clap::CommandFactory;

    use super::Cli;

    /// `--help` and the man pages explain every argument of every command.
    #[test]
    fn every_argument_of_every_command_has_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut missing = Vec::new();
        for cmd in std::iter::once(&cli).chain(cli.get_subcommands()) {
            if cmd.get_about().is_none() && cmd.get_name() != "oobfence" {
                missing.push(format!("{}: no about", cmd.get_name()));
            }
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
                    missing.push(format!("{} {}", cmd.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
