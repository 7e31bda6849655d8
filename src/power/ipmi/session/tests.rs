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
