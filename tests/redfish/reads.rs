//! Reads against sushy-tools: On through a pinned certificate, a power cycle followed, the
//! system discovered when it is the only one (and named when there are several), each
//! system's UUID, concurrent reads.

use super::*;

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
        // The reported UUID first, then its other byte orders.
        assert_eq!(forms[0], emu.uuid(i), "system {i}");
        assert_eq!(
            Some(forms),
            oobfence::identity::uuid_forms_of_redfish_uuid(&emu.uuid(i)).as_ref(),
            "system {i}"
        );
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
        matches!(&reply.identity, MachineIdentity::SystemUuid { forms, .. } if forms[0] == emu.uuid(0)),
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
