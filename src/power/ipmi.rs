//! IPMI over LAN (RMCP+, "lanplus") power source: Get Chassis Status, byte 1 bit 0.
//!
//! 1 is On, 0 is Off; an Off read with power fault bits set is still Off. The fault bits
//! (byte 1 bits 1-4) and the last power event (byte 2) go into the read's details. Every failure
//! — silence, refused credentials or cipher suite, a failed integrity check, a replayed or stray
//! answer, a short reply — is an error read, never Off.
//!
//! After the chassis status, in the same session, Get System GUID asks the machine what it is
//! (see [`crate::identity`]). That question comes second and can only cost the identity: a BMC
//! that refuses it, answers it oddly or not at all still has its power state read. An off
//! chassis is then asked Get ACPI Power State (a sleeping or hibernated machine is Suspended) and,
//! where the entry wants a second witness, DCMI Get Power Reading ([`off_checks`]).
//!
//! The RMCP+ session is oobfence's own ([`session`], on [`rakp`]'s RustCrypto primitives):
//! cipher suite 17 or 3 (or 17 then 3, when the entry asks for it), logged in as User, Operator
//! or Administrator, all async on tokio's `UdpSocket`. At most one session per BMC exists at a
//! time (BMCs have only a handful of slots); it is reused while fresh and closed with Close
//! Session when it is retired, idle, failed, or its last source goes away.
//!
//! Longer than 600 lines: session keeping (one per BMC, reused, retired, closed) and the
//! translation of every failure into a named error are what make IPMI safe to read from.

pub mod commands;
mod off_checks;
pub mod rakp;
pub mod session;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use self::commands::{ChassisStatus, GuidReply};
use self::rakp::{Key, Suite};
use self::session::{Session, Timing, Trouble};
use super::{PowerSource, PowerState, ReadDetail, ReadErrorKind, Reply};
use crate::config::BmcEntry;
use crate::identity::{MachineIdentity, uuid_forms_of_ipmi_guid};
use crate::secret::Secret;

/// A kept session is used again only if it was idle less than this. The IPMI default session
/// inactivity timeout is 60 s; a BMC that forgets sooner is noticed and remembered (see
/// `Slot::max_idle`).
const MAX_IDLE: Duration = Duration::from_secs(45);

/// A kept session that failed after less idle time than this says nothing about the BMC's
/// inactivity timeout (a BMC reset, a lost datagram), and never lowers `Slot::max_idle` below it.
const MIN_IDLE_EVIDENCE: Duration = Duration::from_secs(5);

/// A kept session is retired after this long or this many reads, whichever comes first.
const MAX_AGE: Duration = Duration::from_secs(600);
const MAX_READS: u32 = 10_000;

/// How often an exchange is sent again without an answer, at most (then it waits out the
/// deadline).
const RESENDS: u32 = 2;

// The rules of an IPMI `[[bmc]]` entry belong to the config, which checks them at load; the
// source checks the same ones again when it is built.
pub use crate::config::ipmi::{
    CipherSuites, DEFAULT_CIPHER_SUITE, DEFAULT_PORT, IpmiOptions, Privilege, check_password,
    check_privilege, check_username, parse_address,
};

/// Reads one machine's power state through its BMC over RMCP+.
pub struct IpmiSource {
    shared: Arc<Shared>,
}

struct Shared {
    /// Tells this source's sessions from those of another source for the same BMC.
    id: u64,
    node: String,
    host: String,
    port: u16,
    username: String,
    password: Secret,
    suites: Vec<Suite>,
    /// The configured suites as the config wrote them ("17, then 3").
    suites_text: String,
    privilege: Privilege,
    timeout: Duration,
    /// The entry asks for the power draw beside an Off (`corroborate = "power-draw"`).
    power_draw: bool,
    slot: Arc<tokio::sync::Mutex<Slot>>,
}

impl fmt::Debug for IpmiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("IpmiSource")
            .field("address", &self.address())
            .field("node", &s.node)
            .field("username", &s.username)
            .field("password", &s.password)
            .field("cipher_suite", &s.suites_text)
            .field("privilege", &s.privilege.as_str())
            .field("timeout", &s.timeout)
            .finish()
    }
}

