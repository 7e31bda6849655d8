//! The `[ha]` elector on the real API server: one leader at a time, a takeover only after the
//! lease has run out by the new leader's own clock, and a leader that cannot renew stops
//! writing by its own clock first.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

use oobfence::config::HaConfig;
use oobfence::leader;

fn ha(identity: &str, namespace: &str) -> HaConfig {
    HaConfig {
        namespace: namespace.into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(9),
        renew_interval: Duration::from_secs(1),
    }
}

async fn wait_until(what: &str, limit: Duration, check: impl Fn() -> bool) -> Instant {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} not within {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_a_takeover_only_after_the_lease_ran_out() {
    let client = support::k8s::client().await;
    let ns = support::k8s::unique("ha");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let a = leader::spawn(client.clone(), &ha("a", &ns), "dc1");
    wait_until("a leads", Duration::from_secs(10), || {
        a.read().unwrap().may_write()
    })
    .await;
    let b = leader::spawn(client.clone(), &ha("b", &ns), "dc1");
    // For 3 s: never two writers, and b follows a.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        let (wa, wb) = (a.read().unwrap().may_write(), b.read().unwrap().may_write());
        assert!(!(wa && wb), "two writers at once");
        assert!(!wb, "b writes while a holds the Lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(b.read().unwrap().holder.as_deref(), Some("a"));
    let term = a.read().unwrap().term;
    // a stops (its elector ends with the last handle): b takes over once it has seen the
    // Lease unrenewed for the whole lease duration, not before.
    // The measure is a's last renewal as the Lease records it (a round in flight when a stops
    // may still land one), on this host's clock like b's.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease_name = ha("a", &ns).lease_name("dc1");
    let stopped = Instant::now();
    drop(a);
    let mut last_renewal_by_a = None;
    let (took, since_stopped) = loop {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "b never took over"
        );
        if b.read().unwrap().may_write() {
            break (jiff::Timestamp::now(), stopped.elapsed());
        }
        let spec = leases
            .get(&lease_name)
            .await
            .unwrap()
            .spec
            .unwrap_or_default();
        if spec.holder_identity.as_deref() == Some("a") {
            last_renewal_by_a = spec.renew_time.map(|t| t.0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last = last_renewal_by_a.expect("a's renewal seen before the takeover");
    let after = took.duration_since(last);
    // b counts the lease duration from its first sight of that renewal, which is after it.
    assert!(
        after >= jiff::SignedDuration::from_secs(9),
        "took over {after:?} after a's last renewal"
    );
    assert_eq!(b.read().unwrap().term, term + 1);
    println!(
        "takeover {:.1}s after the leader stopped, {:.1}s after its last renewal",
        since_stopped.as_secs_f64(),
        after.as_secs_f64()
    );
    drop(b);
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
