//! Fixtures for a real kube-apiserver: a client from `OOBFENCE_TEST_KUBECONFIG`, and Nodes
//! driven by a stand-in kubelet (a Node object plus a Lease in kube-node-lease).
#![allow(dead_code)]

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

/// Label every test node carries so one test's daemon watches only its own nodes.
pub const TEST_LABEL: &str = "oobfence.test/run";

/// A test taint that must survive every oobfence write.
pub fn keep_taint() -> Taint {
    Taint {
        key: "example.com/keep".into(),
        value: Some("yes".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

#[derive(Clone)]
pub struct FakeNode {
    pub client: Client,
    pub name: String,
    /// What this stand-in kubelet reports about its machine.
    pub identity: KubeletIdentity,
}

/// What a kubelet reports about its machine: `status.nodeInfo.systemUUID` (the SMBIOS UUID it
/// reads) and its addresses. The stand-ins report the emulators' identities, so the daemon
/// checks them exactly as on real machines.
#[derive(Clone, Debug, Default)]
pub struct KubeletIdentity {
    pub system_uuid: String,
    pub internal_ip: Option<String>,
    pub hostname: Option<String>,
}

impl KubeletIdentity {
    /// A machine known by its system UUID (Redfish, IPMI).
    pub fn uuid(uuid: &str) -> KubeletIdentity {
        KubeletIdentity {
            system_uuid: uuid.into(),
            ..Default::default()
        }
    }

    /// An EC2 instance known by its private IP and private DNS name.
    pub fn instance(private_ip: &str, private_dns: &str) -> KubeletIdentity {
        KubeletIdentity {
            system_uuid: "ec2a0000-0000-0000-0000-000000000000".into(),
            internal_ip: Some(private_ip.into()),
            hostname: Some(private_dns.into()),
        }
    }
}

fn ready_condition(status: &str, since: Timestamp, now: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(
            if status == "True" {
                "KubeletReady"
            } else {
                "KubeletNotReady"
            }
            .into(),
        ),
        message: Some("set by the oobfence test kubelet".into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(since)),
    }
}

/// The stand-in kubelets' `leaseDurationSeconds`: matched to the test control plane's 20 s
/// node-monitor grace, as an operator who shortens one shortens the other (a real kubelet's
/// 40 s default matches the controller-manager's 40 s). A kubelet renews every quarter of it.
pub const LEASE_DURATION_SECONDS: i32 = 20;

impl FakeNode {
    /// Registers a Ready node with a Lease, labelled `TEST_LABEL=group`, whose kubelet reports
    /// no usable machine identity (its Off reads never count unless `identity = "unchecked"`).
    pub async fn create(client: &Client, name: &str, group: &str, boot_id: &str) -> FakeNode {
        FakeNode::create_as(client, name, group, boot_id, KubeletIdentity::default()).await
    }

    /// Registers a Ready node whose kubelet reports `identity`.
    pub async fn create_as(
        client: &Client,
        name: &str,
        group: &str,
        boot_id: &str,
        identity: KubeletIdentity,
    ) -> FakeNode {
        let now = Timestamp::now();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(TEST_LABEL.to_string(), group.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![keep_taint()]),
                ..Default::default()
            }),
            status: None,
        };
        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        let n = FakeNode {
            client: client.clone(),
            name: name.into(),
            identity,
        };
        n.set_status("True", now, boot_id).await;
        n.renew_lease().await;
        n
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub async fn get(&self) -> Node {
        self.nodes().get(&self.name).await.expect("get node")
    }

    pub async fn try_get(&self) -> Option<Node> {
        self.nodes().get_opt(&self.name).await.expect("get node")
    }

    /// Posts the Ready condition and bootID through the status subresource, as a kubelet does.
    pub async fn set_status(&self, ready: &str, since: Timestamp, boot_id: &str) {
        let mut addresses = Vec::new();
        if let Some(ip) = &self.identity.internal_ip {
            addresses.push(NodeAddress {
                type_: "InternalIP".into(),
                address: ip.clone(),
            });
        }
        if let Some(h) = &self.identity.hostname {
            addresses.push(NodeAddress {
                type_: "Hostname".into(),
                address: h.clone(),
            });
        }
        let system_uuid = if self.identity.system_uuid.is_empty() {
            "test".to_string()
        } else {
            self.identity.system_uuid.clone()
        };
        let status = NodeStatus {
            conditions: Some(vec![ready_condition(ready, since, Timestamp::now())]),
            addresses: (!addresses.is_empty()).then_some(addresses),
            node_info: Some(NodeSystemInfo {
                boot_id: boot_id.into(),
                machine_id: "test".into(),
                system_uuid,
                kernel_version: "test".into(),
                os_image: "test".into(),
                container_runtime_version: "test".into(),
                kubelet_version: "v1.20.2".into(),
                kube_proxy_version: "v1.20.2".into(),
                operating_system: "linux".into(),
                architecture: "amd64".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.nodes()
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .expect("patch node status");
    }

    pub async fn renew_lease(&self) {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let spec = LeaseSpec {
            holder_identity: Some(self.name.clone()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        };
        match leases.get_opt(&self.name).await.expect("get lease") {
            Some(_) => {
                leases
                    .patch(
                        &self.name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "spec": spec })),
                    )
                    .await
                    .expect("renew lease");
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some("kube-node-lease".into()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .expect("create lease");
            }
        }
    }

    /// The Lease's renewTime as the kubelet last wrote it.
    pub async fn lease_renew_time(&self) -> Option<Timestamp> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let lease = leases.get_opt(&self.name).await.ok().flatten()?;
        lease.spec?.renew_time.map(|t| t.0)
    }

    /// A kubelet heartbeat: Ready=True, keeping the transition time while it stays Ready.
    pub async fn heartbeat(&self, boot_id: &str) {
        let node = self.get().await;
        let since = ready_condition_of(&node)
            .filter(|c| c.status == "True")
            .and_then(|c| c.last_transition_time.map(|t| t.0))
            .unwrap_or_else(Timestamp::now);
        self.set_status("True", since, boot_id).await;
    }

    /// Keeps these nodes' kubelets alive (Lease and Ready status every 5 s, as `boot_id`) until
    /// the handle is dropped: the test cluster's controller marks a node that stays silent for
    /// 20 s NotReady. Bounded at 15 minutes.
    pub fn keep_alive(nodes: &[&FakeNode], boot_id: &str) -> KeepAlive {
        let nodes: Vec<FakeNode> = nodes.iter().map(|n| (*n).clone()).collect();
        let boot_id = boot_id.to_string();
        KeepAlive(tokio::spawn(async move {
            for _ in 0..180 {
                for n in &nodes {
                    n.renew_lease().await;
                    n.heartbeat(&boot_id).await;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }))
    }

    /// The machine died: the kubelet's last words were NotReady, and the Lease stops.
    pub async fn die(&self, boot_id: &str) {
        self.set_status("False", Timestamp::now(), boot_id).await;
    }

    /// The machine came back: Ready with a (new) bootID and a fresh Lease.
    pub async fn come_back(&self, boot_id: &str) {
        self.renew_lease().await;
        self.set_status("True", Timestamp::now(), boot_id).await;
    }

    /// Sets `spec.providerID`, as the kubelet or a cloud controller does (`aws:///ZONE/ID`).
    pub async fn set_provider_id(&self, provider_id: &str) {
        self.nodes()
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
            )
            .await
            .expect("set the node's providerID");
    }

    pub fn has_oos_taint(node: &Node) -> bool {
        taints(node)
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service")
    }

    pub async fn delete(&self) {
        let _ = self
            .nodes()
            .delete(&self.name, &DeleteParams::default())
            .await;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let _ = leases.delete(&self.name, &DeleteParams::default()).await;
    }
}

/// The field manager that owns a Node's `spec.taints` (an atomic list: its last writer), from
/// the object's managedFields; the API server names it after the writer's User-Agent.
pub fn taints_owner(n: &Node) -> Option<String> {
    n.managed_fields().iter().find_map(|m| {
        let fields = &m.fields_v1.as_ref()?.0;
        fields.get("f:spec")?.get("f:taints").and(m.manager.clone())
    })
}

pub fn ready_condition_of(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned()
}

pub fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

pub fn annotation(node: &Node, key: &str) -> Option<String> {
    node.annotations().get(key).cloned()
}

/// A VolumeAttachment of persistent volume `pv` to `node`, by `attacher` (a CSI driver).
pub fn volume_attachment(name: &str, node: &str, attacher: &str, pv: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: attacher.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.into()),
                ..Default::default()
            },
        },
        status: None,
    }
}

