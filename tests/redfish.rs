//! The Redfish power source against a real Redfish service (sushy-tools' emulator), against
//! peers that misbehave at the TCP level, and against real vendor payloads (the samples that
//! ship with the `sushy` client library).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oobfence::config::BmcEntry;
use oobfence::identity::MachineIdentity;
use oobfence::power::redfish::{RedfishSource, parse_reply};
use oobfence::power::{PowerSource, PowerState, ReadErrorKind};
use support::odd_bmc::OddBmc;
use support::scenario::parsed_bmc_entry;
use support::sushy::{self, SushyEmulator};

/// A `[[bmc]]` entry built through the real config parser. `extra` adds TOML keys.
fn bmc(dir: &Path, address: &str, password: &str, extra: &str) -> BmcEntry {
    parsed_bmc_entry("redfish", dir, address, sushy::USERNAME, password, extra)
}

/// An entry for a BMC of the odd server (any password: it asks for none).
fn bmc_at(dir: &Path, address: &str, extra: &str) -> BmcEntry {
    bmc(dir, address, "any-Passw0rd", extra)
}

fn pinned(emu: &SushyEmulator) -> String {
    format!("ca_file = \"{}\"", emu.cert_pem_path().display())
}

fn source(entry: &BmcEntry, node: &str) -> RedfishSource {
    RedfishSource::new(entry, node).unwrap_or_else(|e| panic!("RedfishSource::new: {e}"))
}

fn error_of(state: &PowerState) -> (ReadErrorKind, &str) {
    match state {
        PowerState::Error { kind, detail } => (*kind, detail.as_str()),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn reads_on_with_a_pinned_certificate() {
    let emu = SushyEmulator::start(1).await;
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let src = source(&entry, "node000");
    assert_eq!(src.read().await, PowerState::On);
    assert_eq!(src.backend(), "redfish");
    assert_eq!(src.address(), emu.base_url());
    // The connection is kept; a second read must work the same.
    assert_eq!(src.read().await, PowerState::On);
}

#[tokio::test]
async fn follows_a_power_cycle() {
    let emu = SushyEmulator::start(1).await;
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let src = source(&entry, "node000");
    assert_eq!(src.read().await, PowerState::On);

    for (on, want) in [(false, PowerState::Off), (true, PowerState::On)] {
        emu.set_power(0, on).await;
        // The fake driver applies the change 1 to 11 s later; until then it still says the
        // old state. Nothing but On or Off may show up on the way.
        let start = Instant::now();
        loop {
            let state = src.read().await;
            if state == want {
                break;
            }
            assert!(
                matches!(state, PowerState::On | PowerState::Off),
                "unexpected {state:?}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still {state:?} 20 s after asking for {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        emu.wait_power(0, if on { "On" } else { "Off" }, Duration::from_secs(1))
            .await;
    }
}

#[tokio::test]
async fn discovers_the_single_system() {
    let emu = SushyEmulator::start(1).await;
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &pinned(&emu));
    let src = source(&entry, "node000");
    assert!(!format!("{src:?}").contains(&emu.uuid(0)));
    assert_eq!(src.read().await, PowerState::On);
    // The discovered path is kept for later reads.
    assert!(format!("{src:?}").contains(&emu.system_path(0)), "{src:?}");
    assert_eq!(src.read().await, PowerState::On);
}

/// The identity is what the emulator's ComputerSystem says: its UUID, and its SerialNumber
/// when it has one.
#[tokio::test]
async fn read_reply_reports_each_systems_uuid() {
    let emu = SushyEmulator::start(3).await;
    for i in 0..3 {
        let system = format!("system = \"{}\"\n{}", emu.system_path(i), pinned(&emu));
        let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
        let reply = source(&entry, "node").read_reply().await;
        assert_eq!(reply.state, PowerState::On, "system {i}: {reply:?}");
        let doc = emu.system_doc(i).await;
        let want_serial = doc["SerialNumber"]
            .as_str()
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_string());
        let MachineIdentity::SystemUuid { forms, serial } = &reply.identity else {
            panic!("system {i}: {:?}", reply.identity);
        };
        assert_eq!(forms, &[emu.uuid(i)], "system {i}");
        assert_eq!(serial, &want_serial, "system {i}");
        for other in (0..3).filter(|&j| j != i) {
            assert!(!forms.contains(&emu.uuid(other)), "system {i} as {other}");
        }
    }

    // A discovered system reports its identity the same way.
    let emu = SushyEmulator::start(1).await;
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &pinned(&emu));
    let reply = source(&entry, "node000").read_reply().await;
    assert_eq!(reply.state, PowerState::On);
    assert!(
        matches!(&reply.identity, MachineIdentity::SystemUuid { forms, .. } if forms == &[emu.uuid(0)]),
        "{:?}",
        reply.identity
    );

    // A failed read (refused credentials, a redirect) carries no identity, and no password.
    let wrong = "Wr0ng-but-still-S3cret";
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), wrong, &system);
    let reply = source(&entry, "node000").read_reply().await;
    assert_eq!(error_of(&reply.state).0, ReadErrorKind::Auth, "{reply:?}");
    assert!(
        matches!(reply.identity, MachineIdentity::Unreported { .. }),
        "{:?}",
        reply.identity
    );
    assert!(!format!("{reply:?}").contains(wrong), "{reply:?}");
    let system = format!("system = \"/redfish/v1/Systems/node000\"\n{}", pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let reply = source(&entry, "node000").read_reply().await;
    assert_eq!(
        error_of(&reply.state).0,
        ReadErrorKind::Protocol,
        "{reply:?}"
    );
    assert!(
        matches!(reply.identity, MachineIdentity::Unreported { .. }),
        "{:?}",
        reply.identity
    );
}

