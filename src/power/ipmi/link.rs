//! The wire guard between ipmi-rs and the BMC.
//!
//! ipmi-rs never talks to the BMC directly: it is given the address of a loopback socket of
//! ours, and this code passes each of its datagrams on to the BMC and each answer back, after
//! checking what the crate leaves unchecked:
//!
//! - Only RMCP+ with cipher suite 3 leaves the host. The crate falls back to IPMI 1.5 when a
//!   BMC does not offer RMCP+, where "straight password" authentication puts the password on the
//!   wire in clear; every IPMI 1.5 datagram except the session-less Get Channel Authentication
//!   Capabilities request is refused here, so that fallback never reaches the network.
//! - The BMC must accept exactly the algorithms of suite 3 (the crate would go on with whatever
//!   the Open Session Response names, even no integrity at all).
//! - One answer per request, of the kind the request calls for. Answers that arrive while none
//!   is awaited (late duplicates, stale answers from an earlier read) are dropped, never passed
//!   on as the answer to a later request.
//! - In-session answers must carry our session ID and a session sequence number above every one
//!   seen before (the crate checks neither): a replayed or reordered answer fails the read.
//! - Session-less answers must have valid IPMB checksums; oversized datagrams are refused.
//! - Retransmission (the crate has none), a deadline for every exchange, and an ICMP "port
//!   unreachable" reported as such. When an exchange fails, the crate, blocked in `recv`, is
//!   woken at once with a one-byte datagram it cannot parse.
//!
//! All of it runs on plain blocking sockets and `poll(2)`, so it needs no async runtime: a
//! session can be closed from `Drop` while the runtime shuts down.
//!
//! Longer than 600 lines: it checks every datagram both ways, and each check says what it
//! refused and why.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::power::ReadErrorKind;

/// The largest datagram passed on: the size of the crate's receive buffer. A larger one would
/// arrive there cut short.
pub const MAX_DATAGRAM: usize = 1024;

/// How often a lost datagram is sent again within one exchange.
const MAX_RESENDS: u32 = 2;

/// Upper bound on one wait in `poll`, so a stop request is seen even if its wake-up is lost.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// The relay loop stays this long past its deadline, for the crate to see the failure.
const LINGER: Duration = Duration::from_millis(500);

/// Upper bound on passes through the relay loop of one read (each pass waits in `poll` or
/// handles at least one datagram or timer), on top of the time bound.
const MAX_PASSES: u32 = 100_000;

/// Upper bound on datagrams taken from one socket in one pass.
const BURST: usize = 32;

const RMCP_VERSION: u8 = 0x06;
const CLASS_ASF: u8 = 0x06;
const CLASS_IPMI: u8 = 0x07;
const ASF_IANA: [u8; 4] = [0x00, 0x00, 0x11, 0xBE];
const ASF_PING: u8 = 0x80;
const ASF_PONG: u8 = 0x40;
const AUTH_NONE: u8 = 0x00;
const AUTH_RMCP_PLUS: u8 = 0x06;

const PT_IPMI: u8 = 0x00;
const PT_OPEN_REQUEST: u8 = 0x10;
const PT_OPEN_RESPONSE: u8 = 0x11;
const PT_RAKP1: u8 = 0x12;
const PT_RAKP2: u8 = 0x13;
const PT_RAKP3: u8 = 0x14;
const PT_RAKP4: u8 = 0x15;
/// Payload type bits: encrypted and authenticated.
const PROTECTED: u8 = 0xC0;

/// The three algorithm records of an Open Session message for cipher suite 3: RAKP-HMAC-SHA1
/// authentication, HMAC-SHA1-96 integrity, AES-CBC-128 confidentiality.
const SUITE_3: [u8; 24] = [
    0x00, 0, 0, 0x08, 0x01, 0, 0, 0, //
    0x01, 0, 0, 0x08, 0x01, 0, 0, 0, //
    0x02, 0, 0, 0x08, 0x01, 0, 0, 0, //
];

/// A reason the read fails, found on the wire or in the crate's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub kind: ReadErrorKind,
    pub detail: String,
}

