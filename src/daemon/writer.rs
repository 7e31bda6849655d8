//! The writers: taint, untaint, delete, clear a record, Events — each a task that re-checks its
//! decision on a fresh read, journals what happened and reports back to the loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::{ActionDone, action_label};
use super::observe::{observe_fence, seconds_between};
use super::release;
use super::state::Daemon;
use crate::cluster::{self, Cluster, EventType, NodeView, reasons};
use crate::decision::{self, Decision, FenceAction, Step};
use crate::journal::{self, RecordKind};
use crate::power;
use crate::status::Shared;

impl Daemon {
    pub(super) fn spawn_event(
        &self,
        node: &Arc<NodeView>,
        kind: EventType,
        reason: &'static str,
        d: &Decision,
    ) {
        let cluster = self.cluster.clone();
        let node = node.clone();
        let message = format!("{} (rule {})", d.reason, d.rule.name());
        tokio::spawn(async move { cluster.event(&node.name, kind, reason, &message).await });
    }

    pub(super) fn spawn_action(
        &self,
        node: Arc<NodeView>,
        uid: String,
        decision: Decision,
        inputs: journal::Inputs,
    ) {
        let cluster = self.cluster.clone();
        let shared = self.shared.clone();
        let journal = self.journal.clone();
        let tx = self.actions_tx.clone();
        let name = node.name.clone();
        let reads: Vec<String> = self
            .trackers
            .get(&name)
            .map(|t| {
                // The reads of the level the decision rests on (every source's, without one).
                t.sources
                    .iter()
                    .filter(|s| inputs.level.is_none_or(|l| s.level == l))
                    .flat_map(|s| s.reads.iter().rev().take(4))
                    .map(|r| {
                        let mut line =
                            format!("{} {} in {:.2}s", r.at, r.state, r.latency.as_secs_f64());
                        for d in &r.details {
                            line.push_str(&format!(" [{d}]"));
                        }
                        line
                    })
                    .collect()
            })
            .unwrap_or_default();
        let volume_watch = self.ec2_volume_watch(&node, &decision);
        // A fence on a person's word rests on the annotation's exact value, re-read at the
        // write; `None` for a person's fence whose value is gone already (nothing written).
        let confirmed = (decision.rule == decision::Rule::ConfirmedOffByPerson).then(|| {
            self.trackers
                .get(&name)
                .and_then(|t| t.confirmation.as_ref())
                .map(|c| c.value.clone())
        });
        let basis = fence_basis(&decision, &inputs);
        // What the fence rests on, where a node has levels or the proof is no attested read.
        let rests_on = match (inputs.level, inputs.basis.as_deref()) {
            (Some(level), Some(basis)) if level > 1 || basis != "attested" => {
                format!("; basis {basis} (level {level})")
            }
            (None, Some(basis)) => format!("; basis {basis}"),
            _ => String::new(),
        };
        tokio::spawn(async move {
            let on = match &confirmed {
                None => Ok(cluster::FencedOn::Power),
                Some(Some(value)) => Ok(cluster::FencedOn::Person(value)),
                Some(None) => Err(cluster::ClusterError::Abandoned(
                    "the person's confirmation is gone; nothing written".into(),
                )),
            };
            let evidence = format!(
                "{} (rule {}{rests_on})",
                decision.reason,
                decision.rule.name()
            );
            let guard = decision.guard.clone();
            let no_guard = || {
                cluster::ClusterError::Precondition(
                    "the decision carries no write guard; nothing written".into(),
                )
            };
            let guard_on = match (&guard, on) {
                (Some(g), Ok(on)) => Ok((g, on)),
                (None, _) => Err(no_guard()),
                (_, Err(e)) => Err(e),
            };
            // With release_at_attestation, a Node delete lists the node's pods first.
            let mut listed_pods = None;
            let (label, result) = match decision.step {
                Step::Fence(FenceAction::Taint) => (
                    "taint",
                    match guard_on {
                        Ok((g, on)) => cluster.apply_fence_taint_on(&name, g, &evidence, on).await,
                        Err(e) => Err(e),
                    }
                    .map(|w| {
                        format!(
                            "out-of-service taint added: {evidence}; bootID at fence {}{}; reads (newest first): {}",
                            w.boot_id,
                            conflicts_met(w.attempts),
                            reads.join("; ")
                        )
                    }),
                ),
                Step::Fence(FenceAction::DeleteNode) => {
                    let result = match guard_on {
                        Ok((g, on)) => {
                            delete_node_and_attachments(&cluster, &shared, &name, g, on).await
                        }
                        Err(e) => Err(e),
                    }
                    .map(|(w, vas, pods)| {
                        listed_pods = pods;
                        format!(
                            "Node deleted: {evidence}; bootID at fence {}{}; {vas}; reads (newest first): {}",
                            w.boot_id,
                            conflicts_met(w.attempts),
                            reads.join("; ")
                        )
                    });
                    ("delete_node", result)
                }
                Step::Unfence => (
                    "untaint",
                    match &guard {
                        Some(g) => cluster.remove_fence_taint(&name, g).await,
                        None => Err(no_guard()),
                    }
                    .map(|()| format!("out-of-service taint removed: {evidence}")),
                ),
                Step::ClearRecord => (
                    "clear_record",
                    cluster
                        .clear_fence_record(&name, &uid)
                        .await
                        .map(|()| format!("fence record removed: {evidence}")),
                ),
                _ => return,
            };
            let done_at = crate::clock::now();
            // The pods go right after the fence, before anything is reported: each moment
            // they stay keeps the volumes attached.
            let released = match (&result, &guard, decision.step) {
                (Ok(_), Some(g), Step::Fence(action)) if g.release_pods => {
                    Some(release::release(&cluster, &shared, &name, g, action, listed_pods).await)
                }
                _ => None,
            };
            let abandoned = matches!(result, Err(cluster::ClusterError::Abandoned(_)));
            shared.metrics.action_result(
                label,
                match (&result, abandoned) {
                    (Ok(_), _) => "success",
                    (Err(_), true) => "abandoned",
                    (Err(_), false) => "failure",
                },
            );
            let reason = match decision.step {
                Step::Fence(_) if confirmed.is_some() => reasons::FENCED_ON_CONFIRMATION,
                Step::Fence(_) => reasons::FENCED,
                Step::Unfence => reasons::UNFENCED,
                _ => reasons::RECORD_CLEARED,
            };
            let mut record = journal.record(
                &name,
                &uid,
                RecordKind::Action,
                decision.rule.name(),
                inputs,
            );
            record.action = label.to_string();
            record.lease_term = cluster.term();
            let outcome = match result {
                Ok(message) => {
                    if let Some(w) = volume_watch {
                        tokio::spawn(w.run(cluster.clone(), node.clone(), shared.clone()));
                    }
                    tracing::warn!(node = %name, action = label, rule = decision.rule.name(), "{message}");
                    cluster
                        .event(&node.name, EventType::Normal, reason, &message)
                        .await;
                    record.event = reason.to_string();
                    record.result = "success".into();
                    record.message = message;
                    Ok(())
                }
                Err(e) if abandoned => {
                    // Not a failure: the re-check did its job. Logged and journaled; the node
                    // is decided again on fresh inputs.
                    let message = format!("{label} not written: {e}; deciding again");
                    tracing::warn!(node = %name, action = label, "{message}");
                    record.result = "abandoned".into();
                    record.error = Some(e.to_string());
                    record.message = message.clone();
                    Err(message)
                }
                Err(e) => {
                    let message = format!("{label} failed: {e}");
                    tracing::error!(node = %name, action = label, error = %e, "action failed; will retry");
                    cluster
                        .event(
                            &node.name,
                            EventType::Warning,
                            reasons::FENCE_FAILED,
                            &message,
                        )
                        .await;
                    record.event = reasons::FENCE_FAILED.to_string();
                    record.result = "failure".into();
                    record.error = Some(e.to_string());
                    record.message = message.clone();
                    Err(message)
                }
            };
            let fenced_at = match (decision.step, &outcome) {
                (Step::Fence(action), Ok(())) => {
                    shared.metrics.fenced(action_label(action), basis);
                    observe_fence(
                        &shared.metrics,
                        &name,
                        &uid,
                        action,
                        &record.inputs,
                        done_at,
                    );
                    Some(done_at)
                }
                (Step::Unfence, Ok(())) => {
                    if let Some(f) = &record.inputs.fence {
                        shared
                            .metrics
                            .fence_to_recovery
                            .observe(seconds_between(f.at, done_at));
                    }
                    None
                }
                _ => None,
            };
            let volume_attachments = record.inputs.volume_attachments.clone();
            journal.submit_wait(&record).await;
            if let Some(released) = released {
                release::report(
                    &cluster,
                    &journal,
                    &name,
                    &uid,
                    decision.rule,
                    record.inputs.clone(),
                    released,
                )
                .await;
            }
            let _ = tx
                .send(ActionDone {
                    node: name,
                    uid,
                    result: outcome,
                    abandoned,
                    step: decision.step,
                    fenced_at,
                    volume_attachments,
                })
                .await;
        });
    }
}