/// Events oobfence emitted about a node, by reason.
pub async fn events_for(client: &Client, node: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default().fields(&format!("involvedObject.name={node}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("oobfence"))
        .collect()
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

/// The `/nodes/NODE` report of the daemon serving HTTP on `listen`.
pub async fn node_report(listen: &str, node: &str) -> Option<serde_json::Value> {
    let r = reqwest::get(format!("http://{listen}/nodes/{node}"))
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Waits until the report of `node` from the daemon serving HTTP on `listen` satisfies
/// `reached`; on a timeout the panic shows the last report and `more` (a daemon's log).
pub async fn wait_node_report(
    listen: &str,
    node: &str,
    what: &str,
    limit: Duration,
    reached: impl Fn(&serde_json::Value) -> bool,
    more: impl Fn() -> String,
) -> serde_json::Value {
    let mut last = None;
    let start = Instant::now();
    loop {
        if let Some(r) = node_report(listen, node).await {
            if reached(&r) {
                return r;
            }
            last = Some(r);
        }
        if start.elapsed() > limit {
            panic!(
                "node {node} never reached {what} within {limit:?}; last report: {last:#?}{}",
                more()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An oobfence daemon running in this process against the test cluster.
/// Heartbeats of [`FakeNode::keep_alive`]; they stop when this is dropped.
pub struct KeepAlive(tokio::task::JoinHandle<()>);

impl KeepAlive {
    /// Stops the heartbeats and waits until none is left in flight, so that what the test
    /// writes next (a NotReady status) is not overwritten by a late one.
    pub async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub struct RunningDaemon {
    pub listen: String,
    pub config_path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// The `/metrics` text of the daemon serving HTTP on `listen`.
pub async fn scrape(listen: &str) -> String {
    reqwest::get(format!("http://{listen}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap()
}

/// Waits until the daemon serving HTTP on `listen` answers `/readyz` with success.
pub async fn wait_ready(listen: &str, limit: Duration) {
    let url = format!("http://{listen}/readyz");
    wait_for("daemon /readyz", limit, || async {
        match reqwest::get(&url).await {
            Ok(r) if r.status().is_success() => Some(()),
            _ => None,
        }
    })
    .await;
}

impl RunningDaemon {
    /// Starts a daemon from config text; `{kubeconfig}`, `{listen}` are filled in here.
    pub async fn start(config_text: &str, dir: tempfile::TempDir) -> RunningDaemon {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut text = config_text
            .replace("{kubeconfig}", &kubeconfig_path().display().to_string())
            .replace("{listen}", &listen);
        if !text.contains("[journal]") {
            // Each test's journal stays in its own directory.
            text.push_str(&format!(
                "\n[journal]\npath = \"{}\"\n",
                dir.path().join("journal.jsonl").display()
            ));
        }
        let config_path = dir.path().join("dc.toml");
        std::fs::write(&config_path, &text).unwrap();
        let cfg = oobfence::config::Config::load(&config_path).expect("test config is valid");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            oobfence::daemon::run(cfg, async {
                let _ = rx.await;
            })
            .await
            .expect("daemon runs");
        });
        let d = RunningDaemon {
            listen,
            config_path,
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
        };
        wait_ready(&d.listen, Duration::from_secs(30)).await;
        d
    }

    pub async fn report(&self, node: &str) -> Option<serde_json::Value> {
        node_report(&self.listen, node).await
    }

    pub async fn metrics(&self) -> String {
        scrape(&self.listen).await
    }

    /// Waits until the daemon's report for `node` has `rule`.
    pub async fn wait_rule(&self, node: &str, rule: &str, limit: Duration) -> serde_json::Value {
        self.wait_report(node, &format!("rule {rule}"), limit, |r| r["rule"] == rule)
            .await
    }

    /// Waits until the daemon's report for `node` shows a fence; on a timeout the panic shows
    /// the last report, which says why not.
    pub async fn wait_fenced(&self, node: &str, limit: Duration) -> serde_json::Value {
        self.wait_report(node, "a fence", limit, |r| !r["fence"].is_null())
            .await
    }

    /// Waits until the daemon's report for `node` has the identity verdict `verdict`
    /// (`match`, `mismatch`, ...).
    pub async fn wait_identity(
        &self,
        node: &str,
        verdict: &str,
        limit: Duration,
    ) -> serde_json::Value {
        let what = format!("identity verdict {verdict}");
        self.wait_report(node, &what, limit, |r| r["identity"]["verdict"] == verdict)
            .await
    }

    async fn wait_report(
        &self,
        node: &str,
        what: &str,
        limit: Duration,
        reached: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_node_report(&self.listen, node, what, limit, reached, String::new).await
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// What a fence decision about `node`, as it is now, would carry: its uid, bootID and Lease
/// renewTime, and an Off read taken just now.
pub async fn fence_guard_for(client: &Client, node: &Node) -> oobfence::decision::WriteGuard {
    let leases: Api<Lease> =
        Api::namespaced(client.clone(), oobfence::cluster::NODE_LEASE_NAMESPACE);
    let lease = leases.get_opt(&node.name_any()).await.unwrap();
    oobfence::decision::WriteGuard {
        purpose: oobfence::decision::GuardPurpose::Fence,
        uid: node.uid().unwrap(),
        boot_id: oobfence::cluster::boot_id(node),
        lease_renew_time: lease.as_ref().and_then(oobfence::cluster::lease_renewed),
        evidence_at: jiff::Timestamp::now(),
        read_max_age: Duration::from_secs(30),
    }
}
