//! A native RMCP+ (IPMI 2.0 "lanplus") session on tokio's `UdpSocket`: Get Channel
//! Authentication Capabilities, Open Session, RAKP 1–4, Set Session Privilege Level, then
//! encrypted and signed requests, and Close Session. Cipher suites 3 and 17 ([`rakp`]), any
//! role from User up.
//!
//! What a session accepts as an answer, it checks itself:
//! - IPMI 1.5 is never spoken beyond the session-less capabilities question: a BMC that does
//!   not offer IPMI 2.0 is refused (IPMI 1.5 sends the password in clear or as MD5).
//! - The BMC must take exactly the algorithms of the configured suite, and prove in RAKP 2 and
//!   RAKP 4 that it knows the password and derived the same keys.
//! - In session: only encrypted, signed answers carrying our session ID, whose AuthCode checks
//!   out, whose sequence number is above every one accepted before (no replay), and which answer
//!   the request in flight (NetFn, command and request sequence). Anything else is dropped and
//!   counted, never taken as an answer; when no answer comes, the read fails with the first
//!   reason seen.
//! - Every exchange is resent a bounded number of times and bounded in time; an ICMP "port
//!   unreachable" is reported as such.
//!
//! Longer than 600 lines: a login is five exchanges, and each answer is checked field by field,
//! every refusal with an error of its own that names what the BMC said.
//!
//! [`rakp`]: super::rakp

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::rakp::{BLOCK, Exchange, Key, SessionKeys, Suite};
use crate::power::ReadErrorKind;

/// Privilege levels as IPMI numbers them (table 22-27 and RAKP 1's role field).
pub const USER: u8 = 2;
pub const OPERATOR: u8 = 3;
pub const ADMINISTRATOR: u8 = 4;

/// RAKP 1's role bit: look the user up by name (and role), as ipmitool does.
const NAME_ONLY_LOOKUP: u8 = 0x10;

/// The largest datagram taken in; a larger one is refused (nothing a BMC says to these
/// requests comes near it).
pub const MAX_DATAGRAM: usize = 1024;
/// Datagrams one exchange looks at before it gives up, on top of its time bound.
const MAX_DATAGRAMS_PER_EXCHANGE: usize = 256;

const RMCP_HEADER: [u8; 4] = [0x06, 0x00, 0xff, 0x07];
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
/// The BMC's and our IPMB addresses in LAN messages.
const BMC_ADDRESS: u8 = 0x20;
const CONSOLE_ADDRESS: u8 = 0x81;
const NETFN_CHASSIS: u8 = 0x00;
const NETFN_APP: u8 = 0x06;
const NETFN_GROUP_EXTENSION: u8 = 0x2c;

/// A reason a read fails, found on the wire or in the BMC's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub kind: ReadErrorKind,
    pub detail: String,
    /// The BMC refused the cipher suite itself (Open Session status): another suite may do.
    pub suite_refused: bool,
}

impl Trouble {
    pub fn new(kind: ReadErrorKind, detail: impl Into<String>) -> Trouble {
        Trouble {
            kind,
            detail: detail.into(),
            suite_refused: false,
        }
    }
}

/// Who logs in, and how.
pub struct Login<'a> {
    pub suite: Suite,
    /// The role asked for: [`USER`], [`OPERATOR`] or [`ADMINISTRATOR`].
    pub privilege: u8,
    pub username: &'a [u8],
    pub kuid: &'a Key,
}

/// How often a request is sent again for want of an answer, and when the whole read ends.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub resend_every: Duration,
    pub resends: u32,
    /// No exchange waits past this; after the last resend, one waits until it.
    pub deadline: Instant,
}

/// An answer inside the session: the completion code and the data after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub completion: u8,
    pub data: Vec<u8>,
}

/// An established RMCP+ session.
pub struct Session {
    wire: Wire,
    suite: Suite,
    keys: SessionKeys,
    console_id: u32,
    bmc_id: u32,
    out_seq: u32,
    last_in_seq: u32,
    rq_seq: u8,
    privilege: u8,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("peer", &self.wire.peer)
            .field("suite", &self.suite.id())
            .field("privilege", &self.privilege)
            .field("bmc_id", &format_args!("{:#010x}", self.bmc_id))
            .finish_non_exhaustive()
    }
}

