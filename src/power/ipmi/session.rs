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
//! This file holds the session and what it does once open (requests, the commands oobfence
//! sends, closing); `login` is the five exchanges that open it, each answer checked field by
//! field, and `wire` the framing, checksums and the socket's bounded, resent exchange.
//!
//! [`rakp`]: super::rakp

use std::time::Duration;

use tokio::time::Instant;

use super::rakp::{BLOCK, Key, SessionKeys, Suite};
use crate::power::ReadErrorKind;

mod login;
#[cfg(test)]
mod tests;
mod wire;

use wire::{Wire, random, request_message, response_of};

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

pub fn role_name(privilege: u8) -> &'static str {
    match privilege {
        USER => "User",
        OPERATOR => "Operator",
        ADMINISTRATOR => "Administrator",
        _ => "an unknown role",
    }
}

impl Session {
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
