//! Power actions against ipmi_sim's Chassis Control: power down and up with an Operator
//! account, after the caller's check on the chassis and System GUID read in the same session;
//! a User account is refused before anything is sent, and a refused check sends nothing.

use oobfence::power::{ActionOutcome, PowerAction, Reply, checked};

use super::*;

fn source_as(sim: &IpmiSim, user: &str, password: &str, privilege: &str) -> IpmiSource {
    let extra = match privilege {
        "" => String::new(),
        p => format!("privilege = \"{p}\""),
    };
    let e = bmc(sim.dir(), &sim.address(), user, password, &extra);
    IpmiSource::new(&e, "n1").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chassis_control_powers_down_and_up_as_operator_after_the_check() {
    let sim = IpmiSim::start();
    let src = source_as(
        &sim,
        ipmi_sim::OPERATOR,
        ipmi_sim::OPERATOR_PASSWORD,
        "operator",
    );
    let support = src.action_support().await;
    assert!(
        support
            .off
            .as_ref()
            .is_ok_and(|s| s.contains("0x00 as operator")),
        "{support:?}"
    );

    let forms = sim.uuid_forms();
    let on_and_ours = |r: &Reply| match &r.identity {
        MachineIdentity::SystemUuid { forms: f, .. }
            if *f == forms && r.state == PowerState::On =>
        {
            Ok(())
        }
        _ => Err(format!(
            "not this machine, or not On: {} {}",
            r.state, r.identity
        )),
    };
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_and_ours(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { .. }),
        "{outcome:?}"
    );
    assert_eq!(sim.ipmitool_power(), "off", "ipmitool sees the chassis off");
    assert_eq!(src.read().await, PowerState::Off);

    // Off now: the check refuses, nothing is sent, the chassis stays off.
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_and_ours(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("not On")),
        "{outcome:?}"
    );
    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { .. }),
        "{outcome:?}"
    );
    assert_eq!(sim.ipmitool_power(), "on");
    assert_eq!(src.read().await, PowerState::On);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_account_is_refused_before_anything_is_sent() {
    let sim = IpmiSim::start();
    let src = source_as(&sim, ipmi_sim::READER, ipmi_sim::READER_PASSWORD, "");
    let support = src.action_support().await;
    assert!(
        support
            .off
            .as_ref()
            .is_err_and(|e| e.contains("Operator privilege")),
        "{support:?}"
    );
    let checked_at_all = std::sync::atomic::AtomicBool::new(false);
    let outcome = src
        .act(PowerAction::Off, &|_: &Reply| {
            checked_at_all.store(true, std::sync::atomic::Ordering::SeqCst);
            checked(Ok(()))
        })
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("privilege = \"operator\"")),
        "{outcome:?}"
    );
    assert!(
        !checked_at_all.load(std::sync::atomic::Ordering::SeqCst),
        "nothing was even read"
    );
    assert_eq!(sim.ipmitool_power(), "on");
}

/// The daemon, an IPMI node that hangs (its kubelet silent, the chassis on): powered down
/// through Chassis Control after `[actuation] after`, fenced on its Off reads, powered up,
/// and untainted on its new boot; ipmitool sees each step at the simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_powers_a_hung_ipmi_node_down_fences_it_and_powers_it_up() {
    use support::k8s::{FakeNode, wait_for};
    use support::scenario::FIRST_BOOT;

    let s = Scenario::ipmi("ipmi-actuate", 1).await;
    s.set_policy(&format!(
        "{}\n[actuation]\nenabled = true\nafter = \"2m\"\n",
        s.policy_lines()
    ));
    s.map_with("a", 0, "actuate = true");
    let node = s.node_reporting("a", FIRST_BOOT, s.identity(0).await).await;
    let name = node.name.clone();
    let sim = s.ipmi_sim(0);
    let kubelet = FakeNode::keep_alive(&[&node], FIRST_BOOT);
    let daemon = s.daemon().await;
    let limit = Duration::from_secs(90);
    daemon.wait_identity(&name, "match", limit).await;
    daemon
        .wait_lease_watched(&name, Duration::from_secs(120))
        .await;
    kubelet.stop().await;
    node.die(FIRST_BOOT).await;
    daemon.wait_rule(&name, "waiting-to-actuate", limit).await;
    assert_eq!(sim.ipmitool_power(), "on");
    wait_for(
        "the chassis powered down",
        Duration::from_secs(180),
        || async { (sim.ipmitool_power() == "off").then_some(()) },
    )
    .await;
    daemon.wait_fenced(&name, limit).await;
    wait_for("the chassis powered up again", limit, || async {
        (sim.ipmitool_power() == "on").then_some(())
    })
    .await;
    node.come_back("boot-2").await;
    let _alive = FakeNode::keep_alive(&[&node], "boot-2");
    daemon.wait_unfenced(&name, limit).await;
    assert!(!FakeNode::has_oos_taint(&node.get().await));
    let metrics = daemon.metrics().await;
    support::k8s::assert_one_power_off_and_on_sent(&metrics, "ipmi");
    daemon.stop().await;
    node.delete().await;
    assert_eq!(sim.other_sessions(), 0);
}
