//! deploy/management-cluster: `kubectl kustomize` builds it, the test API server accepts every
//! object in a server-side dry run (in a namespace of the test's own), and what it runs is
//! what the image and the config need: one replica that never overlaps another, the
//! workload cluster's kubeconfig from a Secret, the config (which check-config passes) from the
//! generated ConfigMap, the credentials where the image looks, a Service on the metrics port.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::{VERSION, read, repo};
use crate::support::k8s::{kubeconfig_path, unique, write_offline_kubeconfig};

/// kubectl 1.20, built beside the test API server by scripts/build-test-apiserver (its
/// `kubectl kustomize` is the oldest an operator may have): $OOBFENCE_KUBECTL, else the cache.
fn kubectl() -> PathBuf {
    if let Some(k) = std::env::var_os("OOBFENCE_KUBECTL") {
        return PathBuf::from(k);
    }
    let cache = std::env::var_os("OOBFENCE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| PathBuf::from(c).join("oobfence")))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/oobfence")
        });
    let k = cache.join("k8s-1.20/bin/kubectl");
    assert!(
        k.exists(),
        "no kubectl at {}: run scripts/build-test-apiserver (scripts/install-deps does), or set OOBFENCE_KUBECTL",
        k.display()
    );
    k
}

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(kubectl())
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).unwrap();
    }
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Deletes the test's namespace however the test ends.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new(kubectl())
            .args(["delete", "namespace", &self.0, "--wait=false"])
            .env("KUBECONFIG", kubeconfig_path())
            .output();
    }
}

fn item<'a>(items: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = items.iter().filter(|i| i["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/management-cluster");
    found[0]
}

#[test]
fn the_management_cluster_manifests_build_and_the_api_server_accepts_them() {
    let dir = repo("deploy/management-cluster");
    let built = run(&["kustomize", dir.to_str().unwrap()], None);
    let yaml = String::from_utf8(built.stdout).unwrap();
    assert!(
        yaml.lines().any(|l| l == "  namespace: oobfence"),
        "kustomization.yaml puts everything in the namespace oobfence"
    );

    let ns = Namespace(unique("deploy"));
    run(&["create", "namespace", &ns.0], None);
    let ours = yaml.replace(
        "  namespace: oobfence\n",
        &format!("  namespace: {}\n", ns.0),
    );
    let answer = run(
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&ours),
    );
    let answer: Value = serde_json::from_slice(&answer.stdout).expect("kubectl's JSON");
    let items = answer["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![answer.clone()]);
    let mut kinds: Vec<&str> = items.iter().filter_map(|i| i["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Deployment",
            "PersistentVolumeClaim",
            "Secret",
            "Service",
            "ServiceAccount"
        ],
        "what the server accepted"
    );

    let deployment = item(&items, "Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 1, "one actor per datacenter");
    assert_eq!(
        spec["strategy"]["type"], "Recreate",
        "a rollout never runs two at once"
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!("registry.example.org/oobfence:{VERSION}")
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let mounts: Vec<(&str, &str)> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    for (name, path) in [
        ("config", "/etc/oobfence/config"),
        ("kubeconfig", "/etc/oobfence/kubeconfig"),
        // The image's $CREDENTIALS_DIRECTORY.
        ("credentials", "/etc/oobfence/credentials"),
        ("journal", "/var/lib/oobfence"),
    ] {
        assert!(
            mounts.contains(&(name, path)),
            "{name} at {path}: {mounts:?}"
        );
    }
    let volume = |name: &str| -> Value {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    assert_eq!(
        volume("kubeconfig")["secret"]["secretName"],
        "oobfence-dc1-kubeconfig",
        "the workload cluster's kubeconfig is a Secret the operator makes"
    );
    assert_eq!(
        volume("credentials")["secret"]["secretName"],
        item(&items, "Secret")["metadata"]["name"]
    );
    let configmap = item(&items, "ConfigMap");
    assert_eq!(
        volume("config")["configMap"]["name"],
        configmap["metadata"]["name"],
        "the Deployment names the generated ConfigMap"
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--config", "/etc/oobfence/config/oobfence.toml"]),
        "{args:?}"
    );

    let service = item(&items, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 9464);
    let labels = &spec["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service selects the pod by {k}");
    }

    // The config the pod reads passes check-config, with the kubeconfig and the credential it
    // names (a copy, their paths this test's own).
    let toml = configmap["data"]["oobfence.toml"].as_str().unwrap();
    assert!(toml.contains("kubeconfig = \"/etc/oobfence/kubeconfig/kubeconfig\""));
    let tmp = tempfile::tempdir().unwrap();
    write_offline_kubeconfig(&tmp.path().join("kubeconfig"));
    let creds = tmp.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    for key in item(&items, "Secret")["data"].as_object().unwrap().keys() {
        let f = creds.join(key);
        std::fs::write(&f, "pw\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let config = tmp.path().join("oobfence.toml");
    std::fs::write(
        &config,
        toml.replace(
            "/etc/oobfence/kubeconfig/kubeconfig",
            tmp.path().join("kubeconfig").to_str().unwrap(),
        ),
    )
    .unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["check-config", "--config", config.to_str().unwrap()])
        .env(
            crate::support::cli::DAEMON_USER_ENV.0,
            crate::support::cli::DAEMON_USER_ENV.1,
        )
        .env("CREDENTIALS_DIRECTORY", &creds)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "check-config on the ConfigMap's config: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// The pod's config is the packaged example with the pod's paths: what is said of one holds
/// for the other.
#[test]
fn the_pods_config_is_the_packaged_example_with_the_pods_paths() {
    let settings = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let example = settings(&read("packaging/example.toml"));
    let pod = settings(&read("deploy/management-cluster/oobfence.toml"));
    let expected: Vec<String> = example
        .iter()
        .map(|l| match l.as_str() {
            "kubeconfig = \"/etc/oobfence/dc1.kubeconfig\"" => {
                "kubeconfig = \"/etc/oobfence/kubeconfig/kubeconfig\"".to_string()
            }
            "listen = \"127.0.0.1:9464\"" => "listen = \"0.0.0.0:9464\"".to_string(),
            other => other.to_string(),
        })
        .collect();
    assert_eq!(
        pod, expected,
        "deploy/management-cluster/oobfence.toml is packaging/example.toml but for the kubeconfig path and the listen address"
    );
}
