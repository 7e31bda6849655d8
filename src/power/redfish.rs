//! Redfish power source: `GET` the ComputerSystem resource and read its `PowerState`.
//!
//! Only the exact string `"Off"` in a well-formed JSON object from a 2xx answer means off.
//! Everything else — other spellings, a missing or duplicated property, an HTML error page, a
//! redirect, a TLS or credential problem, silence — is reported as an error of the matching
//! [`ReadErrorKind`], with a short detail for the operator that never carries the password.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::{StatusCode, Url};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{PowerSource, PowerState, ReadErrorKind};
use crate::config::{BmcEntry, BmcTls};
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
    /// Builds the source for `node` from its `[[bmc]]` entry: one HTTP client with that entry's
    /// TLS settings and timeout. Fails on settings that cannot work (bad URL, unreadable CA).
    pub fn new(entry: &BmcEntry, node: &str) -> Result<RedfishSource, String> {
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
            BmcTls::Verify { ca_file: Some(ca) } => {
                let pem = std::fs::read(ca)
                    .map_err(|e| format!("cannot read ca_file {}: {e}", ca.display()))?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    format!(
                        "ca_file {} is not a PEM certificate bundle: {e}",
                        ca.display()
                    )
                })?;
                if certs.is_empty() {
                    return Err(format!("ca_file {} holds no certificate", ca.display()));
                }
                builder = builder.tls_certs_merge(certs);
            }
            BmcTls::Verify { ca_file: None } => {}
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot build the HTTPS client: {}", error_chain(&e)))?;

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
        })
    }

    async fn read_within_deadline(&self) -> PowerState {
        let state = match tokio::time::timeout(self.timeout, self.read_once()).await {
            Ok(state) => state,
            Err(_) => PowerState::error(
                ReadErrorKind::Timeout,
                format!(
                    "no complete answer within {}",
                    humantime::format_duration(self.timeout)
                ),
            ),
        };
        self.scrub(state)
    }

    async fn read_once(&self) -> PowerState {
        let (path, found) = match (&self.system, self.discovered.get()) {
            (Some(path), _) => (path.clone(), false),
            (None, Some(path)) => (path.clone(), false),
            (None, None) => match self.discover().await {
                Ok(path) => (path, true),
                Err(state) => return state,
            },
        };
        let state = match self.get(&path).await {
            Ok(body) => parse_power_state(&body),
            Err(state) => state,
        };
        if found && !matches!(state, PowerState::Error { .. }) {
            // A concurrent read may have set it first; both found the same single member.
            let _ = self.discovered.set(path);
        }
        state
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

    /// Last line of defence: no detail string leaves this source with the password in it.
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
        Box::pin(self.read_within_deadline())
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

/// Maps a Redfish resource body to a power state.
///
/// Only a JSON object whose single `PowerState` property is exactly `"Off"` maps to
/// [`PowerState::Off`]. `"On"` maps to On; `"PoweringOn"`, `"PoweringOff"` and `"Paused"` are
/// transitional; anything else is a [`ReadErrorKind::BadReply`] error naming what was found.
pub fn parse_power_state(body: &[u8]) -> PowerState {
    let bad = |detail: String| PowerState::error(ReadErrorKind::BadReply, detail);
    if body.iter().all(u8::is_ascii_whitespace) {
        return bad("empty reply".to_string());
    }
    let resource: Resource = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) if e.is_data() => {
            return bad(format!("reply is not a Redfish resource object ({e})"));
        }
        Err(e) => {
            return bad(format!(
                "reply is not JSON ({e}); it starts with {}",
                quote_bytes(body)
            ));
        }
    };
    let value = match resource.power_states.as_slice() {
        [] => {
            let what = match &resource.odata_type {
                Some(t) => format!(" (its @odata.type is {})", quote(t)),
                None => String::new(),
            };
            return bad(format!(
                "reply has no PowerState{what}; is `system` the path of a ComputerSystem?"
            ));
        }
        // A Chassis or Manager also has a PowerState; only the ComputerSystem's is the answer.
        [_] if resource
            .odata_type
            .as_deref()
            .is_some_and(|t| !t.contains("ComputerSystem")) =>
        {
            return bad(format!(
                "reply is a {}, not a ComputerSystem; set `system` to a path under /redfish/v1/Systems",
                quote(resource.odata_type.as_deref().unwrap_or_default())
            ));
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
            "PoweringOn" | "PoweringOff" | "Paused" => {
                PowerState::Transitional { detail: s.clone() }
            }
            other => bad(format!("unknown PowerState {}", quote(other))),
        },
        serde_json::Value::Null => bad("PowerState is null".to_string()),
        other => {
            let json = other.to_string();
            bad(format!("PowerState is not a string: {}", quote(&json)))
        }
    }
}