fn suite_of(id: u8) -> Result<Suite, String> {
    match id {
        17 => Ok(Suite::Seventeen),
        3 => Ok(Suite::Three),
        other => Err(format!(
            "cipher suite {other} is not spoken by oobfence: use 17 or 3"
        )),
    }
}

impl IpmiSource {
    /// Builds the source for `node` from its `[[bmc]]` entry. Fails on settings this build
    /// cannot honour; opens nothing yet.
    pub fn new(entry: &BmcEntry, node: &str) -> Result<IpmiSource, String> {
        let options = entry.ipmi.unwrap_or_default();
        let suites = options
            .cipher_suites
            .in_order()
            .map(suite_of)
            .collect::<Result<Vec<_>, _>>()?;
        check_privilege(options.privilege.as_str())?;
        let address = entry.address_for(node);
        let (host, port) = parse_address(&address).map_err(|e| format!("address {e}"))?;
        check_username(&entry.username).map_err(|e| format!("username {e}"))?;
        check_password(&entry.password)?;
        let key = format!("{}:{port}", host.to_ascii_lowercase());
        Ok(IpmiSource {
            shared: Arc::new(Shared {
                id: NEXT_SOURCE_ID.fetch_add(1, Ordering::Relaxed),
                node: node.to_string(),
                host,
                port,
                username: entry.username.clone(),
                password: entry.password.clone(),
                suites,
                suites_text: options.cipher_suites.to_string(),
                privilege: options.privilege,
                timeout: entry.timeout,
                power_draw: entry.corroborate.is_some(),
                slot: slot_for(&key),
            }),
        })
    }
}

impl PowerSource for IpmiSource {
    fn backend(&self) -> &'static str {
        "ipmi"
    }

    fn address(&self) -> String {
        let s = &self.shared;
        if s.host.contains(':') {
            format!("[{}]:{}", s.host, s.port)
        } else {
            format!("{}:{}", s.host, s.port)
        }
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { self.read_reply().await.state })
    }

    /// The chassis status and the System GUID, both from one exchange in one session.
    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        let shared = self.shared.clone();
        Box::pin(async move {
            // Detached: if the caller gives up, the read still ends by its own deadline and
            // leaves the session slot in order.
            let task = tokio::spawn(read_task(shared.clone()));
            let reply = match task.await {
                Ok(done) => done,
                Err(e) => failed(Trouble::new(
                    ReadErrorKind::BadReply,
                    format!("the IPMI read failed internally: {e}"),
                )),
            };
            scrub_reply(&shared.password, reply)
        })
    }
}

// --- one session per BMC ----------------------------------------------------------------------

static NEXT_SOURCE_ID: AtomicU64 = AtomicU64::new(1);

/// Session slots by BMC (`host:port`), shared by every source that reads that BMC, so that one
/// process never holds more than one session on it.
static SLOTS: LazyLock<Mutex<HashMap<String, Weak<tokio::sync::Mutex<Slot>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn slot_for(key: &str) -> Arc<tokio::sync::Mutex<Slot>> {
    let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(slot) = slots.get(key).and_then(Weak::upgrade) {
        return slot;
    }
    slots.retain(|_, w| w.strong_count() > 0);
    let slot = Arc::new(tokio::sync::Mutex::new(Slot {
        session: None,
        closer_armed: false,
        max_idle: MAX_IDLE,
    }));
    slots.insert(key.to_string(), Arc::downgrade(&slot));
    slot
}

/// The one session a process may hold on a BMC, when it holds one.
struct Slot {
    session: Option<Kept>,
    /// A task is waiting to close the session once it has been idle for `max_idle`.
    closer_armed: bool,
    /// How long a session may sit idle and still be used again. Lowered when the BMC turns out
    /// to forget idle sessions sooner.
    max_idle: Duration,
}

/// A session kept for the next read, closed (Close Session, in the background) when dropped.
struct Kept {
    owner: u64,
    session: Option<Session>,
    opened: Instant,
    last_used: Instant,
    reads: u32,
}

