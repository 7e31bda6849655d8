//! A rack PDU's outlet read through the Redfish reader (`outlet = ...`), against DMTF's rack PDU
//! example served by a test server (`tests/support/redfish_pdu.rs`): its `PowerState`, with its
//! `PowerWatts` as the second witness (an outlet drawing current is not off, whatever its state
//! says); its failures are errors, never Off; its `Outlet.PowerControl` only on the outlet's
//! own target, after the caller's check.

use oobfence::power::{ActionOutcome, PowerAction, PowerDraw, Reply, Watts, checked};
use support::redfish_pdu::{self, RedfishPdu};

use super::*;

/// An outlet entry for node `n1`: `outlet` at the PDU, its certificate pinned.
fn outlet_entry(pdu: &RedfishPdu, outlet: &str, password: &str, extra: &str) -> BmcEntry {
    parsed_bmc_entry(
        "redfish",
        pdu.dir(),
        &pdu.base_url(),
        redfish_pdu::USERNAME,
        password,
        &format!(
            "outlet = \"{outlet}\"\nidentity = \"unchecked\"\nca_file = \"{}\"\n{extra}",
            pdu.cert.display()
        ),
    )
}

async fn read(pdu: &RedfishPdu, outlet: &str) -> Reply {
    let entry = outlet_entry(pdu, outlet, redfish_pdu::PASSWORD, "");
    source(&entry, "n1").read_reply().await
}

fn detail<'a>(reply: &'a Reply, name: &str) -> &'a str {
    reply
        .details
        .iter()
        .find(|d| d.name == name)
        .map(|d| d.value.as_str())
        .unwrap_or_else(|| panic!("no {name:?} detail in {reply:?}"))
}

#[tokio::test]
async fn an_outlet_on_reads_on_and_carries_no_identity() {
    let pdu = RedfishPdu::start(&[("A1", "On", Some(197.4))]);
    let reply = read(&pdu, &RedfishPdu::outlet("A1")).await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    // An outlet cannot say whose machine it feeds.
    assert!(
        matches!(&reply.identity, MachineIdentity::Unreported { reason } if reason.contains("outlet")),
        "{:?}",
        reply.identity
    );
    assert!(
        pdu.requests()
            .contains("GET /redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1")
    );
}

#[tokio::test]
async fn an_outlet_off_drawing_nothing_reads_off_with_its_draw() {
    let pdu = RedfishPdu::start(&[("A1", "Off", Some(0.0))]);
    let reply = read(&pdu, &RedfishPdu::outlet("A1")).await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(
        reply.power_draw,
        Some(PowerDraw::Seen {
            watts: Watts::whole(0),
            from: "PowerWatts.Reading of /redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1".into()
        })
    );
    assert!(detail(&reply, "power draw").starts_with("0 W"), "{reply:?}");
}

/// The outlet says Off but a load on it draws 180 W: its relay did not open, or its state is
/// stale. Never Off, and the read says why.
#[tokio::test]
async fn an_outlet_off_drawing_current_is_not_off() {
    let pdu = RedfishPdu::start(&[("A1", "Off", Some(180.0))]);
    let reply = read(&pdu, &RedfishPdu::outlet("A1")).await;
    let (kind, why) = error_of(&reply.state);
    assert_eq!(kind, ReadErrorKind::BadReply, "{reply:?}");
    assert!(
        why.contains("reads Off but draws 180 W") && why.contains("above 20 W"),
        "{why}"
    );
    // A draw just above the threshold is refused too; at it, the Off stands.
    pdu.set_outlet("A1", "Off", Some(20.5));
    let reply = read(&pdu, &RedfishPdu::outlet("A1")).await;
    assert!(matches!(reply.state, PowerState::Error { .. }), "{reply:?}");
    pdu.set_outlet("A1", "Off", Some(20.0));
    assert_eq!(
        read(&pdu, &RedfishPdu::outlet("A1")).await.state,
        PowerState::Off
    );
}

/// No PowerWatts at all (an unmetered outlet): Off stands on the state alone, and the read
/// says no draw was reported, so that `corroborate = "power-draw"` refuses it.
#[tokio::test]
async fn an_unmetered_outlet_off_reads_off_and_says_no_draw_was_reported() {
    let pdu = RedfishPdu::start(&[("A1", "Off", None)]);
    let reply = read(&pdu, &RedfishPdu::outlet("A1")).await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert!(
        matches!(&reply.power_draw, Some(PowerDraw::Unavailable { why }) if why.contains("reports no PowerWatts")),
        "{reply:?}"
    );
    assert!(
        detail(&reply, "power draw").contains("no draw was reported"),
        "{reply:?}"
    );
    // An entry that asks for the draw as a witness gets no count from that Off; a metered
    // outlet's 0 W counts.
    let entry = outlet_entry(
        &pdu,
        &RedfishPdu::outlet("A1"),
        redfish_pdu::PASSWORD,
        "corroborate = \"power-draw\"",
    );
    let required = entry.corroborate.expect("corroborate is set");
    let why = oobfence::decision::witness::check(required, reply.power_draw.as_ref()).unwrap_err();
    assert!(why.contains("unavailable"), "{why}");
    pdu.set_outlet("A1", "Off", Some(0.0));
    let metered = source(&entry, "n1").read_reply().await;
    assert_eq!(metered.state, PowerState::Off, "{metered:?}");
    assert!(oobfence::decision::witness::check(required, metered.power_draw.as_ref()).is_ok());
}

