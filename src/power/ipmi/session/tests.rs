use super::wire::{checksum, status_trouble};
use super::*;

#[test]
fn a_request_message_has_both_checksums_and_its_answer_is_recognised() {
    let m = request_message(NETFN_APP, 0x37, 5, &[]);
    assert_eq!(
        m[..3],
        [
            BMC_ADDRESS,
            NETFN_APP << 2,
            checksum(&[BMC_ADDRESS, NETFN_APP << 2])
        ]
    );
    assert_eq!(m.iter().skip(3).fold(0u8, |a, x| a.wrapping_add(*x)), 0);
    // The BMC's answer: addresses swapped, NetFn + 1, the same sequence and command.
    let mut r = vec![CONSOLE_ADDRESS, (NETFN_APP | 1) << 2];
    r.push(checksum(&r));
    r.extend([BMC_ADDRESS, 5 << 2, 0x37, 0x00, 0xaa, 0xbb]);
    r.push(checksum(&r[3..]));
    assert_eq!(
        response_of(&r, NETFN_APP, 0x37, 5),
        Some(Answer {
            completion: 0,
            data: vec![0xaa, 0xbb]
        })
    );
    // Another request's answer, or a broken checksum, is not the answer.
    assert_eq!(response_of(&r, NETFN_APP, 0x37, 6), None);
    assert_eq!(response_of(&r, NETFN_APP, 0x38, 5), None);
    assert_eq!(response_of(&r, NETFN_CHASSIS, 0x37, 5), None);
    let mut broken = r.clone();
    broken[7] ^= 1;
    assert_eq!(response_of(&broken, NETFN_APP, 0x37, 5), None);
    assert_eq!(response_of(&r[..7], NETFN_APP, 0x37, 5), None);
}

#[test]
fn status_codes_name_the_suite_and_the_role_asked_for() {
    let kuid = Key::new(b"x").unwrap();
    let login = Login {
        suite: Suite::Seventeen,
        privilege: OPERATOR,
        username: b"oper",
        kuid: &kuid,
    };
    let t = status_trouble("Open Session Response", 0x11, &login);
    assert_eq!(t.kind, ReadErrorKind::Protocol);
    assert!(t.detail.contains("cipher suite 17"), "{}", t.detail);
    let t = status_trouble("RAKP message 2", 0x0d, &login);
    assert_eq!(t.kind, ReadErrorKind::Auth);
    assert!(t.detail.contains("Operator"), "{}", t.detail);
}

/// What ipmi_sim (OpenIPMI 2.0.33) sends to an Open Session Request for cipher suite 17,
/// captured on loopback: the RMCP+ header, payload type 11h, session ID and sequence 0, a
/// payload of 2 bytes — the message tag (42h, as sent) and status 04h (invalid authentication
/// algorithm). No role, no console session ID.
const IPMI_SIM_REFUSES_SUITE_17: [u8; 18] = [
    0x06, 0x00, 0xff, 0x07, 0x06, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0x42, 0x04,
];

/// ipmi_sim's answer to the same request for suite 3 (console session ID 11223344h): status
/// 0, role Administrator, our console session ID, its own (2), the three algorithms.
const IPMI_SIM_OPENS_SUITE_3: [u8; 52] = [
    0x06, 0x00, 0xff, 0x07, 0x06, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0x24, 0x00, 0x42, 0x00, 0x04, 0x00,
    0x44, 0x33, 0x22, 0x11, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x01, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x08, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x08, 0x01, 0x00, 0x00, 0x00,
];

