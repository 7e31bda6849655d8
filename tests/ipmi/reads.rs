//! Reads through `IpmiSource` against ipmi_sim, cross-checked with ipmitool: power on, off and
//! flipped; the System GUID that stands for the machine; an Operator account; and the read
//! path's default suite 17 and User role against the suite-17 test BMC.

use super::*;

/// Reads through oobfence and through ipmitool; both must say `want`, and oobfence must
/// report the simulator's System GUID.
async fn both_say(src: &IpmiSource, sim: &IpmiSim, want: PowerState) -> Duration {
    let start = Instant::now();
    let reply = src.read_reply().await;
    let took = start.elapsed();
    let details = reply.details;
    assert_eq!(reply.state, want, "details: {details:?}");
    assert_eq!(
        reply.identity,
        MachineIdentity::SystemUuid {
            forms: sim.uuid_forms(),
            serial: None
        }
    );
    assert_eq!(
        sim.ipmitool_power(),
        label(&want),
        "ipmitool disagrees with oobfence"
    );
    let names: Vec<&str> = details.iter().map(|d| d.name.as_str()).collect();
    let mut expected = vec![
        "chassis power faults",
        "last power event",
        "chassis status bytes",
        "session",
    ];
    if want == PowerState::Off {
        // ipmi_sim has no Get ACPI Power State: an off chassis says it cannot tell.
        expected.push("ACPI power state");
        assert!(details[4].value.starts_with("cannot tell"), "{details:?}");
    }
    assert_eq!(names, expected);
    assert_eq!(details[0].value, "none", "{details:?}");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_off_and_flips_as_ipmitool_does() {
    let sim = IpmiSim::start();
    let src = admin_source(&sim, "");
    assert_eq!(src.backend(), "ipmi");
    assert_eq!(src.address(), sim.address());

    let first = both_say(&src, &sim, PowerState::On).await;
    let again = both_say(&src, &sim, PowerState::On).await;
    sim.set_power(false);
    let off = both_say(&src, &sim, PowerState::Off).await;
    sim.set_power(true);
    both_say(&src, &sim, PowerState::On).await;
    sim.set_power(false);
    both_say(&src, &sim, PowerState::Off).await;
    sim.set_power(true);
    both_say(&src, &sim, PowerState::On).await;
    eprintln!("ipmi_sim read latency: new session {first:?}, kept session {again:?} and {off:?}");
    // One session was kept for all of them.
    assert_eq!(sim.other_sessions(), 1);
    // It runs at the User privilege level it started with: oobfence only reads.
    let privileges = sim.session_privileges();
    assert!(
        privileges.iter().any(|p| p == "USER"),
        "sessions: {privileges:?}"
    );
    drop(src);
    // Dropping the last source closes its session on the BMC.
    assert_eq!(sim.other_sessions(), 0);
}

/// The bytes of `ipmitool raw` output (`" 00 11 22 ..."`, possibly over several lines).
fn raw_bytes(out: &str) -> Vec<u8> {
    out.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{h:?} in {out:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_reply_reports_the_simulators_system_guid() {
    let sim = IpmiSim::start_with_guid("00112233445566778899AABBCCDDEEFF");
    // What ipmi_sim sends for that `guid` line: the bytes as written, no reordering.
    let raw = raw_bytes(&sim.ipmitool(&["raw", "0x06", "0x37"]));
    assert_eq!(raw, sim.guid_bytes(), "ipmitool raw 0x06 0x37");
    assert_eq!(
        raw,
        (0..16).map(|i| i * 0x11).collect::<Vec<u8>>(),
        "ipmi_sim reordered its GUID"
    );
    assert_eq!(sim.uuid(), "00112233-4455-6677-8899-aabbccddeeff");

    let src = admin_source(&sim, "");
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    let MachineIdentity::SystemUuid { forms, serial } = &reply.identity else {
        panic!("{:?}", reply.identity);
    };
    assert_eq!(serial, &None);
    // The bytes in the order sent (RFC 4122), with the first three fields swapped (SMBIOS) and
    // all sixteen reversed (IPMI): a node whose kubelet reports any of them is this machine.
    assert_eq!(
        forms,
        &[
            "33221100-5544-7766-8899-aabbccddeeff",
            "ffeeddcc-bbaa-9988-7766-554433221100",
            "00112233-4455-6677-8899-aabbccddeeff",
        ]
    );
    assert!(forms.contains(&sim.uuid()));
    let node = |uuid: &str| NodeIdentity {
        system_uuid: uuid.into(),
        addresses: Vec::new(),
        uuid_shared_with: Vec::new(),
    };
    assert!(verify(&node(&sim.uuid()), &reply.identity).is_match());
    assert!(
        verify(
            &node("33221100-5544-7766-8899-AABBCCDDEEFF"),
            &reply.identity
        )
        .is_match()
    );

    // The GUID rides in the power read's session: an Off read carries it the same way, and
    // the BMC still holds one session.
    sim.set_power(false);
    let off = src.read_reply().await;
    assert_eq!(off.state, PowerState::Off);
    assert_eq!(off.identity, reply.identity);
    assert_eq!(sim.other_sessions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_simulators_with_different_guids_are_different_machines() {
    let a = IpmiSim::start();
    let b = IpmiSim::start();
    assert_ne!(a.guid_bytes(), b.guid_bytes());
    let read_a = admin_source(&a, "").read_reply().await;
    let read_b = admin_source(&b, "").read_reply().await;
    assert_eq!(
        (&read_a.state, &read_b.state),
        (&PowerState::On, &PowerState::On)
    );
    let forms = |identity: &MachineIdentity| match identity {
        MachineIdentity::SystemUuid { forms, .. } => forms.clone(),
        other => panic!("{other:?}"),
    };
    let (forms_a, forms_b) = (forms(&read_a.identity), forms(&read_b.identity));
    assert_eq!(forms_a, a.uuid_forms());
    assert_eq!(forms_b, b.uuid_forms());
    assert!(
        forms_a.iter().all(|f| !forms_b.contains(f)),
        "{forms_a:?} vs {forms_b:?}"
    );
    // A node mapped to the wrong BMC is told apart.
    let node_a = NodeIdentity {
        system_uuid: a.uuid(),
        addresses: Vec::new(),
        uuid_shared_with: Vec::new(),
    };
    assert!(verify(&node_a, &read_a.identity).is_match());
    let wrong = verify(&node_a, &read_b.identity);
    assert_eq!(wrong.label(), "mismatch", "{wrong}");
}

/// An Operator-only account reads as Operator and as User (the default), its session at that
/// level as ipmi_sim reports it. (ipmi_sim grants such an account Administrator too when asked
/// by name alone, as ipmitool asks: the test BMC, which refuses it, checks that refusal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_account_reads_as_operator_and_as_user() {
    let sim = IpmiSim::start();
    let source = |privilege: &str| {
        let extra = if privilege.is_empty() {
            String::new()
        } else {
            format!("privilege = \"{privilege}\"")
        };
        let e = bmc(
            sim.dir(),
            &sim.address(),
            ipmi_sim::OPERATOR,
            ipmi_sim::OPERATOR_PASSWORD,
            &extra,
        );
        IpmiSource::new(&e, "n1").unwrap()
    };
    for (privilege, level) in [("operator", "OPERATOR"), ("", "USER")] {
        let src = source(privilege);
        assert_eq!(src.read().await, PowerState::On, "as {privilege:?}");
        // Ours (kept for the next read) and ipmitool's own, which asks as Administrator.
        let mut levels = sim.session_privileges();
        levels.sort();
        assert_eq!(levels, ["ADMINISTRATOR", level], "as {privilege:?}");
        drop(src);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sim.other_sessions(), 0, "closed when its source went");
    }
}

/// The whole read path (`IpmiSource`, as the daemon reads) with the defaults — suite 17, the
/// User role — and with an Operator account, against the suite-17 test BMC; `[17, 3]` falls
/// back to suite 3 on a BMC that refuses 17, and only there; a BMC without either suite is an
/// error read naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_path_logs_in_with_suite_17_as_user_by_default_and_falls_back_only_when_asked() {
    use oobfence::power::ipmi::rakp::Suite;
    use support::rmcp_bmc::{ACCOUNTS, RmcpBmc};
    let guid: [u8; 16] = std::array::from_fn(|i| 0x60 + i as u8);
    let dir = tempfile::tempdir().unwrap();
    let (reader, oper) = (&ACCOUNTS[0], &ACCOUNTS[1]);
    let source = |addr: &str, account: &support::rmcp_bmc::Account, extra: &str| {
        // Not through `bmc()`: these entries keep oobfence's own default suite.
        let e = parsed_bmc_entry(
            "ipmi",
            dir.path(),
            addr,
            account.name,
            account.password,
            extra,
        );
        IpmiSource::new(&e, "n1").unwrap()
    };
    let session_of = |reply: &oobfence::power::Reply| {
        reply
            .details
            .iter()
            .find(|d| d.name == "session")
            .map(|d| d.value.clone())
            .unwrap_or_default()
    };

    let only_17 = RmcpBmc::start(&[Suite::Seventeen], guid).await;
    for (account, extra, session) in [
        (reader, "", "cipher suite 17, User"),
        (
            oper,
            "privilege = \"operator\"",
            "cipher suite 17, Operator",
        ),
    ] {
        let src = source(&only_17.address(), account, extra);
        for on in [true, false] {
            only_17.set_power(on);
            let reply = src.read_reply().await;
            let want = if on { PowerState::On } else { PowerState::Off };
            assert_eq!(reply.state, want, "{reply:?}");
            assert_eq!(session_of(&reply), session);
            let MachineIdentity::SystemUuid { forms, .. } = &reply.identity else {
                panic!("{:?}", reply.identity);
            };
            assert_eq!(forms, &oobfence::identity::uuid_forms_of_ipmi_guid(&guid));
        }
        drop(src);
        // Closed without waiting for the answer: give the datagram a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(only_17.open_sessions(), 0, "closed when its source went");
    }
    // Suite 3 on a suite-17 BMC: refused, and said so; never Off.
    let state = source(&only_17.address(), reader, "cipher_suite = 3")
        .read()
        .await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(
        detail.contains("the BMC does not offer cipher suite 3"),
        "{detail}"
    );

    // [17, 3] on a suite-3 BMC: 17 is refused by the BMC, 3 reads.
    let only_3 = RmcpBmc::start(&[Suite::Three], guid).await;
    only_3.set_power(false);
    let reply = source(
        &only_3.address(),
        oper,
        "cipher_suite = [17, 3]\nprivilege = \"operator\"",
    )
    .read_reply()
    .await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(session_of(&reply), "cipher suite 3, Operator");
    // The default (17 alone) does not fall back.
    let state = source(&only_3.address(), oper, "").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(
        detail.contains("the BMC does not offer cipher suite 17: set cipher_suite = 3 or [17, 3]"),
        "{detail}"
    );
    // A wrong password on the first suite is not a reason to try the second.
    let state = source(
        &only_17.address(),
        &support::rmcp_bmc::Account {
            password: "nope",
            ..oper.clone()
        },
        "cipher_suite = [17, 3]",
    )
    .read()
    .await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    // One session per account, kept for its second read; none for the refused logins.
    assert_eq!(only_17.seen(|s| s.activated.len()), 2);
}