impl Kept {
    fn reusable(&self, owner: u64, max_idle: Duration) -> bool {
        self.owner == owner
            && self.session.is_some()
            && self.last_used.elapsed() < max_idle
            && self.opened.elapsed() < MAX_AGE
            && self.reads < MAX_READS
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // At once and without waiting: this may run as the process ends.
        session.close_now();
    }
}

/// Closes the slot's session once it has sat idle for the slot's `max_idle`. Holds only a weak
/// reference: when the last source of the BMC goes, the slot and its session go at once.
async fn close_when_idle(slot: Weak<tokio::sync::Mutex<Slot>>) {
    let step = MAX_IDLE / 3;
    // Bounded: a session is retired after MAX_AGE anyway.
    let passes = (MAX_AGE.as_secs() / step.as_secs().max(1)) as usize + 2;
    for _ in 0..passes {
        tokio::time::sleep(step).await;
        let Some(slot) = slot.upgrade() else { return };
        let mut g = slot.lock().await;
        let max_idle = g.max_idle;
        let finished = match &g.session {
            None => true,
            Some(s) => s.last_used.elapsed() >= max_idle || s.opened.elapsed() >= MAX_AGE,
        };
        if finished {
            g.closer_armed = false;
            let session = g.session.take();
            drop(g);
            drop(session);
            return;
        }
    }
    if let Some(slot) = slot.upgrade() {
        let mut g = slot.lock().await;
        g.closer_armed = false;
        g.session.take();
    }
}

fn arm_closer(slot_arc: &Arc<tokio::sync::Mutex<Slot>>, slot: &mut Slot) {
    if !slot.closer_armed && slot.session.is_some() {
        slot.closer_armed = true;
        tokio::spawn(close_when_idle(Arc::downgrade(slot_arc)));
    }
}

// --- one read -----------------------------------------------------------------------------------

/// What one exchange with the BMC learnt: the chassis status, what the machine says it is, and
/// how the session ran ("cipher suite 17, User").
struct Answer {
    status: ChassisStatus,
    identity: MachineIdentity,
    session: String,
    /// When the chassis reads off: its ACPI state and power draw.
    off: Option<off_checks::OffChecks>,
}

/// How often an unanswered datagram is sent again: a fifth of the timeout, 0.2 s to 1 s.
fn resend_interval(timeout: Duration) -> Duration {
    (timeout / 5).clamp(Duration::from_millis(200), Duration::from_secs(1))
}

fn timing(shared: &Shared, deadline: Instant) -> Timing {
    Timing {
        resend_every: resend_interval(shared.timeout),
        resends: RESENDS,
        deadline,
    }
}