/// What to do with one datagram received during an exchange.
enum Take<T> {
    Answer(T),
    /// Not the answer: dropped, with why when that may explain a failure.
    Drop(Option<Trouble>),
    Fail(Trouble),
}

fn random<const N: usize>() -> Result<[u8; N], Trouble> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| {
        Trouble::new(
            ReadErrorKind::Protocol,
            format!("no random numbers from the OS: {e}"),
        )
    })?;
    Ok(b)
}

fn checksum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x)).wrapping_neg()
}

/// An IPMI LAN request message to the BMC.
fn request_message(netfn: u8, cmd: u8, rq_seq: u8, data: &[u8]) -> Vec<u8> {
    let mut m = vec![BMC_ADDRESS, netfn << 2];
    m.push(checksum(&m));
    m.extend([CONSOLE_ADDRESS, rq_seq << 2, cmd]);
    m.extend_from_slice(data);
    m.push(checksum(&m[3..]));
    m
}

/// The answer in `m` if it is the BMC's response to (netfn, cmd, rq_seq) with both checksums
/// right.
fn response_of(m: &[u8], netfn: u8, cmd: u8, rq_seq: u8) -> Option<Answer> {
    if m.len() < 8 || checksum(&m[..2]) != m[2] || checksum(&m[3..m.len() - 1]) != m[m.len() - 1] {
        return None;
    }
    let ours = m[0] == CONSOLE_ADDRESS
        && m[1] >> 2 == netfn | 1
        && m[3] == BMC_ADDRESS
        && m[4] >> 2 == rq_seq
        && m[5] == cmd;
    ours.then(|| Answer {
        completion: m[6],
        data: m[7..m.len() - 1].to_vec(),
    })
}

/// An RMCP+ handshake packet (outside any session: session ID and sequence 0).
fn handshake_packet(payload_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = RMCP_HEADER.to_vec();
    p.extend([AUTH_RMCP_PLUS, payload_type]);
    p.extend([0u8; 8]);
    p.extend((payload.len() as u16).to_le_bytes());
    p.extend_from_slice(payload);
    p
}

/// The payload of an RMCP+ datagram of `payload_type` (all eight bits) with session ID 0.
fn handshake_payload(d: &[u8], payload_type: u8) -> Option<&[u8]> {
    if d.len() < 16 || d[..4] != RMCP_HEADER || d[4] != AUTH_RMCP_PLUS || d[5] != payload_type {
        return None;
    }
    let len = usize::from(u16::from_le_bytes([d[14], d[15]]));
    d.get(16..16 + len)
}

/// The payload of the BMC's handshake answer of `payload_type` to our message `tag` for our
/// session `console_id`, its status checked: `None` when the datagram is not that answer.
fn handshake_answer<'d>(
    d: &'d [u8],
    payload_type: u8,
    tag: u8,
    console_id: u32,
    step: &str,
    login: &Login<'_>,
) -> Option<Result<&'d [u8], Trouble>> {
    let p = handshake_payload(d, payload_type)?;
    if p.len() < 8 || p[0] != tag || p[4..8] != console_id.to_le_bytes() {
        return None;
    }
    Some(match p[1] {
        0 => Ok(p),
        status => Err(status_trouble(step, status, login)),
    })
}

/// An RMCP+ status code in a handshake answer (IPMI 2.0 table 13-15), as a read failure.
fn status_trouble(step: &str, code: u8, login: &Login<'_>) -> Trouble {
    let suite = login.suite.id();
    let role = role_name(login.privilege);
    let (kind, what) = match code {
        0x01 => (
            ReadErrorKind::Protocol,
            "insufficient resources to create a session (all session slots in use?)".to_string(),
        ),
        0x02 => (ReadErrorKind::Protocol, "invalid session ID".into()),
        0x03 => (ReadErrorKind::Protocol, "invalid payload type".into()),
        0x04..=0x07 | 0x10 | 0x11 => (
            ReadErrorKind::Protocol,
            format!(
                "cipher suite {suite} refused by the BMC (enable it there, or set cipher_suite)"
            ),
        ),
        0x08 => (ReadErrorKind::Protocol, "inactive session ID".into()),
        0x09 | 0x0A => (
            ReadErrorKind::Auth,
            format!("the user may not log in as {role} (set privilege to its role)"),
        ),
        0x0B => (
            ReadErrorKind::Protocol,
            "insufficient resources to create a session at the requested role".into(),
        ),
        0x0C => (ReadErrorKind::Auth, "invalid user name length".into()),
        0x0D => (
            ReadErrorKind::Auth,
            format!("unauthorized name: the BMC has no such user, or not with the {role} role"),
        ),
        0x0E => (ReadErrorKind::Auth, "unauthorized GUID".into()),
        0x0F => (
            ReadErrorKind::Auth,
            "invalid integrity check value (wrong password?)".into(),
        ),
        0x12 => (
            ReadErrorKind::Protocol,
            "illegal or unrecognized parameter".into(),
        ),
        _ => (ReadErrorKind::Protocol, "unknown status code".into()),
    };
    Trouble {
        suite_refused: matches!(code, 0x04..=0x07 | 0x10 | 0x11),
        ..Trouble::new(kind, format!("{step} has status {code:#04x}: {what}"))
    }
}

