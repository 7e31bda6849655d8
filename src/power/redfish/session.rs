//! Redfish sessions: for BMCs with HTTP Basic turned off (`auth = "session"`, or `"auto"` once
//! the BMC refused Basic).
//!
//! One session per BMC and entry, shared by every node read through it: a BMC has few session
//! slots (often 4 to 16 for every client together), so a session is never opened per read. It
//! is opened by a `POST` of the user name and password to the Sessions collection the service
//! root names (`Links.Sessions`, never a guessed path), its `X-Auth-Token` goes on every read,
//! and it is deleted (`DELETE` of the session the login named) when it has sat idle, when its
//! BMC's sources are gone (a reload replaced them), and at shutdown. A read the BMC answers 401
//! with a kept session's token logs in once more and tries again, once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use reqwest::header::{HeaderMap, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use tokio::time::Instant;

use super::errors::{quote, quote_bytes, status_text};
use super::{Answer, fetch, url_of};
use crate::config::redfish::RedfishAuth;
use crate::power::{PowerState, ReadErrorKind};
use crate::secret::Secret;

/// The service root, readable without credentials (Redfish specification, "Service root").
const SERVICE_ROOT: &str = "/redfish/v1/";

/// A session unused this long is deleted; the next read logs in again. BMCs forget idle
/// sessions after their own `SessionTimeout` (30 minutes on many); deleting earlier frees
/// the slot for the BMC's other clients.
pub(super) const MAX_IDLE: Duration = Duration::from_secs(5 * 60);

/// A session is not used past this age, however busy: a long-lived token is a long-lived
/// secret, and a fresh login shows the credentials still work.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60 * 60);

/// A DELETE of a session gets this long; the BMC times the session out anyway.
const LOGOUT_WAIT: Duration = Duration::from_secs(3);

/// Numbers each login, so that a 401 retires only the session it was sent with.
static NEXT_LOGIN: AtomicU64 = AtomicU64::new(1);

/// How a read proved who it is, for `why` and `probe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AuthForm {
    Basic,
    Session,
}

/// The login state of one BMC (one service address) for one `[[bmc]]` entry.
pub struct Slot {
    client: reqwest::Client,
    /// The service address with its prefix, ending in `/`.
    base: Url,
    auth: RedfishAuth,
    username: String,
    password: Secret,
    timeout: Duration,
    /// `auth = "auto"` and the BMC refused Basic: sessions from now on.
    basic_refused: AtomicBool,
    /// The switch to sessions was logged.
    switch_logged: AtomicBool,
    /// A session login has worked on this BMC (with `auto`: sessions are really what it takes).
    session_worked: AtomicBool,
    /// The last try found no session service (no `Links.Sessions`, or no service root).
    no_session_service: AtomicBool,
    /// Logged out for good (reload, shutdown): a read still under way may log in, but its
    /// session is deleted as soon as the read is done.
    retired: AtomicBool,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The Sessions collection, found once from the service root.
    sessions_path: Option<String>,
    login: Option<Login>,
    closer_armed: bool,
}

/// An open session.
struct Login {
    number: u64,
    token: Secret,
    /// The session resource to DELETE, when the BMC named one on its own address.
    resource: Option<Url>,
    opened: Instant,
    last_used: Instant,
}

