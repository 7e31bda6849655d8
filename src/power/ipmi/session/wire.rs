//! The wire: IPMI messages and their checksums, the session-less handshake packets and their
//! answers (with the status codes a BMC refuses with), and the socket's exchange — sent again
//! a bounded number of times, bounded in time, dropping and counting what is not the answer.

use std::net::SocketAddr;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::{
    AUTH_RMCP_PLUS, Answer, BMC_ADDRESS, CONSOLE_ADDRESS, Login, MAX_DATAGRAM,
    MAX_DATAGRAMS_PER_EXCHANGE, RMCP_HEADER, Take, Timing, Trouble, role_name,
};
use crate::power::ReadErrorKind;
use crate::power::ipmi::rakp::Suite;

pub(super) fn random<const N: usize>() -> Result<[u8; N], Trouble> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| {
        Trouble::new(
            ReadErrorKind::Protocol,
            format!("no random numbers from the OS: {e}"),
        )
    })?;
    Ok(b)
}

pub(super) fn checksum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x)).wrapping_neg()
}

/// An IPMI LAN request message to the BMC.
pub(super) fn request_message(netfn: u8, cmd: u8, rq_seq: u8, data: &[u8]) -> Vec<u8> {
    let mut m = vec![BMC_ADDRESS, netfn << 2];
    m.push(checksum(&m));
    m.extend([CONSOLE_ADDRESS, rq_seq << 2, cmd]);
    m.extend_from_slice(data);
    m.push(checksum(&m[3..]));
    m
}

/// The answer in `m` if it is the BMC's response to (netfn, cmd, rq_seq) with both checksums
/// right.
pub(super) fn response_of(m: &[u8], netfn: u8, cmd: u8, rq_seq: u8) -> Option<Answer> {
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
pub(super) fn handshake_packet(payload_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = RMCP_HEADER.to_vec();
    p.extend([AUTH_RMCP_PLUS, payload_type]);
    p.extend([0u8; 8]);
    p.extend((payload.len() as u16).to_le_bytes());
    p.extend_from_slice(payload);
    p
}

/// The payload of an RMCP+ datagram of `payload_type` (all eight bits) with session ID 0.
pub(super) fn handshake_payload(d: &[u8], payload_type: u8) -> Option<&[u8]> {
    if d.len() < 16 || d[..4] != RMCP_HEADER || d[4] != AUTH_RMCP_PLUS || d[5] != payload_type {
        return None;
    }
    let len = usize::from(u16::from_le_bytes([d[14], d[15]]));
    d.get(16..16 + len)
}

/// The payload of the BMC's handshake answer of `payload_type` to our message `tag` for our
/// session `console_id`, its status checked: `None` when the datagram is not that answer.
///
/// A refusal (status other than 0) may be as short as the message tag and the status: ipmi_sim
/// answers an Open Session for a suite it lacks with exactly those two bytes, and other
/// firmware fills the console session ID with zeros. Such an answer cannot be matched to our
/// session beyond its tag, and is taken anyway: a refusal only ever fails the login, it can
/// never make a read say Off. A refusal that names another console session is someone else's,
/// and is dropped. An answer with status 0 must carry our console session ID.
pub(super) fn handshake_answer<'d>(
    d: &'d [u8],
    payload_type: u8,
    tag: u8,
    console_id: u32,
    step: &str,
    login: &Login<'_>,
) -> Option<Result<&'d [u8], Trouble>> {
    let p = handshake_payload(d, payload_type)?;
    if p.len() < 2 || p[0] != tag {
        return None;
    }
    let named = p.get(4..8);
    match p[1] {
        0 if named == Some(&console_id.to_le_bytes()[..]) => Some(Ok(p)),
        0 => None,
        _ if named.is_some_and(|id| id != [0; 4] && id != console_id.to_le_bytes()) => None,
        status => Some(Err(status_trouble(step, status, login))),
    }
}