impl Trouble {
    pub fn new(kind: ReadErrorKind, detail: impl Into<String>) -> Trouble {
        Trouble {
            kind,
            detail: detail.into(),
        }
    }
}

/// What the guard learnt about the session from the datagrams it passed.
#[derive(Debug, Default)]
pub struct Wire {
    /// Our session ID, from the Open Session Request; in-session answers must carry it.
    pub console_session_id: Option<u32>,
    /// The BMC's session ID, from the Open Session Response; Close Session names it.
    pub bmc_session_id: Option<u32>,
    /// RAKP message 4 was passed on: in-session traffic may flow.
    pub established: bool,
    /// Highest session sequence number of an in-session answer passed on.
    last_answer_seq: u32,
    /// What Get Channel Authentication Capabilities said about RMCP+ support.
    rmcp_plus_offered: Option<bool>,
    /// Answers dropped because no request was waiting for one.
    pub stray: u32,
    /// Datagrams sent again because no answer came.
    pub resent: u32,
    /// The first reason found on the wire why the current read fails.
    pub trouble: Option<Trouble>,
}

impl Wire {
    fn note(&mut self, t: Trouble) {
        if self.trouble.is_none() {
            self.trouble = Some(t);
        }
    }
}

/// Ends a running [`Link::serve`] from another thread.
pub struct Waker {
    socket: UdpSocket,
    target: SocketAddr,
}

impl Waker {
    pub fn wake(&self) {
        let _ = self.socket.send_to(&[], self.target);
    }
}

/// The two sockets of the guard and what it knows of the session.
pub struct Link {
    /// Loopback socket the crate sends to.
    inner: UdpSocket,
    /// Socket connected to the BMC.
    outer: UdpSocket,
    bmc: SocketAddr,
    /// The crate's socket, learnt from its first datagram; nothing else is listened to.
    console: Option<SocketAddr>,
    waker: SocketAddr,
    pub wire: Wire,
}

/// The answer an outstanding request calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Pong { tag: u8 },
    AuthCaps,
    Handshake(u8),
    InSession,
}

struct Pending {
    expect: Expect,
    datagram: Vec<u8>,
    resend_at: Instant,
    resends: u32,
}

/// What to do with an answer.
enum Verdict {
    Pass,
    /// Pass it on (the crate reports it its way) and keep this as the reason.
    PassNoting(Trouble),
    Refuse(Trouble),
}

