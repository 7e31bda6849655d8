//! The OCI image, built by scripts/build-image (what scripts/build-packages runs) from the
//! binary under test, run once by podman with the packaged example config against the test
//! control plane: host network, the test kubeconfig and a credential mounted where the image
//! reads them. It must start, read the cluster (the report of a Node of the test's own) and
//! serve /metrics with Cargo.toml's version.
//!
//! Skipped, saying so, only where podman is not installed at all and CI is not set: CI installs
//! it (scripts/install-deps), and there a missing podman fails the test.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use super::{VERSION, read, repo};
use crate::support::k8s::{
    FakeNode, TEST_LABEL, client, free_port, kubeconfig_path, node_report, scrape, unique,
};
use crate::support::{OutputAside as _, SERVER_START_BOUND};

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output_aside()
        .expect("run podman")
}

fn must(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The container and the image, removed however the test ends.
struct Cleanup {
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time", "5", &self.container])
            .output();
        let _ = Command::new("podman")
            .args(["rmi", "--force", &self.image])
            .output();
    }
}

/// `path` readable by the container's user (65532), as a management host's files would be to
/// the daemon's.
fn open_to_all(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_the_example_config_against_the_cluster() {
    if !on_path("podman") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "podman is not installed, and CI must run the image: scripts/install-deps installs it"
        );
        eprintln!(
            "SKIPPED the_image_runs_the_example_config_against_the_cluster: podman is not installed (Debian: apt install podman buildah runc, as scripts/install-deps does)"
        );
        return;
    }
    let id = unique("img");
    let image = format!("localhost/oobfence-test:{id}");
    let container = format!("oobfence-test-{id}");
    let _cleanup = Cleanup {
        container: container.clone(),
        image: image.clone(),
    };

    let tmp = tempfile::tempdir().unwrap();
    open_to_all(tmp.path(), 0o755);
    let built = Command::new(repo("scripts/build-image"))
        .arg(env!("CARGO_BIN_EXE_oobfence"))
        .arg(tmp.path().join("out"))
        .env("OOBFENCE_IMAGE_NAME", &image)
        .output_aside()
        .expect("run scripts/build-image");
    must("scripts/build-image", built);
    let archive = tmp
        .path()
        .join(format!("out/oobfence-{VERSION}-x86_64-oci.tar"));
    assert!(archive.exists(), "no {}", archive.display());

    // The example as shipped, but for its own port on the host network and only the test's
    // Node (a label of its own), under a datacenter name of its own.
    let port = free_port();
    let group = unique("image");
    let node_name = format!("rack1-{group}");
    let example = read("packaging/example.toml");
    let config = example
        .replace("datacenter = \"dc1\"", &format!("datacenter = \"{group}\""))
        .replace("127.0.0.1:9464", &format!("127.0.0.1:{port}"))
        .replace(
            "# node_selector = \"topology.kubernetes.io/zone=dc1\"",
            &format!("node_selector = \"{TEST_LABEL}={group}\""),
        );
    assert_ne!(config, example, "the example's lines this test changes");
    assert!(config.contains(&format!("node_selector = \"{TEST_LABEL}={group}\"")));
    let config_file = tmp.path().join("oobfence.toml");
    std::fs::write(&config_file, config).unwrap();
    open_to_all(&config_file, 0o644);
    let kubeconfig = tmp.path().join("dc1.kubeconfig");
    std::fs::copy(kubeconfig_path(), &kubeconfig).unwrap();
    open_to_all(&kubeconfig, 0o644);
    let creds = tmp.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    open_to_all(&creds, 0o755);
    std::fs::write(creds.join("rack1"), "not-a-real-bmc-password\n").unwrap();
    open_to_all(&creds.join("rack1"), 0o644);

    // The journal's directory, the daemon's own (as the Deployment's volume is, by fsGroup).
    let journal = tmp.path().join("journal");
    std::fs::create_dir(&journal).unwrap();
    std::os::unix::fs::chown(&journal, Some(65532), Some(65532))
        .expect("chown the journal's directory to 65532 (the tests run as root)");

    let client = client().await;
    let node = FakeNode::create(&client, &node_name, &group, "boot-1").await;

    let mount = |from: &Path, to: &str| format!("{}:{to}:ro", from.display());
    let mut run: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--name".into(),
        container.clone(),
    ];
    // crun refuses hosts whose cgroups are half v1, half v2; runc runs there too. The limits
    // are the host's at most: podman's defaults are above what a container host may grant.
    if on_path("runc") {
        run.extend(["--runtime".into(), "runc".into()]);
    }
    // As deploy/management-cluster runs it: a read-only root, no capabilities, no new
    // privileges, the journal's directory the only one written.
    run.extend(
        [
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
            "--network",
            "host",
            "--volume",
        ]
        .map(String::from),
    );
    run.push(mount(&config_file, "/etc/oobfence/oobfence.toml"));
    run.push("--volume".into());
    run.push(mount(&kubeconfig, "/etc/oobfence/dc1.kubeconfig"));
    run.push("--volume".into());
    run.push(mount(&creds, "/etc/oobfence/credentials"));
    run.push("--volume".into());
    run.push(format!("{}:/var/lib/oobfence:rw", journal.display()));
    run.push(format!("oci-archive:{}", archive.display()));
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    must("podman run", podman(&run));

    let listen = format!("127.0.0.1:{port}");
    let logs = || String::from_utf8_lossy(&podman(&["logs", &container]).stderr).into_owned();
    // Bounded in time (and so in count: one try every 250 ms); the log is shown on a timeout.
    let deadline = std::time::Instant::now() + SERVER_START_BOUND;
    let report = loop {
        if let Some(r) = node_report(&listen, &node_name).await {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the image's daemon did not report {node_name} within {SERVER_START_BOUND:?}; its log:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        report["state"], "healthy",
        "the test's Node, Ready: {report}"
    );

    let metrics = scrape(&listen).await;
    assert!(
        metrics.contains(&format!("oobfence_build_info{{version=\"{VERSION}\"}} 1")),
        "/metrics names Cargo.toml's version {VERSION}: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("oobfence_build_info"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics.contains("oobfence_nodes_watched 1"),
        "the image's daemon watches the one Node its selector names; its log:\n{}",
        logs()
    );
    // It runs as the image's user, not root.
    let user = must(
        "podman inspect",
        podman(&["inspect", "--format", "{{.Config.User}}", &container]),
    );
    assert_eq!(user.trim(), "65532:65532");
    let log = logs();
    assert!(
        !log.contains("not-a-real-bmc-password"),
        "the credential stays out of the log:\n{log}"
    );

    // The daemon writes its journal there, through the read-only root: the file exists.
    let journal_file = journal.join(format!("{group}.journal.jsonl"));
    let deadline = std::time::Instant::now() + SERVER_START_BOUND;
    while !journal_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no journal at {} within {SERVER_START_BOUND:?}; its log:\n{}",
            journal_file.display(),
            logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    node.delete().await;
}
