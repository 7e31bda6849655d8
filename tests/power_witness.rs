//! An Off that is not the whole truth, on real parts: a machine asleep or hibernated behind an
//! IPMI BMC that says so in Get ACPI Power State (the test suite's own RMCP+ BMC, and
//! `ipmi_sim`, which may not know the command), and the second witness for Off (`corroborate =
//! "power-draw"`): DCMI Get Power Reading over IPMI, the chassis' Power or EnvironmentMetrics
//! over Redfish (the odd HTTPS server's `/w/` systems, and sushy-tools, which serves no power
//! figures). Then end to end through the daemon on a real kube-apiserver: suspended and
//! uncorroborated Offs are never fenced, a corroborated one is; a Redfish PDU outlet is fenced
//! through only while it draws nothing.

mod support;

use std::path::Path;
use std::time::Duration;

use oobfence::config::BmcEntry;
use oobfence::identity::uuid_forms_of_ipmi_guid;
use oobfence::power::ipmi::IpmiSource;
use oobfence::power::ipmi::rakp::Suite;
use oobfence::power::redfish::RedfishSource;
use oobfence::power::{PowerDraw, PowerSource, PowerState, Reply, Watts};
use support::ipmi_sim::{self, IpmiSim};
use support::odd_bmc::{self, OddBmc};
use support::rmcp_bmc::{ACCOUNTS, RmcpBmc};
use support::scenario::{Scenario, parsed_bmc_entry};

const CORROBORATE: &str = "corroborate = \"power-draw\"\n";

fn guid(seed: u8) -> [u8; 16] {
    std::array::from_fn(|i| seed.wrapping_add(i as u8))
}

/// A source reading the test BMC as its User account (oobfence's default suite and role).
fn rmcp_source(dir: &Path, bmc: &RmcpBmc, extra: &str) -> IpmiSource {
    let reader = &ACCOUNTS[0];
    let entry = parsed_bmc_entry(
        "ipmi",
        dir,
        &bmc.address(),
        reader.name,
        reader.password,
        extra,
    );
    IpmiSource::new(&entry, "n1").unwrap_or_else(|e| panic!("IpmiSource::new: {e}"))
}

fn detail<'a>(reply: &'a Reply, name: &str) -> &'a str {
    reply
        .details
        .iter()
        .find(|d| d.name == name)
        .map(|d| d.value.as_str())
        .unwrap_or_else(|| panic!("no {name:?} detail in {:?}", reply.details))
}

fn has_detail(reply: &Reply, name: &str) -> bool {
    reply.details.iter().any(|d| d.name == name)
}

fn seen(watts: f64, from: &str) -> Option<PowerDraw> {
    Some(PowerDraw::Seen {
        watts: Watts::from_f64(watts).unwrap(),
        from: from.into(),
    })
}

fn unavailable_because(reply: &Reply) -> &str {
    match &reply.power_draw {
        Some(PowerDraw::Unavailable { why }) => why,
        other => panic!("expected an unavailable power draw, got {other:?} ({reply:?})"),
    }
}