impl Link {
    /// Opens the guard's sockets for a BMC at `bmc`.
    pub fn open(bmc: SocketAddr) -> io::Result<(Link, Waker)> {
        let inner = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        inner.set_nonblocking(true)?;
        let outer = if bmc.is_ipv4() {
            UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?
        } else {
            UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))?
        };
        outer.connect(bmc)?;
        outer.set_nonblocking(true)?;
        let waker = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        let link = Link {
            waker: waker.local_addr()?,
            inner,
            outer,
            bmc,
            console: None,
            wire: Wire::default(),
        };
        let target = link.inner.local_addr()?;
        Ok((
            link,
            Waker {
                socket: waker,
                target,
            },
        ))
    }

    /// Where the crate must send: our loopback socket.
    pub fn crate_peer(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Relays between the crate and the BMC until `stop` is set (and the waker rings) or
    /// `deadline` (plus a short linger) passes. An exchange still open at `deadline` fails.
    pub fn serve(&mut self, stop: &AtomicBool, deadline: Instant, resend_every: Duration) {
        let mut buf = vec![0u8; MAX_DATAGRAM + 1];
        // Whatever reached the socket between reads is stale by definition.
        self.drain_outer(&mut buf);
        let mut pending: Option<Pending> = None;
        for _ in 0..MAX_PASSES {
            if stop.load(Ordering::Acquire) {
                // The crate's last words (a RAKP 3 that reports a failed login, which lets the
                // BMC free the session) are passed on even though no answer will be read.
                self.take_from_crate(&mut buf, &mut pending, resend_every);
                return;
            }
            let now = Instant::now();
            if now >= deadline + LINGER {
                return;
            }
            if let Some(p) = &mut pending {
                if now >= deadline {
                    let what = describe_expect(p.expect);
                    self.wire.note(Trouble::new(
                        ReadErrorKind::Timeout,
                        format!(
                            "no {what} from {} within the deadline ({} sent, {} resent)",
                            self.bmc,
                            1 + p.resends,
                            p.resends
                        ),
                    ));
                    pending = None;
                    self.poison();
                    continue;
                }
                if now >= p.resend_at {
                    if p.resends < MAX_RESENDS {
                        if let Err(e) = self.outer.send(&p.datagram) {
                            self.wire.note(send_trouble(&e, self.bmc));
                            pending = None;
                            self.poison();
                            continue;
                        }
                        p.resends += 1;
                        self.wire.resent += 1;
                        p.resend_at = now + resend_every;
                    } else {
                        p.resend_at = deadline;
                    }
                }
            }
            let wake_at = match &pending {
                Some(p) => p.resend_at.min(deadline),
                None => deadline + LINGER,
            };
            let wait = wake_at.saturating_duration_since(now).min(POLL_SLICE);
            let (crate_ready, bmc_ready) = match self.wait(wait) {
                Ok(ready) => ready,
                Err(e) => {
                    self.wire.note(Trouble::new(
                        ReadErrorKind::Config,
                        format!("waiting on local sockets failed: {e}"),
                    ));
                    self.poison();
                    return;
                }
            };
            if crate_ready {
                self.take_from_crate(&mut buf, &mut pending, resend_every);
            }
            if bmc_ready {
                self.take_from_bmc(&mut buf, &mut pending);
            }
        }
    }

    /// Passes on the one datagram the crate has just written (a Close Session request) without
    /// waiting for an answer. Returns whether it went out.
    pub fn forward_one(&mut self) -> bool {
        let mut buf = [0u8; MAX_DATAGRAM + 1];
        // Loopback delivery is immediate on Linux; a few short retries cover other kernels.
        for _ in 0..5 {
            match self.inner.recv_from(&mut buf) {
                Ok((n, from)) if Some(from) == self.console && n <= MAX_DATAGRAM => {
                    let d = &buf[..n];
                    return matches!(self.check_from_crate(d), Ok(Expect::InSession))
                        && self.outer.send(d).is_ok();
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return false,
            }
        }
        false
    }

    fn wait(&self, timeout: Duration) -> io::Result<(bool, bool)> {
        let ms = timeout.as_micros().div_ceil(1000).min(u16::MAX as u128) as u16;
        let mut fds = [
            PollFd::new(self.inner.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.outer.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok((false, false)),
            Err(e) => return Err(io::Error::from(e)),
        }
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        Ok((ready(&fds[0]), ready(&fds[1])))
    }

    /// Wakes the crate out of `recv` with a datagram too short to be RMCP.
    fn poison(&self) {
        if let Some(console) = self.console {
            let _ = self.inner.send_to(&[0], console);
        }
    }

    fn drain_outer(&mut self, buf: &mut [u8]) {
        for _ in 0..BURST {
            match self.outer.recv(buf) {
                Ok(_) => self.wire.stray += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // An ICMP error left over from an earlier exchange: nothing to pass on.
                Err(_) => {}
            }
        }
    }

    fn take_from_crate(
        &mut self,
        buf: &mut [u8],
        pending: &mut Option<Pending>,
        resend_every: Duration,
    ) {
        for _ in 0..BURST {
            let (n, from) = match self.inner.recv_from(buf) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.wire.note(Trouble::new(
                        ReadErrorKind::Config,
                        format!("local relay socket failed: {e}"),
                    ));
                    return;
                }
            };
            if from == self.waker {
                return;
            }
            match self.console {
                None => self.console = Some(from),
                Some(c) if c != from => continue,
                Some(_) => {}
            }
            if n > MAX_DATAGRAM {
                self.wire.note(Trouble::new(
                    ReadErrorKind::Protocol,
                    format!("the IPMI library wrote a datagram of more than {MAX_DATAGRAM} bytes"),
                ));
                *pending = None;
                self.poison();
                continue;
            }
            let d = &buf[..n];
            match self.check_from_crate(d) {
                Ok(expect) => {
                    if let Err(e) = self.outer.send(d) {
                        self.wire.note(send_trouble(&e, self.bmc));
                        *pending = None;
                        self.poison();
                        continue;
                    }
                    *pending = Some(Pending {
                        expect,
                        datagram: d.to_vec(),
                        resend_at: Instant::now() + resend_every,
                        resends: 0,
                    });
                }
                Err(t) => {
                    self.wire.note(t);
                    *pending = None;
                    self.poison();
                }
            }
        }
    }

    fn take_from_bmc(&mut self, buf: &mut [u8], pending: &mut Option<Pending>) {
        for _ in 0..BURST {
            let n = match self.outer.recv(buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    if pending.take().is_some() {
                        self.wire.note(send_trouble(&e, self.bmc));
                        self.poison();
                    }
                    continue;
                }
            };
            let Some(p) = pending.as_ref() else {
                self.wire.stray += 1;
                continue;
            };
            let verdict = if n > MAX_DATAGRAM {
                Verdict::Refuse(Trouble::new(
                    ReadErrorKind::BadReply,
                    format!("answer of more than {MAX_DATAGRAM} bytes refused"),
                ))
            } else {
                self.check_from_bmc(&buf[..n], p.expect)
            };
            *pending = None;
            match verdict {
                Verdict::Pass => self.pass_to_crate(&buf[..n]),
                Verdict::PassNoting(t) => {
                    self.wire.note(t);
                    self.pass_to_crate(&buf[..n]);
                }
                Verdict::Refuse(t) => {
                    self.wire.note(t);
                    self.poison();
                }
            }
        }
    }

    fn pass_to_crate(&self, d: &[u8]) {
        if let Some(console) = self.console {
            let _ = self.inner.send_to(d, console);
        }
    }

    /// What the crate may send, and the answer it calls for.
    fn check_from_crate(&mut self, d: &[u8]) -> Result<Expect, Trouble> {
        let refused = |why: String| Trouble::new(ReadErrorKind::Protocol, why);
        let Some((class, body)) = rmcp(d) else {
            return Err(refused(
                "the IPMI library wrote a datagram without an RMCP header; not sent".into(),
            ));
        };
        match class {
            CLASS_ASF if body.len() >= 8 && body[..4] == ASF_IANA && body[4] == ASF_PING => {
                Ok(Expect::Pong { tag: body[5] })
            }
            CLASS_IPMI => match body.first().copied() {
                Some(AUTH_NONE) => {
                    let before_session = self.wire.console_session_id.is_none();
                    match ipmi15_sessionless(body) {
                        Some(msg) if before_session && msg_netfn_cmd(msg) == Some((0x06, 0x38)) => {
                            Ok(Expect::AuthCaps)
                        }
                        _ => Err(self.ipmi15_refused()),
                    }
                }
                Some(AUTH_RMCP_PLUS) => self.check_rmcp_plus_from_crate(body),
                _ => Err(self.ipmi15_refused()),
            },
            _ => Err(refused(format!(
                "the IPMI library wrote an RMCP message of class {class:#04x}; not sent"
            ))),
        }
    }

    fn ipmi15_refused(&self) -> Trouble {
        let why = match self.wire.rmcp_plus_offered {
            Some(false) => "the BMC does not offer IPMI 2.0 (RMCP+) on this channel, ",
            _ => "",
        };
        Trouble::new(
            ReadErrorKind::Protocol,
            format!(
                "{why}refused to fall back to IPMI 1.5 (its logins can expose the password); \
                 enable RMCP+ (IPMI 2.0, cipher suite 3) on the BMC"
            ),
        )
    }

    fn check_rmcp_plus_from_crate(&mut self, body: &[u8]) -> Result<Expect, Trouble> {
        let out_of_order = |what: &str| {
            Trouble::new(
                ReadErrorKind::Protocol,
                format!("the IPMI library sent {what} out of order; not sent"),
            )
        };
        let Some(h) = SessionHeader::parse(body) else {
            return Err(out_of_order("a truncated RMCP+ datagram"));
        };
        let w = &mut self.wire;
        let handshake = h.protection == 0 && h.session_id == 0 && !w.established;
        match h.payload_type {
            PT_OPEN_REQUEST if handshake => {
                let p = h.payload;
                if p.len() != 32 || p[8..32] != SUITE_3 {
                    return Err(Trouble::new(
                        ReadErrorKind::Protocol,
                        "the IPMI library proposed algorithms other than cipher suite 3; not sent",
                    ));
                }
                w.console_session_id = Some(le32(&p[4..8]));
                w.bmc_session_id = None;
                Ok(Expect::Handshake(PT_OPEN_RESPONSE))
            }
            PT_RAKP1 if handshake && w.bmc_session_id.is_some() => Ok(Expect::Handshake(PT_RAKP2)),
            PT_RAKP3 if handshake && w.bmc_session_id.is_some() => Ok(Expect::Handshake(PT_RAKP4)),
            PT_IPMI
                if w.established
                    && h.protection == PROTECTED
                    && Some(h.session_id) == w.bmc_session_id =>
            {
                Ok(Expect::InSession)
            }
            other => Err(out_of_order(&format!(
                "RMCP+ payload type {other:#04x} (protection {:#04x}, session {:#010x})",
                h.protection, h.session_id
            ))),
        }
    }

    /// Whether an answer from the BMC is the one `expect` calls for.
    fn check_from_bmc(&mut self, d: &[u8], expect: Expect) -> Verdict {
        let bad = |why: String| Verdict::Refuse(Trouble::new(ReadErrorKind::BadReply, why));
        let Some((class, body)) = rmcp(d) else {
            return bad(format!(
                "answer is not RMCP ({} bytes: {})",
                d.len(),
                hex_head(d)
            ));
        };
        match expect {
            Expect::Pong { tag } => {
                // ASF header (8 bytes) and the 16 data bytes of a pong.
                if class == CLASS_ASF
                    && body.len() >= 24
                    && body[..4] == ASF_IANA
                    && body[4] == ASF_PONG
                    && body[5] == tag
                    && body[7] == 0x10
                {
                    Verdict::Pass
                } else {
                    bad(format!(
                        "answer to the RMCP presence ping is not a pong: {}",
                        hex_head(d)
                    ))
                }
            }
            Expect::AuthCaps => {
                let Some(msg) = (class == CLASS_IPMI)
                    .then(|| ipmi15_sessionless(body))
                    .flatten()
                else {
                    return bad(format!(
                        "answer to Get Channel Authentication Capabilities is not a session-less \
                         IPMI message: {}",
                        hex_head(d)
                    ));
                };
                if !ipmb_checksums_ok(msg) {
                    return bad(
                        "answer to Get Channel Authentication Capabilities fails its IPMB checksum"
                            .into(),
                    );
                }
                if msg_netfn_cmd(msg) != Some((0x07, 0x38)) {
                    return bad(
                        "answer to Get Channel Authentication Capabilities is for another command"
                            .into(),
                    );
                }
                // Completion code, channel, auth types (bit 7: IPMI 2.0 data), flags,
                // extended capabilities (bit 1: IPMI 2.0 connections).
                if let [0x00, _, auth, _, ext, ..] = msg[6..msg.len() - 1] {
                    self.wire.rmcp_plus_offered = Some(auth & 0x80 != 0 && ext & 0x02 != 0);
                }
                Verdict::Pass
            }
            Expect::Handshake(want) => self.check_handshake_answer(class, body, want, d),
            Expect::InSession => {
                let h = (class == CLASS_IPMI)
                    .then(|| SessionHeader::parse(body))
                    .flatten();
                let Some(h) = h.filter(|h| h.auth_type == AUTH_RMCP_PLUS) else {
                    return bad(format!(
                        "answer is not an RMCP+ session message: {}",
                        hex_head(d)
                    ));
                };
                if h.payload_type != PT_IPMI || h.protection != PROTECTED {
                    return bad(format!(
                        "in-session answer has payload type {:#04x} with protection {:#04x}; \
                         an encrypted, authenticated IPMI message was expected",
                        h.payload_type, h.protection
                    ));
                }
                if Some(h.session_id) != self.wire.console_session_id {
                    return bad(format!(
                        "answer is for session {:#010x}, not ours",
                        h.session_id
                    ));
                }
                let last = self.wire.last_answer_seq;
                if h.sequence == 0 || h.sequence <= last {
                    return bad(format!(
                        "answer has session sequence number {} after {last}: a replayed or \
                         reordered datagram",
                        h.sequence
                    ));
                }
                self.wire.last_answer_seq = h.sequence;
                Verdict::Pass
            }
        }
    }

    fn check_handshake_answer(&mut self, class: u8, body: &[u8], want: u8, d: &[u8]) -> Verdict {
        let bad = |why: String| Verdict::Refuse(Trouble::new(ReadErrorKind::BadReply, why));
        let step = handshake_name(want);
        let h = (class == CLASS_IPMI)
            .then(|| SessionHeader::parse(body))
            .flatten()
            .filter(|h| h.auth_type == AUTH_RMCP_PLUS);
        let Some(h) = h else {
            return bad(format!(
                "expected {step}, got a datagram that is not RMCP+: {}",
                hex_head(d)
            ));
        };
        if h.payload_type != want || h.protection != 0 || h.session_id != 0 {
            return bad(format!(
                "expected {step}, got RMCP+ payload type {:#04x} (protection {:#04x}, \
                 session {:#010x})",
                h.payload_type, h.protection, h.session_id
            ));
        }
        let p = h.payload;
        // Status code: byte 1 of every handshake answer.
        let Some(&status) = p.get(1) else {
            return bad(format!("{step} is {} bytes long", p.len()));
        };
        if status != 0 {
            return Verdict::PassNoting(status_trouble(step, status));
        }
        let console_id = p.get(4..8).map(le32);
        if console_id != self.wire.console_session_id {
            return bad(format!("{step} names a session that is not ours"));
        }
        match want {
            PT_OPEN_RESPONSE => {
                if p.len() != 36 {
                    return bad(format!("{step} is {} bytes long, not 36", p.len()));
                }
                if p[12..36] != SUITE_3 {
                    return bad(format!(
                        "the BMC chose algorithms other than cipher suite 3 (authentication \
                         {:#04x}, integrity {:#04x}, confidentiality {:#04x}); refused",
                        p[16], p[24], p[32]
                    ));
                }
                let bmc_id = le32(&p[8..12]);
                if bmc_id == 0 {
                    return bad(format!("{step} gives session ID 0"));
                }
                self.wire.bmc_session_id = Some(bmc_id);
            }
            PT_RAKP4 => self.wire.established = true,
            _ => {}
        }
        Verdict::Pass
    }
}

