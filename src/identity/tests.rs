//! Identity verdicts: UUID spellings and byte orders, placeholders, shared UUIDs, instances.

use super::*;

fn node(uuid: &str) -> NodeIdentity {
    NodeIdentity {
        system_uuid: uuid.into(),
        addresses: vec!["10.0.0.5".into(), "ip-10-0-0-5.ec2.internal".into()],
        uuid_shared_with: Vec::new(),
    }
}

#[test]
fn redfish_uuid_matches_whatever_the_case_and_hyphens() {
    let m = MachineIdentity::system_uuid("4C4C4544-0038-4B10-8052-B4C04F4A4E32", None).unwrap();
    assert!(verify(&node("4c4c4544-0038-4b10-8052-b4c04f4a4e32"), &m).is_match());
    assert!(verify(&node("{4C4C454400384B108052B4C04F4A4E32}"), &m).is_match());
    let other = verify(&node("4c4c4544-0038-4b10-8052-b4c04f4a4e33"), &m);
    assert_eq!(other.label(), "mismatch", "{other}");
    assert!(other.detail().contains("4e33") && other.detail().contains("4e32"));
}

/// Some Supermicro X11 BIOS versions hand their BMC the SMBIOS UUID with its first three
/// fields byte-swapped, so the Redfish `UUID` is the kubelet's in the other byte order. Before,
/// a Redfish UUID counted in one form only and such a node could never be fenced.
#[test]
fn redfish_uuid_matches_in_the_other_byte_orders_and_says_which() {
    const REPORTED: &str = "33221100-5544-7766-8899-aabbccddeeff";
    let m = MachineIdentity::system_uuid(&REPORTED.to_uppercase(), None).unwrap();

    let swapped = verify(&node("00112233-4455-6677-8899-aabbccddeeff"), &m);
    assert!(swapped.is_match(), "{swapped}");
    assert!(
        swapped.detail().contains(&format!(
            "SMBIOS byte-swapped form of the reported {REPORTED}"
        )),
        "{swapped}"
    );

    let same = verify(&node(REPORTED), &m);
    assert_eq!(
        same.detail(),
        format!("system UUID {REPORTED} (as reported)"),
        "{same}"
    );

    let reversed = verify(&node("ffeeddcc-bbaa-9988-6677-445500112233"), &m);
    assert!(reversed.is_match(), "{reversed}");
    assert!(
        reversed
            .detail()
            .contains("byte-reversed form of the reported"),
        "{reversed}"
    );

    // Another machine's UUID is still another machine's, in any of the orders.
    for other in [
        "00112233-4455-6677-8899-aabbccddee00",
        "33221100-5544-7766-8899-aabbccddee00",
        // Swapped and then reversed: no firmware is known to send that, so not accepted.
        "ffeeddcc-bbaa-9988-7766-554433221100",
    ] {
        let v = verify(&node(other), &m);
        assert_eq!(v.label(), "mismatch", "{other}: {v}");
    }
}

/// The placeholder test holds in every order: a BMC that sends the swapped placeholder proves
/// nothing either.
#[test]
fn a_placeholder_in_another_byte_order_proves_nothing() {
    let swapped_placeholder =
        MachineIdentity::system_uuid("00020003-0004-0005-0006-000700080009", None).unwrap();
    let v = verify(
        &node("4c4c4544-0038-4b10-8052-b4c04f4a4e32"),
        &swapped_placeholder,
    );
    assert_eq!(v.label(), "unverifiable", "{v}");
}

/// An IPMI match names the byte order the GUID was read in.
#[test]
fn ipmi_match_names_the_byte_order() {
    let as_sent = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];
    let m = MachineIdentity::SystemUuid {
        forms: uuid_forms_of_ipmi_guid(&as_sent),
        serial: None,
    };
    for (uuid, how) in [
        (
            "33221100-5544-7766-8899-aabbccddeeff",
            "System GUID read in SMBIOS byte order",
        ),
        (
            "00112233-4455-6677-8899-aabbccddeeff",
            "read as sent (RFC 4122 byte order)",
        ),
        (
            "ffeeddcc-bbaa-9988-7766-554433221100",
            "read in IPMI byte order",
        ),
    ] {
        let v = verify(&node(uuid), &m);
        assert!(v.is_match() && v.detail().contains(how), "{uuid}: {v}");
    }
}

/// Two Nodes whose UUIDs are byte orders of each other could both be matched by one answer:
/// they share it, as two Nodes reporting one UUID do, and neither is proven by it.
#[test]
fn nodes_whose_uuids_are_byte_orders_of_each_other_share_them() {
    let a = "00112233-4455-6677-8899-aabbccddeeff";
    let swapped = "33221100-5544-7766-8899-aabbccddeeff";
    let reversed = "ffeeddcc-bbaa-9988-7766-554433221100";
    let unrelated = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";
    let sharers =
        shared_system_uuids([("a", a), ("b", swapped), ("c", reversed), ("d", unrelated)]);
    assert_eq!(sharers["a"], ["b", "c"], "{sharers:?}");
    assert_eq!(sharers["b"], ["a", "c"], "{sharers:?}");
    assert_eq!(sharers["c"], ["a", "b"], "{sharers:?}");
    assert!(!sharers.contains_key("d"), "{sharers:?}");

    let mut n = node(a);
    n.uuid_shared_with = sharers["a"].clone();
    let m = MachineIdentity::system_uuid(swapped, None).unwrap();
    let v = verify(&n, &m);
    assert_eq!(v.label(), "unverifiable", "{v}");
    assert!(v.detail().contains("another byte order"), "{v}");
}

