//! What a 401 says about HTTP Basic, and where the Sessions collection is found.

use reqwest::header::{HeaderMap, HeaderValue, WWW_AUTHENTICATE};

use super::*;

fn challenge(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(WWW_AUTHENTICATE, HeaderValue::from_str(v).unwrap());
    }
    h
}

/// A 401 that offers Basic is a wrong password; one that offers no Basic, or names
/// sessions, is a BMC that refuses Basic itself.
#[test]
fn a_401_refuses_basic_only_when_it_says_so() {
    let plain = br#"{"error": {"code": "Base.1.8.GeneralError"}}"#;
    let sessions =
        br#"{"error": {"@Message.ExtendedInfo": [{"MessageId": "Base.1.8.NoValidSession"}]}}"#;
    assert!(!refuses_basic(
        &challenge(&["Basic realm=\"Redfish\""]),
        plain
    ));
    assert!(!refuses_basic(&challenge(&["basic"]), b""));
    assert!(!refuses_basic(
        &challenge(&["Bearer", "Basic realm=\"x\""]),
        plain
    ));
    assert!(!refuses_basic(
        &challenge(&["Digest realm=\"x\", Basic realm=\"y\""]),
        plain
    ));
    assert!(refuses_basic(&challenge(&[]), plain));
    assert!(refuses_basic(&challenge(&["X-Auth-Token"]), plain));
    assert!(refuses_basic(&challenge(&["Basic realm=\"x\""]), sessions));
    assert!(refuses_basic(
        &challenge(&[]),
        b"<html>X-Auth-Token required</html>"
    ));
}

#[test]
fn the_sessions_collection_comes_from_the_service_root_alone() {
    let root = br#"{"@odata.id": "/redfish/v1/", "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}}"#;
    assert_eq!(
        sessions_link(root).unwrap(),
        "/redfish/v1/SessionService/Sessions"
    );
    // A service root without Links.Sessions is not guessed at.
    let bare = br#"{"@odata.id": "/redfish/v1/", "SessionService": {"@odata.id": "/redfish/v1/SessionService"}}"#;
    let PowerState::Error { kind, detail } = sessions_link(bare).unwrap_err() else {
        panic!()
    };
    assert_eq!(kind, ReadErrorKind::Protocol);
    assert!(detail.contains("set auth = \"basic\""), "{detail}");
    for bad in [
        &br#"{"Links": {"Sessions": {"@odata.id": "https://elsewhere/s"}}}"#[..],
        br#"{"Links": {"Sessions": {"@odata.id": "//elsewhere/s"}}}"#,
        br#"<html>"#,
    ] {
        let PowerState::Error { kind, .. } = sessions_link(bad).unwrap_err() else {
            panic!()
        };
        assert_eq!(kind, ReadErrorKind::BadReply);
    }
}
