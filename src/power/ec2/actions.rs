//! EC2 power actions: `StopInstances` with `Force` (a hung instance does not shut down
//! gracefully) and `StartInstances`, for the one instance of the node, after the caller's check
//! on a fresh `DescribeInstances` answer for it. The IAM policy docs/power-sources.md gives allows both
//! only on instances tagged for oobfence.

use super::errors::bounded;
use super::{Ec2Reader, Ec2Source};
use crate::power::{ActionCheck, ActionOutcome, ActionSupport, PowerAction, PowerSource};

impl Ec2Reader {
    /// Sends `action` for `instance`: what EC2 answered (the instance's state change).
    async fn send_action(&self, instance: &str, action: PowerAction) -> ActionOutcome {
        let answered = match action {
            PowerAction::Off => bounded(
                self.timeout,
                self.client
                    .stop_instances()
                    .instance_ids(instance)
                    .force(true)
                    .send(),
            )
            .await
            .map(|out| {
                out.stopping_instances()
                    .iter()
                    .map(change)
                    .collect::<Vec<_>>()
            }),
            PowerAction::On => bounded(
                self.timeout,
                self.client.start_instances().instance_ids(instance).send(),
            )
            .await
            .map(|out| {
                out.starting_instances()
                    .iter()
                    .map(change)
                    .collect::<Vec<_>>()
            }),
        };
        let call = match action {
            PowerAction::Off => "StopInstances (Force)",
            PowerAction::On => "StartInstances",
        };
        match answered {
            Ok(changes) if changes.iter().any(|c| c.starts_with(instance)) => ActionOutcome::Sent {
                answer: format!("{call}: {}", changes.join(", ")),
            },
            Ok(changes) => ActionOutcome::Failed {
                error: crate::power::PowerState::error(
                    crate::power::ReadErrorKind::BadReply,
                    format!(
                        "{call} answered without {instance} ({})",
                        if changes.is_empty() {
                            "no instance".to_string()
                        } else {
                            changes.join(", ")
                        }
                    ),
                ),
            },
            Err(error) => ActionOutcome::Failed { error },
        }
    }
}

impl Ec2Reader {
    /// Whether the credentials may stop and start `instance`, as EC2 answers a `DryRun` of
    /// each call: `DryRunOperation` is yes, `UnauthorizedOperation` no.
    pub(super) async fn dry_run_actions(&self, instance: &str) -> ActionSupport {
        use aws_sdk_ec2::error::ProvideErrorMetadata;
        let judge = |call: &str, code: Option<&str>, message: Option<&str>| match code {
            Some("DryRunOperation") => Ok(format!(
                "{call} on {instance} (a DryRun says the credentials may)"
            )),
            Some("UnauthorizedOperation") => Err(format!(
                "{call} on {instance} is not allowed to these credentials: grant it in their IAM policy"
            )),
            other => Err(format!(
                "{call} on {instance}: a DryRun answered {} ({})",
                other.unwrap_or("without an error code"),
                message.unwrap_or("no message")
            )),
        };
        let limit = self.timeout;
        let stop = tokio::time::timeout(
            limit,
            self.client
                .stop_instances()
                .instance_ids(instance)
                .force(true)
                .dry_run(true)
                .send(),
        )
        .await;
        let start = tokio::time::timeout(
            limit,
            self.client
                .start_instances()
                .instance_ids(instance)
                .dry_run(true)
                .send(),
        )
        .await;
        let off = match stop {
            Err(_) => Err(format!(
                "a DryRun of StopInstances got no answer within {limit:?}"
            )),
            Ok(Ok(_)) => Err("a DryRun of StopInstances was carried out as a real call".into()),
            Ok(Err(e)) => judge("StopInstances with Force", e.code(), e.message()),
        };
        let on = match start {
            Err(_) => Err(format!(
                "a DryRun of StartInstances got no answer within {limit:?}"
            )),
            Ok(Ok(_)) => Err("a DryRun of StartInstances was carried out as a real call".into()),
            Ok(Err(e)) => judge("StartInstances", e.code(), e.message()),
        };
        ActionSupport { off, on }
    }
}

/// `i-… stopping (was running)`.
fn change(c: &aws_sdk_ec2::types::InstanceStateChange) -> String {
    let name = |s: Option<&aws_sdk_ec2::types::InstanceState>| {
        s.and_then(|s| s.name())
            .map(|n| n.as_str().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "{} {} (was {})",
        c.instance_id().unwrap_or("?"),
        name(c.current_state()),
        name(c.previous_state())
    )
}

impl Ec2Source {
    pub(super) async fn act_once(
        &self,
        action: PowerAction,
        check: ActionCheck<'_>,
    ) -> ActionOutcome {
        let reply = self.read_reply().await;
        if let crate::power::PowerState::Error { .. } = &reply.state {
            return ActionOutcome::Failed { error: reply.state };
        }
        if let Err(why) = check(&reply).await {
            return ActionOutcome::Refused { why };
        }
        self.reader.send_action(&self.instance_id, action).await
    }
}
