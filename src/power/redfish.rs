//! Redfish power source: `GET` the ComputerSystem resource and read its `PowerState` and, from
//! the same answer, its `UUID` (the machine's identity, see [`crate::identity`]).
//!
//! Only the exact string `"Off"` in a well-formed JSON object from a 2xx answer means off, and
//! only when that object says it is the ComputerSystem that was asked for (its `@odata.id` and
//! `@odata.type`). Everything else — other spellings, a missing or duplicated property, another
//! resource, an HTML error page, a redirect, a TLS or credential problem, silence — is reported
//! as an error of the matching [`ReadErrorKind`], with a short detail for the operator that
//! never carries the password.
//!
//! Longer than 600 lines: a strict reading of one resource — its identity, its type, every
//! duplicated or malformed field refused with a named error — is most of this file.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::{StatusCode, Url};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{PowerDraw, PowerSource, PowerState, ReadErrorKind, Reply};
use crate::config::{BmcEntry, BmcTls};
use crate::identity::MachineIdentity;
use crate::secret::Secret;

/// Where the systems collection lives on every Redfish service.
const SYSTEMS_COLLECTION: &str = "/redfish/v1/Systems";

/// Larger answers are refused: a ComputerSystem resource is a few kilobytes, and a BMC that
/// streams megabytes is broken or hostile.
const MAX_BODY: usize = 1024 * 1024;

/// At most this many characters of anything the BMC sent are quoted in a detail string.
const QUOTE_CHARS: usize = 60;

/// Reads one machine's power state through its BMC's Redfish service.
pub struct RedfishSource {
    client: reqwest::Client,
    /// Service root (`https://host:port/`), credentials-free.
    base: Url,
    node: String,
    /// Configured system path, `{node}` filled in.
    system: Option<String>,
    /// System path found under `/redfish/v1/Systems`, kept once a read through it succeeded.
    discovered: OnceLock<String>,
    username: String,
    password: Secret,
    tls: BmcTls,
    timeout: Duration,
    /// The entry asks for the power draw beside an Off (`corroborate = "power-draw"`).
    power_draw: bool,
}

