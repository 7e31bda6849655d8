//! The guards' record on the cluster ([`GuardRecord`]): one ConfigMap (`[guards] record`,
//! default `oobfence/oobfence-guards`), one key per datacenter. A restarted daemon and an `[ha]` instance taking over read it back, so the
//! fence budget and a storm's cooldown outlive the process that counted them.
//!
//! Why a ConfigMap and not Events: Events expire (the API server's `--event-ttl`, 1 h by
//! default, no longer than the default budget window), are best-effort (a failed one is only
//! logged), and listing them needs a right over every Event of the namespace. One object,
//! read once and merge-patched on the datacenter's own key, is none of that: it lives as long
//! as the record in it says, and each datacenter writes its key alone.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use std::time::Duration;

use super::{CALL_TIMEOUT, ClusterError, bounded, bounded_by};
use crate::config::ConfigMapRef;
use crate::decision::holds::record::GuardRecord;

/// What a datacenter's place in the ConfigMap holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredRecord {
    /// No ConfigMap, or no key for the datacenter: never written, or deleted.
    Missing,
    Record(GuardRecord),
    /// Text that is no guard record (a hand edit, a truncated write): why, for the log.
    Corrupt(String),
}

/// Where one datacenter's guard record is kept.
#[derive(Clone)]
pub struct GuardStore {
    api: Api<ConfigMap>,
    at: ConfigMapRef,
    key: String,
    /// How long one write may take (`[ha]`: within the leader's safety margin, so that a
    /// leader's last write lands before another instance may take over).
    write_timeout: Duration,
}

impl GuardStore {
    pub fn new(client: Client, at: &ConfigMapRef, datacenter: &str) -> GuardStore {
        GuardStore {
            api: Api::namespaced(client, &at.namespace),
            at: at.clone(),
            key: record_key(datacenter),
            write_timeout: CALL_TIMEOUT,
        }
    }

    /// `[ha]`: each write cut off after `timeout` ([`crate::config::HaConfig::write_timeout`]).
    pub fn with_write_timeout(mut self, timeout: Duration) -> GuardStore {
        self.write_timeout = timeout.min(CALL_TIMEOUT);
        self
    }

    /// `ConfigMap NAMESPACE/NAME key KEY`, for logs.
    pub fn describe(&self) -> String {
        format!("ConfigMap {} key {}", self.at, self.key)
    }

    /// What the datacenter's place holds; `Err` only when the API gives no answer to tell
    /// (a failed call: the record may hold anything).
    pub async fn read(&self) -> Result<StoredRecord, ClusterError> {
        let Some(cm) = bounded(self.api.get_opt(&self.at.name)).await? else {
            return Ok(StoredRecord::Missing);
        };
        let Some(text) = cm.data.as_ref().and_then(|d| d.get(&self.key)) else {
            return Ok(StoredRecord::Missing);
        };
        Ok(match serde_json::from_str(text) {
            Ok(record) => StoredRecord::Record(record),
            Err(e) => StoredRecord::Corrupt(format!(
                "{} does not hold a guard record oobfence can read: {e}",
                self.describe()
            )),
        })
    }

    /// Replaces the datacenter's record (its key alone: other datacenters' keys stay).
    pub async fn write(&self, record: &GuardRecord) -> Result<(), ClusterError> {
        let text = serde_json::to_string(record).map_err(|e| {
            ClusterError::Precondition(format!("cannot encode the guard record: {e}"))
        })?;
        let patch = json!({ "data": { &self.key: &text } });
        let patched = bounded_by(
            self.write_timeout,
            self.api.patch(
                &self.at.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await;
        match patched {
            Err(ClusterError::Api(kube::Error::Api(s))) if s.is_not_found() => {}
            other => return other.map(|_| ()),
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.at.name.clone()),
                namespace: Some(self.at.namespace.clone()),
                ..Default::default()
            },
            data: Some([(self.key.clone(), text)].into()),
            ..Default::default()
        };
        match bounded_by(
            self.write_timeout,
            self.api.create(&PostParams::default(), &cm),
        )
        .await
        {
            // Another datacenter created it a moment ago: patch our key into it.
            Err(ClusterError::Api(kube::Error::Api(s))) if s.is_already_exists() => bounded_by(
                self.write_timeout,
                self.api.patch(
                    &self.at.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ),
            )
            .await
            .map(|_| ()),
            other => other.map(|_| ()),
        }
    }
}

/// A ConfigMap key for the datacenter: its name with anything a key may not hold (`[-._a-zA-Z0-9]`)
/// made `-`, and `.json`.
fn record_key(datacenter: &str) -> String {
    let name: String = datacenter
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '-',
        })
        .collect();
    format!("{name}.json")
}

#[cfg(test)]
mod tests {
    #[test]
    fn record_keys_are_valid_configmap_keys() {
        assert_eq!(super::record_key("dc1"), "dc1.json");
        assert_eq!(super::record_key("eu west/2"), "eu-west-2.json");
    }
}
