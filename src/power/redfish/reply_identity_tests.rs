//! A ComputerSystem reply counts only when it is the resource that was asked for. Every body
//! below carries a well-formed `PowerState`. Before `@odata.id` and `@odata.type` were checked,
//! a reply for another system, one without `@odata.id` or `@odata.type`, and one whose type
//! merely contained "ComputerSystem" (`#ComputerSystemCollection...`) were read as On or Off.

use super::*;

const ASKED: &str = "/redfish/v1/Systems/1";
const SYSTEM_TYPE: &str = "#ComputerSystem.v1_20_0.ComputerSystem";

fn body(id: Option<&str>, odata_type: Option<&str>, power: &str) -> Vec<u8> {
    let mut doc =
        serde_json::json!({ "PowerState": power, "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32" });
    if let Some(id) = id {
        doc["@odata.id"] = id.into();
    }
    if let Some(t) = odata_type {
        doc["@odata.type"] = t.into();
    }
    doc.to_string().into_bytes()
}

/// The reply is refused as a bad reply whose detail says `want`, and carries no identity.
fn refused(body: &[u8], want: &str) {
    let reply = parse_reply(body, ASKED);
    match &reply.state {
        PowerState::Error {
            kind: ReadErrorKind::BadReply,
            detail,
        } => assert!(detail.contains(want), "{want:?} not in {detail:?}"),
        other => panic!("{} read as {other:?}", String::from_utf8_lossy(body)),
    }
    assert!(
        matches!(reply.identity, MachineIdentity::Unreported { .. }),
        "{:?}",
        reply.identity
    );
}

#[test]
fn the_asked_system_counts() {
    let reply = parse_reply(&body(Some(ASKED), Some(SYSTEM_TYPE), "Off"), ASKED);
    assert_eq!(reply.state, PowerState::Off);
    assert!(matches!(reply.identity, MachineIdentity::SystemUuid { .. }));
    for (id, t) in [
        ("/redfish/v1/Systems/1/", SYSTEM_TYPE),
        ("https://bmc.example/redfish/v1/Systems/1", SYSTEM_TYPE),
        (
            "https://bmc.example:8443/redfish/v1/Systems/1/",
            SYSTEM_TYPE,
        ),
        (ASKED, "#ComputerSystem.ComputerSystem"),
        (ASKED, "#ComputerSystem.v1_0_0.ComputerSystem"),
    ] {
        let state = parse_reply(&body(Some(id), Some(t), "On"), ASKED).state;
        assert_eq!(state, PowerState::On, "{id} {t}");
    }
    // The trailing slash may be on the asked path instead.
    let state = parse_reply(
        &body(Some(ASKED), Some(SYSTEM_TYPE), "On"),
        "/redfish/v1/Systems/1/",
    )
    .state;
    assert_eq!(state, PowerState::On);
}

#[test]
fn another_systems_reply_is_refused() {
    // A BMC that answers for another of its systems (or a proxy that mixes up paths).
    refused(
        &body(Some("/redfish/v1/Systems/2"), Some(SYSTEM_TYPE), "Off"),
        "\"/redfish/v1/Systems/2\" (its @odata.id), not the ComputerSystem at \"/redfish/v1/Systems/1\"",
    );
    for id in [
        "/redfish/v1/Systems/10",
        "/redfish/v1/Systems/1//",
        "/redfish/v1/systems/1",
        "/redfish/v1/Systems",
        "/redfish/v1/Systems/1/Pending",
        "https://bmc.example/redfish/v1/Systems/2",
        "https://bmc.example/redfish/v1/Systems/1?x=1",
        "https://bmc.example/redfish/v1/Systems/1#/PowerState",
        "ftp://bmc.example/redfish/v1/Systems/1",
        "redfish/v1/Systems/1",
        "",
    ] {
        refused(&body(Some(id), Some(SYSTEM_TYPE), "Off"), "its @odata.id");
    }
}

