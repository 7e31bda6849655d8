//! Command line: `run`, `check-config`, `probe`, `why`.
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
use crate::report::{NodeReport, short_state};

#[derive(Parser, Debug)]
#[command(
    name = "oobfence",
    version,
    about = "Out-of-band node fencing for Kubernetes: proves a NotReady node is powered off \
             before letting Kubernetes release its volumes"
)]
pub struct Cli {
    /// Log format for stderr.
    #[arg(long, value_enum, global = true, default_value = "text")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
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
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Parse and validate a config file; with --probe, also read every mapped node's power once.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
        /// Also list the cluster's nodes and read the power state of each mapped one.
        #[arg(long)]
        probe: bool,
    },
    /// Read one node's power state once, from the config alone.
    Probe {
        #[arg(long, short)]
        config: PathBuf,
        node: String,
    },
    /// Ask the running daemon what it thinks of a node, and why.
    Why {
        #[arg(long, short)]
        config: PathBuf,
        node: String,
        /// Print the daemon's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
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

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("OOBFENCE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,hyper=warn,rustls=warn"));
    // Under systemd the journal adds its own timestamps and colours mean nothing.
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(!journald && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text if journald => builder.without_time().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("oobfence: {e}");
        ExitCode::from(2)
    })
}

async fn dispatch(command: Command) -> ExitCode {
    let result = match command {
        Command::Run { config } => run(&config).await,
        Command::CheckConfig { config, probe } => check_config(&config, probe).await,
        Command::Probe { config, node } => probe(&config, &node).await,
        Command::Why { config, node, json } => why(&config, &node, json).await,
    };
    result.unwrap_or_else(|code| code)
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("oobfence: {message}");
    ExitCode::from(1)
}

async fn run(path: &Path) -> Result<ExitCode, ExitCode> {
    let cfg = load(path)?;
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
    let cfg = load(path)?;
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
    let rows: Vec<(String, String, String, String, bool)> =
        futures::stream::iter(nodes.items.into_iter().map(|n| {
            let cfg = cfg.clone();
            async move {
                let name = n.name_any();
                match daemon::power_source_for(&cfg, &name) {
                    Ok(None) => (name, "-".into(), "-".into(), "not mapped".into(), true),
                    Err(e) => (name, "-".into(), "-".into(), format!("error: {e}"), false),
                    Ok(Some(daemon::MappedSource { source, deadline })) => {
                        let r = daemon::read_once(&source, deadline).await;
                        let ok = !matches!(r.state, crate::power::PowerState::Error { .. });
                        (
                            name,
                            source.backend().to_string(),
                            source.address(),
                            format!(
                                "{} ({:.3}s)",
                                short_state(&r.state),
                                r.latency.as_secs_f64()
                            ),
                            ok,
                        )
                    }
                }
            }
        }))
        .buffered(cfg.max_concurrent_reads)
        .collect()
        .await;
    let w = |f: fn(&(String, String, String, String, bool)) -> usize, min: usize| {
        rows.iter().map(f).max().unwrap_or(0).max(min)
    };
    let (w0, w1, w2) = (
        w(|r| r.0.len(), 4),
        w(|r| r.1.len(), 7),
        w(|r| r.2.len(), 7),
    );
    println!(
        "{:w0$}  {:w1$}  {:w2$}  STATE",
        "NODE", "BACKEND", "ADDRESS"
    );
    for r in &rows {
        println!("{:w0$}  {:w1$}  {:w2$}  {}", r.0, r.1, r.2, r.3);
    }
    let failed = rows.iter().filter(|r| !r.4).count();
    if failed > 0 {
        eprintln!(
            "oobfence: {failed} of {} nodes could not be read",
            rows.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

async fn probe(path: &Path, node: &str) -> Result<ExitCode, ExitCode> {
    let cfg = load(path)?;
    let Some(daemon::MappedSource { source, deadline }) =
        daemon::power_source_for(&cfg, node).map_err(fail)?
    else {
        return Err(fail(format!(
            "no [[bmc]] entry in {} matches node {node:?}",
            path.display()
        )));
    };
    let r = daemon::read_once(&source, deadline).await;
    let line = format!(
        "{node}: {} ({} {}, {:.3}s)",
        r.state,
        source.backend(),
        source.address(),
        r.latency.as_secs_f64()
    );
    if let crate::power::PowerState::Error { .. } = r.state {
        return Err(fail(line));
    }
    println!("{line}");
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

async fn why(path: &Path, node: &str, json: bool) -> Result<ExitCode, ExitCode> {
    let cfg = load(path)?;
    let base = daemon_url(&cfg);
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .no_proxy()
        .build()
        .map_err(fail)?;
    let url = format!("{base}/nodes/{node}");
    let resp = client.get(&url).send().await.map_err(|e| {
        fail(format!(
            "no oobfence daemon answers at {base} (server.listen in {}): {}. Is it running? \
             (systemctl status oobfence@{})",
            path.display(),
            root_cause(&e),
            cfg.datacenter
        ))
    })?;
    let status = resp.status();
    let body = resp.text().await.map_err(fail)?;
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

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
