//! Identity attestation: is the machine that answered a power read this node's machine?
//!
//! An Off read proves something only about the machine that sent it. A copy-pasted `[[bmc]]`
//! entry, a re-cabled BMC or a node name re-used for another instance would otherwise turn a
//! running node into a fenced one. So every read carries what the machine says it is
//! ([`MachineIdentity`]), and [`verify`] compares it with what the node's own kubelet reported
//! while it was healthy ([`NodeIdentity`]): the SMBIOS system UUID (`status.nodeInfo.systemUUID`)
//! for Redfish and IPMI, the private IP and DNS name for EC2.
//!
//! Pure: no I/O, no clock. The decision core calls [`verify`] on every read it counts.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

/// `identity = "checked" | "unchecked"`: whether a read counts only when the machine that
/// answered proves it is the node's machine (system UUID, instance address).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityCheck {
    /// The default: no identity, no fence.
    #[default]
    Checked,
    /// For machines that cannot report a usable identity (old BMCs, placeholder UUIDs): their
    /// Off reads count without one. Logged at start and counted in a metric.
    Unchecked,
}

/// What the machine that answered a read says it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MachineIdentity {
    /// Nothing usable: the read failed before it, or the machine offers no identity.
    Unreported { reason: String },
    /// An SMBIOS system UUID as the management controller reports it. `forms` are the
    /// canonical UUID strings it may stand for (lowercase, hyphenated): a Redfish `UUID` is one
    /// string; an IPMI System GUID is 16 bytes that BMCs lay out in one of three byte orders,
    /// see [`uuid_forms_of_ipmi_guid`].
    SystemUuid {
        forms: Vec<String>,
        /// The serial number, where the controller reports one (evidence only: the kubelet
        /// does not report a serial to compare with).
        #[serde(skip_serializing_if = "Option::is_none")]
        serial: Option<String>,
    },
    /// A cloud instance: the addresses the cloud says it has.
    Instance {
        id: String,
        private_ips: Vec<String>,
        private_dns_names: Vec<String>,
    },
}

impl MachineIdentity {
    pub fn unreported(reason: impl Into<String>) -> Self {
        MachineIdentity::Unreported {
            reason: reason.into(),
        }
    }

    /// A Redfish-style UUID string; `None` when it is not a UUID at all.
    pub fn system_uuid(uuid: &str, serial: Option<String>) -> Option<Self> {
        Some(MachineIdentity::SystemUuid {
            forms: vec![canonical_uuid(uuid)?],
            serial,
        })
    }
}

impl fmt::Display for MachineIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineIdentity::Unreported { reason } => write!(f, "no identity ({reason})"),
            MachineIdentity::SystemUuid { forms, serial } => {
                write!(f, "system UUID {}", forms.join(" | "))?;
                if let Some(s) = serial {
                    write!(f, ", serial {s}")?;
                }
                Ok(())
            }
            MachineIdentity::Instance {
                id,
                private_ips,
                private_dns_names,
            } => write!(
                f,
                "instance {id}, private IP {}, private DNS {}",
                list_or_none(private_ips),
                list_or_none(private_dns_names)
            ),
        }
    }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// What the node's kubelet reported about its machine while it was healthy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeIdentity {
    /// `status.nodeInfo.systemUUID` (the SMBIOS product UUID the kubelet read).
    pub system_uuid: String,
    /// `status.addresses` of type InternalIP, Hostname and InternalDNS.
    pub addresses: Vec<String>,
    /// Other Nodes that report the same system UUID (cloned VMs, boards shipped with one UUID):
    /// the UUID then tells no machine apart, and proves none of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uuid_shared_with: Vec<String>,
}

/// Whether a machine proved to be the node's machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "detail", rename_all = "snake_case")]
pub enum Verdict {
    /// It is: `detail` says on what (the UUID, the address).
    Match(String),
    /// It is another machine: `detail` names both sides.
    Mismatch(String),
    /// Cannot tell: no identity reported, a placeholder UUID, nothing on the node to compare.
    Unverifiable(String),
}