#[tokio::test]
async fn a_pdu_that_does_not_answer_is_unreachable_or_a_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = sushy::free_port();
    let entry = parsed_bmc_entry(
        "redfish",
        dir.path(),
        &format!("https://127.0.0.1:{port}"),
        redfish_pdu::USERNAME,
        redfish_pdu::PASSWORD,
        "outlet = \"/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1\"\nidentity = \"unchecked\"\ntimeout = \"2s\"",
    );
    let state = source(&entry, "n1").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Unreachable, "{state:?}");

    // Accepts and holds connections without a byte.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let entry = parsed_bmc_entry(
        "redfish",
        dir.path(),
        &format!("https://127.0.0.1:{port}"),
        redfish_pdu::USERNAME,
        redfish_pdu::PASSWORD,
        "outlet = \"/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1\"\nidentity = \"unchecked\"\ntimeout = \"1s\"",
    );
    let start = Instant::now();
    let state = source(&entry, "n1").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Timeout, "{state:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    peer.abort();
}

#[tokio::test]
async fn wrong_credentials_are_an_auth_error() {
    let pdu = RedfishPdu::start(&[("A1", "Off", Some(0.0))]);
    let entry = outlet_entry(&pdu, &RedfishPdu::outlet("A1"), "not-the-Passw0rd", "");
    let state = source(&entry, "n1").read().await;
    let (kind, why) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{state:?}");
    assert!(!why.contains("not-the-Passw0rd"), "{why}");
}

/// An outlet the PDU does not have, and a resource of the PDU that is not an outlet: errors
/// naming what was found, never Off.
#[tokio::test]
async fn a_path_that_is_no_outlet_is_an_error() {
    let pdu = RedfishPdu::start(&[("A1", "Off", Some(0.0))]);
    let state = read(&pdu, &RedfishPdu::outlet("B9")).await.state;
    let (kind, why) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{state:?}");
    assert!(why.contains("404"), "{why}");

    // An answer that is the PDU itself, not the outlet asked for.
    pdu.alias("Z9", redfish_pdu::PDU);
    let state = read(&pdu, &RedfishPdu::outlet("Z9")).await.state;
    let (kind, why) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::BadReply, "{state:?}");
    assert!(
        why.contains("reply is the resource \"/redfish/v1/PowerEquipment/RackPDUs/1\"")
            && why.contains("not the Outlet at"),
        "{why}"
    );
}

/// Behind a path-prefix proxy, an outlet path that climbs out of the prefix would reach another
/// service with these credentials: refused when the source is built, nothing sent.
#[tokio::test]
async fn an_outlet_path_outside_the_pdus_service_is_refused() {
    let pdu = RedfishPdu::start(&[("A1", "Off", Some(0.0))]);
    for outlet in [
        "/redfish/v1/../../pdu-b/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1",
        "/redfish/%2e%2e/%2E%2e/pdu-b/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1",
    ] {
        let entry = parsed_bmc_entry(
            "redfish",
            pdu.dir(),
            &format!("{}/pdu-a/", pdu.base_url()),
            redfish_pdu::USERNAME,
            redfish_pdu::PASSWORD,
            &format!("outlet = \"{outlet}\"\nidentity = \"unchecked\""),
        );
        let e = RedfishSource::new(&entry, "n1").unwrap_err();
        assert!(e.contains("outlet") && e.contains("'..'"), "{e}");
    }
    assert!(!pdu.requests().contains("pdu-b"), "{}", pdu.requests());
}

/// `Outlet.PowerControl` with `PowerState` Off and On, sent to the outlet's own target (DMTF's
/// example names it without an `Actions/` segment) only after the caller's check passed on the
/// outlet read right before; a refused check and a target of another outlet send nothing.
#[tokio::test]
async fn power_control_goes_to_the_outlets_own_target_after_the_check() {
    let pdu = RedfishPdu::start(&[("A1", "On", Some(197.4)), ("A2", "On", Some(150.0))]);
    let entry = outlet_entry(&pdu, &RedfishPdu::outlet("A1"), redfish_pdu::PASSWORD, "");
    let src = source(&entry, "n1");

    let support = src.action_support().await;
    assert!(
        support
            .off
            .as_ref()
            .is_ok_and(|s| s.contains("PowerState Off")),
        "{support:?}"
    );

    let refused = src
        .act(PowerAction::Off, &|_: &Reply| checked(Err("held".into())))
        .await;
    assert_eq!(refused, ActionOutcome::Refused { why: "held".into() });
    assert!(!pdu.requests().contains("POST"), "{}", pdu.requests());

    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| {
            checked(if r.state == PowerState::On {
                Ok(())
            } else {
                Err(format!("not On: {}", r.state))
            })
        })
        .await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(pdu.power_state("A1"), "Off");
    assert_eq!(src.read().await, PowerState::Off);
    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(src.read().await, PowerState::On);

    // A target that is not below this outlet (another outlet's) is never sent to.
    pdu.set_power_control_target(
        "A1",
        &format!("{}/Outlet.PowerControl", RedfishPdu::outlet("A2")),
    );
    let outcome = src
        .act(PowerAction::Off, &|_: &Reply| checked(Ok(())))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("not below")),
        "{outcome:?}"
    );
    assert_eq!(pdu.power_state("A2"), "On");
    assert_eq!(
        pdu.requests().matches("POST").count(),
        2,
        "{}",
        pdu.requests()
    );
}
