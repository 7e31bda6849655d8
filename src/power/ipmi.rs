//! IPMI over LAN (RMCP+, "lanplus") power source: Get Chassis Status, byte 1 bit 0.
//!
//! 1 is On, 0 is Off; an Off read with power fault bits set is still Off. The fault bits
//! (byte 1 bits 1-4) and the last power event (byte 2) go into the read's details. Every failure
//! — silence, refused credentials or cipher, a failed integrity check, a wrong sequence number, a
//! short reply — is an error read, never Off.
//!
//! After the chassis status, in the same session, Get System GUID asks the machine what it is
//! (see [`crate::identity`]). That question comes second and can only cost the identity: a BMC
//! that refuses it, answers it oddly or not at all still has its power state read.
//!
//! The RMCP+ work (RAKP key exchange, AES-CBC-128, HMAC-SHA1-96) is done by the `ipmi-rs`
//! crate, which is blocking and leaves gaps this module covers:
//!
//! - it runs on tokio's blocking pool, inside a detached task with its own deadline, and a panic
//!   inside it becomes an error read;
//! - it talks only to the wire guard in [`link`], which checks what it does not (no IPMI 1.5
//!   fallback, cipher suite 3 exactly, session IDs and sequence numbers, one answer per request)
//!   and adds retransmission and timeouts;
//! - it never closes a session: here at most one session per BMC exists at a time (BMCs have
//!   only a handful of slots), it is reused while fresh and closed with Close Session when it is
//!   retired, idle, failed, or its last source goes away.
//!
//! What the crate cannot do at all is refused as a config error: cipher suites other than 3
//! (17 included) and accounts without the Administrator role (the crate always asks for it in
//! RAKP message 1). It never sends Set Session Privilege Level, so sessions run at the User
//! level a new session starts with, which is all Get Chassis Status and Get System GUID need.
//!
//! Longer than 600 lines: session keeping (one per BMC, reused, retired, closed) and the
//! translation of every failure into a named error are what make IPMI safe to read from.

pub mod commands;
mod link;
pub mod rakp;
pub mod session;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ipmi_rs::Ipmi;
use ipmi_rs::connection::{
    CompletionErrorCode, IpmiConnection, LogicalUnit, NetFn, Request, RequestTargetAddress,
};
use ipmi_rs::rmcp::{
    ActivationError, ParseSessionResponseError, RakpMessage2ParseError, RakpMessage4ParseError,
    Rmcp, RmcpIpmiError, RmcpIpmiReceiveError, V2_0ActivationError,
};

use self::commands::{
    ChassisStatus, CloseSession, GetChassisStatus, GetSystemGuid, GuidReply, WrongLength,
};
use self::link::{Link, Trouble, Waker};
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

// The rules of an IPMI `[[bmc]]` entry belong to the config, which checks them at load; the
// source checks the same ones again when it is built.
pub use crate::config::ipmi::{
    CIPHER_SUITE, DEFAULT_PORT, IpmiOptions, Privilege, check_cipher_suite, check_password,
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
    timeout: Duration,
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
            .field("cipher_suite", &CIPHER_SUITE)
            .field("timeout", &s.timeout)
            .finish()
    }
}

impl IpmiSource {
    /// Builds the source for `node` from its `[[bmc]]` entry. Fails on settings this build
    /// cannot honour; opens nothing yet.
    pub fn new(entry: &BmcEntry, node: &str) -> Result<IpmiSource, String> {
        let options = entry.ipmi.unwrap_or_default();
        check_cipher_suite(options.cipher_suite)?;
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
                timeout: entry.timeout,
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
    session: Option<Session>,
    /// A task is waiting to close the session once it has been idle for `max_idle`.
    closer_armed: bool,
    /// How long a session may sit idle and still be used again. Lowered when the BMC turns out
    /// to forget idle sessions sooner.
    max_idle: Duration,
}

/// An RMCP+ session: the crate's state and the wire guard it talks through. Closing is
/// best-effort and happens on drop.
struct Session {
    owner: u64,
    ipmi: Option<Ipmi<Rmcp>>,
    link: Link,
    waker: Waker,
    opened: Instant,
    last_used: Instant,
    reads: u32,
    /// The crate panicked while using it: its state is unknown, so it is not touched again.
    broken: bool,
}

impl Session {
    fn open(owner: u64, bmc: SocketAddr) -> std::io::Result<Session> {
        let (link, waker) = Link::open(bmc)?;
        let now = Instant::now();
        Ok(Session {
            owner,
            ipmi: None,
            link,
            waker,
            opened: now,
            last_used: now,
            reads: 0,
            broken: false,
        })
    }