/// A machine whose chassis reads off while Get ACPI Power State says it sleeps or hibernates
/// (S1-S4, and the states that cannot tell them apart) reads Suspended, never Off; soft and
/// mechanical off stay Off with the ACPI state shown; a BMC without the command (C1h) still
/// reads Off, saying it cannot tell. A machine that is on is not asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipmi_machine_asleep_or_hibernated_reads_suspended() {
    let dir = tempfile::tempdir().unwrap();
    let bmc = RmcpBmc::start(&[Suite::Seventeen], guid(0x10)).await;
    let src = rmcp_source(dir.path(), &bmc, "");
    bmc.set_power(false);
    for (state, name) in [
        (0x04, "S4 suspend to disk (04h)"),
        (0x84, "S4 suspend to disk (04h)"),
        (0x03, "S3 suspend to RAM (03h)"),
        (0x01, "S1 sleeping, hardware context kept (01h)"),
        (0x02, "S2 sleeping, processor context lost (02h)"),
        (0x06, "S4/S5 soft off, S4 and S5 not told apart (06h)"),
        (0x08, "sleeping in S1, S2 or S3 (08h)"),
        (0x09, "G1 sleeping, S1 to S4 not told apart (09h)"),
    ] {
        bmc.set_acpi_state(Some(state));
        let reply = src.read_reply().await;
        match &reply.state {
            PowerState::Suspended { detail } => {
                assert!(detail.contains(name), "{state:#04x}: {detail}");
                assert!(detail.contains("chassis power off"), "{detail}");
            }
            other => panic!("ACPI state {state:#04x} read as {other:?}"),
        }
        // The identity still comes with it: a suspended read is the node's machine's.
        assert!(
            matches!(
                reply.identity,
                oobfence::identity::MachineIdentity::SystemUuid { .. }
            ),
            "{:?}",
            reply.identity
        );
    }
    for (state, name) in [
        (0x05, "S5/G2 soft off (05h)"),
        (0x07, "G3 mechanical off (07h)"),
        (0x21, "legacy soft off (21h)"),
        (0x2a, "unknown (2ah)"),
    ] {
        bmc.set_acpi_state(Some(state));
        let reply = src.read_reply().await;
        assert_eq!(reply.state, PowerState::Off, "{state:#04x}: {reply:?}");
        assert_eq!(detail(&reply, "ACPI power state"), name);
    }
    // A BMC without Get ACPI Power State: still Off, and the read says it cannot tell.
    bmc.set_acpi_state(None);
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    let acpi = detail(&reply, "ACPI power state");
    assert!(acpi.contains("cannot tell"), "{acpi}");
    assert!(acpi.contains("0xc1 (invalid command)"), "{acpi}");
    // No power draw asked for without `corroborate`.
    assert_eq!(reply.power_draw, None);
    assert!(!bmc.seen(|s| s.commands.contains(&(0x2c, 0x02))));

    // On: not asked.
    bmc.set_acpi_state(Some(0x04));
    let asked = bmc.seen(|s| s.commands.iter().filter(|c| **c == (0x06, 0x07)).count());
    bmc.set_power(true);
    assert_eq!(src.read_reply().await.state, PowerState::On);
    let after = bmc.seen(|s| s.commands.iter().filter(|c| **c == (0x06, 0x07)).count());
    assert_eq!(
        after, asked,
        "Get ACPI Power State asked of a machine that is on"
    );
    // One session throughout: the extra questions keep it.
    assert_eq!(bmc.seen(|s| s.activated.len()), 1);
}

/// `ipmi_sim` answers whatever it answers to Get ACPI Power State: its off machine still reads
/// Off (never an error), with the ACPI state or the reason it is unknown beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_sim_off_reads_off_with_its_acpi_state_beside_it() {
    let sim = IpmiSim::start();
    let entry = parsed_bmc_entry(
        "ipmi",
        sim.dir(),
        &sim.address(),
        ipmi_sim::USERNAME,
        ipmi_sim::PASSWORD,
        "cipher_suite = 3\n",
    );
    let src = IpmiSource::new(&entry, "n1").unwrap();
    sim.set_power(false);
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    let acpi = detail(&reply, "ACPI power state");
    eprintln!("ipmi_sim's ACPI power state: {acpi}");
    assert!(!acpi.is_empty());
    sim.set_power(true);
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    assert!(!has_detail(&reply, "ACPI power state"), "{reply:?}");
}