pub fn role_name(privilege: u8) -> &'static str {
    match privilege {
        USER => "User",
        OPERATOR => "Operator",
        ADMINISTRATOR => "Administrator",
        _ => "an unknown role",
    }
}

/// The first bytes of a datagram in hex, for an error message.
fn hex_head(d: &[u8]) -> String {
    let head: Vec<String> = d.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let more = if d.len() > 12 { " ..." } else { "" };
    format!("{} bytes: {}{more}", d.len(), head.join(" "))
}

fn io_trouble(e: &std::io::Error, peer: SocketAddr) -> Trouble {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        Trouble::new(
            ReadErrorKind::Unreachable,
            format!("nothing listens on UDP {peer} (ICMP port unreachable)"),
        )
    } else {
        Trouble::new(ReadErrorKind::Unreachable, format!("UDP {peer}: {e}"))
    }
}

/// The socket to one BMC, and what its exchanges counted.
struct Wire {
    socket: UdpSocket,
    peer: SocketAddr,
    timing: Timing,
    /// Datagrams dropped: not an answer to the request in flight, or not ours.
    stray: u32,
    /// Requests sent again for want of an answer.
    resent: u32,
}

impl Wire {
    /// Sends `datagram` and waits for an answer `take` accepts, sending it again after each
    /// `per_try` without one, `resends` times at most. Returns the answer, the first failure `take`
    /// reports, or a timeout naming `what` and the first reason an answer was dropped.
    async fn exchange<T>(
        &mut self,
        what: &str,
        datagram: &[u8],
        mut take: impl FnMut(&[u8]) -> Take<T>,
    ) -> Result<T, Trouble> {
        let (socket, peer, timing) = (&self.socket, self.peer, self.timing);
        let started = Instant::now();
        let mut buf = [0u8; MAX_DATAGRAM + 1];
        let mut seen = 0usize;
        let mut dropped_why: Option<Trouble> = None;
        let mut sends = 0u32;
        for attempt in 0..=timing.resends {
            if Instant::now() >= timing.deadline {
                break;
            }
            if attempt > 0 {
                self.resent += 1;
            }
            socket
                .send(datagram)
                .await
                .map_err(|e| io_trouble(&e, peer))?;
            sends += 1;
            let until = if attempt == timing.resends {
                timing.deadline
            } else {
                (Instant::now() + timing.resend_every).min(timing.deadline)
            };
            loop {
                let n = match tokio::time::timeout_at(until, socket.recv(&mut buf)).await {
                    Err(_) => break,
                    Ok(Err(e)) => return Err(io_trouble(&e, peer)),
                    Ok(Ok(n)) => n,
                };
                seen += 1;
                if seen > MAX_DATAGRAMS_PER_EXCHANGE {
                    return Err(Trouble::new(
                        ReadErrorKind::BadReply,
                        format!(
                            "{what}: more than {MAX_DATAGRAMS_PER_EXCHANGE} datagrams and none the answer"
                        ),
                    ));
                }
                // The socket takes datagrams from the BMC's address only: one that is not RMCP
                // (IPMI) at all is no BMC speaking, and fails the read at once.
                let d = &buf[..n];
                if n > MAX_DATAGRAM {
                    return Err(Trouble::new(
                        ReadErrorKind::BadReply,
                        format!(
                            "{what}: answered with a datagram of more than {MAX_DATAGRAM} bytes"
                        ),
                    ));
                }
                if d.len() < 5 || d[0] != RMCP_HEADER[0] || d[3] != RMCP_HEADER[3] {
                    return Err(Trouble::new(
                        ReadErrorKind::BadReply,
                        format!(
                            "{what}: answered with a datagram that is not RMCP/IPMI ({})",
                            hex_head(d)
                        ),
                    ));
                }
                match take(d) {
                    Take::Answer(t) => return Ok(t),
                    Take::Fail(t) => return Err(t),
                    Take::Drop(why) => {
                        self.stray += 1;
                        if dropped_why.is_none() {
                            dropped_why = why;
                        }
                    }
                }
            }
        }
        let waited = started.elapsed();
        Err(match dropped_why {
            Some(t) => Trouble::new(
                t.kind,
                format!("{what}: no valid answer in {waited:?}; {}", t.detail),
            ),
            None => Trouble::new(
                ReadErrorKind::Timeout,
                format!(
                    "{what}: no answer from {peer} within the deadline ({:.1}s, sent {} times)",
                    waited.as_secs_f64(),
                    sends
                ),
            ),
        })
    }
}

