//! Power commands and pod force-deletes read the pause ConfigMap afresh right before each: the
//! holds the daemon passes its writer are a pass old, and an operator's pause set since still
//! stops the command. The BMC is the project's proxy test server (`support::proxy_bmc`), which
//! counts the Reset POSTs it receives.

use kube::ResourceExt;
use oobfence::power::redfish::RedfishSource;
use oobfence::power::{ActionOutcome, PowerAction, PowerSource};
use support::proxy_bmc::{self, Lure, ProxyBmc};

use super::*;

/// The source of BMC 07 behind the proxy; a generous timeout, as the held ActionInfo GET waits
/// for the test.
fn source_07(proxy: &ProxyBmc, dir: &Path) -> RedfishSource {
    let entry = support::scenario::parsed_bmc_entry(
        "redfish",
        dir,
        &proxy.address_07(),
        proxy_bmc::USERNAME,
        proxy_bmc::PASSWORD,
        &format!(
            "system = \"/redfish/v1/Systems/1\"\n{}\ntimeout = \"20s\"",
            proxy.pinned()
        ),
    );
    RedfishSource::new(&entry, "n1").unwrap()
}

/// A writer whose last pass held nothing, with `cm` as its pause ConfigMap.
fn writer(client: &Client, cm: &ConfigMapRef) -> Cluster {
    Cluster::new(client.clone(), "test").with_pause_configmap(Some(cm.clone()))
}

async fn new_switch(client: &Client, what: &str) -> ConfigMapRef {
    let cm = ConfigMapRef {
        namespace: "default".into(),
        name: format!("{}-switch", unique(what)),
    };
    create_pause_configmap(client, &cm).await;
    cm
}

fn refused_by_the_pause(outcome: &ActionOutcome) {
    assert!(
        matches!(outcome, ActionOutcome::Refused { why } if why.contains("paused") && why.contains("storm in dc2")),
        "{outcome:?}"
    );
}

/// A pause set in the ConfigMap after the daemon's last look stops the ForceOff: the check
/// right before the command reads the switch itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_set_after_the_last_look_stops_the_power_command() {
    let client = support::k8s::client().await;
    let cm = new_switch(&client, "cmd-pause").await;
    let proxy = ProxyBmc::start();
    proxy.lure(None).await;
    let dir = tempfile::tempdir().unwrap();
    let src = source_07(&proxy, dir.path());
    let cluster = writer(&client, &cm);
    let check = cluster.command_check("uid-1", |_| Ok(()));

    annotate(
        &client,
        &cm,
        oobfence::pause::ANNOTATION_PAUSED,
        "storm in dc2",
    )
    .await;
    let outcome = src.act(PowerAction::Off, &check).await;
    refused_by_the_pause(&outcome);
    assert_eq!(
        proxy.stats().await.bmc_07.resets,
        0,
        "a ForceOff while paused"
    );

    // Resumed: the same command, through the same check, is sent.
    annotate(&client, &cm, oobfence::pause::ANNOTATION_PAUSED, "false").await;
    let outcome = src.act(PowerAction::Off, &check).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(proxy.stats().await.bmc_07.resets, 1);
    delete_configmap(&client, &cm).await;
}

/// A BMC slow to answer the Reset's ActionInfo: a pause set while that GET is under way stops
/// the ForceOff, since the check runs last, right before the POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_set_during_a_slow_action_info_gives_no_force_off() {
    let client = support::k8s::client().await;
    let cm = new_switch(&client, "slow-info").await;
    let proxy = ProxyBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let src = source_07(&proxy, dir.path());
    let cluster = writer(&client, &cm);
    let check = cluster.command_check("uid-1", |_| Ok(()));

    // `pause`: what the operator does once the ActionInfo GET has reached the BMC.
    let act_while = |pause: Option<&'static str>| {
        let (src, check, proxy, client, cm) = (&src, &check, &proxy, &client, &cm);
        async move {
            proxy.lure(Some((Lure::HeldActionInfo, ""))).await;
            let operator = async {
                let s = proxy
                    .stats_until(Duration::from_secs(60), |s| s.bmc_07.action_info_gets > 0)
                    .await;
                assert_eq!(s.bmc_07.action_info_gets, 1, "{s:?}");
                if let Some(value) = pause {
                    annotate(client, cm, oobfence::pause::ANNOTATION_PAUSED, value).await;
                }
                proxy.release().await;
            };
            let (outcome, ()) = tokio::join!(src.act(PowerAction::Off, check), operator);
            (outcome, proxy.stats().await.bmc_07.resets)
        }
    };

    let (outcome, resets) = act_while(Some("storm in dc2")).await;
    refused_by_the_pause(&outcome);
    assert_eq!(resets, 0, "a ForceOff after the pause");

    // The same slow BMC without the pause: the ForceOff goes.
    annotate(&client, &cm, oobfence::pause::ANNOTATION_PAUSED, "false").await;
    let (outcome, resets) = act_while(None).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(resets, 1);
    delete_configmap(&client, &cm).await;
}