impl Verdict {
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Match(_) => "match",
            Verdict::Mismatch(_) => "mismatch",
            Verdict::Unverifiable(_) => "unverifiable",
        }
    }

    pub fn is_match(&self) -> bool {
        matches!(self, Verdict::Match(_))
    }

    pub fn detail(&self) -> &str {
        match self {
            Verdict::Match(d) | Verdict::Mismatch(d) | Verdict::Unverifiable(d) => d,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.label(), self.detail())
    }
}

/// UUIDs that firmware ships when nobody set one: they identify no machine. All zeros means
/// "not set" and all ones "not present" (SMBIOS); the third is a well-known BIOS default found
/// on many boards at once.
const PLACEHOLDER_UUIDS: [&str; 3] = [
    "00000000-0000-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
    "03000200-0400-0500-0006-000700080009",
];

/// Whether a canonical UUID is one of the firmware placeholders that identify no machine.
pub fn is_placeholder(canonical: &str) -> bool {
    PLACEHOLDER_UUIDS.contains(&canonical)
}

/// Compares what the machine said with what the node said.
pub fn verify(node: &NodeIdentity, machine: &MachineIdentity) -> Verdict {
    match machine {
        MachineIdentity::Unreported { reason } => {
            Verdict::Unverifiable(format!("the power source reported no identity: {reason}"))
        }
        MachineIdentity::SystemUuid { forms, .. } => {
            let Some(node_uuid) = canonical_uuid(&node.system_uuid) else {
                return Verdict::Unverifiable(format!(
                    "the Node reports no usable status.nodeInfo.systemUUID ({:?})",
                    node.system_uuid
                ));
            };
            if PLACEHOLDER_UUIDS.contains(&node_uuid.as_str()) {
                return Verdict::Unverifiable(format!(
                    "the Node's systemUUID {node_uuid} is a firmware placeholder that many machines share"
                ));
            }
            if forms.is_empty() {
                return Verdict::Unverifiable("the power source reported an empty UUID".into());
            }
            if forms
                .iter()
                .any(|f| PLACEHOLDER_UUIDS.contains(&f.as_str()))
            {
                return Verdict::Unverifiable(format!(
                    "the machine reports the placeholder UUID {}",
                    forms[0]
                ));
            }
            if forms.contains(&node_uuid) && !node.uuid_shared_with.is_empty() {
                Verdict::Unverifiable(format!(
                    "the machine reports the Node's system UUID {node_uuid}, but node(s) {} report it too: a UUID several machines share (cloned VMs, boards shipped with one) cannot tell which machine answered",
                    node.uuid_shared_with.join(", ")
                ))
            } else if forms.contains(&node_uuid) {
                Verdict::Match(format!("system UUID {node_uuid}"))
            } else {
                Verdict::Mismatch(format!(
                    "the machine reports system UUID {} but the Node's systemUUID is {node_uuid}",
                    forms.join(" | ")
                ))
            }
        }
        MachineIdentity::Instance {
            id,
            private_ips,
            private_dns_names,
        } => {
            if node.addresses.is_empty() {
                return Verdict::Unverifiable(
                    "the Node reports no InternalIP, Hostname or InternalDNS address".into(),
                );
            }
            if private_ips.is_empty() && private_dns_names.is_empty() {
                return Verdict::Unverifiable(format!(
                    "instance {id} has no private IP or private DNS name to compare"
                ));
            }
            let same = |a: &String, b: &String| a.eq_ignore_ascii_case(b);
            let found = private_ips
                .iter()
                .chain(private_dns_names)
                .find(|m| node.addresses.iter().any(|n| same(n, m)));
            match found {
                Some(m) => Verdict::Match(format!("instance {id} has the Node's address {m}")),
                None => Verdict::Mismatch(format!(
                    "instance {id} has private IP {} and private DNS {}, none of the Node's addresses {}",
                    list_or_none(private_ips),
                    list_or_none(private_dns_names),
                    node.addresses.join(", ")
                )),
            }
        }
    }
}