#[tokio::test]
async fn several_systems_need_an_explicit_system() {
    let emu = SushyEmulator::start(3).await;
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &pinned(&emu));
    let src = source(&entry, "node001");
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::BadReply, "{detail}");
    assert!(detail.contains("3 systems"), "{detail}");
    assert!(detail.contains("set `system`"), "{detail}");
    assert!(detail.contains(&emu.uuid(0)), "{detail}");

    // With `system` set, the same BMC reads fine.
    let system = format!("system = \"{}\"\n{}", emu.system_path(1), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    assert_eq!(source(&entry, "node001").read().await, PowerState::On);
}

#[tokio::test]
async fn wrong_password_is_auth_and_never_shown() {
    let emu = SushyEmulator::start(1).await;
    let wrong = "Wr0ng-but-still-S3cret";
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), wrong, &system);
    let src = source(&entry, "node000");
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(detail.contains("401"), "{detail}");
    for text in [
        state.to_string(),
        format!("{state:?}"),
        format!("{src:?}"),
        src.address(),
    ] {
        assert!(!text.contains(wrong), "password leaked: {text}");
    }
    // Discovery hits the same wall.
    let entry = bmc(emu.dir(), &emu.base_url(), wrong, &pinned(&emu));
    let state = source(&entry, "node000").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Auth, "{state:?}");
    assert!(!state.to_string().contains(wrong));
}

#[tokio::test]
async fn redirect_is_a_protocol_error_without_the_location() {
    // The emulator answers /Systems/<name> with a 307 whose Location embeds the credentials.
    let emu = SushyEmulator::start(1).await;
    let system = format!("system = \"/redfish/v1/Systems/node000\"\n{}", pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let state = source(&entry, "node000").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(detail.contains("307"), "{detail}");
    assert!(!detail.contains(sushy::PASSWORD), "{detail}");
    assert!(!detail.contains("@127.0.0.1"), "{detail}");
    assert!(!detail.contains(&emu.uuid(0)), "{detail}");
}

#[tokio::test]
async fn certificate_verification() {
    let emu = SushyEmulator::start(1).await;
    let path = format!("system = \"{}\"", emu.system_path(0));

    // System roots only: the self-signed certificate is refused.
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &path);
    let state = source(&entry, "node000").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Tls, "{state:?}");

    // Pinned to an unrelated certificate: refused.
    let other = tempfile::tempdir().unwrap();
    let (other_cert, _) = sushy::self_signed_cert(other.path(), "unrelated");
    let extra = format!("{path}\nca_file = \"{}\"", other_cert.display());
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    let state = source(&entry, "node000").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(detail.to_lowercase().contains("certificate"), "{detail}");

    // Pinned to its own certificate: works.
    let extra = format!("{path}\n{}", pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    assert_eq!(source(&entry, "node000").read().await, PowerState::On);

    // Verification off: works.
    let extra = format!("{path}\ntls_insecure = true");
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    assert_eq!(source(&entry, "node000").read().await, PowerState::On);
}

