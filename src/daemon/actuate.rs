//! Opt-in actuation, the writer's part: a power action recorded on the Node (its guard
//! re-checked on a fresh read), then sent through the node's power source, whose own read right
//! before the command must show the node's machine in the state the decision was made on. A
//! command never sent (refused, failed) has its record taken back, so that it may be tried
//! again after the retry delay; one sent is journaled and reported in an Event.

use std::sync::Arc;

use super::action::ActionDone;
use super::state::Daemon;
use crate::cluster::reasons::{POWER_ACTION_FAILED, POWERED_OFF, POWERED_ON};
use crate::cluster::{ClusterError, EventType, NodeView};
use crate::decision::{Decision, NodeFacts, PowerState, Step};
use crate::identity::{self, NodeIdentity};
use crate::journal::{self, RecordKind};
use crate::power::{ActionOutcome, MappedSource, PowerAction, Reply};

/// The check a source runs on its own read right before the command: the node's machine, in
/// the state the action expects (On before a power-off, Off before a power-on).
pub(super) fn machine_check(
    node: &NodeIdentity,
    action: PowerAction,
) -> impl Fn(&Reply) -> Result<(), String> + Send + Sync + use<> {
    let node = node.clone();
    move |reply: &Reply| {
        let want = match action {
            PowerAction::Off => PowerState::On,
            PowerAction::On => PowerState::Off,
        };
        if reply.state != want {
            return Err(format!(
                "the machine reads {} right before the command, not {want}",
                reply.state
            ));
        }
        match identity::verify(&node, &reply.identity) {
            identity::Verdict::Match(_) => Ok(()),
            other => Err(format!(
                "the read right before the command does not prove the node's machine answered: {other}"
            )),
        }
    }
}

impl Daemon {
    /// Starts the power action `decision` asks for (its step is `PowerOff` or `PowerOn`).
    pub(super) fn spawn_power_action(
        &self,
        node: Arc<NodeView>,
        facts: &NodeFacts,
        source: MappedSource,
        decision: Decision,
        inputs: journal::Inputs,
    ) {
        let action = match decision.step {
            Step::PowerOff => PowerAction::Off,
            Step::PowerOn => PowerAction::On,
            _ => return,
        };
        let cluster = self.cluster.clone();
        let journal = self.journal.clone();
        let shared = self.shared.clone();
        let tx = self.actions_tx.clone();
        let identity = facts.identity.clone();
        let not_ready_since = match facts.readiness {
            crate::decision::Readiness::NotReady { since } => Some(since),
            _ => None,
        };
        tokio::spawn(async move {
            let name = node.name.clone();
            let uid = node.uid.clone();
            let backend = source.source.backend();
            // Err: what happened, and the result label (abandoned, refused, failure).
            let result: Result<String, (String, &'static str)> = async {
                let Some(guard) = &decision.guard else {
                    return Err((
                        "the decision carries no write guard; nothing sent".into(),
                        "failure",
                    ));
                };
                let recorded = cluster.record_power_action(&name, guard, action).await;
                if let Err(e) = recorded {
                    let label = match e {
                        ClusterError::Abandoned(_) => "abandoned",
                        ClusterError::Precondition(_) => "refused",
                        _ => "failure",
                    };
                    return Err((
                        format!("{action} not recorded on the Node, so not sent: {e}"),
                        label,
                    ));
                }
                // Right before the command, after the source's own read: the machine, then the
                // holds and (with [ha]) this instance's leadership deadline, once more.
                let check = cluster.command_check(&uid, machine_check(&identity, action));
                let outcome = source.source.act(action, &check).await;
                match outcome {
                    ActionOutcome::Sent { answer } => Ok(answer),
                    other => {
                        // Never sent, as far as anyone knows: the record goes, so that the
                        // action may be decided again after the retry delay.
                        match cluster.forget_power_action(&name, &uid, action).await {
                            Ok(()) => {}
                            Err(e @ ClusterError::Abandoned(_)) => {
                                tracing::warn!(node = %name, error = %e, "the record of a power action that was not sent stays while writes are held: this boot is not powered off again")
                            }
                            Err(e) => {
                                tracing::error!(node = %name, error = %e, "could not take back the record of a power action that was not sent")
                            }
                        }
                        // A hold (the pause switch read afresh, as the check did) or the end of
                        // leadership is no failure of the source.
                        let label = match cluster.may_send(&uid).await {
                            Err(_) => "abandoned",
                            Ok(()) => other.result_label(),
                        };
                        Err((format!("{action} {other}"), label))
                    }
                }
            }
            .await;
            let mut record = journal.record(
                &name,
                &uid,
                RecordKind::Action,
                decision.rule.name(),
                inputs,
            );
            record.action = action.label().to_string();
            record.lease_term = cluster.term();
            let outcome = match &result {
                Ok(answer) => {
                    let reason = match action {
                        PowerAction::Off => POWERED_OFF,
                        PowerAction::On => POWERED_ON,
                    };
                    let message = format!(
                        "{action} through {backend}: {answer}; {} (rule {})",
                        decision.reason,
                        decision.rule.name()
                    );
                    tracing::warn!(node = %name, action = action.label(), backend, "{message}");
                    cluster
                        .event(&name, EventType::Normal, reason, &message)
                        .await;
                    if let (PowerAction::Off, Some(since)) = (action, not_ready_since) {
                        let waited = crate::clock::now().duration_since(since);
                        shared
                            .metrics
                            .notready_to_power_off
                            .observe(waited.as_secs_f64().max(0.0));
                    }
                    record.event = reason.into();
                    record.result = "sent".into();
                    record.message = message;
                    Ok(())
                }
                Err((message, label)) => {
                    let abandoned = *label == "abandoned";
                    tracing::error!(node = %name, action = action.label(), backend, "{message}");
                    if !abandoned {
                        cluster
                            .event(&name, EventType::Warning, POWER_ACTION_FAILED, message)
                            .await;
                        record.event = POWER_ACTION_FAILED.into();
                    }
                    record.result = (*label).into();
                    record.error = Some(message.clone());
                    record.message = message.clone();
                    Err(message.clone())
                }
            };
            journal.submit_wait(&record).await;
            let abandoned = matches!(&result, Err((_, "abandoned")));
            shared
                .metrics
                .power_actions
                .get_or_create(&crate::metrics::PowerActionLabels {
                    action: action.label(),
                    result: match &result {
                        Ok(_) => "sent",
                        Err((_, label)) => label,
                    },
                    backend,
                })
                .inc();
            let _ = tx
                .send(ActionDone {
                    node: name,
                    uid,
                    result: outcome,
                    abandoned,
                    step: decision.step,
                    fenced_at: None,
                    volume_attachments: None,
                })
                .await;
        });
    }
}
