//! `check-config --probe` asks the API server whether the daemon's kubeconfig may do what the
//! daemon does with that config: the shipped RBAC passes; an account bound to everything but
//! the pods rule is told what it lacks, unless `release_at_attestation` is off.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, RoleBinding, RoleRef, Subject};

use super::*;

/// A ServiceAccount bound to the shipped Roles and to a copy of the shipped ClusterRole
/// without its pods rule; its kubeconfig, minted by `make-kubeconfig`.
async fn account_without_pods(admin: &Client, dir: &Path, name: &str) -> PathBuf {
    apply_rbac(admin).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "oobfence");
    let account = ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
    let shipped: ClusterRole = Api::all(admin.clone())
        .get("oobfence")
        .await
        .expect("the shipped ClusterRole");
    let rules: Vec<PolicyRule> = shipped
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|r| !r.resources.iter().flatten().any(|r| r == "pods"))
        .collect();
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create the ClusterRole without pods");
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some("oobfence".into()),
        ..Default::default()
    };
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.into(),
        },
        subjects: Some(vec![subject.clone()]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind it");
    for (namespace, role) in [
        ("kube-node-lease", "oobfence"),
        ("default", "oobfence-events"),
        ("oobfence", "oobfence-pause"),
        ("oobfence", "oobfence-guards"),
    ] {
        let binding = RoleBinding {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("{name}-{role}")),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: role.into(),
            },
            subjects: Some(vec![subject.clone()]),
        };
        Api::<RoleBinding>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("bind {namespace}/{role}: {e}"));
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    let out = make_kubeconfig(&path, &["--service-account", name, "--duration", "1h"]).await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pods"),
        "make-kubeconfig names the pods permissions it lacks: {out:?}"
    );
    assert!(path.exists(), "{out:?}");
    path
}

/// Runs `oobfence check-config --probe` on the scenario's config with `kubeconfig`.
async fn probe_with(s: &Scenario, kubeconfig: &Path, policy: &str) -> Output {
    s.set_policy(policy);
    let config = s.write_config(kubeconfig, "127.0.0.1:0");
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--probe", "--config"])
        .env(
            support::cli::DAEMON_USER_ENV.0,
            support::cli::DAEMON_USER_ENV.1,
        )
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run oobfence check-config --probe")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_names_the_permissions_the_kubeconfig_lacks() {
    let admin = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let s = Scenario::without_machines("rbac-probe").await;

    // The shipped RBAC: everything the daemon does is granted.
    let (full, _) = service_account_client(&admin, dir.path()).await;
    let o = probe_with(&s, &full, "").await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        out.contains("permissions: the kubeconfig may do all"),
        "{out}"
    );

    // Bound to all of it but the pods rule: release_at_attestation cannot work.
    let name = unique("nopods");
    let lacking = account_without_pods(&admin, dir.path(), &name).await;
    let o = probe_with(&s, &lacking, "").await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        err.contains("MISSING: list pods (cluster-wide)")
            && err.contains("MISSING: delete pods (cluster-wide)")
            && err.contains("release_at_attestation"),
        "{err}"
    );
    assert_eq!(err.matches("MISSING").count(), 2, "only the pods: {err}");
    assert!(err.contains("rbac.yaml"), "{err}");

    // With release_at_attestation off the daemon needs no pods permission.
    let o = probe_with(&s, &lacking, "release_at_attestation = false\n").await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("permissions: the kubeconfig may do all"),
        "{o:?}"
    );

    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ServiceAccount>::namespaced(admin.clone(), "oobfence")
        .delete(&name, &DeleteParams::default())
        .await;
}

/// The test control plane is 1.20: the probe warns that the out-of-service taint is not acted
/// on there and says what to do, without failing the probe (a gate turned on by hand, or
/// `delete-node`, make it work); with `action = "delete-node"` it does not warn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_says_whether_the_cluster_acts_on_the_taint() {
    let s = Scenario::without_machines("k8s-version").await;
    let admin_kubeconfig = support::k8s::kubeconfig_path();
    let o = probe_with(&s, &admin_kubeconfig, "").await;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let warning = err
        .lines()
        .find(|l| l.starts_with("kubernetes: warning:"))
        .unwrap_or_else(|| panic!("no warning for a 1.20 API server:\n{err}"));
    assert!(
        warning.contains("v1.20") && warning.contains("not acted on before 1.26"),
        "{warning}"
    );
    assert!(
        warning.contains("delete-node"),
        "says what to do: {warning}"
    );

    // --json: the same, in one document.
    let config = s.write_config(&admin_kubeconfig, "127.0.0.1:0");
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--probe", "--json", "--config"])
        .env(
            support::cli::DAEMON_USER_ENV.0,
            support::cli::DAEMON_USER_ENV.1,
        )
        .arg(&config)
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(
        doc["kubernetes"]["out_of_service_acted_on"], false,
        "{doc:#}"
    );
    assert_eq!(doc["kubernetes"]["warning"], true, "{doc:#}");
    assert!(
        doc["kubernetes"]["version"]
            .as_str()
            .unwrap()
            .starts_with("v1.20")
    );
    assert_eq!(
        doc["permissions"]["missing"],
        serde_json::json!([]),
        "{doc:#}"
    );

    let o = probe_with(&s, &admin_kubeconfig, "action = \"delete-node\"\n").await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("kubernetes: warning"),
        "{o:?}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("action delete-node needs no out-of-service"),
        "{o:?}"
    );
}
