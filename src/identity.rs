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

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// canonical UUID strings it may stand for (lowercase, hyphenated), in the three byte orders
    /// controllers are known to use: an IPMI System GUID is 16 bytes that BMCs lay out in one
    /// of three orders (see [`uuid_forms_of_ipmi_guid`]), and a Redfish `UUID` string is sent
    /// as is by most services but in the SMBIOS byte-swapped order by some firmware (see
    /// [`uuid_forms_of_redfish_uuid`]). The first form is the one shown first; [`verify`] says
    /// which form matched.
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

    /// A Redfish-style UUID string, with its other byte orders (see
    /// [`uuid_forms_of_redfish_uuid`]); `None` when it is not a UUID at all.
    pub fn system_uuid(uuid: &str, serial: Option<String>) -> Option<Self> {
        Some(MachineIdentity::SystemUuid {
            forms: uuid_forms_of_redfish_uuid(uuid)?,
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
                    "the machine reports the Node's system UUID {node_uuid}, but node(s) {} report it too (or in another byte order, which one answer may stand for): a UUID several machines share (cloned VMs, boards shipped with one) cannot tell which machine answered",
                    node.uuid_shared_with.join(", ")
                ))
            } else if forms.contains(&node_uuid) {
                match which_form(forms, &node_uuid) {
                    Some(how) => Verdict::Match(format!("system UUID {node_uuid} ({how})")),
                    None => Verdict::Match(format!("system UUID {node_uuid}")),
                }
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

/// Node → the other Nodes reporting the same system UUID, compared in canonical form
/// (`{4C4C…}` and `4c4c…` are one UUID), or a UUID that is another byte order of it: a
/// controller's answer is accepted in three byte orders, so two Nodes whose UUIDs are byte
/// orders of each other could both be matched by one answer, and neither is proven by it.
/// UUIDs that are no UUID, and the firmware placeholders that the identity check already
/// refuses, are left out.
pub fn shared_system_uuids<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> HashMap<String, Vec<String>> {
    let mut by_uuid: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, uuid) in nodes {
        if let Some(uuid) = canonical_uuid(uuid).filter(|u| !is_placeholder(u)) {
            by_uuid.entry(uuid).or_default().push(name);
        }
    }
    let mut sharers: HashMap<String, BTreeSet<String>> = HashMap::new();
    for (uuid, names) in &by_uuid {
        // The Nodes whose UUID one answer may stand for together with this one: the same
        // UUID, or one that is another byte order of it (see `byte_order_relatives`).
        let mut alike: Vec<&str> = names.clone();
        for relative in byte_order_relatives(uuid) {
            if let Some(more) = by_uuid.get(&relative) {
                alike.extend(more);
            }
        }
        if alike.len() < 2 {
            continue;
        }
        for name in names {
            sharers
                .entry(name.to_string())
                .or_default()
                .extend(alike.iter().filter(|n| *n != name).map(|n| n.to_string()));
        }
    }
    sharers
        .into_iter()
        .map(|(name, others)| (name, others.into_iter().collect()))
        .collect()
}

/// A UUID string in canonical form (lowercase, hyphenated 8-4-4-4-12); accepts upper case,
/// braces, a `urn:uuid:` prefix and missing hyphens. `None` for anything else.
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
    named_ipmi_forms(guid).into_iter().map(|(f, _)| f).collect()
}

/// The UUID strings a Redfish `UUID` may stand for, the reported one first; `None` when it is
/// not a UUID. The same three byte orders as an IPMI System GUID's, read from the sixteen bytes
/// in the order the string writes them:
/// - as reported (what nearly every Redfish service sends: the SMBIOS UUID the kubelet reads);
/// - SMBIOS byte-swapped: the first three fields byte-swapped, what some BIOS versions (seen on
///   Supermicro X11 boards) hand their BMC, so that the BMC reports the UUID in the other
///   order from the kubelet's;
/// - all sixteen bytes reversed (the IPMI 2.0 layout read as text).
///
/// What a match on another form proves: that the machine that answered reports the Node's UUID
/// in a byte order firmware is known to use. It could be another machine only if that
/// machine's UUID were a byte order of this one: for random (version 4) or time-based UUIDs
/// that is vanishingly unlikely, and vendors' structured UUIDs do not collide that way either
/// (Dell's all start `4c4c4544`, whose swapped form starts `44454c4c`). The daemon already
/// accepts IPMI GUIDs in all three orders on the same grounds; and where two Nodes of the
/// cluster do report UUIDs that are byte orders of each other, [`shared_system_uuids`] counts
/// them as sharing one, so that neither is proven by it.
pub fn uuid_forms_of_redfish_uuid(uuid: &str) -> Option<Vec<String>> {
    let bytes = uuid_bytes(&canonical_uuid(uuid)?)?;
    Some(
        named_redfish_forms(&bytes)
            .into_iter()
            .map(|(f, _)| f)
            .collect(),
    )
}

