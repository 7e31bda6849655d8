//! Events: what oobfence did or refused, as core/v1 Events on the Node, under stable reasons.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};

use jiff::Timestamp;

use super::{Cluster, ClusterError, bounded};

/// Event reasons, stable for alerting and `kubectl get events --field-selector reason=...`.
pub mod reasons {
    pub const FENCED: &str = "OobfenceFenced";
    pub const NODE_DELETED: &str = "OobfenceNodeDeleted";
    pub const UNFENCED: &str = "OobfenceUnfenced";
    pub const BLOCKED: &str = "OobfenceBlocked";
    pub const WOULD_FENCE: &str = "OobfenceWouldFence";
    pub const WOULD_UNFENCE: &str = "OobfenceWouldUnfence";
    pub const WOULD_POWER_OFF: &str = "OobfenceWouldPowerOff";
    pub const WOULD_POWER_ON: &str = "OobfenceWouldPowerOn";
    pub const POWERED_OFF: &str = "OobfencePoweredOff";
    pub const POWERED_ON: &str = "OobfencePoweredOn";
    pub const POWER_ACTION_FAILED: &str = "OobfencePowerActionFailed";
    pub const FENCE_FAILED: &str = "OobfenceFenceFailed";
    pub const RECORD_CLEARED: &str = "OobfenceRecordCleared";
    pub const VOLUMES_RELEASED: &str = "OobfenceVolumesReleased";
    pub const PODS_RELEASED: &str = "OobfencePodsReleased";
    pub const PODS_NOT_RELEASED: &str = "OobfencePodsNotReleased";
    pub const VOLUMES_STILL_ATTACHED: &str = "OobfenceVolumesStillAttached";
    pub const IDENTITY_MISMATCH: &str = "OobfenceIdentityMismatch";
    pub const OFF_WHILE_ALIVE: &str = "OobfencePowerSourceOffWhileAlive";
    pub const GONE_WHILE_ALIVE: &str = "OobfencePowerSourceGoneWhileAlive";
    pub const DUPLICATE_SYSTEM_UUID: &str = "OobfenceDuplicateSystemUUID";
    /// A person's `oobfence.io/confirmed-off` annotation that is not one (never acted on).
    pub const CONFIRMATION_INVALID: &str = "OobfenceConfirmationInvalid";
    /// A fence on a person's confirmation, no power source being able to answer: the Event
    /// names who confirmed, why, and the boot.
    pub const FENCED_ON_CONFIRMATION: &str = "OobfenceFencedOnConfirmation";
}

impl Cluster {
    /// Emits a core/v1 Event about a node. Failures are logged, never fatal: an Event is a
    /// report, not part of the fence.
    pub async fn event(&self, node: &str, kind: EventType, reason: &str, message: &str) {
        // [ha]: Events are writes too; the standby's would double the leader's.
        if let Some(l) = &self.leadership
            && !l.read().map(|l| l.may_write()).unwrap_or(false)
        {
            tracing::debug!(node = %node, reason, "standby: Event not emitted");
            return;
        }
        if let Err(e) = self.try_event(node, kind, reason, message).await {
            tracing::warn!(node = %node, reason, error = %e, "could not emit Event");
        }
    }

    async fn try_event(
        &self,
        name: &str,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        let now = Timestamp::now();
        // core/v1 Events: every server version accepts them for cluster-scoped objects in
        // "default" (1.20 rejects events.k8s.io/v1 ones there). The uid is the node name, as
        // the kubelet does, because that is what `kubectl describe node` looks up.
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.oobfence.")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.to_string()),
                uid: Some(name.to_string()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(truncate(message, 4000)),
            type_: Some(kind.as_str().into()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            source: Some(EventSource {
                component: Some("oobfence".into()),
                host: None,
            }),
            reporting_component: Some("oobfence".into()),
            reporting_instance: Some(format!("oobfence-{}", self.datacenter)),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), "default");
        bounded(api.create(&PostParams::default(), &ev)).await?;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