/// Most BMCs serve a self-signed certificate made as `openssl req -x509` makes it: CA:TRUE, no
/// name the BMC is reached by. Given as `ca_file`, or pinned by its SHA-256 (`tls_fingerprint`,
/// pasted as openssl prints it), it is accepted as the BMC's own, not refused as a CA used as
/// an end entity; another certificate, or the same one expired, is still refused.
#[tokio::test]
async fn a_bmcs_own_self_signed_ca_certificate_can_be_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = sushy::bmc_style_cert(dir.path(), "rack1-07", 30);
    let config_dir = tempfile::tempdir().unwrap();
    let bmc = OddBmc::start_with_cert(dir, cert.clone(), key);
    let address = format!("https://127.0.0.1:{}", bmc.port);
    let read = |extra: String| {
        let entry = bmc_at(
            config_dir.path(),
            &address,
            &format!("system = \"/off\"\n{extra}"),
        );
        async move { source(&entry, "rack1-07").read().await }
    };

    let by_file = read(format!("ca_file = \"{}\"", cert.display())).await;
    assert_eq!(by_file, PowerState::Off, "{by_file:?}");
    let fingerprint = sushy::openssl_fingerprint(&cert);
    assert!(
        fingerprint.starts_with("sha256 Fingerprint="),
        "{fingerprint}"
    );
    let by_fingerprint = read(format!("tls_fingerprint = \"{fingerprint}\"")).await;
    assert_eq!(by_fingerprint, PowerState::Off, "{by_fingerprint:?}");
    let among_others = read(format!(
        "tls_fingerprint = [\"sha256:{}\", \"{fingerprint}\"]",
        "00".repeat(32)
    ))
    .await;
    assert_eq!(among_others, PowerState::Off, "{among_others:?}");

    // Another certificate pinned: refused, saying which certificate the BMC served.
    let wrong = read(format!("tls_fingerprint = \"sha256:{}\"", "ab".repeat(32))).await;
    let (kind, detail) = error_of(&wrong);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(
        detail.contains("is not the one tls_fingerprint pins"),
        "{detail}"
    );
    let other_dir = tempfile::tempdir().unwrap();
    let (other, _) = sushy::bmc_style_cert(other_dir.path(), "rack1-08", 30);
    let other_file = read(format!("ca_file = \"{}\"", other.display())).await;
    assert_eq!(
        error_of(&other_file).0,
        ReadErrorKind::Tls,
        "{other_file:?}"
    );

    // The pin is no excuse for an expired certificate.
    let expired_dir = tempfile::tempdir().unwrap();
    let (expired, expired_key) = sushy::bmc_style_cert(expired_dir.path(), "rack1-09", -1);
    let expired_bmc = OddBmc::start_with_cert(expired_dir, expired.clone(), expired_key);
    let address = format!("https://127.0.0.1:{}", expired_bmc.port);
    for extra in [
        format!("ca_file = \"{}\"", expired.display()),
        format!(
            "tls_fingerprint = \"{}\"",
            sushy::openssl_fingerprint(&expired)
        ),
    ] {
        let entry = bmc_at(
            config_dir.path(),
            &address,
            &format!("system = \"/off\"\n{extra}"),
        );
        let state = source(&entry, "rack1-09").read().await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, ReadErrorKind::Tls, "{extra}: {detail}");
        assert!(
            detail.to_lowercase().contains("expired"),
            "{extra}: {detail}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_reads() {
    let emu = SushyEmulator::start(20).await;
    // Node names are the UUIDs' last group, so `{node}` picks each node's system.
    let extra = format!(
        "system = \"/redfish/v1/Systems/00000000-0000-4000-8000-{{node}}\"\n{}",
        pinned(&emu)
    );
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    let sources: Vec<RedfishSource> = (0..20)
        .map(|i| source(&entry, &format!("{i:012}")))
        .collect();
    let states = futures::future::join_all(sources.iter().map(|s| s.read())).await;
    for (i, state) in states.iter().enumerate() {
        assert_eq!(*state, PowerState::On, "system {i}");
    }
}

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