async fn read_task(shared: Arc<Shared>) -> Reply {
    let deadline = Instant::now() + shared.timeout;
    let lock = shared.slot.clone().lock_owned();
    let mut slot = match tokio::time::timeout_at(deadline, lock).await {
        Ok(g) => g,
        Err(_) => {
            return failed(Trouble::new(
                ReadErrorKind::Timeout,
                "an earlier read of this BMC still holds its session (one IPMI session per \
                 BMC at a time)",
            ));
        }
    };

    let mut kept_failure: Option<Trouble> = None;
    if let Some(mut kept) = slot.session.take() {
        let max_idle = slot.max_idle;
        if kept.reusable(shared.id, max_idle) {
            let idle = kept.last_used.elapsed();
            let now = Instant::now();
            // Half the time for the kept session; the rest for a new one if the BMC forgot it.
            let half = now + deadline.saturating_duration_since(now) / 2;
            let session = kept.session.as_mut().expect("reusable");
            match read_in(session, &shared, half).await {
                (Ok(answer), clean) => {
                    kept.reads += 1;
                    kept.last_used = Instant::now();
                    if clean {
                        slot.session = Some(kept);
                        arm_closer(&shared.slot, &mut slot);
                    }
                    return succeeded(&shared, answer);
                }
                (Err(t), _) => {
                    tracing::debug!(
                        node = %shared.node,
                        idle_ms = idle.as_millis() as u64,
                        error = %t.detail,
                        "kept IPMI session failed; opening a new one"
                    );
                    if t.kind == ReadErrorKind::Timeout && idle >= MIN_IDLE_EVIDENCE {
                        // The BMC forgot a session idle this long: keep them idle less.
                        slot.max_idle = (idle * 3 / 4).max(MIN_IDLE_EVIDENCE).min(max_idle);
                    }
                    kept_failure = Some(t);
                }
            }
        }
        // Anything else taken from the slot is dropped here, and closed.
    }

    let remaining = deadline.saturating_duration_since(Instant::now());
    let lookup = tokio::net::lookup_host((shared.host.as_str(), shared.port));
    let bmc = match tokio::time::timeout(remaining, lookup).await {
        Ok(Ok(mut addrs)) => match addrs.next() {
            Some(a) => a,
            None => {
                return failed(Trouble::new(
                    ReadErrorKind::Unreachable,
                    format!("{} resolves to no address", shared.host),
                ));
            }
        },
        Ok(Err(e)) => {
            return failed(Trouble::new(
                ReadErrorKind::Unreachable,
                format!("cannot resolve {}: {e}", shared.host),
            ));
        }
        Err(_) => {
            return failed(Trouble::new(
                ReadErrorKind::Timeout,
                format!("resolving {} took longer than the deadline", shared.host),
            ));
        }
    };
    let with_kept_failure = |mut t: Trouble| {
        if let Some(first) = &kept_failure {
            t.detail = format!(
                "{} (the kept session failed first: {})",
                t.detail, first.detail
            );
        }
        failed(t)
    };
    let Some(kuid) = Key::new(shared.password.expose().as_bytes()) else {
        return failed(Trouble::new(
            ReadErrorKind::Config,
            "the password is longer than IPMI 2.0's 20 bytes",
        ));
    };
    let opened = Session::open_first(
        bmc,
        &shared.suites,
        shared.privilege.level(),
        shared.username.as_bytes(),
        &kuid,
        timing(&shared, deadline),
    )
    .await;
    let mut session = match opened {
        Ok(s) => s,
        Err(t) => return with_kept_failure(t),
    };
    let now = Instant::now();
    match read_in(&mut session, &shared, deadline).await {
        (Ok(answer), clean) => {
            let mut kept = Kept {
                owner: shared.id,
                session: Some(session),
                opened: now,
                last_used: Instant::now(),
                reads: 1,
            };
            if clean {
                slot.session = Some(kept);
                arm_closer(&shared.slot, &mut slot);
            } else if let Some(s) = kept.session.take() {
                // Something odd on the wire: close it now and start clean next time.
                s.close().await;
            }
            succeeded(&shared, answer)
        }
        (Err(t), _) => {
            session.close().await;
            with_kept_failure(t)
        }
    }
}

/// Reads the chassis status, then the System GUID, through `session` until `deadline`. The
/// answer, and whether the session is clean enough to keep: nothing odd on the wire (a stray
/// answer, a resend, an unanswered GUID question).
async fn read_in(
    session: &mut Session,
    shared: &Shared,
    deadline: Instant,
) -> (Result<Answer, Trouble>, bool) {
    let before = session.stray_and_resent();
    session.set_timing(timing(shared, deadline));
    let status = match session.chassis_status().await {
        Err(t) => return (Err(t), false),
        Ok(a) if a.completion != 0 => {
            return (
                Err(Trouble::new(
                    ReadErrorKind::Protocol,
                    format!(
                        "Get Chassis Status refused with completion code {:#04x}{}",
                        a.completion,
                        completion_name(a.completion)
                    ),
                )),
                false,
            );
        }
        Ok(a) => match ChassisStatus::parse(&a.data) {
            Ok(s) => s,
            Err(e) => {
                return (
                    Err(Trouble::new(ReadErrorKind::BadReply, e.to_string())),
                    false,
                );
            }
        },
    };
    // The power state is read; whatever becomes of the GUID question leaves it as read.
    let (identity, answered) = if Instant::now() >= deadline {
        (
            MachineIdentity::unreported(
                "no time was left within the read's deadline to ask for the System GUID",
            ),
            true,
        )
    } else {
        match session.system_guid().await {
            Ok(a) => (guid_identity(GuidReply::parse(a.completion, &a.data)), true),
            Err(t) => (
                MachineIdentity::unreported(format!("Get System GUID failed: {}", t.detail)),
                false,
            ),
        }
    };
    let off = if status.is_on() {
        None
    } else {
        Some(off_checks::ask(session, deadline, shared.power_draw).await)
    };
    let answered = answered && off.as_ref().is_none_or(|o| o.answered);
    let clean = answered && session.stray_and_resent() == before;
    let how = format!(
        "cipher suite {}, {}",
        session.suite().id(),
        session::role_name(session.privilege())
    );
    (
        Ok(Answer {
            status,
            identity,
            session: how,
            off,
        }),
        clean,
    )
}

