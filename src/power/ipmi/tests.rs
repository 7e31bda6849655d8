use std::path::Path;

use super::commands::{ChassisStatus, GuidReply};
use super::read::{Answer, guid_identity, scrub, succeeded};
use super::*;
use crate::config::Config;
use crate::identity::{MachineIdentity, uuid_forms_of_ipmi_guid};

fn entry(dir: &Path, address: &str) -> BmcEntry {
    let pw = dir.join("pw");
    std::fs::write(&pw, "very-secret-pw\n").unwrap();
    let text = format!(
        "datacenter = \"t\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"ipmi\"\n\
         address = \"{address}\"\nusername = \"admin\"\npassword_file = \"{}\"\n",
        pw.display()
    );
    Config::parse(&text, Path::new("t.toml")).unwrap().bmc[0].clone()
}

#[test]
fn debug_and_address_hide_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let src = IpmiSource::new(&entry(dir.path(), "{node}-ipmi.example"), "n1").unwrap();
    let dbg = format!("{src:?}");
    assert!(!dbg.contains("very-secret-pw"), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
    assert_eq!(src.address(), "n1-ipmi.example:623");
    assert_eq!(src.backend(), "ipmi");
    let v6 = IpmiSource::new(&entry(dir.path(), "[fd00::1]:6230"), "n1").unwrap();
    assert_eq!(v6.address(), "[fd00::1]:6230");
}

#[test]
fn scrub_redacts_the_password() {
    let pw = Secret::new("very-secret-pw");
    let s = scrub(
        &pw,
        PowerState::error(ReadErrorKind::Auth, "x very-secret-pw y"),
    );
    assert_eq!(s.to_string(), "error: auth: x <redacted> y");
    let reply = scrub_reply(
        &pw,
        Reply::without_identity(
            PowerState::error(ReadErrorKind::Auth, "very-secret-pw"),
            "Get System GUID failed: very-secret-pw",
        ),
    );
    let text = format!("{reply:?}");
    assert!(!text.contains("very-secret-pw"), "{text}");
    assert_eq!(
        reply.identity.to_string(),
        "no identity (Get System GUID failed: <redacted>)"
    );
}

fn answer(status: &[u8], identity: MachineIdentity) -> Answer {
    Answer {
        status: ChassisStatus::parse(status).unwrap(),
        identity,
        session: "cipher suite 17, User".into(),
        off: None,
    }
}

#[test]
fn off_with_faults_is_off_and_shows_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = IpmiSource::new(&entry(dir.path(), "bmc.example"), "n1").unwrap();
    let guid = guid_identity(GuidReply::Guid([0x11; 16]));
    let reply = succeeded(&src.shared, answer(&[0x08, 0x01, 0x00], guid.clone()));
    assert_eq!(reply.state, PowerState::Off);
    assert_eq!(reply.identity, guid);
    let text: Vec<String> = reply.details.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "chassis power faults: main power fault",
            "last power event: AC failed",
            "chassis status bytes: 08 01 00",
            "session: cipher suite 17, User",
        ]
    );
    let reply = succeeded(&src.shared, answer(&[0x01, 0, 0], guid));
    assert_eq!(reply.state, PowerState::On);
}

#[test]
fn a_guid_maps_to_its_uuid_forms_and_a_refusal_to_no_identity() {
    // SMBIOS UUID 00112233-4455-6677-8899-aabbccddeeff as a BMC that follows SMBIOS sends it.
    let guid = [
        0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];
    let MachineIdentity::SystemUuid { forms, serial } = guid_identity(GuidReply::Guid(guid)) else {
        panic!("no system UUID");
    };
    assert!(
        forms.contains(&"00112233-4455-6677-8899-aabbccddeeff".to_string()),
        "{forms:?}"
    );
    assert_eq!(forms, uuid_forms_of_ipmi_guid(&guid));
    assert_eq!(serial, None);

    let reason = |reply| match guid_identity(reply) {
        MachineIdentity::Unreported { reason } => reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        reason(GuidReply::Refused(0xC1)),
        "the BMC refused Get System GUID with completion code 0xc1 (invalid command)"
    );
    assert!(reason(GuidReply::Refused(0xD4)).contains("0xd4"));
    assert_eq!(
        reason(GuidReply::WrongLength(15)),
        "the Get System GUID reply has 15 data bytes; 16 expected"
    );
}

#[test]
fn failed_reads_carry_no_identity() {
    let reply = failed(Trouble::new(ReadErrorKind::Timeout, "no answer"));
    assert_eq!(reply.state.label(), "error");
    assert!(matches!(reply.identity, MachineIdentity::Unreported { .. }));
}

#[test]
fn sources_of_one_bmc_share_one_slot() {
    let dir = tempfile::tempdir().unwrap();
    let e = entry(dir.path(), "Shared-BMC.example:623");
    let a = IpmiSource::new(&e, "n1").unwrap();
    let b = IpmiSource::new(&e, "n1").unwrap();
    assert!(Arc::ptr_eq(&a.shared.slot, &b.shared.slot));
    assert_ne!(a.shared.id, b.shared.id);
    let other = IpmiSource::new(&entry(dir.path(), "other.example"), "n1").unwrap();
    assert!(!Arc::ptr_eq(&a.shared.slot, &other.shared.slot));
}

proptest::proptest! {
    #![proptest_config(crate::fuzz::config())]

    /// Chassis status and system GUID replies of any length and content: no panic, and only
    /// the lengths the specification defines are accepted.
    #[test]
    fn fuzz_ipmi_replies(
        data in crate::fuzz::bytes_like(&[0x01, 0x10, 0x40, 0x00]),
        cc in proptest::prelude::any::<u8>(),
    ) {
        use super::commands::{ChassisStatus, GuidReply};
        match ChassisStatus::parse(&data) {
            Ok(_) => proptest::prop_assert!(data.len() == 3 || data.len() == 4),
            Err(_) => proptest::prop_assert!(data.len() != 3 && data.len() != 4),
        }
        match GuidReply::parse(cc, &data) {
            GuidReply::Guid(_) => proptest::prop_assert!(cc == 0 && data.len() == 16),
            GuidReply::Refused(c) => proptest::prop_assert!(c != 0 && c == cc),
            GuidReply::WrongLength(n) => proptest::prop_assert!(cc == 0 && n != 16),
        }
    }
}