/// A UUID string in canonical form (lowercase, hyphenated 8-4-4-4-12); accepts upper case,
/// braces, a `urn:uuid:` prefix and missing hyphens. `None` for anything else.
/// Node → the other Nodes reporting the same system UUID, compared in canonical form
/// (`{4C4C…}` and `4c4c…` are one UUID). UUIDs that are no UUID, and the firmware placeholders
/// that the identity check already refuses, are left out.
pub fn shared_system_uuids<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> HashMap<String, Vec<String>> {
    let mut by_uuid: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, uuid) in nodes {
        if let Some(uuid) = canonical_uuid(uuid).filter(|u| !is_placeholder(u)) {
            by_uuid.entry(uuid).or_default().push(name);
        }
    }
    let mut sharers = HashMap::new();
    for names in by_uuid.into_values().filter(|n| n.len() > 1) {
        for name in &names {
            let mut others: Vec<String> = names
                .iter()
                .filter(|n| *n != name)
                .map(|n| n.to_string())
                .collect();
            others.sort();
            sharers.insert(name.to_string(), others);
        }
    }
    sharers
}

pub fn canonical_uuid(s: &str) -> Option<String> {
    let s = s.trim();
    let s = s.strip_prefix("urn:uuid:").unwrap_or(s);
    let s = s.trim_start_matches('{').trim_end_matches('}');
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .ok()?;
    Some(format_uuid(&bytes))
}

fn format_uuid(b: &[u8]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The UUID strings an IPMI System GUID (Get System GUID, NetFn App, command 0x37) may stand
/// for. BMCs disagree on the byte order, as ipmitool's `-e` decodings show; all three are
/// accepted, because each is what some vendor's BMC returns for the SMBIOS UUID the kubelet
/// reads:
/// - SMBIOS: the first three fields little-endian, the rest as sent (SMBIOS 2.6+ and most
///   current BMCs);
/// - IPMI: all sixteen bytes least significant first (the IPMI 2.0 specification's layout);
/// - RFC 4122: all sixteen bytes in network order.
pub fn uuid_forms_of_ipmi_guid(guid: &[u8; 16]) -> Vec<String> {
    let mut smbios = *guid;
    smbios[0..4].reverse();
    smbios[4..6].reverse();
    smbios[6..8].reverse();
    let mut reversed = *guid;
    reversed.reverse();
    let mut forms = Vec::with_capacity(3);
    for f in [smbios, reversed, *guid] {
        let s = format_uuid(&f);
        if !forms.contains(&s) {
            forms.push(s);
        }
    }
    forms
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn placeholders_and_missing_uuids_prove_nothing() {
        let placeholder =
            MachineIdentity::system_uuid("03000200-0400-0500-0006-000700080009", None).unwrap();
        let v = verify(&node("03000200-0400-0500-0006-000700080009"), &placeholder);
        assert_eq!(v.label(), "unverifiable", "{v}");
        let m = MachineIdentity::system_uuid("4c4c4544-0038-4b10-8052-b4c04f4a4e32", None).unwrap();
        assert_eq!(verify(&node(""), &m).label(), "unverifiable");
        assert_eq!(verify(&node("not-a-uuid"), &m).label(), "unverifiable");
        let zero =
            MachineIdentity::system_uuid("00000000-0000-0000-0000-000000000000", None).unwrap();
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
            0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ];
        let mut ipmi_layout = [
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ];
        ipmi_layout.reverse();
        let rfc_layout = [
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
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
}

#[cfg(test)]
mod fuzz_tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(crate::fuzz::config())]

        /// Any string a BMC or a Node reports: no panic; a UUID comes out canonical or not at
        /// all; and a match needs the same UUID on both sides.
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
                proptest::prop_assert_eq!(canonical_uuid(&a), canonical_uuid(&b));
            }
        }
    }
}
