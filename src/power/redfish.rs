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
//! This file holds the source itself: the client, the request under its deadline, finding
//! the system, and keeping the password out of what is reported. `reply` is the strict
//! reading of the ComputerSystem's answer; `errors` names what went wrong on the way and
//! quotes the BMC's text safely; `session` logs in where a BMC refuses HTTP Basic.
//!
//! The address may carry a path (`https://proxy/bmc1/`): a prefix put before every path
//! oobfence asks for, as some BMC proxies need. The BMC's answers name their resources as the
//! BMC knows them (`/redfish/v1/...`), and are checked against those names.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::{StatusCode, Url};

use super::{PowerDraw, PowerSource, PowerState, ReadErrorKind, Reply};
use crate::config::{BmcEntry, BmcTls};
use crate::identity::MachineIdentity;
use crate::secret::Secret;

pub mod actions;
mod errors;
mod http;
mod outlet;
pub use crate::pinning;
mod reply;
#[cfg(test)]
mod reply_identity_tests;
pub mod session;
#[cfg(test)]
mod tests;
pub mod tls_version;
mod witness;

use errors::{quote, quote_bytes, status_text};
use http::{Answer, fetch, url_of};
pub use http::{EntryShared, client_for};
pub use outlet::parse_outlet;
pub use reply::parse_reply;

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
    /// The BMC's address (`https://host:port/`, with a proxy's prefix if the entry gives one),
    /// ending in `/`, credentials-free.
    base: Url,
    /// How reads log in, shared with every source of the same BMC and entry.
    login: Arc<session::Slot>,
    node: String,
    /// Configured system path, `{node}` filled in.
    system: Option<String>,
    /// Configured PDU outlet path (`outlet`), `{node}` filled in: read instead of a system.
    outlet: Option<String>,
    /// The most that outlet may draw while it reads Off.
    outlet_max_off: super::Watts,
    /// System path found under `/redfish/v1/Systems`, kept once a read through it succeeded.
    discovered: OnceLock<String>,
    username: String,
    password: Secret,
    /// How the entry's client checks the BMC's certificate (its certificates stay with the
    /// entry and its one client: not copied into each of thousands of nodes' sources).
    tls: &'static str,
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
            .field("outlet", &self.outlet)
            .field("discovered", &self.discovered.get())
            .field("username", &self.username)
            .field("password", &self.password)
            .field("login", &self.login)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedfishSource {
    /// Builds the source for `node` from its `[[bmc]]` entry, with an HTTP client of its own.
    /// Fails on settings that cannot work (bad URL, unreadable CA).
    pub fn new(entry: &BmcEntry, node: &str) -> Result<RedfishSource, String> {
        let shared = EntryShared {
            client: client_for(entry)?,
            logins: Default::default(),
        };
        RedfishSource::with_shared(entry, node, &shared)
    }

    /// Builds the source for `node` on what the entry's sources share: one client, one TLS
    /// root store and one connection pool per entry however many nodes it maps, and one login
    /// per BMC.
    pub fn with_shared(
        entry: &BmcEntry,
        node: &str,
        shared: &EntryShared,
    ) -> Result<RedfishSource, String> {
        let address = entry.address_for(node);
        let mut base = Url::parse(&address)
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

        crate::config::redfish::check_address_path(base.path())
            .map_err(|e| format!("BMC address {address:?} {e}"))?;
        if !base.path().ends_with('/') {
            // Paths are joined below the prefix, not beside its last segment.
            let prefixed = format!("{}/", base.path());
            base.set_path(&prefixed);
        }

        let system = entry.system_for(node);
        let outlet = entry.outlet_for(node);
        for (key, path) in [("system", &system), ("outlet", &outlet)] {
            let Some(path) = path else { continue };
            check_path(path).map_err(|why| format!("{key} {path:?} {why}"))?;
            if http::climbs(path) {
                return Err(format!(
                    "{key} {path:?} has a '..' segment (spelled out or percent-encoded): it must name a path below the address {address:?}"
                ));
            }
        }
        Ok(RedfishSource {
            client: shared.client.clone(),
            login: shared.logins.slot_for(&base, entry, &shared.client),
            base,
            node: node.to_string(),
            system,
            outlet,
            outlet_max_off: entry.outlet_max_off_watts(),
            discovered: OnceLock::new(),
            username: entry.username.clone(),
            password: entry.password.clone(),
            tls: match entry.tls {
                BmcTls::System => "system roots",
                BmcTls::Pinned { .. } => "pinned (ca_file, tls_fingerprint)",
                BmcTls::Insecure => "insecure",
            },
            timeout: entry.timeout,
            power_draw: entry.corroborate.is_some(),
        })
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
        let mut reply = self.scrub_reply(reply);
        reply
            .details
            .push(super::ReadDetail::new("session", self.login.describe()));
        reply
    }

    async fn read_once(&self, witness_by: tokio::time::Instant) -> Reply {
        if let Some(outlet) = &self.outlet {
            return self.read_outlet(outlet).await;
        }
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
        self.send(reqwest::Method::GET, path, None).await
    }

    /// One authenticated request (HTTP Basic or a session, as the entry's `auth` and the BMC
    /// say), with `json` as its body; `Ok` only for a 2xx answer whose body arrived in full.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<Vec<u8>, PowerState> {
        let url = url_of(&self.base, path)?;
        let verb = method.as_str().to_string();
        let request = || {
            let r = self
                .client
                .request(method.clone(), url.clone())
                .header(reqwest::header::ACCEPT, "application/json");
            match json {
                Some(body) => r.json(body),
                None => r,
            }
        };
        if self.login.form() == session::AuthForm::Basic {
            let answer = fetch(
                request().basic_auth(&self.username, Some(self.password.expose())),
                &verb,
                path,
            )
            .await?;
            if answer.status != StatusCode::UNAUTHORIZED
                || !self.login.switch_after_basic_refused(&answer)
            {
                return self.accept(answer, &verb, path, session::AuthForm::Basic);
            }
        }
        // A session: a kept one, or a new login; once more after a 401 (the BMC may have
        // timed the kept one out).
        let answer = async {
            let (token, login) = self.login.token().await?;
            let answer = fetch(
                request().header("X-Auth-Token", token.expose()),
                &verb,
                path,
            )
            .await?;
            if answer.status != StatusCode::UNAUTHORIZED {
                return Ok(answer);
            }
            self.login.refused(login).await;
            let (token, _) = self.login.token().await?;
            fetch(
                request().header("X-Auth-Token", token.expose()),
                &verb,
                path,
            )
            .await
        }
        .await;
        self.login.read_done().await;
        answer
            .and_then(|answer| self.accept(answer, &verb, path, session::AuthForm::Session))
            .map_err(|state| self.login.session_failed(state))
    }

    /// The body of a 2xx answer; an error naming the status otherwise.
    fn accept(
        &self,
        answer: Answer,
        method: &str,
        path: &str,
        form: session::AuthForm,
    ) -> Result<Vec<u8>, PowerState> {
        let status = answer.status;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let how = match form {
                session::AuthForm::Basic => {
                    let hint = if session::refuses_basic(&answer.headers, &answer.body) {
                        "; the BMC seems to refuse HTTP Basic: set auth = \"session\" (or \"auto\")"
                    } else {
                        ""
                    };
                    format!(
                        "credentials of user {} refused (HTTP Basic){hint}",
                        quote(&self.username)
                    )
                }
                session::AuthForm::Session => format!(
                    "the session of user {} was refused right after its login",
                    quote(&self.username)
                ),
            };
            return Err(PowerState::error(
                ReadErrorKind::Auth,
                format!("HTTP {} for {method} {path}: {how}", status_text(status)),
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
                format!("HTTP {} for {method} {path}{hint}", status_text(status)),
            ));
        }
        Ok(answer.body)
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

    fn act<'a>(
        &'a self,
        action: super::PowerAction,
        check: super::ActionCheck<'a>,
    ) -> BoxFuture<'a, super::ActionOutcome> {
        Box::pin(async move {
            // The read, an ActionInfo and the command: three requests, each under the entry's
            // timeout, the whole under three of them (the caller's check with them: one that
            // takes longer sends nothing).
            let limit = self.timeout * 3;
            let outcome = tokio::time::timeout(limit, self.act_once(action, check))
                .await
                .unwrap_or_else(|_| super::ActionOutcome::Failed {
                    error: PowerState::error(
                        ReadErrorKind::Timeout,
                        format!(
                            "no complete answer within {}",
                            humantime::format_duration(limit)
                        ),
                    ),
                });
            self.login.read_done().await;
            outcome
        })
    }

    fn action_support(&self) -> BoxFuture<'_, super::ActionSupport> {
        Box::pin(self.support())
    }

    fn transport(&self) -> BoxFuture<'_, Option<String>> {
        Box::pin(async move {
            Some(
                tls_version::negotiated(&self.base, self.timeout)
                    .await
                    .unwrap_or_else(|e| format!("TLS unknown: {e}")),
            )
        })
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