/// The pods a Node delete leaves behind, listed right before it (`None`: not asked for).
type ListedPods = Option<Result<Vec<cluster::BoundPod>, cluster::ClusterError>>;

/// Deletes the Node (after the write-time re-check) and then exactly the VolumeAttachments
/// that pointed at it just before: recorded by name and uid, so that a node re-registered under
/// the same name keeps its own. Returns the write, a sentence about the attachments and, when
/// its pods are to be released, the pods bound to it just before.
async fn delete_node_and_attachments(
    cluster: &Cluster,
    shared: &Shared,
    name: &str,
    guard: &decision::WriteGuard,
    on: cluster::FencedOn<'_>,
) -> Result<(cluster::FenceWrite, String, ListedPods), cluster::ClusterError> {
    let recorded = cluster.volume_attachments_of(name).await;
    let pods = match guard.release_pods {
        true => Some(cluster.pods_on(name).await),
        false => None,
    };
    let w = cluster.delete_node_on(name, guard, on).await?;
    // The Node is gone: its VolumeAttachments can go now instead of after the attach/detach
    // controller's 6-minute force-detach.
    let sentence = match recorded {
        Err(e) => format!(
            "VolumeAttachments NOT deleted (could not list them before the delete: {e}): they are force-detached after 6 minutes"
        ),
        Ok(recorded) => match cluster
            .delete_volume_attachments(&guard.uid, &recorded)
            .await
        {
            Ok(v) => {
                for _ in &v {
                    shared.metrics.action("delete_volumeattachment", true);
                }
                if v.is_empty() {
                    "no VolumeAttachments to delete".to_string()
                } else {
                    format!("VolumeAttachments deleted: {}", v.join(", "))
                }
            }
            Err(e) => {
                let result = match e {
                    cluster::ClusterError::Abandoned(_) => "abandoned",
                    _ => "failure",
                };
                shared
                    .metrics
                    .action_result("delete_volumeattachment", result);
                format!(
                    "VolumeAttachments NOT deleted ({e}): they are force-detached after 6 minutes"
                )
            }
        },
    };
    Ok((w, sentence, pods))
}