impl fmt::Debug for RedfishSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedfishSource")
            .field("address", &self.address())
            .field("node", &self.node)
            .field("system", &self.system)
            .field("discovered", &self.discovered.get())
            .field("username", &self.username)
            .field("password", &self.password)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedfishSource {
    /// Builds the source for `node` from its `[[bmc]]` entry, with an HTTP client of its own.
    /// Fails on settings that cannot work (bad URL, unreadable CA).
    pub fn new(entry: &BmcEntry, node: &str) -> Result<RedfishSource, String> {
        RedfishSource::with_client(entry, node, RedfishSource::client_for(entry)?)
    }

    /// Builds the source for `node` on `client`, the entry's shared client
    /// ([`RedfishSource::client_for`]): one client, one TLS root store and one connection pool
    /// per entry, however many nodes it maps.
    pub fn with_client(
        entry: &BmcEntry,
        node: &str,
        client: reqwest::Client,
    ) -> Result<RedfishSource, String> {
        let address = entry.address_for(node);
        let base = Url::parse(&address)
            .map_err(|e| format!("BMC address {address:?} is not a URL: {e}"))?;
        if base.scheme() != "https" {
            return Err(format!(
                "BMC address {address:?} must use https:// (Redfish is served over TLS)"
            ));
        }
        if base.host_str().is_none_or(str::is_empty) {
            return Err(format!("BMC address {address:?} has no host"));
        }
        if !base.username().is_empty() || base.password().is_some() {
            // Never echo the address here: it holds the credentials we refuse.
            return Err(
                "BMC address must not contain credentials; use username and password_file"
                    .to_string(),
            );
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(format!(
                "BMC address {address:?} must not have a query or fragment"
            ));
        }

        let system = entry.system_for(node);
        if let Some(path) = &system {
            check_path(path).map_err(|why| format!("system {path:?} {why}"))?;
        }
        Ok(RedfishSource {
            client,
            base,
            node: node.to_string(),
            system,
            discovered: OnceLock::new(),
            username: entry.username.clone(),
            password: entry.password.clone(),
            tls: entry.tls.clone(),
            timeout: entry.timeout,
            power_draw: entry.corroborate.is_some(),
        })
    }

    /// The HTTP client of a `[[bmc]]` entry: its TLS settings and timeout.
    pub fn client_for(entry: &BmcEntry) -> Result<reqwest::Client, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(entry.timeout)
            .connect_timeout(entry.timeout)
            // A redirect is never followed: a BMC that redirects the system resource is
            // misconfigured for us, and some put credentials into the Location header.
            .redirect(reqwest::redirect::Policy::none())
            // BMC networks are reached directly; credentials must not go through a proxy
            // picked up from the environment.
            .no_proxy()
            .https_only(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(concat!("oobfence/", env!("CARGO_PKG_VERSION")));
        match &entry.tls {
            BmcTls::Insecure => builder = builder.tls_danger_accept_invalid_certs(true),
            BmcTls::Pinned {
                ca_certs,
                fingerprints,
                ..
            } => {
                let verifier = pinning::PinningVerifier::new(ca_certs, fingerprints)?;
                builder = builder.tls_backend_preconfigured(pinning::client_config(verifier));
            }
            BmcTls::System => {}
        }
        builder
            .build()
            .map_err(|e| format!("cannot build the HTTPS client: {}", error_chain(&e)))
    }

    async fn read_within_deadline(&self) -> Reply {
        // The power draw witness, when asked for, must be in by nine tenths of the timeout, so
        // that its silence shows as its own, not as the whole read's.
        let witness_by = tokio::time::Instant::now() + self.timeout.mul_f64(0.9);
        let reply = match tokio::time::timeout(self.timeout, self.read_once(witness_by)).await {
            Ok(reply) => reply,
            Err(_) => failed(PowerState::error(
                ReadErrorKind::Timeout,
                format!(
                    "no complete answer within {}",
                    humantime::format_duration(self.timeout)
                ),
            )),
        };
        self.scrub_reply(reply)
    }

    async fn read_once(&self, witness_by: tokio::time::Instant) -> Reply {
        let (path, found) = match (&self.system, self.discovered.get()) {
            (Some(path), _) => (path.clone(), false),
            (None, Some(path)) => (path.clone(), false),
            (None, None) => match self.discover().await {
                Ok(path) => (path, true),
                Err(state) => return failed(state),
            },
        };
        let reply = match self.get(&path).await {
            Ok(body) => {
                let mut reply = parse_reply(&body, &path);
                if self.power_draw && reply.state == PowerState::Off {
                    let draw =
                        tokio::time::timeout_at(witness_by, witness::power_draw(self, &body))
                            .await
                            .unwrap_or_else(|_| PowerDraw::Unavailable {
                                why: "the power draw was not read within the read's timeout".into(),
                            });
                    reply
                        .details
                        .push(super::ReadDetail::new("power draw", draw.to_string()));
                    reply.power_draw = Some(draw);
                }
                reply
            }
            Err(state) => failed(state),
        };
        if found && !matches!(reply.state, PowerState::Error { .. }) {
            // A concurrent read may have set it first; both found the same single member.
            let _ = self.discovered.set(path);
        }
        reply
    }

    /// Finds the single member of `/redfish/v1/Systems`.
    async fn discover(&self) -> Result<String, PowerState> {
        let body = self.get(SYSTEMS_COLLECTION).await?;
        single_system(&body, &self.node)
    }

    /// One authenticated GET; `Ok` only for a 2xx answer whose body arrived in full.
    async fn get(&self, path: &str) -> Result<Vec<u8>, PowerState> {
        let url = self.base.join(path).map_err(|e| {
            PowerState::error(
                ReadErrorKind::Config,
                format!("cannot join {} to the BMC address: {e}", quote(path)),
            )
        })?;
        let mut response = self
            .client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .basic_auth(&self.username, Some(self.password.expose()))
            .send()
            .await
            .map_err(|e| classify(e, path))?;

        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PowerState::error(
                ReadErrorKind::Auth,
                format!(
                    "HTTP {} for GET {path}: credentials of user {} refused",
                    status_text(status),
                    quote(&self.username)
                ),
            ));
        }
        if !status.is_success() {
            let hint = if status.is_redirection() {
                " (redirects are not followed; set `system` to the path listed under \
                 /redfish/v1/Systems)"
            } else {
                ""
            };
            return Err(PowerState::error(
                ReadErrorKind::Protocol,
                format!("HTTP {} for GET {path}{hint}", status_text(status)),
            ));
        }

        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_BODY {
                        return Err(PowerState::error(
                            ReadErrorKind::BadReply,
                            format!("reply to GET {path} is larger than {MAX_BODY} bytes"),
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => return Ok(body),
                Err(e) => return Err(classify(e, path)),
            }
        }
    }

    /// Last line of defence: no detail or identity string leaves this source with the password
    /// in it.
    fn scrub_reply(&self, reply: Reply) -> Reply {
        let secret = self.password.expose();
        let clean = |text: String| {
            if !secret.is_empty() && text.contains(secret) {
                text.replace(secret, "<redacted>")
            } else {
                text
            }
        };
        Reply {
            state: self.scrub(reply.state),
            reader: None,
            details: reply
                .details
                .into_iter()
                .map(|d| super::ReadDetail::new(d.name, clean(d.value)))
                .collect(),
            identity: scrub_identity(secret, reply.identity),
            power_draw: reply.power_draw.map(|d| match d {
                PowerDraw::Seen { watts, from } => PowerDraw::Seen {
                    watts,
                    from: clean(from),
                },
                PowerDraw::Unavailable { why } => PowerDraw::Unavailable { why: clean(why) },
            }),
        }
    }

    fn scrub(&self, state: PowerState) -> PowerState {
        let secret = self.password.expose();
        match state {
            PowerState::Error { kind, detail } if !secret.is_empty() && detail.contains(secret) => {
                PowerState::Error {
                    kind,
                    detail: detail.replace(secret, "<redacted>"),
                }
            }
            PowerState::Transitional { detail }
                if !secret.is_empty() && detail.contains(secret) =>
            {
                PowerState::Transitional {
                    detail: detail.replace(secret, "<redacted>"),
                }
            }
            other => other,
        }
    }
}