/// The RMCP+ (IPMI 2.0) session header and payload of a class-IPMI body.
struct SessionHeader<'a> {
    auth_type: u8,
    payload_type: u8,
    protection: u8,
    session_id: u32,
    sequence: u32,
    payload: &'a [u8],
}

impl<'a> SessionHeader<'a> {
    fn parse(body: &'a [u8]) -> Option<SessionHeader<'a>> {
        if body.len() < 12 || body[0] != AUTH_RMCP_PLUS {
            return None;
        }
        let len = u16::from_le_bytes([body[10], body[11]]) as usize;
        Some(SessionHeader {
            auth_type: body[0],
            payload_type: body[1] & 0x3F,
            protection: body[1] & PROTECTED,
            session_id: le32(&body[2..6]),
            sequence: le32(&body[6..10]),
            payload: body.get(12..12 + len)?,
        })
    }
}

/// The RMCP class and body of a datagram, when it has a well-formed RMCP header (version 6, not
/// an acknowledgement).
fn rmcp(d: &[u8]) -> Option<(u8, &[u8])> {
    match d {
        [RMCP_VERSION, 0x00, _, class, body @ ..] if class & 0x80 == 0 => Some((*class, body)),
        _ => None,
    }
}

/// The IPMB message of a session-less IPMI 1.5 body (auth type none, session ID 0).
fn ipmi15_sessionless(body: &[u8]) -> Option<&[u8]> {
    if body.len() < 10 || body[0] != AUTH_NONE || body[5..9] != [0, 0, 0, 0] {
        return None;
    }
    let len = body[9] as usize;
    let msg = body.get(10..10 + len)?;
    (msg.len() >= 7).then_some(msg)
}

/// NetFn (without LUN) and command of an IPMB message.
fn msg_netfn_cmd(msg: &[u8]) -> Option<(u8, u8)> {
    Some((msg.get(1)? >> 2, *msg.get(5)?))
}

/// Both IPMB checksums: header (bytes 0..3) and the rest each sum to 0 modulo 256.
fn ipmb_checksums_ok(msg: &[u8]) -> bool {
    let sum = |b: &[u8]| b.iter().fold(0u8, |a, &x| a.wrapping_add(x));
    msg.len() >= 7 && sum(&msg[..3]) == 0 && sum(&msg[3..]) == 0
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn hex_head(d: &[u8]) -> String {
    let mut s: String = d
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    if d.len() > 16 {
        s.push_str(" ...");
    }
    s
}

fn handshake_name(pt: u8) -> &'static str {
    match pt {
        PT_OPEN_RESPONSE => "the RMCP+ Open Session Response",
        PT_RAKP2 => "RAKP message 2",
        PT_RAKP4 => "RAKP message 4",
        _ => "a handshake answer",
    }
}

fn describe_expect(e: Expect) -> &'static str {
    match e {
        Expect::Pong { .. } => "answer to the RMCP presence ping",
        Expect::AuthCaps => "answer to Get Channel Authentication Capabilities",
        Expect::Handshake(pt) => handshake_name(pt),
        Expect::InSession => "answer to the in-session request",
    }
}

