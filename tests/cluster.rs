//! End to end against a real kube-apiserver (OOBFENCE_TEST_KUBECONFIG) and a real Redfish
//! emulator (sushy-tools): Nodes go NotReady, BMCs say Off or On, and oobfence must fence,
//! refuse, or unfence exactly as its rules say.
//!
//! This file holds what the tests share; they live by family in `tests/cluster/`: fencing
//! (the daemon fences, acts and unfences), refusals (it must not), writes (the Node writes
//! themselves: conflicts, re-checks, VolumeAttachments), release (a node proven off has its
//! pods force-deleted, `release_at_attestation`), drill (the fire drill on a real node),
//! confirmation (a person's word that a node's machine is off).

mod support;

#[path = "cluster/actuation.rs"]
mod actuation;
#[path = "cluster/confirmation.rs"]
mod confirmation;
#[path = "cluster/drill.rs"]
mod drill;
#[path = "cluster/fencing.rs"]
mod fencing;
#[path = "cluster/refusals.rs"]
mod refusals;
#[path = "cluster/release.rs"]
mod release;
#[path = "cluster/writes.rs"]
mod writes;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use oobfence::cluster::{self, Cluster, ClusterError, RecordedAttachment};
use oobfence::decision::{GuardPurpose, WriteGuard};
use support::k8s::{
    FakeNode, KubeletIdentity, TEST_LABEL, annotation, events_for, keep_taint, sample, taints,
    taints_owner, unique, volume_attachment, wait_for,
};
use support::scenario::{FIRST_BOOT, Scenario, UNREACHABLE_BMC_PASSWORD};

const POWER_CHANGE: Duration = Duration::from_secs(30);
// Generous: a loaded 2-core machine has been seen to take over 45 s for a decision these tests
// expect in seconds; a wait that times out shows the daemon's last report (wait_fenced).
const DECISION: Duration = Duration::from_secs(90);

async fn node_has(client: &Client, name: &str, pred: impl Fn(&Node) -> bool) -> Option<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let n = api.get(name).await.ok()?;
    pred(&n).then_some(n)
}
