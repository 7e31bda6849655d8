//! Command line: `run`, `check-config`, `probe`, `why`, `nodes`, `pause`, `resume`,
//! `make-kubeconfig`.
//!
//! Exit codes: 0 success, 1 a runtime failure (cluster, BMC, no daemon), 2 a bad config.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::config::Config;
use crate::daemon;
use crate::power::{MappedSource, PowerSources};
use crate::report::{NodeReport, short_state};

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
    /// Log level for stderr. $OOBFENCE_LOG, a full filter ("info,kube=warn"), wins when set.
    #[arg(long, value_enum, global = true, default_value = "info")]
    pub log_level: LogLevel,
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
    /// Parse and validate a config file; with --probe, also read every mapped node's power once.
    CheckConfig {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Also list the cluster's nodes and read the power state of each mapped one.
        #[arg(long)]
        probe: bool,
    },
    /// Read one node's power state once, from the config alone.
    Probe {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
    },
    /// Ask the running daemon what it thinks of a node, and why.
    Why {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// The Node's name, as `kubectl get nodes` shows it.
        node: String,
        /// Print the daemon's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Every node the running daemon watches, one line each (state, rule, power source, its
    /// last answer, identity), like `kubectl get`.
    Nodes {
        /// The datacenter's config file, /etc/oobfence/DC.toml.
        #[arg(long, short, env = "OOBFENCE_CONFIG")]
        config: PathBuf,
        /// Only nodes in this state (healthy, suspect, confirming, blocked, fenced, recovering).
        #[arg(long)]
        state: Option<String>,
        /// Print the daemon's JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages (oobfence.1 and one per command) into a directory: what the
    /// package ships.
    #[command(hide = true)]
    Man {
        /// The directory to write them into (created if missing).
        #[arg(long, short)]
        output: PathBuf,
    },
    /// Stop every write of this datacenter's daemon (fence, unfence, delete) without stopping
    /// it: writes the pause file named in the config; with `[ha]`, the datacenter's annotation
    /// on the pause ConfigMap, which every instance reads (so a failover does not lift it).
    /// Decisions, reads, Events and metrics go on; `why` shows the pause.
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
    init_logging(cli.log_format, cli.log_level);
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

fn init_logging(format: LogFormat, level: LogLevel) {
    use tracing_subscriber::EnvFilter;
    // --log-level sets oobfence's own level; the libraries stay as quiet as by default.
    let filter = EnvFilter::try_from_env("OOBFENCE_LOG").unwrap_or_else(|_| {
        EnvFilter::new(crate::DEFAULT_LOG_FILTER.replacen(
            "info",
            &format!("info,oobfence={}", level.as_str()),
            1,
        ))
    });
    // Under systemd the journal adds its own timestamps, colours mean nothing, and each line
    // carries its priority so that `journalctl -p warning` and friends work.
    let journald = stderr_is_journal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LogWriter {
            priorities: journald,
        })
        .with_ansi(!journald && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text if journald => builder.without_time().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// True when stderr is the systemd journal's stream: `JOURNAL_STREAM` names stderr's device
/// and inode (a child of a service inherits the variable with another stderr).
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Log output to stderr, one event at a time; with `priorities`, every line starts with the
/// syslog priority of the event's level (sd-daemon `<N>` prefixes), which journald strips and
/// records as the entry's priority.
#[derive(Clone, Copy)]
struct LogWriter {
    priorities: bool,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogEvent;

    fn make_writer(&'a self) -> LogEvent {
        LogEvent {
            prefix: self.priorities.then_some("<6>"),
            buf: Vec::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> LogEvent {
        let prefix = match *meta.level() {
            tracing::Level::ERROR => "<3>",
            tracing::Level::WARN => "<4>",
            tracing::Level::INFO => "<6>",
            _ => "<7>",
        };
        LogEvent {
            prefix: self.priorities.then_some(prefix),
            buf: Vec::new(),
        }
    }
}

/// One formatted event, written to stderr in one piece when dropped.
struct LogEvent {
    prefix: Option<&'static str>,
    buf: Vec<u8>,
}

impl std::io::Write for LogEvent {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogEvent {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let out = match self.prefix {
            None => std::mem::take(&mut self.buf),
            Some(p) => {
                let mut out = Vec::with_capacity(self.buf.len() + 8);
                for line in self.buf.split_inclusive(|b| *b == b'\n') {
                    out.extend_from_slice(p.as_bytes());
                    out.extend_from_slice(line);
                }
                out
            }
        };
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), &out);
    }
}

/// An error line on stderr, at error priority in the journal.
fn say_error(message: impl std::fmt::Display) {
    let prefix = if stderr_is_journal() { "<3>" } else { "" };
    eprintln!("{prefix}oobfence: {message}");
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        say_error(e);
        ExitCode::from(2)
    })
}

async fn dispatch(command: Command) -> ExitCode {
    let result = match command {
        Command::Run { config } => run(&config).await,
        Command::CheckConfig { config, probe } => check_config(&config, probe).await,
        Command::Probe { config, node } => probe(&config, &node).await,
        Command::Why { config, node, json } => why(&config, &node, json).await,
        Command::Nodes {
            config,
            state,
            json,
        } => nodes(&config, state.as_deref(), json).await,
        Command::Man { output } => man_pages(&output),
        Command::Pause { config, reason } => pause(&config, Some(&reason)).await,
        Command::Resume { config } => pause(&config, None).await,
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

/// oobfence.1, and oobfence-COMMAND.1 for each command that is not hidden.
fn man_pages(dir: &Path) -> Result<ExitCode, ExitCode> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)
        .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let cmd = Cli::command();
    let write = |name: &str, cmd: clap::Command| -> Result<(), ExitCode> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut out)
            .map_err(|e| fail(format!("cannot render {name}.1: {e}")))?;
        std::fs::write(&path, out)
            .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))
    };
    write("oobfence", cmd.clone())?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("oobfence-{}", sub.get_name());
        write(
            &name,
            sub.clone()
                .display_name(name.clone())
                .bin_name(format!("oobfence {}", sub.get_name())),
        )?;
    }
    Ok(ExitCode::SUCCESS)
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
    daemon::run(cfg, shutdown_signal()).await.map_err(fail)?;
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