/// With `corroborate = "power-draw"`, an IPMI Off read carries DCMI Get Power Reading's current
/// watts; a refusal (no DCMI) or an inactive measurement is an unavailable witness. A sleeping
/// machine is Suspended before any power draw is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_off_reads_carry_the_dcmi_power_draw_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let bmc = RmcpBmc::start(&[Suite::Seventeen], guid(0x20)).await;
    let src = rmcp_source(dir.path(), &bmc, CORROBORATE);
    bmc.set_power(false);
    bmc.set_acpi_state(Some(0x05));
    let from = "DCMI Get Power Reading, current power";

    bmc.set_power_reading(Some((180, true)));
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(reply.power_draw, seen(180.0, from));
    assert_eq!(detail(&reply, "power draw"), format!("180 W ({from})"));

    bmc.set_power_reading(Some((4, true)));
    assert_eq!(src.read_reply().await.power_draw, seen(4.0, from));

    bmc.set_power_reading(Some((4, false)));
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off);
    assert!(
        unavailable_because(&reply).contains("no power measurement is active"),
        "{reply:?}"
    );

    bmc.set_power_reading(None);
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off);
    let why = unavailable_because(&reply);
    assert!(why.contains("0xc1 (invalid command)"), "{why}");

    // Asleep: Suspended; the power draw is not needed.
    bmc.set_power_reading(Some((4, true)));
    bmc.set_acpi_state(Some(0x04));
    let asked = bmc.seen(|s| s.commands.iter().filter(|c| **c == (0x2c, 0x02)).count());
    let reply = src.read_reply().await;
    assert!(
        matches!(reply.state, PowerState::Suspended { .. }),
        "{reply:?}"
    );
    let after = bmc.seen(|s| s.commands.iter().filter(|c| **c == (0x2c, 0x02)).count());
    assert_eq!(asked, after);
    // On: no power draw either.
    bmc.set_power(true);
    let reply = src.read_reply().await;
    assert_eq!((reply.state, reply.power_draw), (PowerState::On, None));
}

fn odd_source(dir: &Path, odd: &OddBmc, system: &str, extra: &str) -> RedfishSource {
    let entry: BmcEntry = parsed_bmc_entry(
        "redfish",
        dir,
        &format!("https://127.0.0.1:{}", odd.port),
        "admin",
        "any-Passw0rd",
        &format!(
            "timeout = \"3s\"\nsystem = \"{system}\"\nca_file = \"{}\"\n{extra}",
            odd.cert.display()
        ),
    );
    RedfishSource::new(&entry, "n1").unwrap_or_else(|e| panic!("RedfishSource::new: {e}"))
}

/// With `corroborate = "power-draw"`, a Redfish Off read carries the power its chassis draws,
/// found only through the links the service gives: `Links.Chassis`, then the Chassis'
/// `EnvironmentMetrics` or `Power`. Every other case is an unavailable witness, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_off_reads_carry_the_chassis_power_draw_when_asked() {
    let odd = OddBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let read = |system: &str, extra: &str| {
        let src = odd_source(dir.path(), &odd, system, extra);
        async move { src.read_reply().await }
    };

    let reply = read("/w/off-hot", CORROBORATE).await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    let from = "PowerControl[1].PowerConsumedWatts of /w/chassis-hot/Power";
    assert_eq!(reply.power_draw, seen(180.5, from));
    assert_eq!(detail(&reply, "power draw"), format!("180.5 W ({from})"));

    let reply = read("/w/off-cold", CORROBORATE).await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(
        reply.power_draw,
        seen(
            4.5,
            "PowerWatts.Reading of /w/chassis-cold/EnvironmentMetrics"
        )
    );

    for (system, want) in [
        ("/w/off-unlinked", "has no Links.Chassis"),
        (
            "/w/off-bare",
            "the Chassis \"/w/chassis-bare\" links neither EnvironmentMetrics nor Power",
        ),
        (
            "/w/off-null",
            "PowerControl[0].PowerConsumedWatts of \"/w/chassis-null/Power\" is not a reading (\"null\")",
        ),
        (
            "/w/off-wrong",
            "the answer for \"/w/chassis-wrong\" names itself \"/w/chassis-hot\"",
        ),
        (
            "/w/off-missing",
            "HTTP 404 Not Found for GET /w/chassis-missing",
        ),
    ] {
        let reply = read(system, CORROBORATE).await;
        assert_eq!(reply.state, PowerState::Off, "{system}: {reply:?}");
        let why = unavailable_because(&reply);
        assert!(why.contains(want), "{system}: {why}");
        assert!(
            detail(&reply, "power draw").starts_with("unavailable: "),
            "{reply:?}"
        );
    }

    // Without `corroborate`, nothing beyond the ComputerSystem is read.
    let reply = read("/w/off-hot", "").await;
    assert_eq!((reply.state, reply.power_draw), (PowerState::Off, None));
    // Paused (Resource.PowerState v1_13_0): memory kept, Suspended.
    let reply = read("/paused", CORROBORATE).await;
    assert!(
        matches!(reply.state, PowerState::Suspended { .. }),
        "{reply:?}"
    );
    assert_eq!(reply.power_draw, None);
}

