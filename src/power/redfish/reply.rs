//! The strict reading of one ComputerSystem answer: it must be a JSON object that names itself
//! the resource asked for and is a ComputerSystem; then only one `PowerState` of exactly
//! `"Off"` is off. Every duplicated or malformed field is refused with a named error, and the
//! machine's identity comes from the same answer.

use std::fmt;

use reqwest::Url;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::errors::{quote, quote_bytes, truncate};
use super::{QUOTE_CHARS, failed};
use crate::identity::MachineIdentity;
use crate::power::{PowerState, ReadErrorKind, Reply};

/// Maps the answer to a GET of the ComputerSystem at `asked` to a power state and the identity
/// of the machine that answered.
///
/// The answer counts only as a JSON object that says it is that resource: its `@odata.id` is
/// `asked` and its `@odata.type` is a ComputerSystem (see [`check_is_asked_system`]); a BMC
/// that answers with another system, a Chassis or a Manager (they have a `PowerState` too) must
/// not have its answer taken for this machine's. Then only a single `PowerState` property that
/// is exactly `"Off"` maps to [`PowerState::Off`]. `"On"` maps to On; `"PoweringOn"` and
/// `"PoweringOff"` are transitional; `"Paused"` is suspended (memory kept); anything else is a
/// [`ReadErrorKind::BadReply`] error naming what was found. The identity is the `UUID` property
/// (with `SerialNumber` as evidence), or unreported with the reason when it is unusable.
pub fn parse_reply(body: &[u8], asked: &str) -> Reply {
    let resource = match parse_resource(body) {
        Ok(r) => r,
        Err(state) => return failed(state),
    };
    if let Err(state) = check_is_asked_system(&resource, asked) {
        return failed(state);
    }
    match power_state_of(&resource) {
        state @ PowerState::Error { .. } => failed(state),
        state => Reply {
            state,
            details: Vec::new(),
            identity: identity_of(&resource),
            reader: None,
            power_draw: None,
        },
    }
}

pub(super) fn bad(detail: String) -> PowerState {
    PowerState::error(ReadErrorKind::BadReply, detail)
}

pub(super) fn parse_resource(body: &[u8]) -> Result<Resource, PowerState> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("empty reply".to_string()));
    }
    // JSON is UTF-8 text (RFC 8259). The resource reader skips the members it does not need
    // without looking inside them, so check the whole reply here: an answer with broken bytes
    // anywhere is not a well-formed answer, whatever its PowerState says.
    if let Err(e) = std::str::from_utf8(body) {
        return Err(bad(format!(
            "reply is not UTF-8 text (invalid byte at offset {}); it starts with {}",
            e.valid_up_to(),
            quote_bytes(body)
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            bad(format!("reply is not a Redfish resource object ({e})"))
        } else {
            bad(format!(
                "reply is not JSON ({e}); it starts with {}",
                quote_bytes(body)
            ))
        }
    })
}

/// The reply must name itself the resource that was asked for, and be a ComputerSystem.
///
/// `@odata.id` may differ from `asked` by one trailing slash, or be a full URL whose path is
/// `asked` (some services write absolute URLs). `@odata.type` must be a ComputerSystem's (see
/// [`is_resource_type`]); a `ComputerSystemCollection`, a Chassis, a Manager or anything
/// else is refused.
fn check_is_asked_system(resource: &Resource, asked: &str) -> Result<(), PowerState> {
    let id = one_string(&resource.odata_ids, "@odata.id").map_err(|why| {
        bad(format!(
            "reply {why}, so it is not known to be the ComputerSystem at {} that was asked for",
            quote(asked)
        ))
    })?;
    if !names_path(id, asked) {
        return Err(bad(format!(
            "reply is the resource {} (its @odata.id), not the ComputerSystem at {} that was \
             asked for",
            quote(id),
            quote(asked)
        )));
    }
    let odata_type = one_string(&resource.odata_types, "@odata.type").map_err(|why| {
        bad(format!(
            "reply {why}, so it is not known to be a ComputerSystem"
        ))
    })?;
    if !is_resource_type(odata_type, "ComputerSystem") {
        return Err(bad(format!(
            "reply is a {}, not a ComputerSystem (expected \
             #ComputerSystem.v1_20_0.ComputerSystem or, in the Redfish 1.0 form, \
             #ComputerSystem.1.0.1.ComputerSystem, any version); set `system` to a member of \
             /redfish/v1/Systems, not a Chassis, a Manager or a collection",
            quote(odata_type)
        )));
    }
    Ok(())
}

/// Whether an `@odata.id` names the path `asked`: equal but for one trailing slash, as a path
/// or as the path of an `http(s)` URL without query or fragment.
pub(super) fn names_path(odata_id: &str, asked: &str) -> bool {
    let one_slash_off = |s: &str| s.strip_suffix('/').unwrap_or(s).to_string();
    let path = if odata_id.starts_with('/') {
        odata_id.to_string()
    } else {
        match Url::parse(odata_id) {
            Ok(url)
                if matches!(url.scheme(), "https" | "http")
                    && url.query().is_none()
                    && url.fragment().is_none() =>
            {
                url.path().to_string()
            }
            _ => return false,
        }
    };
    one_slash_off(&path) == one_slash_off(asked)
}