#[test]
fn a_reply_without_odata_id_is_refused() {
    refused(&body(None, Some(SYSTEM_TYPE), "Off"), "has no @odata.id");
    refused(
        br##"{"@odata.id": 1, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "Off"}"##,
        "@odata.id that is not a string",
    );
    refused(
        br##"{"@odata.id": "/redfish/v1/Systems/2", "@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "Off"}"##,
        "@odata.id 2 times",
    );
}

#[test]
fn a_chassis_or_manager_reply_is_refused() {
    // A `system` pointing at the Chassis or Manager: they have a PowerState of their own.
    for t in [
        "#Chassis.v1_0_0.Chassis",
        "#Manager.v1_10_0.Manager",
        "#ComputerSystemCollection.ComputerSystemCollection",
        "#ComputerSystem.v1_20_0.Chassis",
        "ComputerSystem.v1_20_0.ComputerSystem",
        "#ComputerSystem.v1_20_0.ComputerSystemX",
        "",
        // The Redfish 1.0 spelling (no `v`) of everything that is not a ComputerSystem.
        "#Chassis.1.0.0.Chassis",
        "#Manager.1.0.0.Manager",
        "#ComputerSystemCollection.1.0.0.ComputerSystemCollection",
        "#ComputerSystem.1.0.1.Foo",
        "#ComputerSystem.1.0.1.Chassis",
        // Versions that are neither form: underscores without the `v`, dots after it, empty
        // or non-digit parts, no dot before the type name.
        "#ComputerSystem.1_0_1.ComputerSystem",
        "#ComputerSystem.v1.0.1.ComputerSystem",
        "#ComputerSystem..ComputerSystem",
        "#ComputerSystem.1..1.ComputerSystem",
        "#ComputerSystem.1.0.x.ComputerSystem",
        "#ComputerSystem. 1.0.1.ComputerSystem",
        "#ComputerSystem.1.0.1ComputerSystem",
        "#ComputerSystem.1.0.1.ComputerSystemCollection",
    ] {
        refused(
            &body(Some(ASKED), Some(t), "Off"),
            &format!("reply is a {}, not a ComputerSystem", quote(t)),
        );
    }
}

/// HPE iLO 4 (ProLiant Gen9) names its system in the Redfish 1.0 form, before `v1_0_1`:
/// `#ComputerSystem.1.0.1.ComputerSystem`. Refused before, so such machines could never be
/// fenced.
#[test]
fn redfish_1_0_type_names_are_a_computer_system() {
    for t in [
        "#ComputerSystem.1.0.1.ComputerSystem",
        "#ComputerSystem.1.0.0.ComputerSystem",
        "#ComputerSystem.1.1.0.ComputerSystem",
    ] {
        let reply = parse_reply(&body(Some(ASKED), Some(t), "Off"), ASKED);
        assert_eq!(reply.state, PowerState::Off, "{t}");
        assert!(
            matches!(reply.identity, MachineIdentity::SystemUuid { .. }),
            "{t}: {:?}",
            reply.identity
        );
        let on = parse_reply(&body(Some(ASKED), Some(t), "On"), ASKED).state;
        assert_eq!(on, PowerState::On, "{t}");
    }
}

/// The refusal says what a ComputerSystem's type looks like, in both forms, and what to do.
#[test]
fn a_refused_type_names_both_forms_and_the_remedy() {
    let reply = parse_reply(
        &body(Some(ASKED), Some("#Chassis.1.0.0.Chassis"), "Off"),
        ASKED,
    );
    let PowerState::Error { detail, .. } = &reply.state else {
        panic!("{reply:?}");
    };
    for want in [
        "\"#Chassis.1.0.0.Chassis\"",
        "#ComputerSystem.v1_20_0.ComputerSystem",
        "#ComputerSystem.1.0.1.ComputerSystem",
        "/redfish/v1/Systems",
    ] {
        assert!(detail.contains(want), "{want:?} not in {detail:?}");
    }
}