/// sushy-tools serves no power figures (its Chassis has Thermal only): its Off reads carry an
/// unavailable witness, so an entry that asks for one never counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_off_reads_have_no_power_draw_witness() {
    let emu = support::sushy::SushyEmulator::start(1).await;
    let entry = parsed_bmc_entry(
        "redfish",
        emu.dir(),
        &emu.base_url(),
        support::sushy::USERNAME,
        support::sushy::PASSWORD,
        &format!(
            "system = \"{}\"\nca_file = \"{}\"\n{CORROBORATE}",
            emu.system_path(0),
            emu.cert_pem_path().display()
        ),
    );
    let src = RedfishSource::new(&entry, "n1").unwrap();
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", Duration::from_secs(30)).await;
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    let why = unavailable_because(&reply);
    eprintln!("sushy-tools' power draw: {why}");
    assert!(
        why.contains("links neither EnvironmentMetrics nor Power") || why.contains("Links.Chassis"),
        "{why}"
    );
}

const DECISION: Duration = Duration::from_secs(90);

/// End to end: nodes whose BMCs all read Off. Hibernated (ACPI S4), a stale Off drawing
/// 180 W, and an Off whose witness cannot be read are never fenced; the Off drawing 3 W is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_only_an_off_that_is_off() {
    use support::k8s::{FakeNode, KubeletIdentity};

    let s = Scenario::without_machines("witness").await;
    let odd = OddBmc::start();
    let odd_extra = |system: &str| {
        format!(
            "timeout = \"3s\"\nsystem = \"{system}\"\nca_file = \"{}\"\n{CORROBORATE}",
            odd.cert.display()
        )
    };
    let odd_address = format!("https://127.0.0.1:{}", odd.port);
    let (hibernated, hot, cold) = (
        RmcpBmc::start(&[Suite::Three], guid(0x30)).await,
        RmcpBmc::start(&[Suite::Three], guid(0x40)).await,
        RmcpBmc::start(&[Suite::Three], guid(0x50)).await,
    );
    for bmc in [&hibernated, &hot, &cold] {
        bmc.set_power(false);
        bmc.set_acpi_state(Some(0x05));
    }
    hibernated.set_acpi_state(Some(0x04));
    hot.set_power_reading(Some((180, true)));
    cold.set_power_reading(Some((3, true)));
    let password = ipmi_sim::PASSWORD;
    s.map_ipmi("hibernated", &hibernated.address(), password, "");
    s.map_ipmi("hot", &hot.address(), password, CORROBORATE);
    s.map_ipmi("cold", &cold.address(), password, CORROBORATE);
    s.map_redfish("rf-hot", &odd_address, "pw", &odd_extra("/w/off-hot"));
    s.map_redfish(
        "rf-unlinked",
        &odd_address,
        "pw",
        &odd_extra("/w/off-unlinked"),
    );
    let ipmi_uuid = |g: [u8; 16]| KubeletIdentity::uuid(&uuid_forms_of_ipmi_guid(&g)[0]);
    let nodes = [
        ("hibernated", ipmi_uuid(guid(0x30))),
        ("hot", ipmi_uuid(guid(0x40))),
        ("cold", ipmi_uuid(guid(0x50))),
        ("rf-hot", KubeletIdentity::uuid(odd_bmc::HOT_UUID)),
        ("rf-unlinked", KubeletIdentity::uuid(odd_bmc::COLD_UUID)),
    ];
    let mut fake = Vec::new();
    for (suffix, identity) in nodes {
        fake.push(s.node_reporting(suffix, "boot-1", identity).await);
    }
    let daemon = s.daemon().await;
    for n in &fake {
        n.die("boot-1").await;
    }

    let report = daemon
        .wait_rule(&s.name("cold"), "fenced-awaiting-recovery", DECISION)
        .await;
    let reads = report["reads"].to_string();
    assert!(reads.contains("3 W (DCMI Get Power Reading"), "{reads}");
    let report = daemon
        .wait_rule(&s.name("hibernated"), "power-suspended", DECISION)
        .await;
    assert!(
        report["reason"].to_string().contains("S4 suspend to disk"),
        "{report}"
    );
    for (suffix, want) in [
        ("hot", "draws 180 W (DCMI Get Power Reading"),
        (
            "rf-hot",
            "draws 180.5 W (PowerControl[1].PowerConsumedWatts",
        ),
        ("rf-unlinked", "has no Links.Chassis"),
    ] {
        let report = daemon
            .wait_rule(&s.name(suffix), "off-uncorroborated", DECISION)
            .await;
        assert_eq!(report["state"], "blocked", "{report}");
        let reason = report["reason"].to_string();
        assert!(reason.contains(want), "{suffix}: {reason}");
    }
    // `why` shows what the witness saw.
    let out = support::cli::oobfence_async(&["why", &s.name("hot")], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(why.contains("off-uncorroborated"), "{why}");
    assert!(why.contains("power draw: 180 W"), "{why}");
    // Only the corroborated Off was fenced, however long the others stay Off.
    for n in &fake {
        let tainted = FakeNode::has_oos_taint(&n.get().await);
        assert_eq!(tainted, n.name == s.name("cold"), "{}", n.name);
    }
    daemon.stop().await;
    for n in &fake {
        n.delete().await;
    }
}