impl PowerSource for RedfishSource {
    fn backend(&self) -> &'static str {
        "redfish"
    }

    fn address(&self) -> String {
        let s = self.base.as_str();
        if self.base.path() == "/" {
            s.trim_end_matches('/').to_string()
        } else {
            s.to_string()
        }
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { self.read_reply().await.state })
    }

    /// One GET of the ComputerSystem yields both the power state and the identity.
    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        Box::pin(self.read_within_deadline())
    }
}

/// A failed or refused read: what answered is not known to be the machine, so no identity.
fn failed(state: PowerState) -> Reply {
    Reply::without_identity(
        state,
        "the read failed, so nothing the BMC said is taken as the machine's identity",
    )
}

/// The password out of an identity's free text (a BMC may echo anything into `SerialNumber`).
/// The UUID forms are left alone: they are hexadecimal digits and hyphens formatted here, and
/// the same UUID is public in the Node's `status.nodeInfo.systemUUID`.
fn scrub_identity(secret: &str, identity: MachineIdentity) -> MachineIdentity {
    let clean = |s: String| {
        if !secret.is_empty() && s.contains(secret) {
            s.replace(secret, "<redacted>")
        } else {
            s
        }
    };
    match identity {
        MachineIdentity::Unreported { reason } => MachineIdentity::Unreported {
            reason: clean(reason),
        },
        MachineIdentity::SystemUuid { forms, serial } => MachineIdentity::SystemUuid {
            forms,
            serial: serial.map(clean),
        },
        other => other,
    }
}

