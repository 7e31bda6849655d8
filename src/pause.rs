//! The pause switch: stop every write without stopping the daemon.
//!
//! Two switches, either one pauses:
//! - a file on the management host (`[pause] file`, default `/etc/oobfence/DC.paused`): while
//!   it exists nothing is written; its text is the reason. `oobfence pause` / `oobfence resume`
//!   write and remove it.
//! - an annotation on a ConfigMap in the cluster (`[pause] configmap`, default
//!   `oobfence/oobfence-pause`): `oobfence.io/paused` with any value but `"false"`; the value
//!   is the reason. It reaches every oobfence of the cluster at once, from wherever `kubectl`
//!   runs.
//!
//! Both fail closed: a pause file that exists but cannot be read pauses, and a ConfigMap that
//! cannot be read (other than "not found") makes the view stale, which holds every write too.

use crate::api_error::ApiError;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::config::{ConfigMapRef, PauseConfig};
use crate::decision::holds::Pause;
use crate::status::Shared;

/// How often the pause file is looked at.
const FILE_EVERY: Duration = Duration::from_secs(1);
/// How often the ConfigMap is read; each read is also the API round trip that tells a fresh
/// view from a stale one.
const API_EVERY: Duration = Duration::from_secs(5);
/// One ConfigMap read may take this long.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches both switches for the daemon's lifetime and publishes them in `shared`: the pause
/// (`shared.pause`) and the last successful API round trip (`shared.last_round_trip`).
pub fn spawn_watch(cfg: PauseConfig, datacenter: String, client: Client, shared: Arc<Shared>) {
    tokio::spawn(async move {
        let mut configmap_says: Option<String> = None;
        let mut last_api: Option<tokio::time::Instant> = None;
        let mut reported_error = false;
        loop {
            if last_api.is_none_or(|t| t.elapsed() >= API_EVERY) {
                last_api = Some(tokio::time::Instant::now());
                let result = match &cfg.configmap {
                    Some(cm) => {
                        tokio::time::timeout(API_TIMEOUT, read_configmap(&client, cm, &datacenter))
                            .await
                            .map_err(|_| {
                                format!("reading ConfigMap {cm} took longer than {API_TIMEOUT:?}")
                            })
                            .and_then(|r| {
                                r.map_err(|e| {
                                    format!("cannot read ConfigMap {cm}: {}", ApiError(&e))
                                })
                            })
                    }
                    None => tokio::time::timeout(API_TIMEOUT, client.apiserver_version())
                        .await
                        .map_err(|_| "the API server's /version took too long".to_string())
                        .and_then(|r| r.map(|_| None).map_err(|e| ApiError(&e).to_string())),
                };
                match result {
                    Ok(says) => {
                        if reported_error {
                            tracing::info!("the pause ConfigMap is readable again");
                            reported_error = false;
                        }
                        configmap_says = says;
                        if let Ok(mut t) = shared.last_round_trip.lock() {
                            *t = Some(jiff::Timestamp::now());
                        }
                    }
                    // The round trip is not renewed: the view goes stale and every write is
                    // held, which is what a switch nobody can read must do.
                    Err(e) => {
                        if !reported_error {
                            tracing::error!(error = %e, "the pause switch cannot be read; writes are held once the view is older than max_view_age (to run without the switch: [pause] configmap = \"\")");
                            reported_error = true;
                        }
                    }
                }
            }
            let mut pause = Pause::default();
            if let Some(reason) = cfg.file.as_deref().and_then(read_file) {
                pause.by.push(reason);
            }
            if let Some(reason) = &configmap_says {
                pause.by.push(reason.clone());
            }
            let changed = shared.pause.read().map(|p| *p != pause).unwrap_or(true);
            if changed {
                if pause.is_paused() {
                    tracing::warn!(by = %pause.by.join("; "), "writes PAUSED: nothing is written to any Node until resumed");
                } else {
                    tracing::warn!("writes resumed");
                }
                if let Ok(mut p) = shared.pause.write() {
                    *p = pause;
                }
            }
            tokio::time::sleep(FILE_EVERY).await;
        }
    });
}

pub use crate::config::{ANNOTATION_PAUSED, datacenter_annotation};

/// What the pause file says: `None` when it does not exist, else the reason to show.
pub fn read_file(path: &Path) -> Option<String> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let reason: String = text
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect();
            let reason = reason.trim();
            Some(if reason.is_empty() {
                format!("file {}", path.display())
            } else {
                format!("file {}: {reason}", path.display())
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        // Fail closed: a switch that exists but cannot be read still pauses.
        Err(e) => Some(format!(
            "file {} exists but cannot be read ({e}); treated as paused",
            path.display()
        )),
    }
}

/// Writes the pause file (`oobfence pause`).
pub fn write_file(path: &Path, reason: &str, by: &str) -> io::Result<()> {
    let now = jiff::Timestamp::now();
    let reason = reason.replace(['\n', '\r'], " ");
    let text = format!("{reason} (paused by {by} at {now})\n");
    std::fs::write(path, text)
}