/// End to end through a Redfish rack PDU (DMTF's example, the project's test server): a node
/// whose outlet reads Off drawing 0 W is fenced; one whose outlet reads Off while drawing 180 W
/// never is, and `why` says what the outlet drew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_through_a_pdu_outlet_only_when_it_draws_nothing() {
    use support::k8s::{FakeNode, KubeletIdentity};
    use support::redfish_pdu::{self, RedfishPdu};
    use support::scenario::FIRST_BOOT;

    let s = Scenario::without_machines("pdu").await;
    s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
    let pdu = RedfishPdu::start(&[("A1", "On", Some(197.4)), ("A2", "On", Some(210.0))]);
    for (suffix, outlet) in [("cut", "A1"), ("hot", "A2")] {
        let extra = format!(
            "outlet = \"{}\"\nidentity = \"unchecked\"\nca_file = \"{}\"\ntimeout = \"3s\"\n",
            RedfishPdu::outlet(outlet),
            pdu.cert.display()
        );
        s.map_redfish(suffix, &pdu.base_url(), redfish_pdu::PASSWORD, &extra);
    }
    let mut nodes = Vec::new();
    for suffix in ["cut", "hot"] {
        nodes.push(
            s.node_reporting(suffix, FIRST_BOOT, KubeletIdentity::default())
                .await,
        );
    }
    let daemon = s.daemon().await;
    pdu.set_outlet("A1", "Off", Some(0.0));
    pdu.set_outlet("A2", "Off", Some(180.0));
    for n in &nodes {
        n.die(FIRST_BOOT).await;
    }

    let report = daemon.wait_fenced(&nodes[0].name, DECISION).await;
    assert_eq!(report["power_source"]["backend"], "redfish", "{report}");
    let report = daemon
        .wait_rule(&nodes[1].name, "power-unknown", DECISION)
        .await;
    let reason = report["reason"].to_string();
    assert!(reason.contains("reads Off but draws 180 W"), "{reason}");
    assert!(!FakeNode::has_oos_taint(&nodes[1].get().await));
    // `why` names the outlet that spoke, what it drew, and that the mapping is the operator's.
    let out = support::cli::oobfence_async(&["why", &nodes[0].name], &daemon.config_path).await;
    let why = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(why.contains("Outlets/A1"), "{why}");
    assert!(why.contains("power draw: 0 W"), "{why}");
    daemon.stop().await;
    for n in &nodes {
        n.delete().await;
    }
}