/// The name IPMI 2.0 (table 13-15) gives an RMCP+ status code.
pub(super) fn status_name(code: u8) -> &'static str {
    match code {
        0x00 => "no errors",
        0x01 => "insufficient resources to create a session",
        0x02 => "invalid session ID",
        0x03 => "invalid payload type",
        0x04 => "invalid authentication algorithm",
        0x05 => "invalid integrity algorithm",
        0x06 => "no matching authentication payload",
        0x07 => "no matching integrity payload",
        0x08 => "inactive session ID",
        0x09 => "invalid role",
        0x0A => "unauthorized role or privilege level requested",
        0x0B => "insufficient resources to create a session at the requested role",
        0x0C => "invalid name length",
        0x0D => "unauthorized name",
        0x0E => "unauthorized GUID",
        0x0F => "invalid integrity check value",
        0x10 => "invalid confidentiality algorithm",
        0x11 => "no cipher suite match with proposed security algorithms",
        0x12 => "illegal or unrecognized parameter",
        _ => "unknown status code",
    }
}

/// Whether a status code refuses the cipher suite itself (its algorithms), so that another
/// suite may do.
pub(super) fn refuses_suite(code: u8) -> bool {
    matches!(code, 0x04..=0x07 | 0x10 | 0x11)
}

/// An RMCP+ status code in a handshake answer (IPMI 2.0 table 13-15), as a read failure: the
/// code, its name, and what it means here.
pub(super) fn status_trouble(step: &str, code: u8, login: &Login<'_>) -> Trouble {
    let role = role_name(login.privilege);
    let (kind, what) = match code {
        _ if refuses_suite(code) => (
            ReadErrorKind::Protocol,
            format!("the BMC does not offer cipher suite {}", login.suite.id()),
        ),
        0x01 => (
            ReadErrorKind::Protocol,
            "all of the BMC's session slots may be in use".to_string(),
        ),
        0x09 | 0x0A => (
            ReadErrorKind::Auth,
            format!("the user may not log in as {role} (set privilege to its role)"),
        ),
        0x0D => (
            ReadErrorKind::Auth,
            format!("the BMC has no such user, or not with the {role} role"),
        ),
        0x0E => (ReadErrorKind::Auth, "check the BMC's user settings".into()),
        0x0F => (ReadErrorKind::Auth, "wrong password?".into()),
        0x0C => (
            ReadErrorKind::Auth,
            "the user name is refused by the BMC".into(),
        ),
        _ => (ReadErrorKind::Protocol, String::new()),
    };
    let name = status_name(code);
    let detail = if what.is_empty() {
        format!("{step} has status {code:#04x} ({name})")
    } else {
        format!("{step} has status {code:#04x} ({name}): {what}")
    };
    Trouble {
        suite_refused: refuses_suite(code),
        ..Trouble::new(kind, detail)
    }
}

/// What to do when the BMC refused every suite of `tried` (cipher_suite's list, in order).
pub(super) fn suite_advice(tried: &[Suite]) -> String {
    let other = |s: Suite| match s {
        Suite::Seventeen => Suite::Three,
        Suite::Three => Suite::Seventeen,
    };
    match tried {
        [only] => format!(
            "set cipher_suite = {} or [{}, {}], or enable suite {} on the BMC",
            other(*only).id(),
            only.id(),
            other(*only).id(),
            only.id()
        ),
        _ => {
            let ids: Vec<String> = tried.iter().map(|s| s.id().to_string()).collect();
            format!(
                "the BMC offers none of cipher suites {}: enable one of them on the BMC",
                ids.join(" and ")
            )
        }
    }
}

/// The first bytes of a datagram in hex, for an error message.
pub(super) fn hex_head(d: &[u8]) -> String {
    let head: Vec<String> = d.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let more = if d.len() > 12 { " ..." } else { "" };
    format!("{} bytes: {}{more}", d.len(), head.join(" "))
}

pub(super) fn io_trouble(e: &std::io::Error, peer: SocketAddr) -> Trouble {
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
pub(super) struct Wire {
    pub(super) socket: UdpSocket,
    pub(super) peer: SocketAddr,
    pub(super) timing: Timing,
    /// Datagrams dropped: not an answer to the request in flight, or not ours.
    pub(super) stray: u32,
    /// Requests sent again for want of an answer.
    pub(super) resent: u32,
}

impl Wire {
    /// Sends `datagram` and waits for an answer `take` accepts, sending it again after each
    /// `per_try` without one, `resends` times at most. Returns the answer, the first failure `take`
    /// reports, or a timeout naming `what` and the first reason an answer was dropped.
    pub(super) async fn exchange<T>(
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
