//! The EC2 power source against moto's EC2 emulator (real AWS wire format), a counting proxy
//! for the batching, recorded EC2 replies for what moto cannot produce (stopping,
//! shutting-down, hibernation, throttling, auth failure), and end to end with a real
//! kube-apiserver.
//!
//! This file holds the helpers the tests share (a reader built through the config parser, its
//! reads, the call count scraped); the tests live by family in `tests/ec2/`: reads (against
//! moto), batching, recorded (replies moto cannot produce), end_to_end.

mod support;

#[path = "ec2/actions.rs"]
mod actions;
#[path = "ec2/batching.rs"]
mod batching;
#[path = "ec2/end_to_end.rs"]
mod end_to_end;
#[path = "ec2/reads.rs"]
mod reads;
#[path = "ec2/recorded.rs"]
mod recorded;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, PostParams};

use oobfence::config::{AwsConfig, Config};
use oobfence::identity::{MachineIdentity, NodeIdentity, verify};
use oobfence::power::ec2::{Ec2Reader, Ec2Source, volume_ids};
use oobfence::power::{PowerSource, PowerSources, PowerState, ReadErrorKind, Reply};
use support::k8s::{FakeNode, KubeletIdentity, events_for, volume_attachment, wait_for};
use support::moto::{
    CountingProxy, MotoServer, ZONE, attach_data_volume, client_in, describe_instance, kubelet_of,
    provider_id, run_instances, run_instances_in,
};
use support::scenario::{FIRST_BOOT, Scenario};

fn config(endpoint: &str, timeout: &str) -> Config {
    let text = format!(
        "datacenter = \"t\"\n[aws]\nregion = \"us-east-1\"\nnodes = [\"*\"]\nendpoint_url = \"{endpoint}\"\ntimeout = \"{timeout}\"\n"
    );
    Config::parse(&text, std::path::Path::new("t.toml")).unwrap()
}

fn aws_config(endpoint: &str, timeout: &str) -> AwsConfig {
    config(endpoint, timeout).aws.unwrap()
}

async fn reader(endpoint: &str) -> Arc<Ec2Reader> {
    support::moto::require_test_aws_env();
    Ec2Reader::new(&aws_config(endpoint, "5s"), Default::default()).await
}

async fn read_reply(reader: &Arc<Ec2Reader>, id: &str) -> Reply {
    Ec2Source::new(reader.clone(), id.to_string())
        .read_reply()
        .await
}

async fn read(reader: &Arc<Ec2Reader>, id: &str) -> (PowerState, Vec<oobfence::power::ReadDetail>) {
    let r = read_reply(reader, id).await;
    (r.state, r.details)
}

/// `oobfence_ec2_describe_instances_calls_total` as scraped.
fn describe_instances_calls(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("oobfence_ec2_describe_instances_calls_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no DescribeInstances count in {metrics}"))
}