/// The name of a generic completion code (IPMI 2.0 table 5-2), for an error message.
fn completion_name(code: u8) -> &'static str {
    match code {
        0xC0 => " (node busy)",
        0xC1 => " (invalid command)",
        0xC3 => " (timeout)",
        0xC7 | 0xC8 => " (request data length invalid)",
        0xCC => " (invalid data field)",
        0xCE => " (response could not be provided)",
        0xD4 => " (insufficient privilege level)",
        0xD5 => " (not supported in present state)",
        0xFF => " (unspecified error)",
        _ => "",
    }
}

fn succeeded(shared: &Shared, answer: Answer) -> Reply {
    let Answer {
        status,
        identity,
        session,
        off,
    } = answer;
    let faults = status.faults();
    let events = status.last_events();
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if !faults.is_empty() {
        tracing::warn!(
            node = %shared.node,
            power = if status.is_on() { "on" } else { "off" },
            faults = %faults.join(", "),
            "IPMI chassis status reports power faults"
        );
    }
    let mut details = vec![
        ReadDetail::new("chassis power faults", list(&faults)),
        ReadDetail::new("last power event", list(&events)),
        ReadDetail::new("chassis status bytes", status.hex()),
        ReadDetail::new("session", session),
    ];
    let (state, power_draw) = match off {
        _ if status.is_on() => (PowerState::On, None),
        None => (PowerState::Off, None),
        Some(checks) => {
            let (state, more) = off_checks::apply(&checks);
            details.extend(more);
            (state, checks.power_draw)
        }
    };
    Reply {
        state,
        details,
        identity,
        reader: None,
        power_draw,
    }
}

fn failed(t: Trouble) -> Reply {
    Reply::without_identity(
        PowerState::error(t.kind, t.detail),
        "the power read failed, so the System GUID was not asked for",
    )
}

/// The machine's identity from a Get System GUID answer. BMCs disagree on the byte order, so
/// the identity holds every UUID the 16 bytes may stand for.
fn guid_identity(reply: GuidReply) -> MachineIdentity {
    match reply {
        GuidReply::Guid(guid) => MachineIdentity::SystemUuid {
            forms: uuid_forms_of_ipmi_guid(&guid),
            serial: None,
        },
        GuidReply::Refused(code) => MachineIdentity::unreported(format!(
            "the BMC refused Get System GUID with completion code {code:#04x}{}",
            completion_name(code)
        )),
        GuidReply::WrongLength(n) => MachineIdentity::unreported(format!(
            "the Get System GUID reply has {n} data bytes; 16 expected"
        )),
    }
}

/// Last line of defence: no detail or identity string leaves this source with the password in
/// it. (The GUID forms are hexadecimal digits and hyphens formatted here, not BMC text.)
fn scrub_reply(password: &Secret, reply: Reply) -> Reply {
    let identity = match reply.identity {
        MachineIdentity::Unreported { reason } => {
            let secret = password.expose();
            if !secret.is_empty() && reason.contains(secret) {
                MachineIdentity::unreported(reason.replace(secret, "<redacted>"))
            } else {
                MachineIdentity::Unreported { reason }
            }
        }
        other => other,
    };
    Reply {
        state: scrub(password, reply.state),
        details: reply.details,
        identity,
        reader: reply.reader,
        power_draw: reply.power_draw,
    }
}

/// The password out of a state's detail.
fn scrub(password: &Secret, state: PowerState) -> PowerState {
    let secret = password.expose();
    match state {
        PowerState::Error { kind, detail } if !secret.is_empty() && detail.contains(secret) => {
            PowerState::Error {
                kind,
                detail: detail.replace(secret, "<redacted>"),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