/// The path of the single system a `/redfish/v1/Systems` collection lists; an error that tells
/// the operator to set `system` when it lists none, several, or may hide some.
fn single_system(body: &[u8], node: &str) -> Result<String, PowerState> {
    let bad = |detail: String| PowerState::error(ReadErrorKind::BadReply, detail);
    let doc: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "{SYSTEMS_COLLECTION} is not JSON ({e}); it starts with {}",
            quote_bytes(body)
        ))
    })?;
    let Some(members) = doc.get("Members").and_then(|m| m.as_array()) else {
        return Err(bad(format!(
            "{SYSTEMS_COLLECTION} has no Members list; set `system` for this BMC in the config"
        )));
    };
    // A paged collection, or one whose count disagrees with its list, may hide members.
    let count = doc.get("Members@odata.count").and_then(|c| c.as_u64());
    if doc.get("Members@odata.nextLink").is_some()
        || count.is_some_and(|c| c != members.len() as u64)
    {
        return Err(bad(format!(
            "{SYSTEMS_COLLECTION} is paged or its count disagrees with its list; \
             set `system` for this BMC in the config"
        )));
    }
    let mut paths = Vec::with_capacity(members.len());
    for member in members {
        match member.get("@odata.id").and_then(|id| id.as_str()) {
            Some(id) => paths.push(id),
            None => {
                return Err(bad(format!(
                    "{SYSTEMS_COLLECTION} has a member without a string @odata.id"
                )));
            }
        }
    }
    match paths.as_slice() {
        [] => Err(bad(format!(
            "{SYSTEMS_COLLECTION} lists no system; set `system` for this BMC in the config"
        ))),
        [one] => {
            check_path(one)
                .map_err(|why| bad(format!("{SYSTEMS_COLLECTION} member {} {why}", quote(one))))?;
            Ok((*one).to_string())
        }
        many => {
            let shown: Vec<String> = many.iter().take(3).map(|p| quote(p)).collect();
            let more = if many.len() > 3 { ", ..." } else { "" };
            Err(bad(format!(
                "{SYSTEMS_COLLECTION} lists {} systems ({}{more}); set `system` for this BMC \
                 in the config to the one for node {}",
                many.len(),
                shown.join(", "),
                node
            )))
        }
    }
}

/// A system path must be absolute on the BMC itself: no scheme, no other host.
fn check_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') || path.starts_with("//") {
        return Err("is not a path on the BMC (it must start with a single '/')");
    }
    if path.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("contains spaces or control characters");
    }
    Ok(())
}

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

fn bad(detail: String) -> PowerState {
    PowerState::error(ReadErrorKind::BadReply, detail)
}

fn parse_resource(body: &[u8]) -> Result<Resource, PowerState> {
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
/// `asked` (some services write absolute URLs). `@odata.type` must be
/// `#ComputerSystem.v<version>.ComputerSystem` or the unversioned
/// `#ComputerSystem.ComputerSystem`; a `ComputerSystemCollection` or anything else is refused.
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
    if !is_computer_system_type(odata_type) {
        return Err(bad(format!(
            "reply is a {}, not a ComputerSystem (#ComputerSystem.v1_x_y.ComputerSystem); set \
             `system` to a path under /redfish/v1/Systems",
            quote(odata_type)
        )));
    }
    Ok(())
}