impl Daemon {
    /// For a fence of an EC2 instance that held data volumes: what to watch until they are
    /// released.
    fn ec2_volume_watch(&self, node: &NodeView, decision: &Decision) -> Option<Ec2VolumeWatch> {
        if !matches!(decision.step, Step::Fence(_)) {
            return None;
        }
        let reader = self.sources.ec2()?.clone();
        let aws = self.cfg.aws.as_ref()?;
        let name = node.name.clone();
        if !self.sources.needs_node_data(&name) {
            return None;
        }
        let instance = node
            .provider_id
            .as_deref()
            .and_then(|p| power::ec2::instance_id_from_provider_id(p).ok())?;
        let last = self
            .trackers
            .get(&name)?
            .sources
            .iter()
            .find(|s| {
                s.source
                    .as_ref()
                    .is_some_and(|s| s.source.backend() == "ec2")
            })?
            .reads
            .last()?;
        let volumes = power::ec2::volume_ids(&last.details);
        if volumes.is_empty() {
            return None;
        }
        Some(Ec2VolumeWatch {
            reader,
            instance,
            volumes,
            warn_after: aws.volume_release_warning,
        })
    }
}

/// Follows a fenced instance's EBS volumes until they are detached from it: an Event when they
/// are released (with how long it took) and a warning Event if they are still attached
/// `warn_after` the fence.
struct Ec2VolumeWatch {
    reader: Arc<power::ec2::Ec2Reader>,
    instance: String,
    volumes: Vec<String>,
    warn_after: Duration,
}

