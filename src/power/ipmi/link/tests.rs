use super::*;

fn link() -> Link {
    let bmc: SocketAddr = "127.0.0.1:9".parse().unwrap();
    Link::open(bmc).unwrap().0
}

fn rmcp_plus(pt: u8, session: u32, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0x06, 0x00, 0xFF, CLASS_IPMI, AUTH_RMCP_PLUS, pt];
    d.extend(session.to_le_bytes());
    d.extend(seq.to_le_bytes());
    d.extend((payload.len() as u16).to_le_bytes());
    d.extend(payload);
    d
}

fn open_request(console: u32, algorithms: &[u8; 24]) -> Vec<u8> {
    let mut p = vec![0x00, 0x04, 0, 0];
    p.extend(console.to_le_bytes());
    p.extend(algorithms);
    rmcp_plus(PT_OPEN_REQUEST, 0, 0, &p)
}

fn open_response(status: u8, console: u32, bmc: u32, algorithms: &[u8; 24]) -> Vec<u8> {
    let mut p = vec![0x00, status, 0x04, 0];
    p.extend(console.to_le_bytes());
    p.extend(bmc.to_le_bytes());
    p.extend(algorithms);
    rmcp_plus(PT_OPEN_RESPONSE, 0, 0, &p)
}

fn established(l: &mut Link) {
    l.wire.console_session_id = Some(0x1111);
    l.wire.bmc_session_id = Some(0x2222);
    l.wire.established = true;
}

fn refused(v: Verdict) -> Trouble {
    match v {
        Verdict::Refuse(t) => t,
        Verdict::Pass => panic!("passed"),
        Verdict::PassNoting(t) => panic!("passed, noting {t:?}"),
    }
}

#[test]
fn only_suite_3_is_proposed_and_accepted() {
    let mut l = link();
    assert_eq!(
        l.check_from_crate(&open_request(0x1111, &SUITE_3)),
        Ok(Expect::Handshake(PT_OPEN_RESPONSE))
    );
    let mut weaker = SUITE_3;
    weaker[12] = 0x00; // integrity: none
    let t = refused(l.check_from_bmc(
        &open_response(0, 0x1111, 0x2222, &weaker),
        Expect::Handshake(PT_OPEN_RESPONSE),
    ));
    assert!(t.detail.contains("other than cipher suite 3"), "{t:?}");
    assert_eq!(l.wire.bmc_session_id, None);

    assert!(matches!(
        l.check_from_bmc(
            &open_response(0, 0x1111, 0x2222, &SUITE_3),
            Expect::Handshake(PT_OPEN_RESPONSE)
        ),
        Verdict::Pass
    ));
    assert_eq!(l.wire.bmc_session_id, Some(0x2222));

    let mut l = link();
    assert!(l.check_from_crate(&open_request(1, &weaker)).is_err());
}

#[test]
fn a_refused_cipher_is_passed_on_with_a_clear_reason() {
    let mut l = link();
    l.check_from_crate(&open_request(0x1111, &SUITE_3)).unwrap();
    match l.check_from_bmc(
        &open_response(0x11, 0x1111, 0, &[0; 24]),
        Expect::Handshake(PT_OPEN_RESPONSE),
    ) {
        Verdict::PassNoting(t) => {
            assert_eq!(t.kind, ReadErrorKind::Protocol);
            assert!(t.detail.contains("cipher suite 3 refused"), "{t:?}");
        }
        _ => panic!("expected PassNoting"),
    }
}