/// The parts of a Redfish resource that matter here. Every occurrence of `PowerState` is kept
/// (a plain map would silently keep only the last of duplicated keys); the rest is skipped.
struct Resource {
    power_states: Vec<serde_json::Value>,
    odata_type: Option<String>,
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
        let mut resource = Resource {
            power_states: Vec::new(),
            odata_type: None,
        };
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "PowerState" => resource.power_states.push(map.next_value()?),
                "@odata.type" => {
                    let value: serde_json::Value = map.next_value()?;
                    if let serde_json::Value::String(s) = value {
                        resource.odata_type = Some(s);
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(resource)
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

#[cfg(test)]
mod odata_type_tests {
    use super::*;

    #[test]
    fn only_a_computer_system_power_state_counts() {
        let manager = br##"{"@odata.type": "#Manager.v1_10_0.Manager", "PowerState": "Off"}"##;
        assert!(matches!(
            parse_power_state(manager),
            PowerState::Error {
                kind: ReadErrorKind::BadReply,
                ..
            }
        ));
        let system =
            br##"{"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "Off"}"##;
        assert_eq!(parse_power_state(system), PowerState::Off);
        assert_eq!(
            parse_power_state(br#"{"PowerState": "Off"}"#),
            PowerState::Off
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn kind(state: &PowerState) -> Option<ReadErrorKind> {
        match state {
            PowerState::Error { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    fn detail(state: &PowerState) -> &str {
        match state {
            PowerState::Error { detail, .. } | PowerState::Transitional { detail } => detail,
            _ => "",
        }
    }

    #[test]
    fn exact_values_map_to_states() {
        assert_eq!(
            parse_power_state(br#"{"PowerState":"Off"}"#),
            PowerState::Off
        );
        assert_eq!(parse_power_state(br#"{"PowerState":"On"}"#), PowerState::On);
        for t in ["PoweringOn", "PoweringOff", "Paused"] {
            let body = format!(r#"{{"Id":"1","PowerState":"{t}","Status":{{"State":"Enabled"}}}}"#);
            assert_eq!(
                parse_power_state(body.as_bytes()),
                PowerState::Transitional {
                    detail: t.to_string()
                }
            );
        }
    }

    #[test]
    fn near_misses_of_off_are_errors() {
        for v in [
            "off",
            "OFF",
            " Off",
            "Off ",
            "Off\u{0}",
            "Of",
            "PoweredOff",
            "Shutdown",
            "",
            "Unknown",
        ] {
            let body = serde_json::json!({ "PowerState": v }).to_string();
            let s = parse_power_state(body.as_bytes());
            assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{v:?}: {s:?}");
            assert!(detail(&s).contains("unknown PowerState"), "{s:?}");
        }
    }

    #[test]
    fn missing_null_and_odd_types_are_errors() {
        let cases: [(&[u8], &str); 10] = [
            (b"{}", "no PowerState"),
            (
                br##"{"@odata.type":"#ComputerSystemCollection.ComputerSystemCollection"}"##,
                "ComputerSystemCollection",
            ),
            (br#"{"PowerState":null}"#, "null"),
            (br#"{"PowerState":0}"#, "not a string: \"0\""),
            (br#"{"PowerState":false}"#, "not a string"),
            (br#"{"PowerState":["Off"]}"#, "not a string"),
            (br#"{"PowerState":{"State":"Off"}}"#, "not a string"),
            (br#"{"Status":{"PowerState":"Off"}}"#, "no PowerState"),
            (br#"{"powerstate":"Off"}"#, "no PowerState"),
            (br#"{"PowerState":"On","PowerState":"Off"}"#, "2 times"),
        ];
        for (body, want) in cases {
            let s = parse_power_state(body);
            assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{s:?}");
            assert!(detail(&s).contains(want), "{want:?} not in {s:?}");
        }
    }

    #[test]
    fn non_json_and_non_objects_are_errors() {
        let cases: [&[u8]; 9] = [
            b"",
            b"   \n",
            b"<html><body>Login</body></html>",
            b"Off",
            b"\"Off\"",
            br#"[{"PowerState":"Off"}]"#,
            br#"{"PowerState":"Off""#,
            br#"{"PowerState":"Off"} trailing"#,
            b"\xff\xfe\x00garbage",
        ];
        for body in cases {
            let s = parse_power_state(body);
            assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{body:?}: {s:?}");
        }
    }

    #[test]
    fn details_quote_briefly_and_escape() {
        let long = "x".repeat(10_000);
        let body = format!(r#"{{"PowerState":"{long}"}}"#);
        let s = parse_power_state(body.as_bytes());
        assert!(detail(&s).len() < 200, "{s:?}");

        let body = "<html>\n\u{1b}[31m".to_string() + &"y".repeat(5000);
        let s = parse_power_state(body.as_bytes());
        let d = detail(&s);
        assert!(d.len() < 400, "{d}");
        assert!(!d.contains('\n') && !d.contains('\u{1b}'), "{d}");
        assert!(d.contains("<html>\\n"), "{d}");
    }

    #[test]
    fn escaped_key_still_counts_as_power_state() {
        // JSON escapes in keys are the same key; a duplicate hidden this way is still caught.
        let s = parse_power_state(br#"{"PowerState":"On","Power\u0053tate":"Off"}"#);
        assert_eq!(kind(&s), Some(ReadErrorKind::BadReply), "{s:?}");
    }

    #[test]
    fn discovery_takes_only_a_single_listed_system() {
        let one = br#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}],"Members@odata.count":1}"#;
        assert_eq!(single_system(one, "n1").unwrap(), "/redfish/v1/Systems/1");
        let cases: [(&[u8], &str); 8] = [
            (br#"{"Members":[]}"#, "lists no system"),
            (
                br#"{"Members":[{"@odata.id":"/a"},{"@odata.id":"/b"}]}"#,
                "lists 2 systems",
            ),
            (
                br#"{"Members":[{"@odata.id":"/a"}],"Members@odata.count":2}"#,
                "count disagrees",
            ),
            (
                br#"{"Members":[{"@odata.id":"/a"}],"Members@odata.nextLink":"/p2"}"#,
                "paged",
            ),
            (
                br#"{"Members":[{"@odata.id":"https://other.example/x"}]}"#,
                "not a path",
            ),
            (br#"{"Members":[{"@odata.id":7}]}"#, "without a string"),
            (br#"{"Systems":[]}"#, "no Members"),
            (b"<html>", "not JSON"),
        ];
        for (body, want) in cases {
            let state = single_system(body, "n1").unwrap_err();
            assert_eq!(kind(&state), Some(ReadErrorKind::BadReply), "{state:?}");
            assert!(detail(&state).contains(want), "{want:?} not in {state:?}");
        }
    }

    fn entry(dir: &Path, address: &str, extra: &str) -> BmcEntry {
        let pw = dir.join("pw");
        std::fs::write(&pw, "very-secret-pw\n").unwrap();
        let text = format!(
            "datacenter = \"t\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"redfish\"\n\
             address = \"{address}\"\nusername = \"admin\"\npassword_file = \"{}\"\n{extra}\n",
            pw.display()
        );
        let cfg = Config::parse(&text, Path::new("t.toml")).unwrap();
        cfg.bmc[0].clone()
    }

    #[test]
    fn debug_and_address_hide_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let e = entry(
            dir.path(),
            "https://{node}-bmc.example:8443",
            "system = \"/redfish/v1/Systems/{node}\"",
        );
        let src = RedfishSource::new(&e, "n1").unwrap();
        let dbg = format!("{src:?}");
        assert!(!dbg.contains("very-secret-pw"), "{dbg}");
        assert!(dbg.contains("<redacted>"), "{dbg}");
        assert!(dbg.contains("/redfish/v1/Systems/n1"), "{dbg}");
        assert_eq!(src.address(), "https://n1-bmc.example:8443");
        assert_eq!(src.backend(), "redfish");
    }

    #[test]
    fn credentials_in_the_address_are_refused_without_echo() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = entry(dir.path(), "https://bmc.example", "");
        e.address = "https://admin:url-secret@bmc.example".to_string();
        let err = RedfishSource::new(&e, "n1").unwrap_err();
        assert!(!err.contains("url-secret"), "{err}");
        assert!(err.contains("credentials"), "{err}");
    }

    #[test]
    fn bad_system_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = entry(dir.path(), "https://bmc.example", "");
        for bad in ["//evil.example/x", "/a b"] {
            e.system = Some(bad.to_string());
            assert!(RedfishSource::new(&e, "n1").is_err(), "{bad}");
        }
    }

    #[test]
    fn scrub_redacts_the_password_anywhere() {
        let dir = tempfile::tempdir().unwrap();
        let e = entry(dir.path(), "https://bmc.example", "");
        let src = RedfishSource::new(&e, "n1").unwrap();
        let s = src.scrub(PowerState::error(
            ReadErrorKind::Protocol,
            "Location: https://admin:very-secret-pw@x/",
        ));
        assert!(!s.to_string().contains("very-secret-pw"), "{s}");
        assert!(s.to_string().contains("<redacted>"), "{s}");
    }

    #[test]
    fn quote_truncates_on_char_boundaries() {
        let q = quote(&"é".repeat(100));
        assert!(q.ends_with("\"..."), "{q}");
        assert_eq!(q.chars().filter(|&c| c == 'é').count(), QUOTE_CHARS);
        assert_eq!(truncate("abc", 2), "ab...");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