/// Every JSON sample that ships with the `sushy` Redfish client, parsed as the reply to a GET
/// of the path it names itself by (its `@odata.id`), as the BMC it came from would serve it: a
/// ComputerSystem maps to exactly what its own `PowerState` says and to its `UUID`; anything
/// else (a Chassis, a Manager, a collection, a body without `@odata.id`) is an error. Asked for
/// any other path, every sample is an error.
#[test]
fn sushy_vendor_samples() {
    let root = sushy_package_dir().join("tests");
    let mut files = Vec::new();
    collect_json(&root, &mut files);
    assert!(
        files.len() > 100,
        "only {} JSON samples under {}",
        files.len(),
        root.display()
    );

    let mut systems = Vec::new();
    let mut with_power_state = 0;
    let mut with_identity = 0;
    for file in &files {
        let body = std::fs::read(file).unwrap();
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&body) else {
            let got = parse_reply(&body, "/redfish/v1/Systems/1");
            assert!(
                matches!(
                    got.state,
                    PowerState::Error {
                        kind: ReadErrorKind::BadReply,
                        ..
                    }
                ),
                "{}: not JSON, yet {got:?}",
                file.display()
            );
            continue;
        };
        let own_id = doc.get("@odata.id").and_then(|i| i.as_str());
        let asked = own_id.unwrap_or("/redfish/v1/Systems/1");
        let got = parse_reply(&body, asked);
        // Chassis and Managers carry a PowerState too, but only a ComputerSystem's counts.
        let is_system = own_id.is_some() && is_computer_system(&doc);
        let want = if is_system {
            expected(doc.get("PowerState"))
        } else {
            PowerState::error(ReadErrorKind::BadReply, "not the ComputerSystem asked for")
        };
        assert_eq!(
            label(&got.state),
            label(&want),
            "{}: {got:?}, expected {want:?}",
            file.display()
        );
        if doc.get("PowerState").is_some() {
            with_power_state += 1;
        }
        if !matches!(got.state, PowerState::Error { .. }) {
            check_sample_identity(file, &doc, &got.identity);
            with_identity += 1;
        } else {
            assert!(
                matches!(got.identity, MachineIdentity::Unreported { .. }),
                "{}: {got:?}",
                file.display()
            );
        }
        // The same body as the answer for another system: never read.
        let elsewhere = parse_reply(&body, "/redfish/v1/Systems/SomeOtherSystem");
        assert_eq!(
            label(&elsewhere.state),
            "error bad_reply",
            "{}: {elsewhere:?}",
            file.display()
        );
        if is_system {
            systems.push((file.clone(), doc));
        }
    }
    assert!(with_power_state > 0, "no sample carries a PowerState");
    assert!(with_identity > 0, "no sample was read with an identity");
    let dell = systems
        .iter()
        .find(|(f, _)| f.to_string_lossy().contains("oem/dell"))
        .expect("the Dell system sample was not found");
    let reply = parse_reply(
        &serde_json::to_vec(&dell.1).unwrap(),
        dell.1["@odata.id"].as_str().unwrap(),
    );
    assert_eq!(
        reply.identity,
        MachineIdentity::SystemUuid {
            forms: vec!["4c4c4544-0043-5910-8043-b8c04f5a3233".into()],
            serial: Some("CNIVC000180873".into()),
        }
    );

    // The same real payloads with every other PowerState value put in.
    let mut checked = 0;
    for (file, doc) in &systems {
        if doc.get("PowerState").is_none() {
            continue;
        }
        let asked = doc["@odata.id"].as_str().unwrap();
        for value in [
            serde_json::json!("Off"),
            serde_json::json!("On"),
            serde_json::json!("PoweringOn"),
            serde_json::json!("PoweringOff"),
            serde_json::json!("Paused"),
            serde_json::json!("off"),
            serde_json::json!(""),
            serde_json::Value::Null,
            serde_json::json!(0),
        ] {
            let mut doc = doc.clone();
            doc["PowerState"] = value.clone();
            let got = parse_reply(&serde_json::to_vec_pretty(&doc).unwrap(), asked);
            let want = expected(Some(&value));
            assert_eq!(
                label(&got.state),
                label(&want),
                "{} with {value}: {got:?}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no ComputerSystem sample with a PowerState");
}

/// `#ComputerSystem.ComputerSystem` or `#ComputerSystem.v<digits and _>.ComputerSystem`.
fn is_computer_system(doc: &serde_json::Value) -> bool {
    let Some(t) = doc.get("@odata.type").and_then(|t| t.as_str()) else {
        return false;
    };
    let Some(version) = t
        .strip_prefix("#ComputerSystem.")
        .and_then(|r| r.strip_suffix("ComputerSystem"))
    else {
        return false;
    };
    version.is_empty()
        || version
            .strip_prefix('v')
            .and_then(|v| v.strip_suffix('.'))
            .is_some_and(|v| v.split('_').all(|n| n.parse::<u32>().is_ok()))
}

/// A sample read as a ComputerSystem reports its own `UUID` (lowercase) and `SerialNumber`.
fn check_sample_identity(file: &Path, doc: &serde_json::Value, identity: &MachineIdentity) {
    let uuid = doc.get("UUID").and_then(|u| u.as_str());
    match (uuid, identity) {
        (Some(uuid), MachineIdentity::SystemUuid { forms, serial }) => {
            assert_eq!(forms, &[uuid.to_lowercase()], "{}", file.display());
            let want = doc
                .get("SerialNumber")
                .and_then(|s| s.as_str())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty());
            assert_eq!(serial, &want, "{}", file.display());
        }
        (None, MachineIdentity::Unreported { reason }) => {
            assert!(reason.contains("no UUID"), "{}: {reason}", file.display());
        }
        (_, other) => panic!("{}: UUID {uuid:?} read as {other:?}", file.display()),
    }
}

/// What a reply should map to, from its top-level `PowerState` value.
fn expected(value: Option<&serde_json::Value>) -> PowerState {
    match value.and_then(|v| v.as_str()) {
        Some("Off") => PowerState::Off,
        Some("On") => PowerState::On,
        Some(t @ ("PoweringOn" | "PoweringOff")) => PowerState::Transitional {
            detail: t.to_string(),
        },
        Some("Paused") => PowerState::Suspended {
            detail: "the ComputerSystem's PowerState is Paused".into(),
        },
        _ => PowerState::error(ReadErrorKind::BadReply, ""),
    }
}

fn label(state: &PowerState) -> String {
    match state {
        PowerState::Transitional { detail } => format!("transitional {detail}"),
        PowerState::Error { kind, .. } => format!("error {kind}"),
        other => other.label().to_string(),
    }
}

fn sushy_package_dir() -> PathBuf {
    let python = support::venv_bin("python");
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import os, sushy; print(os.path.dirname(sushy.__file__))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "the `sushy` package is not installed in the test venv \
         (run scripts/install-deps): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_json(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
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
            forms: vec!["4c4c4544-0038-4b10-8052-b4c04f4a4e32".into()],
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
