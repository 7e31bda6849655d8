//! Fencing levels on real parts: a Redfish BMC (sushy-tools) at level 1 and `fence_ipmilan`
//! against ipmi_sim at level 2, standing in for the PDU outlet that feeds the machine
//! (`identity = "unchecked"`: an outlet proves only the mapping the config wrote).

use std::time::Duration;

use super::ipmilan;
use super::support::ipmi_sim::{self, IpmiSim};
use super::support::k8s::{FakeNode, KubeletIdentity, events_for, wait_for};
use super::support::scenario::{FIRST_BOOT, Scenario};

/// A level-2 outlet entry for node `suffix`, read by `fence_ipmilan` from `sim`.
fn outlet(s: &Scenario, suffix: &str, sim: &IpmiSim) {
    s.map_fence_agent(
        suffix,
        ipmi_sim::PASSWORD,
        &format!("{}level = 2\n", ipmilan(sim)),
    );
}

/// (a) The BMC went dark with its machine and the outlet reads Off: fenced through level 2,
/// and the journal, the Event and `why` say so, unattested. (b) The BMC answers On while the
/// outlet reads Off: On ends the question, never fenced. (c) Two outlets at level 2 (a
/// dual-fed machine), one On: never fenced. (d) Every level dark: never fenced, and `why`
/// lists both levels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_fenced_through_its_outlet_only_when_its_bmc_is_dark_and_every_outlet_is_off() {
    let s = Scenario::redfish("levels", 1).await;
    s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
    let sims: Vec<IpmiSim> = (0..4).map(|_| IpmiSim::start()).collect();
    let [dark_outlet, on_outlet, dual_on, dual_off] = [&sims[0], &sims[1], &sims[2], &sims[3]];

    // (a) dark: its BMC on a closed port, its outlet Off once the node dies.
    s.map_unreachable("dark");
    outlet(&s, "dark", dark_outlet);
    // (b) on: its BMC (Redfish system 0) On, its outlet Off.
    s.map("on", 0);
    outlet(&s, "on", on_outlet);
    // (c) dual: its BMC dark, two outlets, one On.
    s.map_unreachable("dual");
    outlet(&s, "dual", dual_on);
    outlet(&s, "dual", dual_off);
    // (d) nothing: its BMC dark, its outlet a closed port.
    s.map_unreachable("nothing");
    s.map_fence_agent(
        "nothing",
        ipmi_sim::PASSWORD,
        &format!(
            "agent = \"fence_ipmilan\"\nusername = \"{}\"\ntimeout = \"5s\"\nlevel = 2\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\", lanplus = \"1\", cipher = \"3\", privlvl = \"administrator\" }}\n",
            ipmi_sim::USERNAME,
            super::support::k8s::free_port()
        ),
    );

    let dark = s
        .node_reporting("dark", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let on = s
        .node_reporting("on", FIRST_BOOT, s.identity(0).await)
        .await;
    let dual = s
        .node_reporting("dual", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let nothing = s
        .node_reporting("nothing", FIRST_BOOT, KubeletIdentity::default())
        .await;
    let daemon = s.daemon().await;
    // The machines lose power as their kubelets fall silent (an Off read of a living node
    // would rightly make its source untrusted).
    for n in [&dark, &on, &dual, &nothing] {
        n.die(FIRST_BOOT).await;
    }
    for sim in [dark_outlet, on_outlet, dual_off] {
        sim.set_power(false);
    }
    let limit = Duration::from_secs(120);

    // (a)
    let r = daemon.wait_fenced(&dark.name, limit).await;
    assert!(FakeNode::has_oos_taint(&dark.get().await), "{r}");
    let levels = r["levels"].as_array().cloned().unwrap_or_default();
    assert_eq!(levels.len(), 2, "{r}");
    assert_eq!(levels[0]["level"], 1, "{r}");
    assert_eq!(levels[0]["last_read_failed"], true, "{r}");
    assert_eq!(levels[1]["level"], 2, "{r}");
    assert_eq!(levels[1]["chosen"], true, "{r}");
    assert_eq!(levels[1]["attested"], false, "{r}");
    let fenced = wait_for("the fence's journal record", limit, || async {
        oobfence::journal::tail(&s.journal(), &dark.name, 100)
            .ok()?
            .records
            .into_iter()
            .find(|r| r.action == "taint" && r.result == "success")
    })
    .await;
    assert_eq!(fenced.inputs.level, Some(2), "{fenced:?}");
    assert_eq!(
        fenced.inputs.basis.as_deref(),
        Some("unattested"),
        "{fenced:?}"
    );
    assert!(
        fenced
            .inputs
            .power_source
            .as_deref()
            .is_some_and(|p| p.contains("fence_ipmilan")),
        "{fenced:?}"
    );
    let event = wait_for("the fence's Event", limit, || async {
        events_for(&s.client, &dark.name)
            .await
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("out-of-service taint added"))
    })
    .await;
    assert!(event.contains("basis unattested (level 2)"), "{event}");
    assert!(
        event.contains("level 2 speaks (level 1 cannot answer"),
        "{event}"
    );
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_fences_total{action=\"taint\",basis=\"unattested\"} 1"),
        "{metrics}"
    );

    // (b), (c), (d): the levels are read and answer; none is fenced.
    let r = daemon.wait_rule(&on.name, "power-on", limit).await;
    assert!(r["fence"].is_null(), "{r}");
    let r = daemon.wait_rule(&dual.name, "power-on", limit).await;
    assert!(r["fence"].is_null(), "{r}");
    assert!(
        r["reason"].as_str().unwrap_or_default().contains("level 2"),
        "{r}"
    );
    let r = daemon
        .wait_rule(&nothing.name, "power-unknown", limit)
        .await;
    assert!(r["fence"].is_null(), "{r}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("no level can answer"),
        "{r}"
    );
    let out =
        super::support::cli::oobfence_async(&["why", &nothing.name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout);
    assert!(why.contains("    level 1: [[bmc]]"), "{why}");
    assert!(why.contains("    level 2: [[bmc]]"), "{why}");
    assert!(why.contains("fence_ipmilan"), "{why}");
    // check-config shows each node's levels, a row per source.
    let path = s.write_config(&super::support::k8s::kubeconfig_path(), "127.0.0.1:0");
    let o = super::support::cli::oobfence_async(&["check-config", "--probe"], &path).await;
    let out = String::from_utf8_lossy(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with(&dual.name)).collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows[0].contains("(level 1)") && rows[0].contains("redfish"),
        "{out}"
    );
    for row in &rows[1..] {
        assert!(
            row.contains("(level 2)") && row.contains("fence_ipmilan"),
            "{out}"
        );
    }
    // The outlet of (b) read Off the whole time, the machines of (b) and (c) stayed up: a
    // few more decisions (reads spaced a second apart) change nothing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for n in [&on, &dual, &nothing] {
        assert!(!FakeNode::has_oos_taint(&n.get().await), "{}", n.name);
    }
    daemon.stop().await;
    for n in [&dark, &on, &dual, &nothing] {
        n.delete().await;
    }
}