impl Login {
    fn fresh(&self) -> bool {
        self.last_used.elapsed() < MAX_IDLE && self.opened.elapsed() < MAX_AGE
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("base", &self.base.as_str())
            .field("auth", &self.auth)
            .field("basic_refused", &self.basic_refused.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Slot {
    /// The form the next read uses.
    pub(super) fn form(&self) -> AuthForm {
        match self.auth {
            RedfishAuth::Basic => AuthForm::Basic,
            RedfishAuth::Session => AuthForm::Session,
            RedfishAuth::Auto if self.basic_refused.load(Ordering::Relaxed) => AuthForm::Session,
            RedfishAuth::Auto => AuthForm::Basic,
        }
    }

    /// What `why` and `probe` show of the login.
    pub(super) fn describe(&self) -> String {
        match (self.auth, self.form()) {
            (RedfishAuth::Auto, AuthForm::Session) => {
                "Redfish session, auth = auto (the BMC refused HTTP Basic)".into()
            }
            (RedfishAuth::Auto, AuthForm::Basic) => "HTTP Basic, auth = auto".into(),
            (_, AuthForm::Session) => "Redfish session, auth = session".into(),
            (_, AuthForm::Basic) => "HTTP Basic, auth = basic".into(),
        }
    }

    /// After a 401 to Basic: whether to go on with a session. Only `auto` does, and only when
    /// the answer shows that the BMC refuses Basic rather than these credentials, so that a
    /// wrong password is not tried twice per read (BMCs lock accounts after a few failures).
    pub(super) fn switch_after_basic_refused(&self, answer: &Answer) -> bool {
        if self.auth != RedfishAuth::Auto || !refuses_basic(&answer.headers, &answer.body) {
            return false;
        }
        self.basic_refused.store(true, Ordering::Relaxed);
        // Once per slot: a wrong password on such a BMC comes back to Basic every read.
        if !self.switch_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                bmc = %self.base,
                "the BMC refuses HTTP Basic; oobfence logs in with a Redfish session from now on (auth = \"auto\")"
            );
        }
        true
    }

    /// With `auto`, a read that went to a session after Basic's 401 and found no session
    /// service, or had its login refused, before any session login ever worked on this BMC:
    /// the 401 may as well have been a wrong password from a BMC that sends no challenge, so
    /// the error says both, as an Auth error, and the next read tries Basic again. Other
    /// failures (no free session slot, silence) are said as they are.
    pub(super) fn session_failed(&self, state: PowerState) -> PowerState {
        let credentials_or_none = matches!(
            &state,
            PowerState::Error {
                kind: ReadErrorKind::Auth,
                ..
            }
        ) || self.no_session_service.load(Ordering::Relaxed);
        if self.auth != RedfishAuth::Auto
            || self.session_worked.load(Ordering::Relaxed)
            || !credentials_or_none
        {
            return state;
        }
        self.basic_refused.store(false, Ordering::Relaxed);
        match state {
            PowerState::Error { detail, .. } => PowerState::error(
                ReadErrorKind::Auth,
                format!(
                    "HTTP Basic was refused (a 401 without a Basic challenge), and a session \
                     login did not work either: {detail}; check the user and password (auth = \
                     \"auto\")"
                ),
            ),
            other => other,
        }
    }

    /// A session token for the next read, and the number of its login; logs in when there is
    /// no fresh session. Concurrent reads wait for one login.
    pub(super) async fn token(self: &Arc<Self>) -> Result<(Secret, u64), PowerState> {
        let mut state = self.state.lock().await;
        if let Some(login) = state.login.as_mut()
            && login.fresh()
        {
            login.last_used = Instant::now();
            return Ok((login.token.clone(), login.number));
        }
        if let Some(old) = state.login.take() {
            self.spawn_logout(old);
        }
        let sessions = match &state.sessions_path {
            Some(path) => path.clone(),
            None => {
                let found = self.find_sessions().await;
                self.no_session_service
                    .store(found.is_err(), Ordering::Relaxed);
                let path = found?;
                state.sessions_path = Some(path.clone());
                path
            }
        };
        let login = self.log_in(&sessions).await?;
        self.session_worked.store(true, Ordering::Relaxed);
        let token = (login.token.clone(), login.number);
        state.login = Some(login);
        if !state.closer_armed {
            state.closer_armed = true;
            tokio::spawn(close_when_idle(Arc::downgrade(self)));
        }
        Ok(token)
    }

    /// The BMC refused the token of login `number`: forget that session (it is gone on the
    /// BMC's side), so that the next [`Slot::token`] logs in again.
    pub(super) async fn refused(&self, number: u64) {
        let mut state = self.state.lock().await;
        if state.login.as_ref().is_some_and(|l| l.number == number) {
            state.login = None;
        }
    }

    /// After a read: a retired slot's session (a read under way at a reload or shutdown
    /// logged in again) is deleted at once.
    pub(super) async fn read_done(&self) {
        if self.retired.load(Ordering::Relaxed) {
            self.close().await;
        }
    }

    /// Deletes the open session, if any, waiting for the BMC's answer (bounded).
    pub async fn close(&self) {
        let login = self.state.lock().await.login.take();
        if let Some(login) = login {
            self.log_out(login).await;
        }
    }

    /// `Links.Sessions` of the service root.
    async fn find_sessions(&self) -> Result<String, PowerState> {
        let url = url_of(&self.base, SERVICE_ROOT)?;
        let answer = fetch(
            self.client
                .get(url)
                .header(reqwest::header::ACCEPT, "application/json"),
            "GET",
            SERVICE_ROOT,
        )
        .await?;
        if !answer.status.is_success() {
            return Err(PowerState::error(
                ReadErrorKind::Protocol,
                format!(
                    "HTTP {} for GET {SERVICE_ROOT}: the service root must answer without \
                     credentials for a session login to find its Sessions collection",
                    status_text(answer.status)
                ),
            ));
        }
        sessions_link(&answer.body)
    }

    /// `POST {"UserName", "Password"}` to the Sessions collection.
    async fn log_in(&self, sessions: &str) -> Result<Login, PowerState> {
        let url = url_of(&self.base, sessions)?;
        let body = serde_json::json!({
            "UserName": self.username,
            "Password": self.password.expose(),
        });
        let answer = fetch(
            self.client
                .post(url)
                .header(reqwest::header::ACCEPT, "application/json")
                .json(&body),
            "POST",
            sessions,
        )
        .await?;
        let status = answer.status;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PowerState::error(
                ReadErrorKind::Auth,
                format!(
                    "HTTP {} for POST {sessions}: session login of user {} refused",
                    status_text(status),
                    quote(&self.username)
                ),
            ));
        }
        if !status.is_success() {
            let full = status == StatusCode::SERVICE_UNAVAILABLE
                || String::from_utf8_lossy(&answer.body).contains("SessionLimitExceeded");
            let hint = if full {
                " (no free session slot on the BMC? other clients hold them; they free up as \
                 their sessions time out)"
            } else {
                ""
            };
            return Err(PowerState::error(
                ReadErrorKind::Protocol,
                format!(
                    "HTTP {} for POST {sessions}: session login refused{hint}",
                    status_text(status)
                ),
            ));
        }
        let token = answer
            .headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                PowerState::error(
                    ReadErrorKind::BadReply,
                    format!(
                        "the BMC accepted the session login (HTTP {}) but sent no X-Auth-Token \
                         header; set auth = \"basic\" if it takes HTTP Basic",
                        status_text(status)
                    ),
                )
            })?;
        let now = Instant::now();
        Ok(Login {
            number: NEXT_LOGIN.fetch_add(1, Ordering::Relaxed),
            token: Secret::new(token),
            resource: self.session_resource(&answer),
            opened: now,
            last_used: now,
        })
    }

    /// The session the login made, to DELETE at the end: its `Location` (or the body's
    /// `@odata.id`), below this BMC's address and prefix. A path leaving the prefix is not
    /// deleted (the BMC times the session out): a token is never sent elsewhere. An absolute URL
    /// on the address's own origin that lacks the prefix (a BMC unaware of its proxy) is the
    /// BMC's own path, and goes below the prefix.
    fn session_resource(&self, answer: &Answer) -> Option<Url> {
        let location = answer
            .headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| {
                serde_json::from_slice::<serde_json::Value>(&answer.body)
                    .ok()?
                    .get("@odata.id")?
                    .as_str()
                    .map(str::to_string)
            })?;
        let path = if location.starts_with('/') && !location.starts_with("//") {
            location
        } else {
            let url = Url::parse(&location).ok()?;
            let same_origin = url.scheme() == self.base.scheme()
                && url.host_str() == self.base.host_str()
                && url.port_or_known_default() == self.base.port_or_known_default();
            if !same_origin {
                return None;
            }
            let path = url.path();
            match path.strip_prefix(self.base.path()) {
                Some(below) => format!("/{below}"),
                None => path.to_string(),
            }
        };
        match url_of(&self.base, &path) {
            Ok(url) => Some(url),
            Err(e) => {
                tracing::warn!(bmc = %self.base, error = %e, "the BMC named its session off its address's prefix: not deleted, it times out on the BMC");
                None
            }
        }
    }

    async fn log_out(&self, login: Login) {
        let Some(resource) = login.resource else {
            tracing::debug!(bmc = %self.base, "the BMC named no session resource: its session times out on its own");
            return;
        };
        let request = self
            .client
            .delete(resource)
            .header("X-Auth-Token", login.token.expose())
            .timeout(self.timeout.min(LOGOUT_WAIT));
        match request.send().await {
            Ok(r) => {
                tracing::debug!(bmc = %self.base, status = %r.status(), "Redfish session deleted")
            }
            Err(e) => {
                tracing::debug!(bmc = %self.base, error = %e.without_url(), "deleting the Redfish session failed; the BMC times it out")
            }
        }
    }

    /// Deletes `login` in the background, where a runtime runs (a `Drop` may run without one).
    fn spawn_logout(&self, login: Login) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let slot = Slot {
            client: self.client.clone(),
            base: self.base.clone(),
            auth: self.auth,
            username: String::new(),
            password: Secret::new(""),
            timeout: self.timeout,
            basic_refused: AtomicBool::new(false),
            switch_logged: AtomicBool::new(false),
            session_worked: AtomicBool::new(false),
            no_session_service: AtomicBool::new(false),
            retired: AtomicBool::new(true),
            state: Default::default(),
        };
        handle.spawn(async move { slot.log_out(login).await });
    }
}