impl Session {
    /// Logs in to the BMC at `peer` and raises the session to the login's role.
    pub async fn open(
        peer: SocketAddr,
        login: &Login<'_>,
        timing: Timing,
    ) -> Result<Session, Trouble> {
        if login.username.len() > 16 {
            return Err(Trouble::new(
                ReadErrorKind::Config,
                "user names are at most 16 bytes in IPMI 2.0",
            ));
        }
        let local: SocketAddr = if peer.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let socket = UdpSocket::bind(local)
            .await
            .map_err(|e| io_trouble(&e, peer))?;
        socket
            .connect(peer)
            .await
            .map_err(|e| io_trouble(&e, peer))?;
        let mut wire = Wire {
            socket,
            peer,
            timing,
            stray: 0,
            resent: 0,
        };

        // 1. Does the BMC speak IPMI 2.0 at all? (IPMI 1.5, session-less.)
        let caps = {
            let msg = request_message(NETFN_APP, 0x38, 0, &[0x8e, login.privilege]);
            let mut p = RMCP_HEADER.to_vec();
            p.extend([AUTH_NONE, 0, 0, 0, 0, 0, 0, 0, 0, msg.len() as u8]);
            p.extend(msg);
            p
        };
        let offered = wire.exchange(
            "Get Channel Authentication Capabilities",
            &caps,
            |d| {
                if d.len() < 14 || d[..4] != RMCP_HEADER || d[4] != AUTH_NONE {
                    return Take::Drop(None);
                }
                let len = usize::from(d[13]);
                let Some(answer) = d.get(14..14 + len).and_then(|m| response_of(m, NETFN_APP, 0x38, 0)) else {
                    return Take::Drop(None);
                };
                if answer.completion != 0 || answer.data.len() < 4 {
                    return Take::Fail(Trouble::new(
                        ReadErrorKind::Protocol,
                        format!(
                            "Get Channel Authentication Capabilities refused (completion code {:#04x})",
                            answer.completion
                        ),
                    ));
                }
                Take::Answer(answer.data[1] & 0x80 != 0 && answer.data[3] & 0x02 != 0)
            },
        )
        .await?;
        if !offered {
            return Err(Trouble::new(
                ReadErrorKind::Protocol,
                "the BMC does not offer IPMI 2.0 (RMCP+) on this channel; IPMI 1.5 is refused \
                 (it sends the password in clear or as MD5): enable IPMI 2.0 on the BMC",
            ));
        }

        // 2. Open Session: our session ID and the suite's algorithms.
        let console_id = loop {
            let id = u32::from_le_bytes(random::<4>()?);
            if id != 0 {
                break id;
            }
        };
        let (auth, integrity, conf) = login.suite.algorithms();
        let tag = random::<1>()?[0];
        let mut open = vec![tag, login.privilege, 0, 0];
        open.extend(console_id.to_le_bytes());
        for (kind, alg) in [(0u8, auth), (1, integrity), (2, conf)] {
            open.extend([kind, 0, 0, 8, alg, 0, 0, 0]);
        }
        let bmc_id = wire
            .exchange(
                "Open Session",
                &handshake_packet(PT_OPEN_REQUEST, &open),
                |d| {
                    let p = match handshake_answer(
                        d,
                        PT_OPEN_RESPONSE,
                        tag,
                        console_id,
                        "Open Session Response",
                        login,
                    ) {
                        None => return Take::Drop(None),
                        Some(Err(t)) => return Take::Fail(t),
                        Some(Ok(p)) => p,
                    };
                    if p.len() < 36 {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            format!("Open Session Response of {} bytes (36 expected)", p.len()),
                        ));
                    }
                    let chosen = (p[16], p[24], p[32]);
                    if chosen != (auth, integrity, conf) {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            format!(
                                "the BMC chose algorithms {chosen:?}, not cipher suite {}'s {:?}",
                                login.suite.id(),
                                (auth, integrity, conf)
                            ),
                        ));
                    }
                    let bmc_id = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
                    if bmc_id == 0 {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            "Open Session Response names session ID 0",
                        ));
                    }
                    Take::Answer(bmc_id)
                },
            )
            .await?;

        // 3. RAKP 1 and 2: the BMC proves it knows the password.
        let console_random = random::<16>()?;
        let role = login.privilege | NAME_ONLY_LOOKUP;
        let tag = random::<1>()?[0];
        let mut rakp1 = vec![tag, 0, 0, 0];
        rakp1.extend(bmc_id.to_le_bytes());
        rakp1.extend(console_random);
        rakp1.extend([role, 0, 0, login.username.len() as u8]);
        rakp1.extend_from_slice(login.username);
        let hash_len = login.suite.hash_len();
        let rakp2 = wire
            .exchange("RAKP message 1", &handshake_packet(PT_RAKP1, &rakp1), |d| {
                let p =
                    match handshake_answer(d, PT_RAKP2, tag, console_id, "RAKP message 2", login) {
                        None => return Take::Drop(None),
                        Some(Err(t)) => return Take::Fail(t),
                        Some(Ok(p)) => p,
                    };
                if p.len() != 40 + hash_len {
                    return Take::Fail(Trouble::new(
                        ReadErrorKind::Protocol,
                        format!(
                            "RAKP message 2 of {} bytes ({} expected)",
                            p.len(),
                            40 + hash_len
                        ),
                    ));
                }
                let rc: [u8; 16] = p[8..24].try_into().expect("16 bytes");
                let guid: [u8; 16] = p[24..40].try_into().expect("16 bytes");
                let ex = Exchange {
                    console_session: console_id,
                    bmc_session: bmc_id,
                    console_random,
                    bmc_random: rc,
                    bmc_guid: guid,
                    role,
                    username: login.username,
                };
                if !ex.rakp2_matches(login.suite, login.kuid, &p[40..]) {
                    return Take::Answer(None);
                }
                Take::Answer(Some((rc, guid)))
            })
            .await?;
        let Some((bmc_random, bmc_guid)) = rakp2 else {
            // Tell the BMC, as ipmitool does, so that it drops the half-open session now rather
            // than at its timeout: RAKP 3 with status "invalid integrity check value".
            let mut refusal = vec![random::<1>()?[0], 0x0f, 0, 0];
            refusal.extend(bmc_id.to_le_bytes());
            let _ = wire
                .socket
                .send(&handshake_packet(PT_RAKP3, &refusal))
                .await;
            return Err(Trouble::new(
                ReadErrorKind::Auth,
                "RAKP message 2: the BMC's key exchange code does not match the password \
                 (wrong password, or not the BMC answering)",
            ));
        };
        let ex = Exchange {
            console_session: console_id,
            bmc_session: bmc_id,
            console_random,
            bmc_random,
            bmc_guid,
            role,
            username: login.username,
        };

        // 4. RAKP 3 and 4: we prove it, the BMC proves it derived the same keys.
        let sik = ex.sik(login.suite, login.kuid);
        let tag = random::<1>()?[0];
        let mut rakp3 = vec![tag, 0, 0, 0];
        rakp3.extend(bmc_id.to_le_bytes());
        rakp3.extend(ex.rakp3_code(login.suite, login.kuid));
        let tag_len = login.suite.tag_len();
        wire.exchange("RAKP message 3", &handshake_packet(PT_RAKP3, &rakp3), |d| {
            let p = match handshake_answer(d, PT_RAKP4, tag, console_id, "RAKP message 4", login) {
                None => return Take::Drop(None),
                Some(Err(t)) => return Take::Fail(t),
                Some(Ok(p)) => p,
            };
            if p.len() != 8 + tag_len || !ex.rakp4_matches(login.suite, &sik, &p[8..]) {
                return Take::Fail(Trouble::new(
                    ReadErrorKind::Auth,
                    "RAKP message 4: the integrity check value does not match the session \
                         keys",
                ));
            }
            Take::Answer(())
        })
        .await?;

        let mut session = Session {
            wire,
            suite: login.suite,
            keys: SessionKeys::new(login.suite, &sik),
            console_id,
            bmc_id,
            out_seq: 0,
            last_in_seq: 0,
            rq_seq: 0,
            privilege: USER,
        };
        // 5. A session starts at User level; raise it when more was asked for.
        if login.privilege > USER {
            // The BMC holds the session from RAKP 4 on: whatever fails now closes it, or a few
            // failed reads fill the BMC's session slots until its own timeout.
            let a = match session.request(NETFN_APP, 0x3b, &[login.privilege]).await {
                Ok(a) => a,
                Err(t) => {
                    session.close_now();
                    return Err(t);
                }
            };
            if a.completion != 0 {
                session.close().await;
                return Err(Trouble::new(
                    ReadErrorKind::Auth,
                    format!(
                        "Set Session Privilege Level to {} refused (completion code {:#04x})",
                        role_name(login.privilege),
                        a.completion
                    ),
                ));
            }
            session.privilege = login.privilege;
        }
        Ok(session)
    }

    /// Logs in with the first of `suites` the BMC accepts: the next is tried only when the BMC
    /// refuses the suite itself (Open Session status), never after a failed login.
    pub async fn open_first(
        peer: SocketAddr,
        suites: &[Suite],
        privilege: u8,
        username: &[u8],
        kuid: &Key,
        timing: Timing,
    ) -> Result<Session, Trouble> {
        let mut refused: Vec<String> = Vec::new();
        for suite in suites {
            let login = Login {
                suite: *suite,
                privilege,
                username,
                kuid,
            };
            match Session::open(peer, &login, timing).await {
                Ok(s) => return Ok(s),
                Err(t) if t.suite_refused => refused.push(t.detail),
                Err(mut t) => {
                    if !refused.is_empty() {
                        t.detail = format!("{} (after: {})", t.detail, refused.join("; "));
                    }
                    return Err(t);
                }
            }
        }
        Err(Trouble {
            suite_refused: true,
            ..Trouble::new(ReadErrorKind::Protocol, refused.join("; "))
        })
    }

    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// The session's privilege level now.
    pub fn privilege(&self) -> u8 {
        self.privilege
    }

    /// How the exchanges from now on resend and end.
    pub fn set_timing(&mut self, timing: Timing) {
        self.wire.timing = timing;
    }

    /// The BMC's ID of this session.
    pub fn bmc_id(&self) -> u32 {
        self.bmc_id
    }

    /// Datagrams dropped so far (not ours, stale, or failing a check) and requests resent.
    pub fn stray_and_resent(&self) -> (u32, u32) {
        (self.wire.stray, self.wire.resent)
    }

    /// The next request as a datagram, encrypted and signed, with its request sequence number.
    fn sealed_request(
        &mut self,
        netfn: u8,
        cmd: u8,
        data: &[u8],
    ) -> Result<(Vec<u8>, u8), Trouble> {
        self.rq_seq = (self.rq_seq + 1) & 0x3f;
        self.out_seq = self.out_seq.wrapping_add(1).max(1);
        let message = request_message(netfn, cmd, self.rq_seq, data);
        let sealed = self.keys.seal(random::<BLOCK>()?, &message);
        let mut p = RMCP_HEADER.to_vec();
        p.extend([AUTH_RMCP_PLUS, PROTECTED | PT_IPMI]);
        p.extend(self.bmc_id.to_le_bytes());
        p.extend(self.out_seq.to_le_bytes());
        p.extend((sealed.len() as u16).to_le_bytes());
        p.extend(sealed);
        // Integrity pad: from AuthType to Next Header, a multiple of four bytes.
        let pad = (4 - (p.len() - 4 + 2) % 4) % 4;
        p.extend(std::iter::repeat_n(0xffu8, pad));
        p.extend([pad as u8, 0x07]);
        let code = self.keys.auth_code(&p[4..]);
        p.extend(code);
        Ok((p, self.rq_seq))
    }

    /// One request inside the session, and its answer.
    pub async fn request(&mut self, netfn: u8, cmd: u8, data: &[u8]) -> Result<Answer, Trouble> {
        let (p, rq_seq) = self.sealed_request(netfn, cmd, data)?;

        let what = format!("NetFn {netfn:#04x} command {cmd:#04x}");
        let (keys, console_id, tag_len) = (&self.keys, self.console_id, self.suite.tag_len());
        let last_in_seq = self.last_in_seq;
        let (answer, seq) = self
            .wire
            .exchange(&what, &p, |d| {
                let drop = |why: &str| {
                    Take::Drop(Some(Trouble::new(ReadErrorKind::BadReply, why.to_string())))
                };
                if d.len() < 16 || d[..4] != RMCP_HEADER || d[4] != AUTH_RMCP_PLUS {
                    return Take::Drop(None);
                }
                if d[5] != PROTECTED | PT_IPMI {
                    return drop("an answer that was not encrypted and signed");
                }
                if d[6..10] != console_id.to_le_bytes() {
                    return drop("an answer for a session not ours (another session ID)");
                }
                let len = usize::from(u16::from_le_bytes([d[14], d[15]]));
                if d.len() < 16 + len + 2 + tag_len {
                    return drop("an answer cut short");
                }
                let trailer = d.len() - tag_len;
                if d[trailer - 1] != 0x07 || usize::from(d[trailer - 2]) != trailer - 2 - (16 + len)
                {
                    return drop("an answer with a malformed session trailer");
                }
                if !keys.auth_code_matches(&d[4..trailer], &d[trailer..]) {
                    return drop("an answer whose AuthCode does not check out");
                }
                let seq = u32::from_le_bytes([d[10], d[11], d[12], d[13]]);
                if seq <= last_in_seq {
                    return drop(
                        "an answer replayed or reordered (its session sequence number is not \
                         above the last one accepted)",
                    );
                }
                let Ok(message) = keys.open(&d[16..16 + len]) else {
                    return drop("an answer that does not decrypt");
                };
                match response_of(&message, netfn, cmd, rq_seq) {
                    Some(a) => Take::Answer((a, seq)),
                    None => drop("an answer to another request"),
                }
            })
            .await?;
        self.last_in_seq = seq;
        Ok(answer)
    }

    /// Get Chassis Status: the answer's data.
    pub async fn chassis_status(&mut self) -> Result<Answer, Trouble> {
        self.request(NETFN_CHASSIS, 0x01, &[]).await
    }

    /// Get System GUID: the answer's data.
    pub async fn system_guid(&mut self) -> Result<Answer, Trouble> {
        self.request(NETFN_APP, 0x37, &[]).await
    }

    /// Get ACPI Power State: the answer's data.
    pub async fn acpi_power_state(&mut self) -> Result<Answer, Trouble> {
        self.request(NETFN_APP, 0x07, &[]).await
    }

    /// DCMI Get Power Reading (system power statistics): the answer's data.
    pub async fn dcmi_power_reading(&mut self) -> Result<Answer, Trouble> {
        self.request(
            NETFN_GROUP_EXTENSION,
            0x02,
            &super::commands::acpi::POWER_READING_REQUEST,
        )
        .await
    }

    /// Sends Close Session without waiting for the answer, from any context (a `Drop`, a
    /// runtime shutting down): a UDP send does not block. Failures are ignored (the BMC times
    /// the session out anyway).
    pub fn close_now(mut self) {
        let id = self.bmc_id.to_le_bytes();
        if let Ok((p, _)) = self.sealed_request(NETFN_APP, 0x3c, &id) {
            let _ = self.wire.socket.try_send(&p);
        }
    }

    /// Close Session, waiting at most one try's time for the answer; failures are ignored (the
    /// BMC times the session out anyway).
    pub async fn close(mut self) {
        let wait = self.wire.timing.resend_every;
        self.wire.timing = Timing {
            resend_every: wait,
            resends: 0,
            deadline: Instant::now() + wait,
        };
        let id = self.bmc_id.to_le_bytes();
        let _ = self.request(NETFN_APP, 0x3c, &id).await;
    }
}

#[cfg(test)]
mod tests;