#[test]
fn a_reply_without_odata_type_is_refused() {
    refused(&body(Some(ASKED), None, "Off"), "has no @odata.type");
    refused(
        br#"{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": null, "PowerState": "On"}"#,
        "@odata.type that is not a string",
    );
}

#[test]
fn identity_comes_from_uuid_and_serial_number() {
    let reply = parse_reply(
        br##"{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
              "PowerState": "On", "UUID": "4C4C4544-0038-4B10-8052-B4C04F4A4E32", "SerialNumber": " CN7\n01 "}"##,
        ASKED,
    );
    assert_eq!(reply.state, PowerState::On);
    assert_eq!(
        reply.identity,
        MachineIdentity::SystemUuid {
            forms: vec![
                "4c4c4544-0038-4b10-8052-b4c04f4a4e32".into(),
                // SMBIOS byte-swapped and byte-reversed forms, which some firmware reports.
                "44454c4c-3800-104b-8052-b4c04f4a4e32".into(),
                "324e4a4f-c0b4-5280-104b-380044454c4c".into(),
            ],
            serial: Some("CN7\\n01".into()),
        }
    );
    let unreported = |extra: &str| {
        let body = format!(
            r##"{{"@odata.id": "{ASKED}", "@odata.type": "{SYSTEM_TYPE}", "PowerState": "Off"{extra}}}"##
        );
        let reply = parse_reply(body.as_bytes(), ASKED);
        assert_eq!(reply.state, PowerState::Off, "{body}");
        match reply.identity {
            MachineIdentity::Unreported { reason } => reason,
            other => panic!("{body}: {other:?}"),
        }
    };
    assert_eq!(unreported(""), "the ComputerSystem has no UUID");
    assert_eq!(
        unreported(r#", "UUID": """#),
        "the ComputerSystem's UUID is empty"
    );
    assert_eq!(
        unreported(r#", "UUID": "not-a-uuid", "SerialNumber": "S1""#),
        "the ComputerSystem's UUID \"not-a-uuid\" is not a UUID"
    );
    assert!(unreported(r#", "UUID": null"#).contains("not a string"));
    assert!(
        unreported(r#", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e33""#)
            .contains("UUID 2 times")
    );
    // No serial, an empty or a null one: the UUID alone.
    for extra in ["", r#", "SerialNumber": "  ""#, r#", "SerialNumber": null"#] {
        let body = format!(
            r##"{{"@odata.id": "{ASKED}", "@odata.type": "{SYSTEM_TYPE}", "PowerState": "Off", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32"{extra}}}"##
        );
        let identity = parse_reply(body.as_bytes(), ASKED).identity;
        assert!(
            matches!(identity, MachineIdentity::SystemUuid { serial: None, .. }),
            "{body}: {identity:?}"
        );
    }
}

#[test]
fn failed_reads_carry_no_identity() {
    // The right system, but a PowerState that is no answer: no identity either.
    let reply = parse_reply(&body(Some(ASKED), Some(SYSTEM_TYPE), "off"), ASKED);
    assert!(matches!(reply.state, PowerState::Error { .. }), "{reply:?}");
    assert!(matches!(reply.identity, MachineIdentity::Unreported { .. }));
}

#[test]
fn the_password_never_shows_in_an_identity() {
    let scrubbed = scrub_identity(
        "very-secret-pw",
        MachineIdentity::SystemUuid {
            forms: vec!["4c4c4544-0038-4b10-8052-b4c04f4a4e32".into()],
            serial: Some("sn-very-secret-pw".into()),
        },
    );
    assert!(
        !format!("{scrubbed} {scrubbed:?}").contains("very-secret-pw"),
        "{scrubbed}"
    );
    let scrubbed = scrub_identity(
        "very-secret-pw",
        MachineIdentity::unreported("UUID \"very-secret-pw\" is not a UUID"),
    );
    assert!(
        !scrubbed.to_string().contains("very-secret-pw"),
        "{scrubbed}"
    );
    assert!(scrubbed.to_string().contains("<redacted>"), "{scrubbed}");
}
