//! What an identity check must not be fooled by:
//! - an operator changes what the daemon reads through while it runs: new `[aws]` credentials
//!   or a new endpoint, taken by `systemctl reload`. The identity binding learnt through the
//!   old reader must not make the new one's "not found" a proof that the instance is gone: a
//!   partitioned node whose instance runs must never be deleted;
//! - a cloned machine: two Nodes report one system UUID, which then proves neither machine.

use std::time::Duration;

use super::support::daemon_process::DaemonProcess;
use super::support::k8s::{FakeNode, events_for, free_port, kubeconfig_path, wait_for};
use super::support::moto::MotoServer;
use super::support::scenario::{FIRST_BOOT, Scenario};
use super::support::{OutputAside, venv_bin};
use super::{
    EVENT_BOUND, Outcome, ScenarioFuture, WriteRecorder, conclude, nodes_of, stays_unfenced,
};

/// What changes under the running daemon.
#[derive(Clone, Copy)]
enum Change {
    /// `[aws] endpoint_url` names another EC2 (an empty one: another account's view).
    Endpoint,
    /// The shared credentials file holds another account's keys.
    Credentials,
    /// The same, with health reads every 10 s: the new reader says "not found" for the
    /// running node first, which proves it wrong before the node fails.
    CredentialsSeenWhileHealthy,
}

pub fn new_aws_endpoint_by_a_reload() -> ScenarioFuture {
    Box::pin(reader_changed_under_a_partitioned_node(Change::Endpoint))
}

pub fn new_aws_credentials_by_a_reload() -> ScenarioFuture {
    Box::pin(reader_changed_under_a_partitioned_node(Change::Credentials))
}

pub fn new_aws_credentials_read_while_the_node_runs() -> ScenarioFuture {
    Box::pin(reader_changed_under_a_partitioned_node(
        Change::CredentialsSeenWhileHealthy,
    ))
}