/// Whether an `@odata.id` names the path `asked`: equal but for one trailing slash, as a path
/// or as the path of an `http(s)` URL without query or fragment.
fn names_path(odata_id: &str, asked: &str) -> bool {
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

/// `#ComputerSystem.ComputerSystem` or `#ComputerSystem.v1_20_0.ComputerSystem` (any version
/// of digits and underscores after the `v`).
fn is_computer_system_type(odata_type: &str) -> bool {
    let Some(rest) = odata_type.strip_prefix("#ComputerSystem.") else {
        return false;
    };
    let Some(version) = rest.strip_suffix("ComputerSystem") else {
        return false;
    };
    if version.is_empty() {
        return true;
    }
    version
        .strip_prefix('v')
        .and_then(|v| v.strip_suffix('.'))
        .is_some_and(|v| {
            v.split('_')
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// The single string value of a property; the reason, as the end of a sentence starting with
/// "reply", when there is none, several, or not a string.
fn one_string<'a>(values: &'a [serde_json::Value], name: &str) -> Result<&'a str, String> {
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
struct Resource {
    power_states: Vec<serde_json::Value>,
    odata_ids: Vec<serde_json::Value>,
    odata_types: Vec<serde_json::Value>,
    uuids: Vec<serde_json::Value>,
    serials: Vec<serde_json::Value>,
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

/// Maps a transport failure to an error kind, from the reqwest/hyper/rustls error chain.
fn classify(err: reqwest::Error, path: &str) -> PowerState {
    let err = err.without_url();
    let chain = error_chain(&err);
    let mut io_kinds = Vec::new();
    visit_chain(&err, &mut |e| {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            io_kinds.push(io.kind());
        }
    });
    let has = |k: io::ErrorKind| io_kinds.contains(&k);
    let (kind, what) = if err.is_timeout() || has(io::ErrorKind::TimedOut) {
        (ReadErrorKind::Timeout, "timed out")
    } else if err.is_connect() {
        if has(io::ErrorKind::InvalidData) || mentions_tls(&chain) {
            // rustls reports handshake and certificate failures as InvalidData.
            (ReadErrorKind::Tls, "TLS handshake failed")
        } else if has(io::ErrorKind::UnexpectedEof)
            || has(io::ErrorKind::ConnectionReset)
            || has(io::ErrorKind::ConnectionAborted)
        {
            // TCP was up and the peer dropped it before TLS was established.
            (
                ReadErrorKind::Tls,
                "connection closed during the TLS handshake",
            )
        } else {
            (ReadErrorKind::Unreachable, "cannot connect")
        }
    } else if has(io::ErrorKind::InvalidData) && mentions_tls(&chain) {
        (ReadErrorKind::Tls, "TLS failure")
    } else if err.is_body() || err.is_decode() {
        (ReadErrorKind::Protocol, "reply body broken")
    } else {
        (ReadErrorKind::Protocol, "request failed")
    };
    PowerState::error(kind, format!("GET {path}: {what}: {chain}"))
}

fn mentions_tls(chain: &str) -> bool {
    let lower = chain.to_ascii_lowercase();
    ["certificate", "tls", "handshake", "alert"]
        .iter()
        .any(|w| lower.contains(w))
}

/// Calls `f` on an error and everything behind it. `io::Error::source` skips the error an
/// `io::Error` wraps (where rustls puts its own), so that one is visited through `get_ref`.
fn visit_chain<'a>(
    err: &'a (dyn StdError + 'static),
    f: &mut dyn FnMut(&'a (dyn StdError + 'static)),
) {
    let mut cur: Option<&'a (dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        f(e);
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            visit_chain(inner, f);
        }
        cur = e.source();
    }
}

/// `a: b: c` from an error and its sources, without repeats, bounded in length.
fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        let text = e.to_string();
        // Wrapper messages that say nothing an operator can act on.
        let noise = matches!(
            text.as_str(),
            "error sending request" | "client error (Connect)"
        );
        if !noise && !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    truncate(&parts.join(": "), 300)
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// A short, escaped quotation of text that came from the BMC.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    let mut chars = s.chars();
    for c in chars.by_ref().take(QUOTE_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('"');
    if chars.next().is_some() {
        out.push_str("...");
    }
    out
}