impl Ec2VolumeWatch {
    /// Polling interval, and the bound on how long one watch lasts.
    const EVERY: Duration = Duration::from_secs(10);
    const GIVE_UP: Duration = Duration::from_secs(6 * 3600);

    async fn run(self, cluster: Cluster, node: Arc<NodeView>, shared: Arc<Shared>) {
        let started = Instant::now();
        let mut warned = false;
        let max_polls = (Self::GIVE_UP.as_secs() / Self::EVERY.as_secs()) as usize;
        for _ in 0..max_polls {
            tokio::time::sleep(Self::EVERY).await;
            let held = match self
                .reader
                .still_attached(&self.instance, &self.volumes)
                .await
            {
                Ok(h) => h,
                Err(e) => {
                    tracing::debug!(instance = %self.instance, error = %e, "volume check failed; retrying");
                    continue;
                }
            };
            let took = started.elapsed();
            if held.is_empty() {
                let msg = format!(
                    "EBS volumes {} detached from {} {:.0}s after the fence",
                    self.volumes.join(", "),
                    self.instance,
                    took.as_secs_f64()
                );
                tracing::info!(node = %node.name.clone(), "{msg}");
                shared
                    .metrics
                    .fence_to_ebs_detached
                    .observe(took.as_secs_f64());
                cluster
                    .event(
                        &node.name,
                        EventType::Normal,
                        reasons::VOLUMES_RELEASED,
                        &msg,
                    )
                    .await;
                return;
            }
            if !warned && took >= self.warn_after {
                warned = true;
                let msg = format!(
                    "EBS volumes {} are still attached to {} {:.0}s after the fence: check the CSI driver and `kubectl get volumeattachment`",
                    held.join(", "),
                    self.instance,
                    took.as_secs_f64()
                );
                tracing::warn!(node = %node.name.clone(), "{msg}");
                cluster
                    .event(
                        &node.name,
                        EventType::Warning,
                        reasons::VOLUMES_STILL_ATTACHED,
                        &msg,
                    )
                    .await;
            }
        }
    }
}

/// What a fence rests on, for the `basis` label of `oobfence_fences_total`: `person` (a
/// person's confirmation), else `attested` or `unattested` (whether the source proves whose
/// machine it read).
fn fence_basis(decision: &Decision, inputs: &journal::Inputs) -> &'static str {
    if decision.rule == decision::Rule::ConfirmedOffByPerson {
        return decision::levels::Basis::Person.label();
    }
    // The core's word, where the decision came with one (levels).
    match inputs.basis.as_deref() {
        Some("attested") => return "attested",
        Some("unattested") => return "unattested",
        _ => {}
    }
    let attested = inputs
        .identity
        .as_ref()
        .is_none_or(|i| i.check == "checked");
    decision::levels::Basis::Reads { level: 1, attested }.label()
}

/// How many 409 Conflicts a write met before it landed, for its message ("" when none).
fn conflicts_met(attempts: usize) -> String {
    match attempts {
        0 | 1 => String::new(),
        n => format!(
            "; written on attempt {n} (the Node changed under {} earlier one(s): 409 Conflict, re-read, re-checked)",
            n - 1
        ),
    }
}