async fn reader_changed_under_a_partitioned_node(change: Change) -> Outcome {
    let (prefix, name) = match change {
        Change::Endpoint => (
            "fm-endpoint",
            "EC2: [aws] endpoint_url changed by a reload, node partitioned",
        ),
        Change::Credentials => (
            "fm-creds",
            "EC2: another account's credentials by a reload, node partitioned",
        ),
        Change::CredentialsSeenWhileHealthy => (
            "fm-creds-health",
            "EC2: another account's credentials read while the node runs",
        ),
    };
    let s = Scenario::ec2(prefix, 1).await;
    let node = s.node("n", 0).await;
    let rec = WriteRecorder::start(&s.client, &s.group).await;
    let alive = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    if let Change::CredentialsSeenWhileHealthy = change {
        s.set_policy(&format!(
            "{}health_read_interval = \"10s\"\n",
            s.policy_lines()
        ));
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let config = s.write_config(&kubeconfig_path(), &listen);
    // The daemon's credentials come from a file, as on a management host.
    let credentials = s.dir().join("aws-credentials");
    let aws_config = s.dir().join("aws-config");
    std::fs::write(&credentials, keys("testing", "testing", None)).unwrap();
    std::fs::write(&aws_config, "").unwrap();
    let daemon = DaemonProcess::start(
        &config,
        &listen,
        s.dir(),
        &[
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                &credentials.display().to_string(),
            ),
            ("AWS_CONFIG_FILE", &aws_config.display().to_string()),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
        &["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"],
    )
    .await;
    // While the node is healthy, the reader finds its instance: the binding.
    daemon
        .wait_report(&node.name, "identity match", EVENT_BOUND, |r| {
            r["identity"]["verdict"] == "match"
        })
        .await;

    let other_ec2 = match change {
        Change::Endpoint => {
            let other = MotoServer::start().await;
            let text = std::fs::read_to_string(&config)
                .unwrap()
                .replace(&s.moto().endpoint(), &other.endpoint());
            std::fs::write(&config, text).unwrap();
            Some(other)
        }
        Change::Credentials | Change::CredentialsSeenWhileHealthy => {
            let (id, secret, token) = other_account_keys(&s.moto().endpoint());
            std::fs::write(&credentials, keys(&id, &secret, Some(&token))).unwrap();
            None
        }
    };
    daemon.reload().await;

    // The new reader's health read says "not found" while the kubelet lives on: proven wrong,
    // an Event and a problem for the alert, before the node fails.
    let rule = if let Change::CredentialsSeenWhileHealthy = change {
        let problem = format!(
            "oobfence_node_identity_problem{{node=\"{}\",problem=\"gone-while-alive\"}} 1",
            node.name
        );
        wait_for("the gone-while-alive problem", EVENT_BOUND, || async {
            let metrics = reqwest::get(format!("http://{listen}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            metrics.contains(&problem).then_some(())
        })
        .await;
        let events = events_for(&s.client, &node.name).await;
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("OobfencePowerSourceGoneWhileAlive")),
            "no OobfencePowerSourceGoneWhileAlive Event: {events:?}"
        );
        "gone-while-alive"
    } else {
        "reader-changed"
    };

    // A partition: the kubelet goes silent, its instance runs on.
    alive.stop().await;
    node.die(FIRST_BOOT).await;
    let r = daemon
        .wait_report(&node.name, &format!("rule {rule}"), EVENT_BOUND, |r| {
            r["rule"] == rule
        })
        .await;
    let reason = r["reason"].as_str().unwrap_or_default().to_string();
    stays_unfenced(&node, Duration::from_secs(3)).await;
    assert!(
        node.try_get().await.is_some(),
        "{} was deleted: {reason}",
        node.name
    );
    daemon.stop().await;
    drop(other_ec2);
    let seen = rec.writes_once_seen(&[]).await;
    node.delete().await;
    Outcome {
        name,
        expected: Vec::new(),
        seen,
    }
}

/// A shared credentials file with one `[default]` profile.
fn keys(id: &str, secret: &str, token: Option<&str>) -> String {
    let mut text =
        format!("[default]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n");
    if let Some(t) = token {
        text.push_str(&format!("aws_session_token = {t}\n"));
    }
    text
}

/// Keys of another account (111111111111) from moto's STS AssumeRole: moto answers every
/// EC2 call signed with them from that account, which runs no instance.
fn other_account_keys(endpoint: &str) -> (String, String, String) {
    let script = format!(
        "import boto3\n\
         c = boto3.client('sts', endpoint_url='{endpoint}', region_name='us-east-1').assume_role(\n\
             RoleArn='arn:aws:iam::111111111111:role/other-account', RoleSessionName='oobfence-test')\n\
         k = c['Credentials']\n\
         print(k['AccessKeyId'], k['SecretAccessKey'], k['SessionToken'])\n"
    );
    let out = std::process::Command::new(venv_bin("python"))
        .args(["-c", &script])
        .output_aside()
        .expect("run the venv's python");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert!(
        out.status.success() && parts.len() == 3,
        "AssumeRole on moto failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    (parts[0].into(), parts[1].into(), parts[2].into())
}

/// Node `a` runs on Redfish system 0; node `clone` (a VM cloned from it, Ready, on no BMC oobfence
/// reads) reports the same system UUID. `a` dies and its machine reads Off: the UUID proves
/// nothing, so `a` is not fenced, and says why.
pub fn a_cloned_system_uuid_proves_no_machine() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-clone", 1).await;
        let a = s.node("a", 0).await;
        let clone = s
            .node_reporting("clone", FIRST_BOOT, s.identity(0).await)
            .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let alive = FakeNode::keep_alive(&[&a, &clone], FIRST_BOOT);
        let daemon = s.daemon().await;
        let emu = s.redfish_emulator();
        emu.set_power(0, false).await;
        emu.wait_power(0, "Off", EVENT_BOUND).await;
        alive.stop().await;
        let alive = FakeNode::keep_alive(&[&clone], FIRST_BOOT);
        a.die(FIRST_BOOT).await;
        let r = daemon
            .wait_rule(&a.name, "duplicate-system-uuid", EVENT_BOUND)
            .await;
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or_default()
                .contains(&clone.name),
            "{r:#}"
        );
        assert_eq!(
            r["identity"]["uuid_shared_with"][0],
            clone.name.as_str(),
            "{r:#}"
        );
        stays_unfenced(&a, Duration::from_secs(3)).await;
        let events = events_for(&s.client, &a.name).await;
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("OobfenceDuplicateSystemUUID")),
            "no OobfenceDuplicateSystemUUID Event on {}: {events:?}",
            a.name
        );
        let problem = format!(
            "oobfence_node_identity_problem{{node=\"{}\",problem=\"duplicate-system-uuid\"}} 1",
            a.name
        );
        assert!(daemon.metrics().await.contains(&problem), "{problem}");
        alive.stop().await;
        conclude(
            "a system UUID two Nodes report (a cloned VM)",
            Vec::new(),
            daemon,
            &rec,
            &nodes_of([&a, &clone]),
        )
        .await
    })
}