#[test]
fn ipmi_1_5_logins_never_leave() {
    let mut l = link();
    // Get Session Challenge (App 39h), which carries the user name, session-less.
    let msg = [0x20, 0x18, 0xC8, 0x81, 0x04, 0x39, 0x02, 0x00];
    let mut d = vec![
        0x06, 0x00, 0xFF, CLASS_IPMI, AUTH_NONE, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    d.push(msg.len() as u8);
    d.extend(msg);
    let t = l.check_from_crate(&d).unwrap_err();
    assert!(t.detail.contains("IPMI 1.5"), "{t:?}");
    // An IPMI 1.5 session message with "straight password" authentication (type 4).
    let d = [
        0x06, 0x00, 0xFF, CLASS_IPMI, 0x04, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    assert!(l.check_from_crate(&d).is_err());
    // Get Channel Authentication Capabilities is allowed.
    let msg = [0x20, 0x18, 0xC8, 0x81, 0x00, 0x38, 0x8E, 0x04, 0xB5];
    let mut d = vec![
        0x06, 0x00, 0xFF, CLASS_IPMI, AUTH_NONE, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    d.push(msg.len() as u8);
    d.extend(msg);
    assert_eq!(l.check_from_crate(&d), Ok(Expect::AuthCaps));
}

#[test]
fn in_session_answers_need_our_id_and_a_rising_sequence() {
    let mut l = link();
    established(&mut l);
    let answer = |seq| rmcp_plus(PROTECTED | PT_IPMI, 0x1111, seq, &[0; 32]);
    assert!(matches!(
        l.check_from_bmc(&answer(5), Expect::InSession),
        Verdict::Pass
    ));
    for seq in [5, 4, 0] {
        let t = refused(l.check_from_bmc(&answer(seq), Expect::InSession));
        assert_eq!(t.kind, ReadErrorKind::BadReply);
        assert!(t.detail.contains("replayed or reordered"), "{t:?}");
    }
    assert!(matches!(
        l.check_from_bmc(&answer(6), Expect::InSession),
        Verdict::Pass
    ));
    let other = rmcp_plus(PROTECTED | PT_IPMI, 0x9999, 7, &[0; 32]);
    assert!(
        refused(l.check_from_bmc(&other, Expect::InSession))
            .detail
            .contains("not ours")
    );
    let clear = rmcp_plus(PT_IPMI, 0x1111, 8, &[0; 32]);
    assert!(matches!(
        l.check_from_bmc(&clear, Expect::InSession),
        Verdict::Refuse(_)
    ));
}

#[test]
fn in_session_requests_must_be_protected_and_established() {
    let mut l = link();
    let req = rmcp_plus(PROTECTED | PT_IPMI, 0x2222, 1, &[0; 32]);
    assert!(l.check_from_crate(&req).is_err());
    established(&mut l);
    assert_eq!(l.check_from_crate(&req), Ok(Expect::InSession));
    let clear = rmcp_plus(PT_IPMI, 0x2222, 2, &[0; 32]);
    assert!(l.check_from_crate(&clear).is_err());
    let wrong = rmcp_plus(PROTECTED | PT_IPMI, 0x3333, 3, &[0; 32]);
    assert!(l.check_from_crate(&wrong).is_err());
}

#[test]
fn garbage_and_short_pongs_are_refused() {
    let mut l = link();
    for d in [
        &b""[..],
        b"\x00",
        b"hello world, this is not RMCP",
        &[
            0x06, 0x00, 0xFF, CLASS_ASF, 0x00, 0x00, 0x11, 0xBE, 0x40, 0xC8, 0x00, 0x10,
        ],
    ] {
        let t = refused(l.check_from_bmc(d, Expect::Pong { tag: 0xC8 }));
        assert_eq!(t.kind, ReadErrorKind::BadReply);
    }
}

#[test]
fn checksums_of_session_less_answers_are_checked() {
    let mut l = link();
    // Get Channel Auth Caps answer: cc 0, channel 1, auth 0x80|0x04, flags, ext 0x02, OEM.
    let mut msg = vec![
        0x81, 0x1C, 0x63, 0x20, 0x00, 0x38, 0x00, 0x01, 0x84, 0x04, 0x02,
    ];
    msg.extend([0, 0, 0, 0]);
    let sum = msg[3..].iter().fold(0u8, |a, &x| a.wrapping_add(x));
    msg.push(0u8.wrapping_sub(sum));
    let wrap = |msg: &[u8]| {
        let mut d = vec![
            0x06, 0x00, 0xFF, CLASS_IPMI, AUTH_NONE, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        d.push(msg.len() as u8);
        d.extend(msg);
        d
    };
    assert!(matches!(
        l.check_from_bmc(&wrap(&msg), Expect::AuthCaps),
        Verdict::Pass
    ));
    assert_eq!(l.wire.rmcp_plus_offered, Some(true));
    let last = msg.len() - 1;
    msg[last] ^= 0x01;
    let t = refused(l.check_from_bmc(&wrap(&msg), Expect::AuthCaps));
    assert!(t.detail.contains("checksum"), "{t:?}");
}
