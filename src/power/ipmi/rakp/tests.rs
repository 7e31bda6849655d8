//! Known answers for both suites, computed from the specification's definitions by an
//! independent implementation (Python's `hmac` and `hashlib`, and `cryptography`'s AES) over one
//! fixed exchange; the agreement with ipmitool and ipmi_sim on a real exchange is in
//! tests/ipmi.rs.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn exchange() -> Exchange<'static> {
    let bytes = |start: u8| std::array::from_fn(|i| start + i as u8);
    Exchange {
        console_session: 0x0a0b_0c0d,
        bmc_session: 0x0102_0304,
        console_random: bytes(0x00),
        bmc_random: bytes(0x10),
        bmc_guid: bytes(0x20),
        role: 0x14,
        username: b"oobfence",
    }
}

/// The answers of one suite for [`exchange`] with the password "secret".
struct Answers {
    suite: Suite,
    rakp2: &'static str,
    rakp3: &'static str,
    sik: &'static str,
    rakp4: &'static str,
    /// The AuthCode of bytes 0x40..0x5e under K1.
    auth: &'static str,
    /// Bytes 0x50..0x65 sealed under K2 with the IV 0xa0..0xaf.
    sealed: &'static str,
}

const ANSWERS: [Answers; 2] = [
    Answers {
        suite: Suite::Three,
        rakp2: "9956b48ccfd447d9c7b98895436dcb39e756e9d9",
        rakp3: "bf357eb501adf58062dd5448ffef5a2097be5728",
        sik: "0d661d06c09d218b846a7b533acd5c86377d43dc",
        rakp4: "6b6e4eb663a85cb25c7d5d3f",
        auth: "da21fce54f82c00c3a892bb2",
        sealed: "a0a1a2a3a4a5a6a7a8a9aaabacadaeafd8829115dc76755f631693c0365079616fadc305331121c70ae801d2d8dc2eec",
    },
    Answers {
        suite: Suite::Seventeen,
        rakp2: "5a93a72f4651a94ad7945fcdb3cefbe23090cad19bd89399a706b39ad079fc52",
        rakp3: "afd185cbde973c9adb74432d7132526bc549df62d41b825ba2a31deef5fe5833",
        sik: "0b670e793d2684646f089468389f9d030c6b38a2a4be401b20abfd95cf0ed7c0",
        rakp4: "fb12ad1f5b47336d62efd0e47a686e96",
        auth: "675089b76c3f8d30ea42795989b2162c",
        sealed: "a0a1a2a3a4a5a6a7a8a9aaabacadaeafcac2b75b73291dba05fecea6f32f55df5c31ee9b9621d71fcf465e9ab3475426",
    },
];

fn signed() -> Vec<u8> {
    (0x40..0x5e).collect()
}

fn payload() -> Vec<u8> {
    (0x50..0x65).collect()
}

fn iv() -> [u8; BLOCK] {
    std::array::from_fn(|i| 0xa0 + i as u8)
}

#[test]
fn both_suites_derive_the_known_answers() {
    let kuid = Key::new(b"secret").unwrap();
    let ex = exchange();
    for a in ANSWERS {
        let s = a.suite;
        assert_eq!(ex.rakp2_code(s, &kuid), hex(a.rakp2), "suite {}", s.id());
        assert!(ex.rakp2_matches(s, &kuid, &hex(a.rakp2)));
        assert_eq!(ex.rakp3_code(s, &kuid), hex(a.rakp3), "suite {}", s.id());
        let sik = ex.sik(s, &kuid);
        assert_eq!(sik, hex(a.sik), "suite {}", s.id());
        assert_eq!(ex.rakp4_icv(s, &sik), hex(a.rakp4), "suite {}", s.id());
        assert!(ex.rakp4_matches(s, &sik, &hex(a.rakp4)), "suite {}", s.id());
        let keys = SessionKeys::new(s, &sik);
        assert_eq!(keys.auth_code(&signed()), hex(a.auth), "suite {}", s.id());
        assert!(keys.auth_code_matches(&signed(), &hex(a.auth)));
        assert_eq!(
            keys.seal(iv(), &payload()),
            hex(a.sealed),
            "suite {}",
            s.id()
        );
        assert_eq!(keys.open(&hex(a.sealed)).unwrap(), payload());
    }
}