impl Drop for Slot {
    /// The config that made this slot is gone (a reload replaced it, or the daemon stops) and
    /// no read holds it: its session goes too.
    fn drop(&mut self) {
        if let Some(login) = self.state.get_mut().login.take() {
            self.spawn_logout(login);
        }
    }
}

/// Deletes the slot's session once it has sat idle for [`MAX_IDLE`] or reached [`MAX_AGE`].
/// Holds only a weak reference: when the BMC's sources go, the slot goes with its session.
async fn close_when_idle(slot: Weak<Slot>) {
    let step = MAX_IDLE / 5;
    // Bounded: a session is retired at MAX_AGE anyway, and the next login arms a new closer.
    let passes = (MAX_AGE.as_secs() / step.as_secs().max(1)) as usize + 2;
    for _ in 0..passes {
        tokio::time::sleep(step).await;
        let Some(slot) = slot.upgrade() else { return };
        let mut state = slot.state.lock().await;
        let stale = match &state.login {
            None => true,
            Some(login) => !login.fresh(),
        };
        if stale {
            state.closer_armed = false;
            let login = state.login.take();
            drop(state);
            if let Some(login) = login {
                slot.log_out(login).await;
            }
            return;
        }
    }
    if let Some(slot) = slot.upgrade() {
        let mut state = slot.state.lock().await;
        state.closer_armed = false;
        let login = state.login.take();
        drop(state);
        if let Some(login) = login {
            slot.log_out(login).await;
        }
    }
}

