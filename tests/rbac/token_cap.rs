//! `make-kubeconfig` against an API server that caps token lifetimes: the test control plane
//! runs with `--service-account-max-token-expiration 48h` (scripts/test-cluster), as hardened
//! clusters do, so the year asked for by default comes back as two days.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_kubeconfig_says_when_the_api_server_issued_a_shorter_token_than_asked() {
    let admin = support::k8s::client().await;
    apply_rbac(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let out = make_kubeconfig(&dir.path().join("dc1.kubeconfig"), &["--duration", "8760h"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let warning = stderr
        .lines()
        .find(|l| l.contains("warning: asked for a token valid"))
        .unwrap_or_else(|| panic!("no warning for a token shortened to 48h:\n{stderr}"));
    assert!(
        warning.contains("valid 8760h") && warning.contains("issued one valid 48h"),
        "{warning}"
    );
    assert!(
        warning.contains("max-token-expiration") && warning.contains("systemctl reload"),
        "says why and what rotation needs: {warning}"
    );
}