#[test]
fn placeholders_and_missing_uuids_prove_nothing() {
    let placeholder =
        MachineIdentity::system_uuid("03000200-0400-0500-0006-000700080009", None).unwrap();
    let v = verify(&node("03000200-0400-0500-0006-000700080009"), &placeholder);
    assert_eq!(v.label(), "unverifiable", "{v}");
    let m = MachineIdentity::system_uuid("4c4c4544-0038-4b10-8052-b4c04f4a4e32", None).unwrap();
    assert_eq!(verify(&node(""), &m).label(), "unverifiable");
    assert_eq!(verify(&node("not-a-uuid"), &m).label(), "unverifiable");
    let zero = MachineIdentity::system_uuid("00000000-0000-0000-0000-000000000000", None).unwrap();
    assert_eq!(
        verify(&node("4c4c4544-0038-4b10-8052-b4c04f4a4e32"), &zero).label(),
        "unverifiable"
    );
    assert_eq!(
        verify(&node("x"), &MachineIdentity::unreported("old firmware")).label(),
        "unverifiable"
    );
    assert!(MachineIdentity::system_uuid("12345", None).is_none());
}

#[test]
fn ipmi_guid_accepts_the_three_byte_orders_and_nothing_else() {
    // SMBIOS UUID 00112233-4455-6677-8899-aabbccddeeff as each layout sends it.
    let smbios_layout = [
        0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];
    let mut ipmi_layout = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];
    ipmi_layout.reverse();
    let rfc_layout = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ];
    let want = node("00112233-4455-6677-8899-aabbccddeeff");
    for layout in [smbios_layout, ipmi_layout, rfc_layout] {
        let m = MachineIdentity::SystemUuid {
            forms: uuid_forms_of_ipmi_guid(&layout),
            serial: None,
        };
        assert!(verify(&want, &m).is_match(), "{m}");
    }
    // A different machine whose GUID merely shares bytes is still a mismatch.
    let mut other = smbios_layout;
    other[15] = 0x00;
    let m = MachineIdentity::SystemUuid {
        forms: uuid_forms_of_ipmi_guid(&other),
        serial: None,
    };
    assert_eq!(verify(&want, &m).label(), "mismatch");
}

#[test]
fn instances_match_on_a_private_address() {
    let m = |ips: &[&str], dns: &[&str]| MachineIdentity::Instance {
        id: "i-0abc".into(),
        private_ips: ips.iter().map(|s| s.to_string()).collect(),
        private_dns_names: dns.iter().map(|s| s.to_string()).collect(),
    };
    let n = node("");
    assert!(verify(&n, &m(&["10.0.0.5"], &[])).is_match());
    assert!(verify(&n, &m(&[], &["IP-10-0-0-5.ec2.internal"])).is_match());
    assert_eq!(
        verify(&n, &m(&["10.0.0.6"], &["ip-10-0-0-6.ec2.internal"])).label(),
        "mismatch"
    );
    assert_eq!(verify(&n, &m(&[], &[])).label(), "unverifiable");
    let no_addresses = NodeIdentity::default();
    assert_eq!(
        verify(&no_addresses, &m(&["10.0.0.5"], &[])).label(),
        "unverifiable"
    );
}

mod fuzz_tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// Any string a BMC or a Node reports: no panic; a UUID comes out canonical or not at
        /// all; and a match needs the Node's UUID to be one of the reported UUID's byte orders.
        #[test]
        fn fuzz_uuids(
            a in crate::fuzz::text_like("{4C4C4544-0038-4B10-8052-B4C04F4A4E32}"),
            b in crate::fuzz::text_like("4c4c4544-0038-4b10-8052-b4c04f4a4e32"),
        ) {
            if let Some(c) = canonical_uuid(&a) {
                proptest::prop_assert_eq!(c.len(), 36);
                proptest::prop_assert!(c.chars().all(|ch| ch == '-' || ch.is_ascii_hexdigit() && !ch.is_ascii_uppercase()));
            }
            let node = NodeIdentity { system_uuid: b.clone(), addresses: vec![b.clone()], uuid_shared_with: Vec::new() };
            if let Some(m) = MachineIdentity::system_uuid(&a, None)
                && verify(&node, &m).is_match()
            {
                let forms = uuid_forms_of_redfish_uuid(&a).expect("a UUID");
                let node_uuid = canonical_uuid(&b).expect("a UUID");
                proptest::prop_assert!(forms.contains(&node_uuid), "{:?} {}", forms, node_uuid);
                proptest::prop_assert_eq!(&forms[0], &canonical_uuid(&a).unwrap());
            }
        }
    }
}
