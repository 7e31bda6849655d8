//! A rotated kubeconfig token on the real API server: after the kubeconfig is replaced and the
//! daemon reloaded (SIGHUP), every request carries the new token, so revoking the old one
//! blinds nothing.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use support::k8s::{FakeNode, free_port, kubeconfig_path, sample, unique, wait_for, wait_ready};
use support::scenario::Scenario;

/// A ServiceAccount in "default" bound to cluster-admin (what it may do is not the point
/// here, whose token it is).
async fn account(admin: &Client, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .expect("create the ServiceAccount");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]
            }))
            .unwrap(),
        )
        .await
        .expect("bind the ServiceAccount");
}

/// A token of ServiceAccount `default/name` from the TokenRequest API, as make-kubeconfig
/// mints them.
async fn mint(admin: &Client, name: &str, seconds: i64) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(seconds),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a token")
        .token
}

/// Writes (atomically, as an operator's `install` does) a kubeconfig for the test cluster
/// holding `token` inline.
fn write_kubeconfig(path: &Path, token: &str) {
    let mut kc = kube::config::Kubeconfig::read_from(kubeconfig_path()).expect("test kubeconfig");
    let user = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    for a in &mut kc.auth_infos {
        a.auth_info = Some(user.clone());
    }
    let text = serde_json::to_string(&kc).expect("kubeconfig as JSON");
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A client carrying `token` alone.
async fn client_with(path: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

fn expiry_metric(metrics: &str) -> f64 {
    sample(
        metrics,
        "oobfence_kubeconfig_token_expiry_timestamp_seconds",
    )
    .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotated_by_reload_is_the_one_used_and_the_old_one_can_be_revoked() {
    let s = Scenario::redfish("token", 1).await;
    let (admin, emu) = (s.client.clone(), s.redfish_emulator());
    let old_account = unique("oobfence-old");
    let new_account = unique("oobfence-new");
    account(&admin, &old_account).await;
    account(&admin, &new_account).await;
    let kubeconfig = s.dir().join("dc.kubeconfig");
    write_kubeconfig(&kubeconfig, &mint(&admin, &old_account, 3600).await);

    let node = s.node("a", 0).await;
    let kubelet = FakeNode::keep_alive(&[&node], support::scenario::FIRST_BOOT);
    let listen = format!("127.0.0.1:{}", free_port());
    let config = s.write_config(&kubeconfig, &listen);
    let log = s.dir().join("daemon.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env("OOBFENCE_LOG", oobfence::DEFAULT_LOG_FILTER)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("CREDENTIALS_DIRECTORY")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .expect("start oobfence run");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_ready(&listen, Duration::from_secs(60)).await;
    let before = expiry_metric(&support::k8s::scrape(&listen).await);
    assert!(before > 0.0, "the old token's expiry is reported: {before}");

    let pid = child.id().expect("the daemon runs");
    let hangup = || {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };

    // A token pasted wrong: the API server refuses it, so the reload is refused and the
    // token in use stays.
    write_kubeconfig(&kubeconfig, "not-a-token");
    hangup();
    wait_for("the reload refused", Duration::from_secs(30), || async {
        log_text()
            .lines()
            .any(|l| l.contains("config reload refused") && l.contains("401"))
            .then_some(())
    })
    .await;
    let metrics = support::k8s::scrape(&listen).await;
    assert_eq!(
        expiry_metric(&metrics),
        before,
        "the token in use is still the old one"
    );
    assert_eq!(
        sample(&metrics, "oobfence_config_last_reload_successful"),
        Some(0.0)
    );

    // The rotation, as the runbook says: a new kubeconfig in place, then a reload.
    write_kubeconfig(&kubeconfig, &mint(&admin, &new_account, 7200).await);
    hangup();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = expiry_metric(&support::k8s::scrape(&listen).await);
        if now > before + 1800.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expiry metric never moved to the new token's ({now}, was {before}); log:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The old token is revoked: its account is gone. Its requests now get 401 (the API
    // server may answer from its 10 s token cache a little longer).
    let old_path = s.dir().join("old.kubeconfig");
    write_kubeconfig(&old_path, &mint(&admin, &old_account, 3600).await);
    let old_client = client_with(&old_path).await;
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .delete(&old_account, &DeleteParams::default())
        .await
        .expect("delete the old account");
    wait_for("the old token refused", Duration::from_secs(30), || async {
        match Api::<Node>::all(old_client.clone())
            .list_metadata(&ListParams::default().limit(1))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 401 => Some(()),
            _ => None,
        }
    })
    .await;

    // The daemon still sees and fences: the machine goes off, the node NotReady.
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", Duration::from_secs(30)).await;
    kubelet.stop().await;
    node.die(support::scenario::FIRST_BOOT).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = node.name.clone();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let n = nodes.get(&name).await.expect("read the node");
        if FakeNode::has_oos_taint(&n) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no fence after the old token was revoked; log:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    node.delete().await;
    let _ = Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .delete(&new_account, &DeleteParams::default())
        .await;
    for a in [&old_account, &new_account] {
        let _ = Api::<ClusterRoleBinding>::all(admin.clone())
            .delete(a, &DeleteParams::default())
            .await;
    }
}