/// Whether a 401 shows the BMC refuses HTTP Basic itself: it offers no `Basic` challenge
/// (RFC 9110: a 401 carries the challenges the server accepts), or its message names sessions
/// (`Base.1.x.NoValidSession`, `X-Auth-Token`).
pub(super) fn refuses_basic(headers: &HeaderMap, body: &[u8]) -> bool {
    let offers_basic = headers.get_all(WWW_AUTHENTICATE).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.to_ascii_lowercase()
                .split(',')
                .any(|c| c.trim_start().starts_with("basic"))
        })
    });
    let text = String::from_utf8_lossy(&body[..body.len().min(64 * 1024)]).to_ascii_lowercase();
    let names_sessions = text.contains("novalidsession") || text.contains("x-auth-token");
    !offers_basic || names_sessions
}

/// `Links.Sessions.@odata.id` of a service root.
fn sessions_link(body: &[u8]) -> Result<String, PowerState> {
    let bad = |detail: String| PowerState::error(ReadErrorKind::BadReply, detail);
    let root: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "the service root {SERVICE_ROOT} is not JSON ({e}); it starts with {}",
            quote_bytes(body)
        ))
    })?;
    let link = root
        .get("Links")
        .and_then(|l| l.get("Sessions"))
        .and_then(|s| s.get("@odata.id"))
        .and_then(|i| i.as_str())
        .ok_or_else(|| {
            PowerState::error(
                ReadErrorKind::Protocol,
                format!(
                    "the service root {SERVICE_ROOT} names no Sessions collection \
                     (Links.Sessions): this BMC offers no Redfish sessions; set auth = \"basic\""
                ),
            )
        })?;
    if !link.starts_with('/') || link.starts_with("//") || link.chars().any(char::is_whitespace) {
        return Err(bad(format!(
            "the service root's Links.Sessions {} is not a path on the BMC",
            quote(link)
        )));
    }
    Ok(link.to_string())
}

/// The login slots of one `[[bmc]]` entry, by BMC address: every node read through the same
/// BMC shares its slot, for as long as the config that made them is in force. A source is
/// made afresh for each read of a healthy node, so the slot (and its session) must outlive
/// them: it goes when its idle time runs out, when [`Slots::close_all`] is called, and when the
/// entry's sources are replaced (a reload) or the daemon stops.
#[derive(Default)]
pub struct Slots {
    by_base: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Slots {
    /// The slot for the BMC at `base` (its address with prefix, ending in `/`).
    pub(super) fn slot_for(
        &self,
        base: &Url,
        entry: &crate::config::BmcEntry,
        client: &reqwest::Client,
    ) -> Arc<Slot> {
        let mut by_base = self.by_base.lock().unwrap_or_else(|e| e.into_inner());
        by_base
            .entry(base.as_str().to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    client: client.clone(),
                    base: base.clone(),
                    auth: entry.redfish.unwrap_or_default().auth,
                    username: entry.username.clone(),
                    password: entry.password.clone(),
                    timeout: entry.timeout,
                    basic_refused: AtomicBool::new(false),
                    switch_logged: AtomicBool::new(false),
                    session_worked: AtomicBool::new(false),
                    no_session_service: AtomicBool::new(false),
                    retired: AtomicBool::new(false),
                    state: Default::default(),
                })
            })
            .clone()
    }

    /// Deletes every open session of this entry for good (reload, shutdown), at most
    /// [`LOGOUT_WAIT`] each, all at once.
    pub async fn close_all(&self) {
        let slots: Vec<Arc<Slot>> = {
            let by_base = self.by_base.lock().unwrap_or_else(|e| e.into_inner());
            by_base.values().cloned().collect()
        };
        for slot in &slots {
            slot.retired.store(true, Ordering::Relaxed);
        }
        futures::future::join_all(slots.iter().map(|s| s.close())).await;
    }
}

#[cfg(test)]
mod tests;