    fn reusable(&self, owner: u64, max_idle: Duration) -> bool {
        self.owner == owner
            && !self.broken
            && self.link.wire.established
            && self.last_used.elapsed() < max_idle
            && self.opened.elapsed() < MAX_AGE
            && self.reads < MAX_READS
    }

    /// Sends Close Session for the BMC's session ID, without waiting for the answer.
    fn close(&mut self) {
        if self.broken || !self.link.wire.established {
            return;
        }
        let (Some(id), Some(ipmi)) = (self.link.wire.bmc_session_id, self.ipmi.as_mut()) else {
            return;
        };
        let sent = catch_unwind(AssertUnwindSafe(|| {
            let mut request = Request::new(
                CloseSession { bmc_session_id: id }.into(),
                RequestTargetAddress::Bmc(LogicalUnit::Zero),
            );
            ipmi.inner_mut().send(&mut request).is_ok()
        }))
        .unwrap_or(false);
        if sent {
            self.link.forward_one();
        }
        self.link.wire.established = false;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
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

// --- one read -----------------------------------------------------------------------------------

/// What one exchange with the BMC learnt: the chassis status, and what the machine says it is.
struct Answer {
    status: ChassisStatus,
    identity: MachineIdentity,
}

async fn read_task(shared: Arc<Shared>) -> Reply {
    let deadline = Instant::now() + shared.timeout;
    let lock = shared.slot.clone().lock_owned();
    let mut slot = match tokio::time::timeout_at(deadline.into(), lock).await {
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
    if let Some(session) = slot.session.take() {
        let max_idle = slot.max_idle;
        if session.reusable(shared.id, max_idle) {
            let idle = session.last_used.elapsed();
            let now = Instant::now();
            // Half the time for the kept session; the rest for a new one if the BMC forgot it.
            let half = now + deadline.saturating_duration_since(now) / 2;
            match run_blocking(shared.clone(), Job::Reuse(Box::new(session)), half).await {
                (kept, Ok(answer)) => {
                    slot.session = kept;
                    arm_closer(&shared.slot, &mut slot);
                    return succeeded(&shared, answer);
                }
                (_, Err(t)) => {
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
        // Anything else left in the slot was dropped (and closed) above.
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
    match run_blocking(shared.clone(), Job::Fresh(bmc), deadline).await {
        (kept, Ok(answer)) => {
            slot.session = kept;
            if slot.session.is_some() {
                arm_closer(&shared.slot, &mut slot);
            }
            succeeded(&shared, answer)
        }
        (_, Err(mut t)) => {
            if let Some(first) = kept_failure {
                t.detail = format!(
                    "{} (the kept session failed first: {})",
                    t.detail, first.detail
                );
            }
            failed(t)
        }
    }
}

fn arm_closer(slot_arc: &Arc<tokio::sync::Mutex<Slot>>, slot: &mut Slot) {
    if !slot.closer_armed && slot.session.is_some() {
        slot.closer_armed = true;
        tokio::spawn(close_when_idle(Arc::downgrade(slot_arc)));
    }
}

fn succeeded(shared: &Shared, answer: Answer) -> Reply {
    let Answer { status, identity } = answer;
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
    let state = if status.is_on() {
        PowerState::On
    } else {
        PowerState::Off
    };
    Reply {
        state,
        details: vec![
            ReadDetail::new("chassis power faults", list(&faults)),
            ReadDetail::new("last power event", list(&events)),
            ReadDetail::new("chassis status bytes", status.hex()),
        ],
        identity,
    }
}

fn failed(t: Trouble) -> Reply {
    Reply::without_identity(
        PowerState::error(t.kind, t.detail),
        "the power read failed, so the System GUID was not asked for",
    )
}

enum Job {
    Reuse(Box<Session>),
    Fresh(SocketAddr),
}

/// Runs one job on the blocking pool. Returns the session when it may be used again.
async fn run_blocking(
    shared: Arc<Shared>,
    job: Job,
    deadline: Instant,
) -> (Option<Session>, Result<Answer, Trouble>) {
    match on_blocking_pool(move || run_job(&shared, job, deadline)).await {
        Ok(done) => done,
        Err(t) => (None, Err(t)),
    }
}

/// Runs `f` on tokio's blocking pool; a panic inside it becomes a read failure.
async fn on_blocking_pool<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Trouble> {
    let joined = tokio::task::spawn_blocking(move || catch_unwind(AssertUnwindSafe(f))).await;
    let why = match joined {
        Ok(Ok(done)) => return Ok(done),
        Ok(Err(panic)) => panic_text(&*panic),
        Err(e) => e.to_string(),
    };
    Err(Trouble::new(
        ReadErrorKind::BadReply,
        format!("the IPMI read failed internally: {why}"),
    ))
}

/// How often an unanswered datagram is sent again: a fifth of the timeout, 0.2 s to 1 s.
fn resend_interval(timeout: Duration) -> Duration {
    (timeout / 5).clamp(Duration::from_millis(200), Duration::from_secs(1))
}

/// Reads the chassis status, then the System GUID, in one session. Returns the session when
/// it may be used again.
fn run_job(
    shared: &Shared,
    job: Job,
    deadline: Instant,
) -> (Option<Session>, Result<Answer, Trouble>) {
    let mut session = match job {
        Job::Reuse(s) => *s,
        Job::Fresh(bmc) => match Session::open(shared.id, bmc) {
            Ok(s) => s,
            Err(e) => {
                return (
                    None,
                    Err(Trouble::new(
                        ReadErrorKind::Config,
                        format!("cannot open local UDP sockets: {e}"),
                    )),
                );
            }
        },
    };
    let stray_before = session.link.wire.stray;
    let resent_before = session.link.wire.resent;
    let status = exchange(&mut session, shared, deadline, |ipmi, peer, backstop| {
        talk(ipmi, peer, backstop, &shared.username, &shared.password)
    });
    let status = match status {
        Ok(status) => status,
        Err(t) => return (None, Err(t)),
    };
    session.reads += 1;
    session.last_used = Instant::now();
    // The power state is read; whatever becomes of the GUID question leaves it as read.
    let (identity, clean) = ask_identity(&mut session, shared, deadline);
    // Something odd on the wire (a late answer, a resend, a failed GUID exchange): start clean
    // next time.
    let odd = !clean
        || session.link.wire.stray != stray_before
        || session.link.wire.resent != resent_before;
    let kept = if odd { None } else { Some(session) };
    (kept, Ok(Answer { status, identity }))
}

/// Asks for the System GUID in the session the chassis status was just read through, within
/// what is left of the read's deadline. The identity, and whether the session is still in a
/// known state (the BMC answered, even with a refusal).
fn ask_identity(
    session: &mut Session,
    shared: &Shared,
    deadline: Instant,
) -> (MachineIdentity, bool) {
    if Instant::now() >= deadline {
        return (
            MachineIdentity::unreported(
                "no time was left within the read's deadline to ask for the System GUID",
            ),
            true,
        );
    }
    match exchange(session, shared, deadline, |ipmi, _, _| ask_guid(ipmi)) {
        Ok(reply) => (guid_identity(reply), true),
        Err(t) => (
            MachineIdentity::unreported(format!("Get System GUID failed: {}", t.detail)),
            false,
        ),
    }
}

/// Get System GUID, straight through the connection (see [`GetSystemGuid`] for why).
fn ask_guid(ipmi: &mut Option<Ipmi<Rmcp>>) -> Result<GuidReply, Trouble> {
    let Some(ipmi) = ipmi else {
        return Err(Trouble::new(
            ReadErrorKind::Config,
            "the IPMI library has no active session",
        ));
    };
    let mut request = Request::new(
        GetSystemGuid.into(),
        RequestTargetAddress::Bmc(LogicalUnit::Zero),
    );
    let response = ipmi
        .inner_mut()
        .send_recv(&mut request)
        .map_err(|e| connection_trouble("Get System GUID", &e))?;
    if response.netfn() != NetFn::App || response.cmd() != 0x37 {
        return Err(Trouble::new(
            ReadErrorKind::BadReply,
            format!(
                "answer is for NetFn {:?} command {:#04x}, not Get System GUID",
                response.netfn(),
                response.cmd()
            ),
        ));
    }
    Ok(GuidReply::parse(response.cc(), response.data()))
}

/// The machine's identity from a Get System GUID answer. BMCs disagree on the byte order, so
/// the identity holds every UUID the 16 bytes may stand for.
fn guid_identity(reply: GuidReply) -> MachineIdentity {
    match reply {
        GuidReply::Guid(guid) => MachineIdentity::SystemUuid {
            forms: uuid_forms_of_ipmi_guid(&guid),
            serial: None,
        },
        GuidReply::Refused(code) => {
            let name = CompletionErrorCode::try_from(code)
                .map(|c| format!(" ({c:?})"))
                .unwrap_or_default();
            MachineIdentity::unreported(format!(
                "the BMC refused Get System GUID with completion code {code:#04x}{name}"
            ))
        }
        GuidReply::WrongLength(n) => MachineIdentity::unreported(format!(
            "the Get System GUID reply has {n} data bytes; 16 expected"
        )),
    }
}

/// One request and its answer through the wire guard: `ask` runs the crate on this thread
/// while the guard relays on another, until `deadline`. What the guard saw on the wire explains
/// a failure better than the crate's error, and no answer counts while the guard has an
/// objection.
fn exchange<T>(
    session: &mut Session,
    shared: &Shared,
    deadline: Instant,
    ask: impl FnOnce(&mut Option<Ipmi<Rmcp>>, SocketAddr, Duration) -> Result<T, Trouble>,
) -> Result<T, Trouble> {
    session.link.wire.trouble = None;
    let peer = session
        .link
        .crate_peer()
        .map_err(|e| Trouble::new(ReadErrorKind::Config, format!("local relay socket: {e}")))?;
    // The crate's own receive timeout is only a backstop: the guard wakes it at the deadline.
    let backstop = shared.timeout + Duration::from_secs(1);
    let stop = AtomicBool::new(false);
    let resend_every = resend_interval(shared.timeout);

    let Session {
        link, ipmi, waker, ..
    } = &mut *session;
    let (answer, relay_ok) = std::thread::scope(|scope| {
        let relay = std::thread::Builder::new()
            .name("oobfence-ipmi".into())
            .spawn_scoped(scope, || link.serve(&stop, deadline, resend_every));
        let relay = match relay {
            Ok(r) => r,
            Err(e) => {
                let t = Trouble::new(ReadErrorKind::Config, format!("cannot start a thread: {e}"));
                return (Ok(Err(t)), true);
            }
        };
        let answer = catch_unwind(AssertUnwindSafe(|| ask(ipmi, peer, backstop)));
        stop.store(true, Ordering::Release);
        waker.wake();
        (answer, relay.join().is_ok())
    });

    let wire_trouble = session.link.wire.trouble.take();
    if !relay_ok {
        session.broken = true;
        return Err(Trouble::new(
            ReadErrorKind::BadReply,
            "the IPMI relay failed internally",
        ));
    }
    match answer {
        Err(panic) => {
            session.broken = true;
            Err(wire_trouble.unwrap_or_else(|| {
                Trouble::new(
                    ReadErrorKind::BadReply,
                    format!(
                        "the IPMI library panicked on the BMC's answer: {}",
                        panic_text(&*panic)
                    ),
                )
            }))
        }
        Ok(Err(crate_error)) => Err(wire_trouble.unwrap_or(crate_error)),
        Ok(Ok(value)) => match wire_trouble {
            Some(t) => Err(t),
            None => Ok(value),
        },
    }
}

/// Logs in if needed, then asks for the chassis status.
fn talk(
    ipmi: &mut Option<Ipmi<Rmcp>>,
    peer: SocketAddr,
    backstop: Duration,
    username: &str,
    password: &Secret,
) -> Result<ChassisStatus, Trouble> {
    let ipmi = match ipmi {
        Some(i) => i,
        None => {
            let mut rmcp = Rmcp::new(peer, backstop).map_err(|e| {
                Trouble::new(
                    ReadErrorKind::Config,
                    format!("cannot set up the IPMI library: {e}"),
                )
            })?;
            rmcp.activate(true, Some(username), Some(password.expose().as_bytes()))
                .map_err(|e| activation_trouble(&e, username))?;
            ipmi.insert(Ipmi::new(rmcp))
        }
    };
    ipmi.send_recv(GetChassisStatus)
        .map_err(|e| command_trouble(&e))
}

fn io_trouble(what: &str, e: &std::io::Error) -> Trouble {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock | K::TimedOut => {
            Trouble::new(ReadErrorKind::Timeout, format!("no {what} in time"))
        }
        _ => Trouble::new(ReadErrorKind::Unreachable, format!("{what}: {e}")),
    }
}

fn receive_trouble(what: &str, e: &RmcpIpmiReceiveError) -> Trouble {
    match e {
        RmcpIpmiReceiveError::Io(io) => io_trouble(what, io),
        RmcpIpmiReceiveError::Session(s) => Trouble::new(
            ReadErrorKind::BadReply,
            format!("{what} fails its integrity check or cannot be decrypted ({s:?})"),
        ),
        other => Trouble::new(
            ReadErrorKind::BadReply,
            format!("{what} is malformed ({other:?})"),
        ),
    }
}

fn activation_trouble(e: &ActivationError, username: &str) -> Trouble {
    let user = format!("{username:?}");
    match e {
        ActivationError::BindSocket(io) => Trouble::new(
            ReadErrorKind::Config,
            format!("the IPMI library cannot open its UDP socket (it binds [::]:0): {io}"),
        ),
        ActivationError::PingSend(io) | ActivationError::PongReceive(io) => {
            io_trouble("answer to the RMCP presence ping", io)
        }
        ActivationError::PongRead => Trouble::new(
            ReadErrorKind::BadReply,
            "answer to the RMCP presence ping is not a pong",
        ),
        ActivationError::IpmiNotSupported => Trouble::new(
            ReadErrorKind::Protocol,
            "the BMC's pong says it does not support IPMI",
        ),
        ActivationError::NoSupportedIpmiLANVersions => Trouble::new(
            ReadErrorKind::Protocol,
            "the BMC offers neither IPMI 2.0 nor 1.5 on this channel",
        ),
        ActivationError::GetChannelAuthenticationCapabilities(e) => Trouble::new(
            ReadErrorKind::Protocol,
            format!(
                "Get Channel Authentication Capabilities failed: {}",
                short_debug(e)
            ),
        ),
        ActivationError::V1_5(_) => Trouble::new(
            ReadErrorKind::Protocol,
            "refused to fall back to IPMI 1.5; enable RMCP+ (IPMI 2.0) on the BMC",
        ),
        ActivationError::RmcpError(h) => Trouble::new(
            ReadErrorKind::BadReply,
            format!("malformed RMCP header in an answer ({h:?})"),
        ),
        ActivationError::V2_0(v2) => match v2 {
            V2_0ActivationError::ServerAuthenticationFailed => Trouble::new(
                ReadErrorKind::Auth,
                format!(
                    "login of user {user} refused: the BMC's RAKP 2 key-exchange code does not \
                     match the configured password (wrong password, or not the expected BMC)"
                ),
            ),
            V2_0ActivationError::RakpMessage4InvalidIntegrityCheckValue => Trouble::new(
                ReadErrorKind::Auth,
                format!("login of user {user}: RAKP 4 integrity check value does not match"),
            ),
            V2_0ActivationError::OpenSessionResponseParse(
                ParseSessionResponseError::HaveErrorCode(code),
            ) => Trouble::new(
                ReadErrorKind::Protocol,
                format!("the BMC refused the RMCP+ session ({})", short_debug(code)),
            ),
            V2_0ActivationError::RakpMessage2Parse(
                RakpMessage2ParseError::UnknownErrorStatusCode(code),
            )
            | V2_0ActivationError::RakpMessage4Parse(
                RakpMessage4ParseError::UnknownErrorStatusCode(code),
            ) => link::status_trouble("a RAKP answer", *code),
            V2_0ActivationError::RakpMessage2Parse(RakpMessage2ParseError::ErrorStatusCode(c)) => {
                Trouble::new(
                    ReadErrorKind::Auth,
                    format!("login of user {user} refused at RAKP 2 ({c:?})"),
                )
            }
            V2_0ActivationError::RakpMessage4Parse(RakpMessage4ParseError::ErrorStatusCode(c)) => {
                Trouble::new(
                    ReadErrorKind::Auth,
                    format!("login of user {user} refused at RAKP 4 ({c:?})"),
                )
            }
            V2_0ActivationError::OpenSessionResponseReceive(r) => {
                receive_trouble("RMCP+ Open Session Response", r)
            }
            V2_0ActivationError::RakpMessage2Receive(r) => receive_trouble("RAKP message 2", r),
            V2_0ActivationError::RakpMessage4Receive(r) => receive_trouble("RAKP message 4", r),
            other => Trouble::new(
                ReadErrorKind::BadReply,
                format!("RMCP+ login failed: {}", short_debug(other)),
            ),
        },
    }
}

/// A request that did not get through the session, or whose answer did not come back intact.
fn connection_trouble(command: &str, e: &RmcpIpmiError) -> Trouble {
    match e {
        RmcpIpmiError::Receive(r) => receive_trouble(&format!("answer to {command}"), r),
        RmcpIpmiError::Send(s) => Trouble::new(
            ReadErrorKind::Unreachable,
            format!("cannot send {command}: {}", short_debug(s)),
        ),
        RmcpIpmiError::NotActive => Trouble::new(
            ReadErrorKind::Config,
            "the IPMI library has no active session",
        ),
    }
}

fn command_trouble(e: &ipmi_rs::IpmiError<RmcpIpmiError, WrongLength>) -> Trouble {
    use ipmi_rs::IpmiError as E;
    match e {
        E::Connection(c) => connection_trouble("Get Chassis Status", c),
        E::Failed {
            completion_code, ..
        } => Trouble::new(
            ReadErrorKind::Protocol,
            format!("Get Chassis Status refused with completion code {completion_code:?}"),
        ),
        E::Command { error, .. } => Trouble::new(ReadErrorKind::BadReply, error.to_string()),
        E::UnexpectedResponse {
            netfn_recvd,
            cmd_recvd,
            ..
        } => Trouble::new(
            ReadErrorKind::BadReply,
            format!(
                "answer is for NetFn {netfn_recvd:?} command {cmd_recvd:#04x}, not Get Chassis \
                 Status"
            ),
        ),
        E::NetFnIsResponse(n) => Trouble::new(
            ReadErrorKind::BadReply,
            format!("request NetFn {n:?} is a response NetFn"),
        ),
    }
}

fn short_debug(v: &dyn fmt::Debug) -> String {
    let s = format!("{v:?}");
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    short_debug(&text)
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