/// Whether an `@odata.type` names a resource of type `name` (`ComputerSystem`, `Outlet`):
/// namespace `name`, type `name`, and between them no version or a version in one of the two
/// forms Redfish has used:
/// - `#ComputerSystem.v1_20_0.ComputerSystem`: `v`, then numbers joined by underscores (Redfish
///   1.1 and later, and most services);
/// - `#ComputerSystem.1.0.1.ComputerSystem`: numbers joined by dots, no `v` (the Redfish 1.0
///   form, before `v1_0_1`, which HPE iLO 4 on ProLiant Gen9 still sends);
/// - `#ComputerSystem.ComputerSystem`: unversioned.
///
/// The namespace and the type are matched whole, so `#ComputerSystemCollection...`,
/// `#Chassis.1.0.0.Chassis` or `#ComputerSystem.1.0.1.Foo` are not a ComputerSystem.
pub(super) fn is_resource_type(odata_type: &str, name: &str) -> bool {
    let Some(rest) = odata_type
        .strip_prefix('#')
        .and_then(|t| t.strip_prefix(name))
        .and_then(|t| t.strip_prefix('.'))
    else {
        return false;
    };
    let Some(version) = rest.strip_suffix(name) else {
        return false;
    };
    if version.is_empty() {
        return true;
    }
    let numbers = |v: &str, separator: char| {
        v.split(separator)
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    version
        .strip_suffix('.')
        .is_some_and(|v| match v.strip_prefix('v') {
            Some(v) => numbers(v, '_'),
            None => numbers(v, '.'),
        })
}

/// The single string value of a property; the reason, as the end of a sentence starting with
/// "reply", when there is none, several, or not a string.
pub(super) fn one_string<'a>(
    values: &'a [serde_json::Value],
    name: &str,
) -> Result<&'a str, String> {
    match values {
        [] => Err(format!("has no {name}")),
        [serde_json::Value::String(s)] => Ok(s),
        [other] => Err(format!(
            "has a {name} that is not a string: {}",
            quote(&other.to_string())
        )),
        many => Err(format!("has {name} {} times", many.len())),
    }
}

fn power_state_of(resource: &Resource) -> PowerState {
    let value = match resource.power_states.as_slice() {
        [] => {
            return bad(
                "the ComputerSystem has no PowerState; is `system` the path of a ComputerSystem?"
                    .to_string(),
            );
        }
        [one] => one,
        many => {
            return bad(format!(
                "reply has PowerState {} times; refusing an ambiguous answer",
                many.len()
            ));
        }
    };
    match value {
        serde_json::Value::String(s) => match s.as_str() {
            "Off" => PowerState::Off,
            "On" => PowerState::On,
            "PoweringOn" | "PoweringOff" => PowerState::Transitional { detail: s.clone() },
            // Resource.PowerState "Paused" (v1_13_0): "The resource is paused." A paused
            // system keeps its memory and resumes with the same processes.
            "Paused" => PowerState::Suspended {
                detail: "the ComputerSystem's PowerState is Paused".into(),
            },
            other => bad(format!("unknown PowerState {}", quote(other))),
        },
        serde_json::Value::Null => bad("PowerState is null".to_string()),
        other => {
            let json = other.to_string();
            bad(format!("PowerState is not a string: {}", quote(&json)))
        }
    }
}

/// The machine's identity from the ComputerSystem's `UUID`, with `SerialNumber` beside it.
fn identity_of(resource: &Resource) -> MachineIdentity {
    let uuid = match one_string(&resource.uuids, "UUID") {
        Ok(uuid) => uuid,
        Err(why) => return MachineIdentity::unreported(format!("the ComputerSystem {why}")),
    };
    if uuid.trim().is_empty() {
        return MachineIdentity::unreported("the ComputerSystem's UUID is empty");
    }
    MachineIdentity::system_uuid(uuid, serial_of(resource)).unwrap_or_else(|| {
        MachineIdentity::unreported(format!(
            "the ComputerSystem's UUID {} is not a UUID",
            quote(uuid)
        ))
    })
}

/// `SerialNumber` when it is one non-empty string, escaped and bounded like every quotation
/// of BMC text (it ends up in `why`, Events and the journal).
fn serial_of(resource: &Resource) -> Option<String> {
    let serial = one_string(&resource.serials, "SerialNumber").ok()?.trim();
    if serial.is_empty() {
        return None;
    }
    let escaped: String = serial.chars().flat_map(char::escape_debug).collect();
    Some(truncate(&escaped, QUOTE_CHARS))
}

/// The parts of a Redfish resource that matter here. Every occurrence of each property is kept
/// (a plain map would silently keep only the last of duplicated keys); the rest is skipped.
#[derive(Default)]
pub(super) struct Resource {
    pub(super) power_states: Vec<serde_json::Value>,
    pub(super) odata_ids: Vec<serde_json::Value>,
    pub(super) odata_types: Vec<serde_json::Value>,
    uuids: Vec<serde_json::Value>,
    serials: Vec<serde_json::Value>,
    /// An Outlet's `PowerWatts` (a Sensor excerpt).
    pub(super) power_watts: Vec<serde_json::Value>,
}

impl<'de> Deserialize<'de> for Resource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ResourceVisitor)
    }
}

struct ResourceVisitor;

impl<'de> Visitor<'de> for ResourceVisitor {
    type Value = Resource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Resource, A::Error> {
        let mut r = Resource::default();
        while let Some(key) = map.next_key::<String>()? {
            let kept = match key.as_str() {
                "PowerState" => &mut r.power_states,
                "@odata.id" => &mut r.odata_ids,
                "@odata.type" => &mut r.odata_types,
                "UUID" => &mut r.uuids,
                "SerialNumber" => &mut r.serials,
                "PowerWatts" => &mut r.power_watts,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            kept.push(map.next_value()?);
        }
        Ok(r)
    }
}