#[test]
fn a_code_from_another_password_or_altered_is_refused() {
    let kuid = Key::new(b"secret").unwrap();
    let other = Key::new(b"Secret").unwrap();
    let ex = exchange();
    for a in ANSWERS {
        let s = a.suite;
        let code = hex(a.rakp2);
        assert!(!ex.rakp2_matches(s, &other, &code), "another password");
        let mut flipped = code.clone();
        flipped[7] ^= 0x01;
        assert!(!ex.rakp2_matches(s, &kuid, &flipped), "a bit flipped");
        // A code cut short proves less than the suite promises: refused, never compared.
        assert!(!ex.rakp2_matches(s, &kuid, &code[..s.tag_len()]));
        assert!(!ex.rakp2_matches(s, &kuid, &[]));
        let sik = ex.sik(s, &kuid);
        let icv = hex(a.rakp4);
        assert!(!ex.rakp4_matches(s, &sik, &icv[..icv.len() - 1]));
        assert!(!ex.rakp4_matches(s, &ex.sik(s, &other), &icv));
        let keys = SessionKeys::new(s, &sik);
        let mut auth = hex(a.auth);
        auth[0] ^= 0x80;
        assert!(!keys.auth_code_matches(&signed(), &auth));
        // Another user name or role changes every code.
        let mut renamed = exchange();
        renamed.username = b"oobfencf";
        assert!(!renamed.rakp2_matches(s, &kuid, &code));
        let mut operator = exchange();
        operator.role = 0x13;
        assert!(!operator.rakp2_matches(s, &kuid, &code));
    }
}

#[test]
fn every_payload_length_seals_to_whole_blocks_and_opens_again() {
    let keys = SessionKeys::new(Suite::Seventeen, &[7u8; 32]);
    for len in 0..=48 {
        let payload: Vec<u8> = (0..len as u8).collect();
        let sealed = keys.seal(iv(), &payload);
        assert_eq!(sealed.len() % BLOCK, 0, "{len}");
        assert!(sealed.len() >= 2 * BLOCK);
        assert_eq!(keys.open(&sealed).unwrap(), payload, "{len}");
    }
}

#[test]
fn a_sealed_payload_that_is_cut_or_badly_padded_does_not_open() {
    let keys = SessionKeys::new(Suite::Three, &[9u8; 20]);
    let sealed = keys.seal(iv(), &payload());
    assert_eq!(
        keys.open(&sealed[..sealed.len() - 1]),
        Err(OpenError::Length(sealed.len() - 1))
    );
    assert_eq!(keys.open(&sealed[..BLOCK]), Err(OpenError::Length(BLOCK)));
    // Another key decrypts to noise, whose pad does not check out (with overwhelming odds for
    // this fixed input).
    let other = SessionKeys::new(Suite::Three, &[8u8; 20]);
    assert_eq!(other.open(&sealed), Err(OpenError::Padding));
    // A payload whose pad bytes are not 1, 2, 3...: sealed by hand.
    let mut body = payload();
    body.extend([9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 10]);
    let mut raw = iv().to_vec();
    raw.extend_from_slice(&body);
    let len = body.len();
    cbc::Encryptor::<Aes128>::new(&keys.aes.into(), &iv().into())
        .encrypt_padded_mut::<NoPadding>(&mut raw[BLOCK..], len)
        .unwrap();
    assert_eq!(keys.open(&raw), Err(OpenError::Padding));
}

#[test]
fn keys_are_at_most_twenty_bytes_and_never_printed() {
    assert!(Key::new(&[b'x'; 20]).is_some());
    assert!(Key::new(&[b'x'; 21]).is_none());
    let k = Key::new(b"hunter2").unwrap();
    assert!(!format!("{k:?}").contains("hunter2"));
    let keys = SessionKeys::new(Suite::Three, b"sik-sik-sik-sik-sik-");
    assert_eq!(format!("{keys:?}"), "SessionKeys(suite 3, redacted)");
}
