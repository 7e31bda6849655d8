//! Peers that misbehave at the TCP and HTTPS level: nothing listening, silence, garbage, odd
//! HTTPS replies. None is ever a power state.

use super::*;

#[tokio::test]
async fn nothing_listening_is_unreachable_fast() {
    let port = sushy::free_port();
    let dir = tempfile::tempdir().unwrap();
    let entry = bmc(
        dir.path(),
        &format!("https://127.0.0.1:{port}"),
        "pw",
        "timeout = \"5s\"",
    );
    let start = Instant::now();
    let state = source(&entry, "n").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Unreachable, "{state:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn silent_peer_is_a_timeout_within_the_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accepts and holds connections without ever sending a byte.
    let peer = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    for extra in [
        "timeout = \"1s\"",
        "timeout = \"1s\"\nsystem = \"/redfish/v1/Systems/1\"",
    ] {
        let entry = bmc(
            dir.path(),
            &format!("https://127.0.0.1:{port}"),
            "pw",
            extra,
        );
        let start = Instant::now();
        let state = source(&entry, "n").read().await;
        let took = start.elapsed();
        assert_eq!(error_of(&state).0, ReadErrorKind::Timeout, "{state:?}");
        assert!(
            took >= Duration::from_millis(900),
            "gave up early: {took:?}"
        );
        assert!(took < Duration::from_secs(4), "deadline not kept: {took:?}");
    }
    peer.abort();
}

#[tokio::test]
async fn garbage_peer_is_never_a_power_state() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let replies: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"PowerState\":\"Off\"}",
        b"\x16\x03\x01\x00\x05garbage that looks like a TLS record header",
        b"\x00\xff\x13\x37 not TLS, not HTTP",
    ];
    let dir = tempfile::tempdir().unwrap();
    for reply in replies {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let peer = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(reply).await;
                let _ = conn.shutdown().await;
            }
        });
        let extra = "timeout = \"3s\"\nsystem = \"/redfish/v1/Systems/1\"";
        let entry = bmc(
            dir.path(),
            &format!("https://127.0.0.1:{port}"),
            "pw",
            extra,
        );
        let state = source(&entry, "n").read().await;
        let (kind, detail) = error_of(&state);
        assert!(
            matches!(
                kind,
                ReadErrorKind::Tls | ReadErrorKind::BadReply | ReadErrorKind::Protocol
            ),
            "{reply:?}: {kind:?}: {detail}"
        );
        peer.abort();
    }
}

#[tokio::test]
async fn odd_https_replies_are_never_a_power_state() {
    let bmc_server = OddBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let reply = |path: &str, password: &str| {
        let extra = format!(
            "timeout = \"2s\"\nsystem = \"{path}\"\nca_file = \"{}\"",
            bmc_server.cert.display()
        );
        let entry = bmc(
            dir.path(),
            &format!("https://127.0.0.1:{}", bmc_server.port),
            password,
            &extra,
        );
        async move { source(&entry, "n").read_reply().await }
    };
    let read = |path: &str| {
        let reply = reply(path, "pw");
        async move { reply.await.state }
    };
    // The server itself works: a clean Off is read as Off, with the machine's identity.
    let off = reply("/off", "pw").await;
    assert_eq!(off.state, PowerState::Off);
    assert_eq!(
        off.identity,
        MachineIdentity::SystemUuid {
            forms: vec![
                "4c4c4544-0038-4b10-8052-b4c04f4a4e32".into(),
                // SMBIOS byte-swapped and byte-reversed forms, which some firmware reports.
                "44454c4c-3800-104b-8052-b4c04f4a4e32".into(),
                "324e4a4f-c0b4-5280-104b-380044454c4c".into(),
            ],
            serial: Some("SN-odd".into()),
        }
    );
    // An absolute URL in @odata.id with the asked path (and a trailing slash) is the same.
    assert_eq!(read("/off-url").await, PowerState::Off);
    // What the BMC echoes into the identity never shows the password.
    let echo = reply("/serial-echo", "Pa55-word").await;
    assert_eq!(echo.state, PowerState::On);
    let text = format!("{} {:?}", echo.identity, echo.identity);
    assert!(!text.contains("Pa55-word"), "{text}");
    assert!(text.contains("<redacted>"), "{text}");
    let bad_uuid = reply("/bad-uuid", "Pa55-word").await;
    assert_eq!(bad_uuid.state, PowerState::On);
    let MachineIdentity::Unreported { reason } = &bad_uuid.identity else {
        panic!("{bad_uuid:?}");
    };
    assert!(reason.contains("not a UUID"), "{reason}");
    assert!(!reason.contains("Pa55-word"), "{reason}");

    let cases = [
        (
            "/other-system",
            ReadErrorKind::BadReply,
            "reply is the resource \"/redfish/v1/Systems/other\" (its @odata.id), not the \
             ComputerSystem at \"/other-system\"",
        ),
        ("/anonymous", ReadErrorKind::BadReply, "has no @odata.id"),
        (
            "/chassis",
            ReadErrorKind::BadReply,
            "reply is a \"#Chassis.v1_0_0.Chassis\", not a ComputerSystem",
        ),
        ("/untyped", ReadErrorKind::BadReply, "has no @odata.type"),
        ("/html", ReadErrorKind::BadReply, "not JSON"),
        (
            "/lower",
            ReadErrorKind::BadReply,
            "unknown PowerState \"off\"",
        ),
        ("/dup", ReadErrorKind::BadReply, "2 times"),
        ("/null", ReadErrorKind::BadReply, "null"),
        ("/truncated", ReadErrorKind::BadReply, "not JSON"),
        ("/big", ReadErrorKind::BadReply, "larger than"),
        ("/error", ReadErrorKind::Protocol, "500"),
        ("/forbidden", ReadErrorKind::Auth, "403"),
        ("/empty", ReadErrorKind::BadReply, "empty"),
        ("/missing", ReadErrorKind::Protocol, "404"),
        ("/redirect", ReadErrorKind::Protocol, "302"),
    ];
    for (path, want, text) in cases {
        let state = read(path).await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, want, "{path}: {detail}");
        assert!(detail.contains(text), "{path}: {text:?} not in {detail:?}");
        assert!(detail.len() < 400, "{path}: detail too long: {detail}");
        assert!(!detail.contains("elsewhere.invalid"), "{detail}");
    }

    // Headers arrive, the body stalls: the deadline still holds.
    let start = Instant::now();
    let state = read("/slow-body").await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Timeout, "{state:?}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
