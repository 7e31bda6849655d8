//! `confirm-off`: a person's word on record that a node's machine is off, written as the
//! Node annotation `oobfence.io/confirmed-off` with the person's own kubeconfig (so that the
//! API server's audit log names them), or withdrawn.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{fail, say_error};
use crate::cluster::{self, ClusterError};
use crate::config::{Config, KubernetesConfig};
use crate::decision::confirmation::ANNOTATION;

/// What `confirm-off` was asked.
pub(super) struct ConfirmOff {
    pub(super) node: String,
    /// `None`: withdraw.
    pub(super) reason: Option<String>,
    pub(super) by: Option<String>,
    pub(super) config: Option<PathBuf>,
    pub(super) kubeconfig: Option<PathBuf>,
    pub(super) context: Option<String>,
}

pub(super) async fn confirm_off(a: ConfirmOff) -> Result<ExitCode, ExitCode> {
    // The config only names the datacenter for what to run next: its kubeconfig is the
    // daemon's, and the write must carry the person's own identity.
    if let Some(path) = &a.config {
        Config::load_without_secrets(path).map_err(super::say_config_errors)?;
    }
    let client = cluster::connect(&KubernetesConfig {
        kubeconfig: a.kubeconfig.clone(),
        context: a.context.clone(),
        node_selector: None,
    })
    .await
    .map_err(|e| {
        say_error(e);
        ExitCode::from(2)
    })?;
    let node = a.node.as_str();
    let Some(reason) = a.reason.as_deref() else {
        return match cluster::withdraw_confirmation(&client, node).await {
            Ok(true) => {
                println!(
                    "withdrew the confirmation of node {node} ({ANNOTATION} removed): oobfence no longer fences it on a person's word"
                );
                Ok(ExitCode::SUCCESS)
            }
            Ok(false) => {
                println!("node {node} carries no {ANNOTATION}: nothing to withdraw");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(fail(e)),
        };
    };
    if reason.trim().is_empty() {
        return Err(fail(
            "--reason is empty: say who looked at what (\"rack 12 PDU breaker tripped, checked by hand\")",
        ));
    }
    let by =
        a.by.clone()
            .unwrap_or_else(super::daemon_commands::operator);
    match cluster::confirm_off(&client, node, reason, &by, crate::clock::now).await {
        Ok(note) => {
            let value = serde_json::to_string(&note).unwrap_or_default();
            println!("node {node}: wrote {ANNOTATION}={value}");
            println!(
                "  confirmed off by {by} for boot {}: {reason}",
                note.boot_id
            );
            println!(
                "next: oobfence fences the node where no power source can answer (none configured, or every one unreachable), with every hold still in force (pause, storm, fence budget, standby, dry run); a sign of life from its kubelet or another boot voids the confirmation, and the fence is lifted when it comes back on a new boot."
            );
            println!(
                "  follow it:  oobfence why {node}{}",
                config_arg(a.config.as_deref())
            );
            println!("  withdraw:   oobfence confirm-off {node} --withdraw");
            Ok(ExitCode::SUCCESS)
        }
        Err(ClusterError::Precondition(why)) => Err(fail(format!("refused: {why}"))),
        Err(e) => Err(fail(format!(
            "{ANNOTATION} not written on node {node}: {e}"
        ))),
    }
}

fn config_arg(config: Option<&Path>) -> String {
    config
        .map(|p| format!(" --config {}", p.display()))
        .unwrap_or_default()
}