/// The first three fields byte-swapped (SMBIOS 2.6+ stores them little-endian).
fn smbios_swapped(b: &[u8; 16]) -> [u8; 16] {
    let mut s = *b;
    s[0..4].reverse();
    s[4..6].reverse();
    s[6..8].reverse();
    s
}

fn reversed(b: &[u8; 16]) -> [u8; 16] {
    let mut r = *b;
    r.reverse();
    r
}

/// Forms of `candidates` in order, each once (a UUID may equal its own swapped form), with
/// the name of the byte order that gave it.
fn dedup_named(candidates: [([u8; 16], FormName); 3]) -> Vec<(String, FormName)> {
    let mut forms: Vec<(String, FormName)> = Vec::with_capacity(3);
    for (bytes, name) in candidates {
        let s = format_uuid(&bytes);
        if !forms.iter().any(|(f, _)| *f == s) {
            forms.push((s, name));
        }
    }
    forms
}

fn named_ipmi_forms(guid: &[u8; 16]) -> Vec<(String, FormName)> {
    dedup_named([
        (smbios_swapped(guid), FormName::IpmiSmbios),
        (reversed(guid), FormName::IpmiReversed),
        (*guid, FormName::IpmiAsSent),
    ])
}

fn named_redfish_forms(uuid: &[u8; 16]) -> Vec<(String, FormName)> {
    dedup_named([
        (*uuid, FormName::AsReported),
        (smbios_swapped(uuid), FormName::SmbiosSwapped),
        (reversed(uuid), FormName::Reversed),
    ])
}

/// Which byte order of what the controller sent a form is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FormName {
    AsReported,
    SmbiosSwapped,
    Reversed,
    IpmiSmbios,
    IpmiReversed,
    IpmiAsSent,
}

/// How `matched`, one of `forms`, stands for what the controller sent: "as reported", "SMBIOS
/// byte-swapped form of the reported …", and so on. The form lists are recognised by how they
/// were built (a Redfish UUID's, whose first form is the reported string; an IPMI GUID's, whose
/// first form is the GUID in SMBIOS order); `None` for a list built otherwise.
fn which_form(forms: &[String], matched: &str) -> Option<String> {
    let first = forms.first()?;
    let first_bytes = uuid_bytes(first)?;
    let same = |named: &[(String, FormName)]| {
        named.len() == forms.len() && named.iter().zip(forms).all(|((a, _), b)| a == b)
    };
    let redfish = named_redfish_forms(&first_bytes);
    let named = if same(&redfish) {
        redfish
    } else {
        let ipmi = named_ipmi_forms(&smbios_swapped(&first_bytes));
        if !same(&ipmi) {
            return None;
        }
        ipmi
    };
    let (_, name) = named.iter().find(|(f, _)| f == matched)?;
    let raw = format_uuid(&smbios_swapped(&first_bytes));
    Some(match name {
        FormName::AsReported => "as reported".to_string(),
        FormName::SmbiosSwapped => format!(
            "SMBIOS byte-swapped form of the reported {first}: its first three fields \
             byte-swapped"
        ),
        FormName::Reversed => {
            format!("byte-reversed form of the reported {first}: all sixteen bytes reversed")
        }
        FormName::IpmiSmbios => "System GUID read in SMBIOS byte order".to_string(),
        FormName::IpmiReversed => {
            format!("System GUID {raw} read in IPMI byte order: all sixteen bytes reversed")
        }
        FormName::IpmiAsSent => format!("System GUID {raw} read as sent (RFC 4122 byte order)"),
    })
}

/// The other byte orders a UUID may be written in, under which one answer could match both
/// it and them: its SMBIOS-swapped and reversed forms, and both of those applied in turn.
fn byte_order_relatives(canonical: &str) -> Vec<String> {
    let Some(b) = uuid_bytes(canonical) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::with_capacity(4);
    for r in [
        smbios_swapped(&b),
        reversed(&b),
        reversed(&smbios_swapped(&b)),
        smbios_swapped(&reversed(&b)),
    ] {
        let s = format_uuid(&r);
        if s != canonical && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The sixteen bytes of a canonical UUID string, in the order it writes them.
fn uuid_bytes(canonical: &str) -> Option<[u8; 16]> {
    let hex: String = canonical.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(b)
}

#[cfg(test)]
mod tests;