/// Pod force-deletes read the switch afresh before each batch: a pause set after the daemon's
/// last look leaves every pod to the pod garbage collector, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_set_after_the_last_look_stops_the_pod_deletes() {
    use support::k8s::{bound_pod, pods_on};
    let client = support::k8s::client().await;
    let cm = new_switch(&client, "pods-pause").await;
    let name = unique("pods-pause");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    for pod in ["a", "b"] {
        bound_pod(&client, &name, &format!("{name}-{pod}"), |_| {}).await;
    }
    let uid = node.get().await.uid().unwrap();
    let cluster = writer(&client, &cm);
    let pods = cluster.pods_on(&name).await.unwrap();
    assert_eq!(pods.len(), 2);

    annotate(
        &client,
        &cm,
        oobfence::pause::ANNOTATION_PAUSED,
        "storm in dc2",
    )
    .await;
    let released = cluster.force_delete_pods(&uid, &pods).await.unwrap();
    assert!(released.deleted.is_empty(), "{released:?}");
    assert_eq!(released.left.len(), 2, "{released:?}");
    assert!(
        released
            .left
            .iter()
            .all(|(_, why)| why.contains("paused") && why.contains("storm in dc2")),
        "{released:?}"
    );
    assert_eq!(pods_on(&client, &name).await.len(), 2);

    annotate(&client, &cm, oobfence::pause::ANNOTATION_PAUSED, "false").await;
    let released = cluster.force_delete_pods(&uid, &pods).await.unwrap();
    assert_eq!(released.deleted.len(), 2, "{released:?}");
    assert!(pods_on(&client, &name).await.is_empty());
    node.delete().await;
    delete_configmap(&client, &cm).await;
}

/// A client of the real API server whose every ConfigMap read fails (500): the pause switch
/// cannot be read.
fn switch_unreadable(client: &Client) -> Client {
    let inner = client.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let inner = inner.clone();
        let is_cm = req.uri().path().contains("/configmaps/");
        async move {
            if is_cm {
                let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd is down (test)","reason":"InternalError","code":500}"#;
                return Ok(http::Response::builder()
                    .status(500)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(status.to_vec()))
                    .unwrap());
            }
            inner.send(req).await
        }
    });
    Client::new(service, "default")
}

/// A pause switch that cannot be read is a pause: no ForceOff, no pod deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_that_cannot_be_read_stops_commands_and_deletes() {
    use support::k8s::{bound_pod, pods_on};
    let client = support::k8s::client().await;
    let cm = new_switch(&client, "unreadable").await;
    let cluster = writer(&switch_unreadable(&client), &cm);

    let proxy = ProxyBmc::start();
    proxy.lure(None).await;
    let dir = tempfile::tempdir().unwrap();
    let check = cluster.command_check("uid-1", |_| Ok(()));
    let outcome = source_07(&proxy, dir.path())
        .act(PowerAction::Off, &check)
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("etcd is down") && why.contains("cannot be read")),
        "{outcome:?}"
    );
    assert_eq!(proxy.stats().await.bmc_07.resets, 0);

    let name = unique("unreadable");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    bound_pod(&client, &name, &format!("{name}-a"), |_| {}).await;
    let uid = node.get().await.uid().unwrap();
    let pods = cluster.pods_on(&name).await.unwrap();
    let released = cluster.force_delete_pods(&uid, &pods).await.unwrap();
    assert!(released.deleted.is_empty(), "{released:?}");
    assert!(
        released.left.len() == 1
            && released.left[0].1.contains("etcd is down")
            && released.left[0]
                .1
                .contains(&format!("ConfigMap {cm} cannot be read")),
        "{released:?}"
    );
    assert_eq!(pods_on(&client, &name).await.len(), 1);
    support::k8s::force_delete_pod(&client, &format!("{name}-a")).await;
    node.delete().await;
    delete_configmap(&client, &cm).await;
}
