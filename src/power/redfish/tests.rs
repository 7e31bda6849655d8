use std::path::Path;

use super::errors::truncate;
use super::*;
use crate::config::Config;

fn kind(state: &PowerState) -> Option<ReadErrorKind> {
    match state {
        PowerState::Error { kind, .. } => Some(*kind),
        _ => None,
    }
}

const ASKED: &str = "/redfish/v1/Systems/1";

/// A ComputerSystem at [`ASKED`] with these members (JSON, without braces) besides.
fn system(members: &str) -> Vec<u8> {
    let sep = if members.is_empty() { "" } else { ", " };
    format!(
        r##"{{"@odata.id": "{ASKED}", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem"{sep}{members}}}"##
    )
    .into_bytes()
}

fn parse_power_state(body: &[u8]) -> PowerState {
    parse_reply(body, ASKED).state
}

fn detail(state: &PowerState) -> &str {
    match state {
        PowerState::Error { detail, .. } | PowerState::Transitional { detail } => detail,
        _ => "",
    }
}

#[test]
fn exact_values_map_to_states() {
    assert_eq!(
        parse_power_state(&system(r#""PowerState":"Off""#)),
        PowerState::Off
    );
    assert_eq!(
        parse_power_state(&system(r#""PowerState":"On""#)),
        PowerState::On
    );
    for t in ["PoweringOn", "PoweringOff"] {
        let body = format!(r#""Id":"1","PowerState":"{t}","Status":{{"State":"Enabled"}}"#);
        assert_eq!(
            parse_power_state(&system(&body)),
            PowerState::Transitional {
                detail: t.to_string()
            }
        );
    }
    // Paused (Resource.PowerState, v1_13_0): memory kept, the system resumes where it was.
    assert_eq!(
        parse_power_state(&system(r#""PowerState":"Paused""#)),
        PowerState::Suspended {
            detail: "the ComputerSystem's PowerState is Paused".into()
        }
    );
}

#[test]
fn near_misses_of_off_are_errors() {
    for v in [
        "off",
        "OFF",
        " Off",
        "Off ",
        "Off\u{0}",
        "Of",
        "PoweredOff",
        "Shutdown",
        "",
        "Unknown",
    ] {
        let member = serde_json::json!({ "PowerState": v }).to_string();
        let s = parse_power_state(&system(&member[1..member.len() - 1]));
        assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{v:?}: {s:?}");
        assert!(detail(&s).contains("unknown PowerState"), "{s:?}");
    }
}

#[test]
fn missing_null_and_odd_types_are_errors() {
    let cases = [
        (system(""), "has no PowerState"),
        (
            br##"{"@odata.id":"/redfish/v1/Systems/1","@odata.type":"#ComputerSystemCollection.ComputerSystemCollection"}"##.to_vec(),
            "ComputerSystemCollection",
        ),
        (system(r#""PowerState":null"#), "null"),
        (system(r#""PowerState":0"#), "not a string: \"0\""),
        (system(r#""PowerState":false"#), "not a string"),
        (system(r#""PowerState":["Off"]"#), "not a string"),
        (system(r#""PowerState":{"State":"Off"}"#), "not a string"),
        (system(r#""Status":{"PowerState":"Off"}"#), "no PowerState"),
        (system(r#""powerstate":"Off""#), "no PowerState"),
        (system(r#""PowerState":"On","PowerState":"Off""#), "2 times"),
    ];
    for (body, want) in cases {
        let s = parse_power_state(&body);
        assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{s:?}");
        assert!(detail(&s).contains(want), "{want:?} not in {s:?}");
    }
}

#[test]
fn non_json_and_non_objects_are_errors() {
    let cases: [&[u8]; 9] = [
        b"",
        b"   \n",
        b"<html><body>Login</body></html>",
        b"Off",
        b"\"Off\"",
        br#"[{"PowerState":"Off"}]"#,
        br#"{"PowerState":"Off""#,
        br#"{"PowerState":"Off"} trailing"#,
        b"\xff\xfe\x00garbage",
    ];
    for body in cases {
        let s = parse_power_state(body);
        assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{body:?}: {s:?}");
    }
}

#[test]
fn details_quote_briefly_and_escape() {
    let long = "x".repeat(10_000);
    let s = parse_power_state(&system(&format!(r#""PowerState":"{long}""#)));
    assert!(detail(&s).contains("unknown PowerState"), "{s:?}");
    assert!(detail(&s).len() < 200, "{s:?}");

    let body = "<html>\n\u{1b}[31m".to_string() + &"y".repeat(5000);
    let s = parse_power_state(body.as_bytes());
    let d = detail(&s);
    assert!(d.len() < 400, "{d}");
    assert!(!d.contains('\n') && !d.contains('\u{1b}'), "{d}");
    assert!(d.contains("<html>\\n"), "{d}");
}

#[test]
fn escaped_key_still_counts_as_power_state() {
    // JSON escapes in keys are the same key; a duplicate hidden this way is still caught.
    let s = parse_power_state(&system(r#""PowerState":"On","Power\u0053tate":"Off""#));
    assert!(detail(&s).contains("2 times"), "{s:?}");
    assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{s:?}");
}

#[test]
fn discovery_takes_only_a_single_listed_system() {
    let one = br#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}"#;
    assert_eq!(single_system(one, "n1").unwrap(), "/redfish/v1/Systems/1");
    let cases: [(&[u8], &str); 8] = [
        (br#"{"Members":[]}"#, "lists no system"),
        (
            br#"{"Members":[{"@odata.id":"/a"},{"@odata.id":"/b"}]}"#,
            "lists 2 systems",
        ),
        (
            br#"{"Members":[{"@odata.id":"/a"}],"Members@odata.count":2}"#,
            "count disagrees",
        ),
        (
            br#"{"Members":[{"@odata.id":"/a"}],"Members@odata.nextLink":"/p2"}"#,
            "paged",
        ),
        (
            br#"{"Members":[{"@odata.id":"https://other.example/x"}]}"#,
            "not a path",
        ),
        (br#"{"Members":[{"@odata.id":7}]}"#, "without a string"),
        (br#"{"Systems":[]}"#, "no Members"),
        (b"<html>", "not JSON"),
    ];
    for (body, want) in cases {
        let state = single_system(body, "n1").unwrap_err();
        assert_eq!(kind(&state), Some(ReadErrorKind::BadReply), "{state:?}");
        assert!(detail(&state).contains(want), "{want:?} not in {state:?}");
    }
}

fn entry(dir: &Path, address: &str, extra: &str) -> BmcEntry {
    let pw = dir.join("pw");
    std::fs::write(&pw, "very-secret-pw\n").unwrap();
    let text = format!(
        "datacenter = \"t\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"redfish\"\n\
         address = \"{address}\"\nusername = \"admin\"\npassword_file = \"{}\"\n{extra}\n",
        pw.display()
    );
    let cfg = Config::parse(&text, Path::new("t.toml")).unwrap();
    cfg.bmc[0].clone()
}

#[test]
fn debug_and_address_hide_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let e = entry(
        dir.path(),
        "https://{node}-bmc.example:8443",
        "system = \"/redfish/v1/Systems/{node}\"",
    );
    let src = RedfishSource::new(&e, "n1").unwrap();
    let dbg = format!("{src:?}");
    assert!(!dbg.contains("very-secret-pw"), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
    assert!(dbg.contains("/redfish/v1/Systems/n1"), "{dbg}");
    assert_eq!(src.address(), "https://n1-bmc.example:8443");
    assert_eq!(src.backend(), "redfish");
}

#[test]
fn credentials_in_the_address_are_refused_without_echo() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = entry(dir.path(), "https://bmc.example", "");
    e.address = "https://admin:url-secret@bmc.example".to_string();
    let err = RedfishSource::new(&e, "n1").unwrap_err();
    assert!(!err.contains("url-secret"), "{err}");
    assert!(err.contains("credentials"), "{err}");
}

#[test]
fn bad_system_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = entry(dir.path(), "https://bmc.example", "");
    for bad in ["//evil.example/x", "/a b"] {
        e.system = Some(bad.to_string());
        assert!(RedfishSource::new(&e, "n1").is_err(), "{bad}");
    }
}

#[test]
fn scrub_redacts_the_password_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let e = entry(dir.path(), "https://bmc.example", "");
    let src = RedfishSource::new(&e, "n1").unwrap();
    let s = src.scrub(PowerState::error(
        ReadErrorKind::Protocol,
        "Location: https://admin:very-secret-pw@x/",
    ));
    assert!(!s.to_string().contains("very-secret-pw"), "{s}");
    assert!(s.to_string().contains("<redacted>"), "{s}");
}

#[test]
fn quote_truncates_on_char_boundaries() {
    let q = quote(&"é".repeat(100));
    assert!(q.ends_with("\"..."), "{q}");
    assert_eq!(q.chars().filter(|&c| c == 'é').count(), QUOTE_CHARS);
    assert_eq!(truncate("abc", 2), "ab...");
    assert_eq!(truncate("abc", 3), "abc");
}

/// A ComputerSystem as a BMC sends it, for the fuzz test to mutate.
const FUZZ_SAMPLE: &str = r##"{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "Id": "1", "PowerState": "Off", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32", "SerialNumber": "CN7475", "Status": {"State": "Enabled"}}"##;

/// Found by the fuzz test: a stray non-UTF-8 byte inside a member the reader skips (here a key
/// under `Status`) left the reply readable as Off. A reply that is not UTF-8 is not JSON.
#[test]
fn a_reply_with_bytes_that_are_not_utf8_is_refused() {
    let mut body = FUZZ_SAMPLE.as_bytes().to_vec();
    let at = FUZZ_SAMPLE.find("{\"State").unwrap() + 2;
    body[at] = 0x80;
    let r = parse_reply(&body, ASKED);
    assert_eq!(kind(&r.state), Some(ReadErrorKind::BadReply), "{r:?}");
    assert!(r.state.to_string().contains("UTF-8"), "{}", r.state);
}

/// The fuzz sample is a well-formed Off reply, so its mutations start from the one answer
/// that can fence.
#[test]
fn fuzz_sample_is_an_off_reply_of_the_asked_system() {
    let r = parse_reply(FUZZ_SAMPLE.as_bytes(), ASKED);
    assert_eq!(r.state, PowerState::Off);
    assert!(
        matches!(r.identity, MachineIdentity::SystemUuid { .. }),
        "{r:?}"
    );
}

proptest::proptest! {
    #![proptest_config(crate::fuzz::config())]

    /// Whatever arrives, no panic; and Off only ever comes from a JSON object that says it is
    /// the ComputerSystem asked for and whose one `PowerState` is exactly "Off".
    #[test]
    fn fuzz_redfish_replies(body in crate::fuzz::bytes_like(FUZZ_SAMPLE.as_bytes())) {
        let reply = parse_reply(&body, ASKED);
        if reply.state == PowerState::Off {
            let v: serde_json::Value = serde_json::from_slice(&body).expect("Off from non-JSON");
            proptest::prop_assert_eq!(v["PowerState"].as_str(), Some("Off"));
            let id = v["@odata.id"].as_str().unwrap_or_default();
            proptest::prop_assert!(id.trim_end_matches('/').ends_with(ASKED), "{}", id);
            let ty = v["@odata.type"].as_str().unwrap_or_default();
            proptest::prop_assert!(ty.starts_with("#ComputerSystem."), "{}", ty);
        }
    }
}
