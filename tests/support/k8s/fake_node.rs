//! The stand-in kubelet: a Node registered with its Lease, its status and heartbeats written
//! as a kubelet would, and the identity it reports.

use super::*;

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