fn send_trouble(e: &io::Error, bmc: SocketAddr) -> Trouble {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        Trouble::new(
            ReadErrorKind::Unreachable,
            format!("nothing listens on UDP {bmc} (ICMP port unreachable)"),
        )
    } else {
        Trouble::new(ReadErrorKind::Unreachable, format!("UDP {bmc}: {e}"))
    }
}

/// An RMCP+ status code in a handshake answer (IPMI 2.0 table 13-15), as a read failure.
pub fn status_trouble(step: &str, code: u8) -> Trouble {
    let (kind, what) = match code {
        0x01 => (
            ReadErrorKind::Protocol,
            "insufficient resources to create a session (all session slots in use?)",
        ),
        0x02 => (ReadErrorKind::Protocol, "invalid session ID"),
        0x03 => (ReadErrorKind::Protocol, "invalid payload type"),
        0x04 | 0x05 | 0x06 | 0x07 | 0x10 | 0x11 => (
            ReadErrorKind::Protocol,
            "cipher suite 3 refused by the BMC (enable suite 3, or use redfish)",
        ),
        0x08 => (ReadErrorKind::Protocol, "inactive session ID"),
        0x09 | 0x0A => (
            ReadErrorKind::Auth,
            "the user lacks the Administrator role this build always asks for",
        ),
        0x0B => (
            ReadErrorKind::Protocol,
            "insufficient resources to create a session at the requested role",
        ),
        0x0C => (ReadErrorKind::Auth, "invalid user name length"),
        0x0D => (
            ReadErrorKind::Auth,
            "unauthorized name: the BMC has no such user, or the user lacks the Administrator \
             role this build always asks for",
        ),
        0x0E => (ReadErrorKind::Auth, "unauthorized GUID"),
        0x0F => (
            ReadErrorKind::Auth,
            "invalid integrity check value (wrong password?)",
        ),
        0x12 => (ReadErrorKind::Protocol, "illegal or unrecognized parameter"),
        _ => (ReadErrorKind::Protocol, "unknown status code"),
    };
    Trouble::new(kind, format!("{step} has status {code:#04x}: {what}"))
}

#[cfg(test)]
mod tests;