/// Removes the pause file (`oobfence resume`); `Ok(false)` when there was none.
pub fn remove_file(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What the ConfigMap says to `datacenter`'s oobfence: `Ok(None)` when it is absent, or when
/// neither the annotation for every datacenter nor the one for this datacenter is there (or
/// each says `"false"`).
pub async fn read_configmap(
    client: &Client,
    cm: &ConfigMapRef,
    datacenter: &str,
) -> Result<Option<String>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let Some(found) = api.get_opt(&cm.name).await? else {
        return Ok(None);
    };
    Ok(configmap_says(&found, cm, datacenter))
}

fn configmap_says(found: &ConfigMap, cm: &ConfigMapRef, datacenter: &str) -> Option<String> {
    let said: Vec<String> = [
        ANNOTATION_PAUSED.to_string(),
        datacenter_annotation(datacenter),
    ]
    .into_iter()
    .filter_map(|key| {
        let value = found.annotations().get(&key)?.trim();
        if value.eq_ignore_ascii_case("false") {
            return None;
        }
        let value: String = value
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect();
        Some(format!("ConfigMap {cm} annotation {key}={value:?}"))
    })
    .collect();
    (!said.is_empty()).then(|| said.join("; "))
}

/// `oobfence pause` / `oobfence resume` under `[ha]`: sets (`reason` given) or removes this
/// datacenter's annotation on the pause ConfigMap, which every instance of the group reads;
/// `by` is who paused. The ConfigMap must exist (`kubectl -n NS create configmap NAME`).
pub async fn set_group_pause(
    client: &Client,
    cm: &ConfigMapRef,
    datacenter: &str,
    reason: Option<&str>,
    by: &str,
) -> Result<(), String> {
    let key = datacenter_annotation(datacenter);
    let value = reason.map(|r| {
        let r = r.replace(['\n', '\r'], " ");
        format!("{r} (paused by {by} at {})", jiff::Timestamp::now())
    });
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
    let (params, patch) = (
        kube::api::PatchParams::default(),
        kube::api::Patch::Merge(&patch),
    );
    let call = api.patch(&cm.name, &params, &patch);
    match tokio::time::timeout(API_TIMEOUT, call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(format!(
            "the pause ConfigMap {cm} does not exist: create it once (kubectl -n {} create configmap {})",
            cm.namespace, cm.name
        )),
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(format!(
            "the kubeconfig's token may not patch the pause ConfigMap {cm} (apply deploy/rbac.yaml again: Role oobfence-pause): {}",
            s.message
        )),
        Ok(Err(e)) => Err(format!(
            "cannot write the pause ConfigMap {cm}: {}",
            ApiError(&e)
        )),
        Err(_) => Err(format!(
            "writing the pause ConfigMap {cm} took longer than {API_TIMEOUT:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_file_pauses_while_it_exists_and_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dc1.paused");
        assert_eq!(read_file(&path), None);
        write_file(&path, "rack 7 maintenance\nsecond line", "alice").unwrap();
        let said = read_file(&path).unwrap();
        assert!(
            said.contains("rack 7 maintenance second line (paused by alice"),
            "{said}"
        );
        assert!(remove_file(&path).unwrap());
        assert!(!remove_file(&path).unwrap());
        assert_eq!(read_file(&path), None);
        // A directory where the file should be cannot be read: paused, and said so.
        std::fs::create_dir(&path).unwrap();
        assert!(read_file(&path).unwrap().contains("treated as paused"));
    }

    #[test]
    fn the_configmap_annotation_pauses_unless_false() {
        let cm = ConfigMapRef {
            namespace: "oobfence".into(),
            name: "oobfence-pause".into(),
        };
        let with = |v: Option<&str>| {
            let mut c = ConfigMap::default();
            if let Some(v) = v {
                c.metadata.annotations =
                    Some([(ANNOTATION_PAUSED.to_string(), v.to_string())].into());
            }
            configmap_says(&c, &cm, "dc1")
        };
        assert_eq!(with(None), None);
        assert_eq!(with(Some("false")), None);
        assert_eq!(with(Some(" FALSE ")), None);
        assert!(
            with(Some("true"))
                .unwrap()
                .contains("oobfence/oobfence-pause")
        );
        assert!(with(Some("")).is_some(), "present and empty still pauses");
        assert!(with(Some("storm in dc2")).unwrap().contains("storm in dc2"));
    }

    #[test]
    fn a_datacenters_annotation_pauses_that_datacenter_only() {
        let cm = ConfigMapRef {
            namespace: "oobfence".into(),
            name: "oobfence-pause".into(),
        };
        assert_eq!(
            datacenter_annotation("DC_1.east"),
            "oobfence.io/paused-dc-1-east"
        );
        let mut c = ConfigMap::default();
        c.metadata.annotations = Some(
            [
                (datacenter_annotation("dc1"), "rack 7".to_string()),
                (datacenter_annotation("dc3"), "false".to_string()),
            ]
            .into(),
        );
        assert!(
            configmap_says(&c, &cm, "dc1")
                .unwrap()
                .contains("oobfence.io/paused-dc1=\"rack 7\"")
        );
        assert_eq!(configmap_says(&c, &cm, "dc2"), None);
        assert_eq!(configmap_says(&c, &cm, "dc3"), None);
    }
}
