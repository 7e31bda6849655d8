//! Fixtures for a real kube-apiserver: a client from `OOBFENCE_TEST_KUBECONFIG`, and Nodes
//! driven by a stand-in kubelet (a Node object plus a Lease in kube-node-lease).
//!
//! This file holds the client and the waits; the stand-in kubelet is in `fake_node`, what
//! tests read off a Node in `node_view`, pods bound to the nodes in `pods`, a daemon run in
//! this process in `running_daemon`.
#![allow(dead_code)]

mod fake_node;
mod node_view;
mod pods;
mod running_daemon;

// Named `support::k8s::…` by the tests; each test binary uses only some of them.
#[allow(unused_imports)]
pub use fake_node::{
    FakeNode, KeepAlive, KubeletIdentity, LEASE_DURATION_SECONDS, TEST_LABEL, keep_taint,
};
#[allow(unused_imports)]
pub use node_view::{
    annotation, events_for, fence_guard_for, ready_condition_of, taints, taints_owner,
    volume_attachment,
};
#[allow(unused_imports)]
pub use pods::{NAMESPACE, bound_pod, force_delete_pod, pods_on, tolerating, with_claim};
#[allow(unused_imports)]
pub use running_daemon::{
    RunningDaemon, hang_under_watch, node_report, scrape, wait_lease_watched, wait_node_report,
    wait_ready,
};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Event, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os("OOBFENCE_TEST_KUBECONFIG") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "OOBFENCE_TEST_KUBECONFIG is not set: run the tests with scripts/test, which starts \
             a local kube-apiserver, or point it at a test cluster's kubeconfig"
        ),
    }
}

pub async fn client() -> Client {
    let path = kubeconfig_path();
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read test kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("test kubeconfig");
    Client::try_from(cfg).expect("client")
}

/// A client whose requests reach the real API server, except that right after each of the first
/// `times` GETs of Node `node` has been answered, another writer changes that Node (a label
/// `competing-writer`): the caller holds a resourceVersion that is already gone, so its
/// preconditioned write meets a real 409 Conflict, every time, not when a race happens to fall
/// that way. `competing_writes` counts what the other writer did.
pub fn client_racing_a_writer(
    client: Client,
    node: &str,
    times: usize,
) -> (Client, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let path = format!("/api/v1/nodes/{node}");
    let competing = Arc::new(AtomicUsize::new(0));
    let counter = competing.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, path, counter) = (client.clone(), path.clone(), counter.clone());
        async move {
            let is_node_get = req.method() == http::Method::GET && req.uri().path() == path;
            let response = client.send(req).await?;
            let n = counter.load(Ordering::SeqCst);
            if is_node_get && response.status().is_success() && n < times {
                let api: Api<Node> = Api::all(client.clone());
                let name = path.rsplit('/').next().unwrap_or_default();
                let patch = json!({"metadata": {"labels": {"competing-writer": n.to_string()}}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                counter.store(n + 1, Ordering::SeqCst);
            }
            Ok::<_, kube::Error>(response)
        }
    });
    (Client::new(service, "default"), competing)
}

/// The value of one series in a Prometheus exposition, `name{labels}` written as the exposition
/// writes it.
/// Asserts that the daemon's metrics count exactly one `power_off` and one `power_on` sent
/// through `backend` (opt-in actuation: one hung node taken down and brought back).
pub fn assert_one_power_off_and_on_sent(metrics: &str, backend: &str) {
    for action in ["power_off", "power_on"] {
        assert_eq!(
            sample(
                metrics,
                &format!(
                    "oobfence_power_actions_total{{action=\"{action}\",result=\"sent\",backend=\"{backend}\"}}"
                )
            ),
            Some(1.0),
            "{metrics}"
        );
    }
}

pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The sum of the values of every series in a Prometheus exposition that starts with `prefix`
/// (`name{` for all of a family's series, `name{first_label="value",` for some).
pub fn sum_of(exposition: &str, prefix: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A unique, DNS-safe name for this test run.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{:x}", std::process::id(), nanos & 0xffffff)
}

/// Polls `check` every 250 ms until it returns Some, or panics after `limit` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Writes a kubeconfig (mode 0600) that `check-config` accepts without reaching any
/// cluster: a context, a cluster at 127.0.0.1:6443, a user with a token that is no JWT.
pub fn write_offline_kubeconfig(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        "apiVersion: v1\nkind: Config\ncurrent-context: dc1\n\
         clusters:\n- name: dc1\n  cluster: {server: \"https://127.0.0.1:6443\"}\n\
         contexts:\n- name: dc1\n  context: {cluster: dc1, user: oobfence}\n\
         users:\n- name: oobfence\n  user: {token: not-a-jwt}\n",
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