fn quote_bytes(body: &[u8]) -> String {
    let head = &body[..body.len().min(QUOTE_CHARS * 4)];
    quote(&String::from_utf8_lossy(head))
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// A ComputerSystem reply counts only when it is the resource that was asked for. Every body
/// below carries a well-formed `PowerState`. Before `@odata.id` and `@odata.type` were checked,
/// a reply for another system, one without `@odata.id` or `@odata.type`, and one whose type
/// merely contained "ComputerSystem" (`#ComputerSystemCollection...`) were read as On or Off.
#[cfg(test)]
mod reply_identity_tests {
    use super::*;

    const ASKED: &str = "/redfish/v1/Systems/1";
    const SYSTEM_TYPE: &str = "#ComputerSystem.v1_20_0.ComputerSystem";

    fn body(id: Option<&str>, odata_type: Option<&str>, power: &str) -> Vec<u8> {
        let mut doc = serde_json::json!({ "PowerState": power, "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32" });
        if let Some(id) = id {
            doc["@odata.id"] = id.into();
        }
        if let Some(t) = odata_type {
            doc["@odata.type"] = t.into();
        }
        doc.to_string().into_bytes()
    }

    /// The reply is refused as a bad reply whose detail says `want`, and carries no identity.
    fn refused(body: &[u8], want: &str) {
        let reply = parse_reply(body, ASKED);
        match &reply.state {
            PowerState::Error {
                kind: ReadErrorKind::BadReply,
                detail,
            } => assert!(detail.contains(want), "{want:?} not in {detail:?}"),
            other => panic!("{} read as {other:?}", String::from_utf8_lossy(body)),
        }
        assert!(
            matches!(reply.identity, MachineIdentity::Unreported { .. }),
            "{:?}",
            reply.identity
        );
    }

    #[test]
    fn the_asked_system_counts() {
        let reply = parse_reply(&body(Some(ASKED), Some(SYSTEM_TYPE), "Off"), ASKED);
        assert_eq!(reply.state, PowerState::Off);
        assert!(matches!(reply.identity, MachineIdentity::SystemUuid { .. }));
        for (id, t) in [
            ("/redfish/v1/Systems/1/", SYSTEM_TYPE),
            ("https://bmc.example/redfish/v1/Systems/1", SYSTEM_TYPE),
            (
                "https://bmc.example:8443/redfish/v1/Systems/1/",
                SYSTEM_TYPE,
            ),
            (ASKED, "#ComputerSystem.ComputerSystem"),
            (ASKED, "#ComputerSystem.v1_0_0.ComputerSystem"),
        ] {
            let state = parse_reply(&body(Some(id), Some(t), "On"), ASKED).state;
            assert_eq!(state, PowerState::On, "{id} {t}");
        }
        // The trailing slash may be on the asked path instead.
        let state = parse_reply(
            &body(Some(ASKED), Some(SYSTEM_TYPE), "On"),
            "/redfish/v1/Systems/1/",
        )
        .state;
        assert_eq!(state, PowerState::On);
    }

    #[test]
    fn another_systems_reply_is_refused() {
        // A BMC that answers for another of its systems (or a proxy that mixes up paths).
        refused(
            &body(Some("/redfish/v1/Systems/2"), Some(SYSTEM_TYPE), "Off"),
            "\"/redfish/v1/Systems/2\" (its @odata.id), not the ComputerSystem at \"/redfish/v1/Systems/1\"",
        );
        for id in [
            "/redfish/v1/Systems/10",
            "/redfish/v1/Systems/1//",
            "/redfish/v1/systems/1",
            "/redfish/v1/Systems",
            "/redfish/v1/Systems/1/Pending",
            "https://bmc.example/redfish/v1/Systems/2",
            "https://bmc.example/redfish/v1/Systems/1?x=1",
            "https://bmc.example/redfish/v1/Systems/1#/PowerState",
            "ftp://bmc.example/redfish/v1/Systems/1",
            "redfish/v1/Systems/1",
            "",
        ] {
            refused(&body(Some(id), Some(SYSTEM_TYPE), "Off"), "its @odata.id");
        }
    }

    #[test]
    fn a_reply_without_odata_id_is_refused() {
        refused(&body(None, Some(SYSTEM_TYPE), "Off"), "has no @odata.id");
        refused(
            br##"{"@odata.id": 1, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "Off"}"##,
            "@odata.id that is not a string",
        );
        refused(
            br##"{"@odata.id": "/redfish/v1/Systems/2", "@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "Off"}"##,
            "@odata.id 2 times",
        );
    }

    #[test]
    fn a_chassis_or_manager_reply_is_refused() {
        // A `system` pointing at the Chassis or Manager: they have a PowerState of their own.
        for t in [
            "#Chassis.v1_0_0.Chassis",
            "#Manager.v1_10_0.Manager",
            "#ComputerSystemCollection.ComputerSystemCollection",
            "#ComputerSystem.v1_20_0.Chassis",
            "#ComputerSystem.1.0.1.ComputerSystem",
            "ComputerSystem.v1_20_0.ComputerSystem",
            "#ComputerSystem.v1_20_0.ComputerSystemX",
            "",
        ] {
            refused(
                &body(Some(ASKED), Some(t), "Off"),
                &format!("reply is a {}, not a ComputerSystem", quote(t)),
            );
        }
    }

    #[test]
    fn a_reply_without_odata_type_is_refused() {
        refused(&body(Some(ASKED), None, "Off"), "has no @odata.type");
        refused(
            br#"{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": null, "PowerState": "On"}"#,
            "@odata.type that is not a string",
        );
    }

    #[test]
    fn identity_comes_from_uuid_and_serial_number() {
        let reply = parse_reply(
            br##"{"@odata.id": "/redfish/v1/Systems/1", "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
                  "PowerState": "On", "UUID": "4C4C4544-0038-4B10-8052-B4C04F4A4E32", "SerialNumber": " CN7\n01 "}"##,
            ASKED,
        );
        assert_eq!(reply.state, PowerState::On);
        assert_eq!(
            reply.identity,
            MachineIdentity::SystemUuid {
                forms: vec!["4c4c4544-0038-4b10-8052-b4c04f4a4e32".into()],
                serial: Some("CN7\\n01".into()),
            }
        );
        let unreported = |extra: &str| {
            let body = format!(
                r##"{{"@odata.id": "{ASKED}", "@odata.type": "{SYSTEM_TYPE}", "PowerState": "Off"{extra}}}"##
            );
            let reply = parse_reply(body.as_bytes(), ASKED);
            assert_eq!(reply.state, PowerState::Off, "{body}");
            match reply.identity {
                MachineIdentity::Unreported { reason } => reason,
                other => panic!("{body}: {other:?}"),
            }
        };
        assert_eq!(unreported(""), "the ComputerSystem has no UUID");
        assert_eq!(
            unreported(r#", "UUID": """#),
            "the ComputerSystem's UUID is empty"
        );
        assert_eq!(
            unreported(r#", "UUID": "not-a-uuid", "SerialNumber": "S1""#),
            "the ComputerSystem's UUID \"not-a-uuid\" is not a UUID"
        );
        assert!(unreported(r#", "UUID": null"#).contains("not a string"));
        assert!(
            unreported(r#", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e33""#)
                .contains("UUID 2 times")
        );
        // No serial, an empty or a null one: the UUID alone.
        for extra in ["", r#", "SerialNumber": "  ""#, r#", "SerialNumber": null"#] {
            let body = format!(
                r##"{{"@odata.id": "{ASKED}", "@odata.type": "{SYSTEM_TYPE}", "PowerState": "Off", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32"{extra}}}"##
            );
            let identity = parse_reply(body.as_bytes(), ASKED).identity;
            assert!(
                matches!(identity, MachineIdentity::SystemUuid { serial: None, .. }),
                "{body}: {identity:?}"
            );
        }
    }

    #[test]
    fn failed_reads_carry_no_identity() {
        // The right system, but a PowerState that is no answer: no identity either.
        let reply = parse_reply(&body(Some(ASKED), Some(SYSTEM_TYPE), "off"), ASKED);
        assert!(matches!(reply.state, PowerState::Error { .. }), "{reply:?}");
        assert!(matches!(reply.identity, MachineIdentity::Unreported { .. }));
    }

    #[test]
    fn the_password_never_shows_in_an_identity() {
        let scrubbed = scrub_identity(
            "very-secret-pw",
            MachineIdentity::SystemUuid {
                forms: vec!["4c4c4544-0038-4b10-8052-b4c04f4a4e32".into()],
                serial: Some("sn-very-secret-pw".into()),
            },
        );
        assert!(
            !format!("{scrubbed} {scrubbed:?}").contains("very-secret-pw"),
            "{scrubbed}"
        );
        let scrubbed = scrub_identity(
            "very-secret-pw",
            MachineIdentity::unreported("UUID \"very-secret-pw\" is not a UUID"),
        );
        assert!(
            !scrubbed.to_string().contains("very-secret-pw"),
            "{scrubbed}"
        );
        assert!(scrubbed.to_string().contains("<redacted>"), "{scrubbed}");
    }
}

#[cfg(test)]
mod tests;

pub mod pinning;
mod witness;
