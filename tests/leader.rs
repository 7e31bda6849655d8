//! The `[ha]` elector on the real API server: one leader at a time, a takeover only after the
//! lease has run out by the new leader's own clock, and a leader that cannot renew stops
//! writing by its own clock first. Two instances under one identity never both write, and
//! the second reports the first; a slow GET does not date a renewal back.

mod support;

use std::sync::RwLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};

use oobfence::config::HaConfig;
use oobfence::leader::{self, Elector, Leadership};
use oobfence::metrics::Metrics;

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

async fn namespace(client: &kube::Client) -> (Api<Namespace>, String) {
    let ns = support::k8s::unique("ha");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    (namespaces, ns)
}

/// The same `[ha] identity` on two hosts (a copied config, cloned host names): each would
/// renew the Lease it believes is its own. The one that did not write the Lease's renewTime
/// follows instead, and says so; it takes over only once the other has stopped renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_one_identity_never_both_write() {
    let client = support::k8s::client().await;
    let (namespaces, ns) = namespace(&client).await;
    let first = leader::spawn(client.clone(), &ha("a", &ns), "dc1");
    wait_until("the first instance leads", Duration::from_secs(10), || {
        first.read().unwrap().may_write()
    })
    .await;
    let second = leader::spawn(client.clone(), &ha("a", &ns), "dc1");
    // Longer than a lease: never two writers; the second reports the first.
    let mut reported = None;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(12) {
        let (w1, w2) = (
            first.read().unwrap().may_write(),
            second.read().unwrap().may_write(),
        );
        assert!(!(w1 && w2), "two instances named a write at once");
        let l2 = second.read().unwrap().clone();
        if l2.duplicate_identity && reported.is_none() {
            reported = Some(watched.elapsed());
            let reason = l2.standby_reason().expect("the second one does not write");
            assert!(
                reason.contains("under this instance's identity"),
                "{reason}"
            );
            let metrics = Metrics::new().for_datacenter("dc1");
            metrics.set_leadership(Some(&l2));
            assert!(
                metrics
                    .encode()
                    .contains("oobfence_ha_duplicate_identity{datacenter=\"dc1\"} 1"),
                "the metric does not say it"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reported = reported.expect("the second instance never reported the first");
    println!(
        "the duplicate reported {:.1}s after it started",
        reported.as_secs_f64()
    );
    // The first never noticed anything wrong: nobody else wrote under its name.
    assert!(first.read().unwrap().may_write(), "nobody writes any more");
    assert!(!first.read().unwrap().duplicate_identity);
    // The first stops: the second takes over once the Lease has gone unrenewed for a lease
    // duration, and the report clears.
    drop(first);
    let stopped = Instant::now();
    while !second.read().unwrap().may_write() {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "the second never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(7),
        "took over too soon"
    );
    assert!(!second.read().unwrap().duplicate_identity);
    drop(second);
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}

/// How long after a leader's last write could start it has surely landed or been given up.
fn settled(ha: &HaConfig) -> Duration {
    ha.write_settled_within()
}

/// A standby whose Lease GET is slow reads a renewal the leader wrote while the GET was on its
/// way. It must count the lease from the arrival of that answer: counted from the GET's
/// departure, the standby took over while the leader, cut off from the API server since that
/// renewal, could still write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lease_get_does_not_let_the_standby_in_early() {
    let client = support::k8s::client().await;
    let (namespaces, ns) = namespace(&client).await;
    let ha = |identity: &str| HaConfig {
        lease_duration: Duration::from_secs(15),
        ..ha(identity, &ns)
    };
    let a_out = RwLock::new(Leadership::new("a"));
    let b_out = RwLock::new(Leadership::new("b"));
    let mut a = Elector::new(client.clone(), &ha("a"), "dc1");
    let slow = support::slow_api::SlowApi::new(client.clone());
    let mut b = Elector::new(slow.client.clone(), &ha("b"), "dc1");
    a.attempt(&a_out).await;
    assert!(a_out.read().unwrap().may_write(), "a does not lead");
    b.attempt(&b_out).await;
    assert_eq!(b_out.read().unwrap().holder.as_deref(), Some("a"));
    // b's next GET takes 3 s to reach the API server; 2.5 s after it left, a renews.
    slow.hold_next_lease_get(Duration::from_millis(3000));
    let b_round = async {
        b.attempt(&b_out).await;
        b
    };
    let a_renews = async {
        slow.until_held(Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        a.attempt(&a_out).await;
    };
    let (mut b, ()) = tokio::join!(b_round, a_renews);
    let until = a_out.read().unwrap().writable_until.expect("a renewed");
    assert!(
        b_out.read().unwrap().error.is_none(),
        "{:?}",
        b_out.read().unwrap().error
    );
    // From here a is cut off (no more rounds): it may still start writes until `until`.
    let writes_settled = until + settled(&ha("a"));
    let start = Instant::now();
    while !b_out.read().unwrap().may_write() {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "b never took over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.attempt(&b_out).await;
    }
    let took = tokio::time::Instant::now();
    let early = writes_settled.saturating_duration_since(took);
    assert!(
        early.is_zero(),
        "b took over {:.2}s before a's last writes had settled",
        early.as_secs_f64()
    );
    println!(
        "b took over {:.2}s after a's writes had settled",
        took.duration_since(writes_settled).as_secs_f64()
    );
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}

/// A leader's writes tell the API server when to give up on them (`timeout`): it does, so a
/// write our side has cut off does not go on there for the server's own 34 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_gives_up_a_leaders_write_in_time() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = support::k8s::client().await;
    let (namespaces, ns) = namespace(&client).await;
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
    };
    // Bounded as a leader's writes are: they go through, reads are untouched.
    let bounded = leader::server_bounded(client.clone(), Duration::from_secs(5));
    let api: Api<ConfigMap> = Api::namespaced(bounded, &ns);
    api.create(&PostParams::default(), &cm("fine"))
        .await
        .unwrap();
    api.get("fine").await.unwrap();
    // Told to give up after 1 ms, the API server answers that it did: its handler's deadline
    // (504) or the storage call's, which gets the deadline too (500, "context deadline
    // exceeded"). A ConfigMap of 900 kB takes longer than that to store; a few tries in case
    // one makes it even so.
    let big = |name: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "data": {"filler": "x".repeat(900_000)},
        }))
        .unwrap()
    };
    let hasty: Api<ConfigMap> = Api::namespaced(
        leader::server_bounded(client.clone(), Duration::from_millis(1)),
        &ns,
    );
    let mut gave_up = None;
    for i in 0..5 {
        match hasty
            .create(&PostParams::default(), &big(&format!("hasty-{i}")))
            .await
        {
            Err(kube::Error::Api(e))
                if e.code == 504 || (e.code == 500 && e.message.contains("deadline")) =>
            {
                gave_up = Some(e.message);
                break;
            }
            Err(e) => println!("try {i}: {e}"),
            Ok(_) => println!("try {i}: stored within 1 ms"),
        }
    }
    let message = gave_up.expect("the API server never gave up on a write told to");
    println!("the API server gave up: {message}");
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