#[test]
fn a_refusal_of_two_bytes_is_a_refusal_that_names_the_status_and_the_suite() {
    use super::wire::handshake_answer;
    let kuid = Key::new(b"x").unwrap();
    let login = |suite| Login {
        suite,
        privilege: USER,
        username: b"admin",
        kuid: &kuid,
    };
    let console = 0x1122_3344;
    let step = "Open Session Response";
    let l17 = login(Suite::Seventeen);
    let t = match handshake_answer(
        &IPMI_SIM_REFUSES_SUITE_17,
        PT_OPEN_RESPONSE,
        0x42,
        console,
        step,
        &l17,
    ) {
        Some(Err(t)) => t,
        other => panic!("ipmi_sim's refusal not taken as one: {other:?}"),
    };
    assert!(t.suite_refused, "{t:?}");
    assert_eq!(t.kind, ReadErrorKind::Protocol);
    assert!(
        t.detail
            .contains("status 0x04 (invalid authentication algorithm)"),
        "{}",
        t.detail
    );
    assert!(
        t.detail.contains("does not offer cipher suite 17"),
        "{}",
        t.detail
    );
    // Another message's tag: not the answer.
    assert_eq!(
        handshake_answer(
            &IPMI_SIM_REFUSES_SUITE_17,
            PT_OPEN_RESPONSE,
            0x43,
            console,
            step,
            &l17
        ),
        None
    );
    // Another payload type (RAKP 2): not the answer.
    assert_eq!(
        handshake_answer(
            &IPMI_SIM_REFUSES_SUITE_17,
            PT_RAKP2,
            0x42,
            console,
            step,
            &l17
        ),
        None
    );
    // A refusal with the console session ID zeroed is taken; one naming another session is
    // someone else's.
    let with_id = |id: [u8; 4]| {
        let mut d = IPMI_SIM_REFUSES_SUITE_17[..14].to_vec();
        d.extend([8, 0, 0x42, 0x11, 0, 0]);
        d.extend(id);
        d
    };
    let zeroed = with_id([0; 4]);
    assert!(matches!(
        handshake_answer(&zeroed, PT_OPEN_RESPONSE, 0x42, console, step, &l17),
        Some(Err(Trouble {
            suite_refused: true,
            ..
        }))
    ));
    let ours = with_id(u32::to_le_bytes(console));
    assert!(matches!(
        handshake_answer(&ours, PT_OPEN_RESPONSE, 0x42, console, step, &l17),
        Some(Err(_))
    ));
    let theirs = with_id([1, 2, 3, 4]);
    assert_eq!(
        handshake_answer(&theirs, PT_OPEN_RESPONSE, 0x42, console, step, &l17),
        None
    );
    // A success must name our session: two bytes of "status 0" are nothing.
    let mut short_ok = IPMI_SIM_REFUSES_SUITE_17;
    short_ok[17] = 0;
    assert_eq!(
        handshake_answer(&short_ok, PT_OPEN_RESPONSE, 0x42, console, step, &l17),
        None
    );
    // ipmi_sim's acceptance of suite 3 is the answer, for our session only.
    let l3 = login(Suite::Three);
    let p = handshake_answer(
        &IPMI_SIM_OPENS_SUITE_3,
        PT_OPEN_RESPONSE,
        0x42,
        console,
        step,
        &l3,
    );
    assert_eq!(p, Some(Ok(&IPMI_SIM_OPENS_SUITE_3[16..])));
    assert_eq!(
        handshake_answer(
            &IPMI_SIM_OPENS_SUITE_3,
            PT_OPEN_RESPONSE,
            0x42,
            7,
            step,
            &l3
        ),
        None
    );
}

#[test]
fn every_status_is_named_and_refusing_every_suite_says_what_to_set() {
    use super::wire::{status_name, suite_advice};
    for code in 0x01..=0x12u8 {
        assert_ne!(status_name(code), "unknown status code", "{code:#04x}");
    }
    assert_eq!(
        suite_advice(&[Suite::Seventeen]),
        "set cipher_suite = 3 or [17, 3], or enable suite 17 on the BMC"
    );
    assert_eq!(
        suite_advice(&[Suite::Three]),
        "set cipher_suite = 17 or [3, 17], or enable suite 3 on the BMC"
    );
    assert_eq!(
        suite_advice(&[Suite::Seventeen, Suite::Three]),
        "the BMC offers none of cipher suites 17 and 3: enable one of them on the BMC"
    );
}