async fn check_config(path: &Path, probe: bool) -> Result<ExitCode, ExitCode> {
    use crate::config::checks::{self, Severity};
    let cfg = load(path)?;
    let mut findings = checks::kubeconfig(&cfg.kubernetes, jiff::Timestamp::now());
    findings.extend(checks::warnings(&cfg));
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    for f in &findings {
        match f.severity {
            Severity::Note => println!("{}: {f}", path.display()),
            _ => eprintln!("{}: {f}", path.display()),
        }
    }
    if errors > 0 {
        eprintln!(
            "{}: {errors} error(s): `oobfence run` would not work with this config",
            path.display()
        );
        return Err(ExitCode::from(2));
    }
    println!(
        "{}: OK (datacenter {}, {} [[bmc]] entries, action {}{})",
        path.display(),
        cfg.datacenter,
        cfg.bmc.len(),
        cfg.policy.action,
        if cfg.policy.dry_run { ", dry run" } else { "" }
    );
    if !probe {
        return Ok(ExitCode::SUCCESS);
    }
    let client = daemon::client_for(&cfg).await.map_err(fail)?;
    let nodes = Api::<Node>::all(client)
        .list(&match &cfg.kubernetes.node_selector {
            Some(sel) => ListParams::default().labels(sel),
            None => ListParams::default(),
        })
        .await
        .map_err(|e| fail(format!("cannot list nodes: {e}")))?;
    let cfg = Arc::new(cfg);
    let sources = Arc::new(PowerSources::new(cfg.clone(), Default::default()).await);
    let conflicts = daemon::mapping_conflicts(
        &cfg,
        nodes.items.iter().map(|n| {
            (
                n.metadata.name.as_deref().unwrap_or(""),
                crate::cluster::provider_id(n),
            )
        }),
    );
    let conflicts = &conflicts;
    let shared_uuids = crate::identity::shared_system_uuids(nodes.items.iter().map(|n| {
        (
            n.metadata.name.as_deref().unwrap_or(""),
            n.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map_or("", |i| i.system_uuid.as_str()),
        )
    }));
    let shared_uuids = &shared_uuids;
    let rows: Vec<Row> = futures::stream::iter(nodes.items.into_iter().map(|n| {
        let sources = sources.clone();
        let cfg = cfg.clone();
        async move {
            let name = n.name_any();
            let provider_id = n.spec.as_ref().and_then(|s| s.provider_id.as_deref());
            match sources.for_node(&name, provider_id) {
                None => Row {
                    node: name,
                    backend: "-".into(),
                    address: "-".into(),
                    state: "not mapped".into(),
                    identity: "-".into(),
                    ok: true,
                },
                Some(MappedSource { source, deadline }) => {
                    let r = daemon::read_once(&source, deadline).await;
                    let mut node_identity = crate::cluster::node_identity(&n);
                    node_identity.uuid_shared_with =
                        shared_uuids.get(&name).cloned().unwrap_or_default();
                    let verdict = crate::identity::verify(&node_identity, &r.identity);
                    let checked = cfg.mapping_for(&name).map(|m| m.identity())
                        != Some(crate::identity::IdentityCheck::Unchecked);
                    let conflict = conflicts.get(&name);
                    let identity_ok = conflict.is_none()
                        && match &verdict {
                            crate::identity::Verdict::Match(_) => true,
                            crate::identity::Verdict::Mismatch(_) => false,
                            // A gone instance reports no identity: that is for the daemon's
                            // binding to judge, not a broken mapping.
                            crate::identity::Verdict::Unverifiable(_) => {
                                !checked || r.state.is_gone()
                            }
                        };
                    let identity = match conflict {
                        Some(c) => format!("UNTRUSTED {c}"),
                        None if !checked => format!("{verdict} (identity unchecked)"),
                        None => verdict.to_string(),
                    };
                    // How the read logged in, where the backend says (IPMI: suite and role).
                    let backend = match r.details.iter().find(|d| d.name == "session") {
                        Some(d) => format!("{} ({})", source.backend(), d.value),
                        None => source.backend().to_string(),
                    };
                    Row {
                        node: name,
                        backend,
                        address: source.address(),
                        state: format!(
                            "{} ({:.3}s)",
                            short_state(&r.state),
                            r.latency.as_secs_f64()
                        ),
                        identity,
                        ok: !matches!(r.state, crate::power::PowerState::Error { .. })
                            && identity_ok,
                    }
                }
            }
        }
    }))
    .buffered(cfg.max_concurrent_reads)
    .collect()
    .await;
    let w = |f: fn(&Row) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let (w0, w1, w2, w3) = (
        w(|r| r.node.len(), 4),
        w(|r| r.backend.len(), 7),
        w(|r| r.address.len(), 7),
        w(|r| r.state.len(), 5),
    );
    println!(
        "{:w0$}  {:w1$}  {:w2$}  {:w3$}  IDENTITY",
        "NODE", "BACKEND", "ADDRESS", "STATE"
    );
    for r in &rows {
        println!(
            "{:w0$}  {:w1$}  {:w2$}  {:w3$}  {}",
            r.node, r.backend, r.address, r.state, r.identity
        );
    }
    let failed = rows.iter().filter(|r| !r.ok).count();
    if failed > 0 {
        eprintln!(
            "oobfence: {failed} of {} nodes could not be read or not tied to their machine (see STATE and IDENTITY)",
            rows.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line of `check-config --probe`.
struct Row {
    node: String,
    backend: String,
    address: String,
    state: String,
    identity: String,
    ok: bool,
}

async fn probe(path: &Path, node: &str) -> Result<ExitCode, ExitCode> {
    let cfg = Arc::new(load(path)?);
    let sources = PowerSources::new(cfg.clone(), Default::default()).await;
    // Only an EC2-mapped node needs the cluster (its providerID); a BMC is in the config.
    let provider_id = if sources.needs_node_data(node) {
        let client = daemon::client_for(&cfg).await.map_err(fail)?;
        let n = Api::<Node>::all(client)
            .get(node)
            .await
            .map_err(|e| fail(format!("cannot read node {node} for its providerID: {e}")))?;
        n.spec.and_then(|s| s.provider_id)
    } else {
        None
    };
    let Some(MappedSource { source, deadline }) = sources.for_node(node, provider_id.as_deref())
    else {
        return Err(fail(format!(
            "no [[bmc]] entry or [aws] nodes pattern in {} matches node {node:?}",
            path.display()
        )));
    };
    let r = daemon::read_once(&source, deadline).await;
    let mut out = format!(
        "{node}: {} ({} {}, {:.3}s)",
        r.state,
        source.backend(),
        source.address(),
        r.latency.as_secs_f64()
    );
    out.push_str(&format!("\n  identity: {}", r.identity));
    for d in &r.details {
        out.push_str(&format!("\n  {d}"));
    }
    if let crate::power::PowerState::Error { .. } = r.state {
        return Err(fail(out));
    }
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// Where to reach the daemon: its listen address, with a wildcard turned into loopback.
fn daemon_url(cfg: &Config) -> String {
    let mut addr = cfg.server.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{addr}")
}

/// `pause` (with a reason) and `resume` (without): the pause file; with `[ha]`, the group's
/// annotation on the pause ConfigMap.
async fn pause(path: &Path, reason: Option<&str>) -> Result<ExitCode, ExitCode> {
    let cfg = Config::load_without_secrets(path).map_err(|e| {
        say_error(e);
        ExitCode::from(2)
    })?;
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
                    "paused: {} exists; the daemon of datacenter {} writes nothing within a second. Resume with: oobfence resume --config {}",
                    file.display(),
                    cfg.datacenter,
                    path.display()
                );
                Ok(ExitCode::SUCCESS)
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
                Ok(ExitCode::SUCCESS)
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

fn operator() -> String {
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
            Ok(ExitCode::SUCCESS)
        }
        Ok(()) => {
            println!(
                "removed {key} from ConfigMap {cm}: writes resume within 5 seconds unless it still carries {}",
                crate::pause::ANNOTATION_PAUSED
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            say_error(e);
            Err(ExitCode::from(1))
        }
    }
}

async fn why(path: &Path, node: &str, json: bool) -> Result<ExitCode, ExitCode> {
    // `why` needs the daemon's address and journal, never a password.
    let cfg = Config::load_without_secrets(path).map_err(|e| {
        eprintln!("oobfence: {e}");
        ExitCode::from(2)
    })?;
    let live = ask_daemon(&cfg, path, node, json).await;
    if !json {
        print_journal(&cfg, node, live.is_ok());
    }
    live
}

/// The node's last decision journal records, read from the file named in the config: there
/// even when the daemon is down.
fn print_journal(cfg: &Config, node: &str, daemon_answered: bool) {
    const SHOWN: usize = 5;
    let path = &cfg.journal.path;
    if !daemon_answered {
        println!(
            "node {node} (datacenter {}): no live report from the daemon; its decision journal says:",
            cfg.datacenter
        );
    }
    match crate::journal::tail(path, node, SHOWN) {
        Ok(t) if t.records.is_empty() => {
            println!(
                "  journal:      no record about this node in {}",
                path.display()
            );
        }
        Ok(t) => {
            println!("  journal ({}, newest last):", path.display());
            print!("{}", crate::journal::render(&t.records));
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
async fn nodes(path: &Path, state: Option<&str>, json: bool) -> Result<ExitCode, ExitCode> {
    const STATES: [&str; 6] = [
        "healthy",
        "suspect",
        "confirming",
        "blocked",
        "fenced",
        "recovering",
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
    let cfg = Config::load_without_secrets(path).map_err(|e| {
        eprintln!("oobfence: {e}");
        ExitCode::from(2)
    })?;
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
        reports.retain(|r| r.state == s);
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
                "no oobfence daemon answers at {base} (server.listen in {}): {}. Is it running? \
                 (systemctl status oobfence@{})",
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

async fn make_kubeconfig(req: &crate::kubeconfig::Request) -> Result<ExitCode, ExitCode> {
    use crate::kubeconfig::MintError;
    let minted = crate::kubeconfig::make(req).await.map_err(|e| match e {
        MintError::TooShort(_) => {
            eprintln!("oobfence: {e}");
            ExitCode::from(2)
        }
        e => fail(e),
    })?;
    println!(
        "{}: kubeconfig for ServiceAccount {}/{}, token valid until {}",
        req.output.display(),
        req.namespace,
        req.service_account,
        minted.expires
    );
    for p in &minted.excess {
        eprintln!(
            "oobfence: warning: this ServiceAccount may {p}, which oobfence never needs: \
             it is bound to more than deploy/rbac.yaml grants"
        );
    }
    if !minted.missing.is_empty() {
        for p in &minted.missing {
            eprintln!("oobfence: this ServiceAccount may not {p}");
        }
        return Err(fail(
            "the token lacks permissions the daemon needs: apply deploy/rbac.yaml, then the \
             same kubeconfig works (no need to mint a new one)",
        ));
    }
    println!(
        "install it on the management host: install -m 0640 -g oobfence {} /etc/oobfence/DC.kubeconfig",
        req.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
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
