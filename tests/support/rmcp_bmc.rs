//! A small RMCP+ BMC of the test suite's own, on 127.0.0.1, for what `ipmi_sim` cannot serve:
//! cipher suite 17 (RAKP-HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128), and suite 3 when a test
//! needs to see inside the BMC. It speaks exactly what a status read needs: Get Channel
//! Authentication Capabilities (IPMI 1.5, session-less), Open Session, RAKP 1–4, and inside a
//! session Set Session Privilege Level, Get Chassis Status, Get System GUID and Close Session,
//! and when a test sets them, Get ACPI Power State and DCMI Get Power Reading; anything else is
//! answered "invalid command" (C1h). Like many real BMCs it ignores the RMCP
//! presence ping.
//!
//! Its crypto is oobfence's own (`oobfence::power::ipmi::rakp`), so it is first checked against
//! ipmitool (tests/ipmi.rs): a client is never tested only against its own reading of the
//! specification.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use oobfence::power::ipmi::rakp::{BLOCK, Exchange, Key, SessionKeys, Suite};
use tokio::net::UdpSocket;

/// Privilege levels as IPMI numbers them.
pub const USER: u8 = 2;
pub const OPERATOR: u8 = 3;
pub const ADMINISTRATOR: u8 = 4;

/// One account of the BMC.
#[derive(Clone, Debug)]
pub struct Account {
    pub name: &'static str,
    pub password: &'static str,
    /// The highest privilege the account may have.
    pub max_privilege: u8,
}

/// The accounts every test BMC has: one per role.
pub const ACCOUNTS: [Account; 3] = [
    Account {
        name: "reader",
        password: "reader-pass",
        max_privilege: USER,
    },
    Account {
        name: "oper",
        password: "operpass",
        max_privilege: OPERATOR,
    },
    Account {
        name: "admin",
        password: "password",
        max_privilege: ADMINISTRATOR,
    },
];

/// What the BMC saw, for tests to check.
#[derive(Default, Debug)]
pub struct Seen {
    /// Sessions activated (RAKP 4 sent with status 0), with the suite and role they run at.
    pub activated: Vec<(u8, u8)>,
    /// Sessions closed by Close Session.
    pub closed: usize,
    /// Commands received inside sessions, as (netfn, cmd).
    pub commands: Vec<(u8, u8)>,
    /// RMCP presence pings received (and ignored).
    pub pings: usize,
}

struct Pending {
    suite: Suite,
    console_session: u32,
    console_random: [u8; 16],
    bmc_random: [u8; 16],
    role: u8,
    username: Vec<u8>,
    kuid: Key,
}

struct Active {
    suite: Suite,
    console_session: u32,
    keys: SessionKeys,
    /// The session's privilege limit (RAKP 1's role) and its level now.
    max_privilege: u8,
    privilege: u8,
    sequence: u32,
}

struct State {
    suites: Vec<Suite>,
    guid: [u8; 16],
    powered_on: AtomicBool,
    pending: Mutex<HashMap<u32, Pending>>,
    active: Mutex<HashMap<u32, Active>>,
    seen: Mutex<Seen>,
    next_session: Mutex<u32>,
    /// Set Session Privilege Level requests go unanswered (a BMC that stalls mid-login).
    silent_on_set_privilege: AtomicBool,
    /// Open Session refusals carry the message tag and the status alone, as ipmi_sim's do.
    brief_refusals: AtomicBool,
    /// The Get ACPI Power State answer's system power state; `None`: the command is not
    /// implemented (C1h).
    acpi: Mutex<Option<u8>>,
    /// The DCMI Get Power Reading answer's current watts and "measurement active" bit; `None`:
    /// the command is not implemented (C1h).
    power_reading: Mutex<Option<(u16, bool)>>,
}

/// A running test BMC; stopped when dropped.
pub struct RmcpBmc {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl RmcpBmc {
    /// A BMC that accepts only `suites`, powered on, whose System GUID is `guid`.
    pub async fn start(suites: &[Suite], guid: [u8; 16]) -> RmcpBmc {
        let socket = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind the test BMC");
        let addr = socket.local_addr().unwrap();
        let state = Arc::new(State {
            suites: suites.to_vec(),
            guid,
            powered_on: AtomicBool::new(true),
            pending: Mutex::default(),
            active: Mutex::default(),
            seen: Mutex::default(),
            next_session: Mutex::new(0x5eed_0001),
            silent_on_set_privilege: AtomicBool::new(false),
            brief_refusals: AtomicBool::new(false),
            acpi: Mutex::new(None),
            power_reading: Mutex::new(None),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(reply) = s.answer(&buf[..n]) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        RmcpBmc { addr, state, task }
    }

    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set_power(&self, on: bool) {
        self.state.powered_on.store(on, Ordering::SeqCst);
    }

    /// Answers Get ACPI Power State with system power state `state` (`None`: C1h, as a BMC
    /// without the command).
    pub fn set_acpi_state(&self, state: Option<u8>) {
        *self.state.acpi.lock().unwrap() = state;
    }

    /// Answers DCMI Get Power Reading with `watts` now, the measurement active or not (`None`:
    /// C1h, as a BMC without DCMI).
    pub fn set_power_reading(&self, reading: Option<(u16, bool)>) {
        *self.state.power_reading.lock().unwrap() = reading;
    }

    /// Leaves every Set Session Privilege Level request unanswered from now on.
    pub fn stall_set_privilege(&self) {
        self.state
            .silent_on_set_privilege
            .store(true, Ordering::SeqCst);
    }

    /// Answers an Open Session for a suite it lacks with the message tag and the status alone
    /// (2 bytes: no role, no console session ID), as ipmi_sim does, from now on.
    pub fn refuse_briefly(&self) {
        self.state.brief_refusals.store(true, Ordering::SeqCst);
    }

    /// What the BMC has seen so far.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.state.seen.lock().unwrap())
    }

    /// Sessions open now.
    pub fn open_sessions(&self) -> usize {
        self.state.active.lock().unwrap().len()
    }
}

impl Drop for RmcpBmc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const RMCP: [u8; 4] = [0x06, 0x00, 0xff, 0x07];

fn checksum(b: &[u8]) -> u8 {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x)).wrapping_neg()
}

/// An IPMI LAN response message to `request` (the request's addresses swapped, its sequence
/// kept), with `completion` and `data`.
fn response(request: &[u8], completion: u8, data: &[u8]) -> Vec<u8> {
    let netfn = request[1] >> 2;
    let header = [request[3], ((netfn + 1) << 2) | (request[4] & 0x03)];
    let mut m = vec![header[0], header[1], checksum(&header)];
    let body_start = m.len();
    m.extend([request[0], request[4] & 0xfc, request[5], completion]);
    m.extend_from_slice(data);
    m.push(checksum(&m[body_start..]));
    m
}

/// An RMCP+ packet: session header (payload type, session ID, sequence), then `payload`.
fn packet(payload_type: u8, session: u32, sequence: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = RMCP.to_vec();
    p.push(0x06);
    p.push(payload_type);
    p.extend(session.to_le_bytes());
    p.extend(sequence.to_le_bytes());
    p.extend((payload.len() as u16).to_le_bytes());
    p.extend_from_slice(payload);
    p
}

fn suite_of(auth: u8, integrity: u8, confidentiality: u8) -> Option<Suite> {
    [Suite::Three, Suite::Seventeen]
        .into_iter()
        .find(|s| s.algorithms() == (auth, integrity, confidentiality))
}

impl State {
    fn answer(&self, d: &[u8]) -> Option<Vec<u8>> {
        if d.len() < 5 || d[0] != RMCP[0] {
            return None;
        }
        match d[3] {
            0x07 => {}
            // ASF: the presence ping. Ignored, as many BMCs do.
            0x06 => {
                self.seen.lock().unwrap().pings += 1;
                return None;
            }
            _ => return None,
        }
        match d[4] {
            0x00 => self.session_less(d),
            0x06 => self.rmcp_plus(d),
            _ => None,
        }
    }

    /// IPMI 1.5 session-less: only Get Channel Authentication Capabilities.
    fn session_less(&self, d: &[u8]) -> Option<Vec<u8>> {
        let len = usize::from(*d.get(13)?);
        let msg = d.get(14..14 + len)?;
        if msg.len() < 7 || msg[1] >> 2 != 0x06 || msg[5] != 0x38 {
            return None;
        }
        // Channel 1; IPMI v2.0 extended data; non-null user names; IPMI 2.0 connections.
        let data = [0x01, 0x80, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00];
        let r = response(msg, 0x00, &data);
        let mut p = RMCP.to_vec();
        p.extend([0x00, 0, 0, 0, 0, 0, 0, 0, 0, r.len() as u8]);
        p.extend(r);
        Some(p)
    }

    fn rmcp_plus(&self, d: &[u8]) -> Option<Vec<u8>> {
        let ty = *d.get(5)?;
        let session = u32::from_le_bytes(d.get(6..10)?.try_into().ok()?);
        let len = usize::from(u16::from_le_bytes(d.get(14..16)?.try_into().ok()?));
        let payload = d.get(16..16 + len)?;
        match ty & 0x3f {
            0x10 => self.open_session(payload),
            0x12 => self.rakp1(payload),
            0x14 => self.rakp3(payload),
            0x00 if ty == 0xc0 => self.in_session(session, d, len),
            _ => None,
        }
    }

    fn open_session(&self, p: &[u8]) -> Option<Vec<u8>> {
        let tag = p[0];
        let console_session = u32::from_le_bytes(p.get(4..8)?.try_into().ok()?);
        let (auth, integrity, conf) = (*p.get(12)?, *p.get(20)?, *p.get(28)?);
        let mut r = vec![tag, 0x00, ADMINISTRATOR, 0x00];
        r.extend(console_session.to_le_bytes());
        let Some(suite) = suite_of(auth, integrity, conf).filter(|s| self.suites.contains(s))
        else {
            r[1] = 0x11; // no cipher suite match
            if self.brief_refusals.load(Ordering::SeqCst) {
                r.truncate(2);
            } else {
                r.extend([0u8; 4]);
            }
            return Some(packet(0x11, 0, 0, &r));
        };
        let bmc_session = {
            let mut n = self.next_session.lock().unwrap();
            *n += 1;
            *n
        };
        r.extend(bmc_session.to_le_bytes());
        for (kind, alg) in [(0u8, auth), (1, integrity), (2, conf)] {
            r.extend([kind, 0, 0, 8, alg, 0, 0, 0]);
        }
        self.pending.lock().unwrap().insert(
            bmc_session,
            Pending {
                suite,
                console_session,
                console_random: [0; 16],
                bmc_random: [0; 16],
                role: 0,
                username: Vec::new(),
                kuid: Key::new(b"").unwrap(),
            },
        );
        Some(packet(0x11, 0, 0, &r))
    }

    fn rakp1(&self, p: &[u8]) -> Option<Vec<u8>> {
        let tag = p[0];
        let bmc_session = u32::from_le_bytes(p.get(4..8)?.try_into().ok()?);
        let console_random: [u8; 16] = p.get(8..24)?.try_into().ok()?;
        let role = *p.get(24)?;
        let name_len = usize::from(*p.get(27)?);
        let username = p.get(28..28 + name_len)?.to_vec();
        let mut pending = self.pending.lock().unwrap();
        let s = pending.get_mut(&bmc_session)?;
        let mut r = vec![tag, 0x00, 0, 0];
        r.extend(s.console_session.to_le_bytes());
        let account = ACCOUNTS.iter().find(|a| a.name.as_bytes() == username);
        let status = match account {
            None => 0x0d,                                     // unauthorized name
            Some(a) if role & 0x0f > a.max_privilege => 0x0a, // unauthorized role
            Some(_) => 0x00,
        };
        if status != 0 {
            r[1] = status;
            pending.remove(&bmc_session);
            return Some(packet(0x13, 0, 0, &r));
        }
        let account = account.expect("found");
        s.console_random = console_random;
        s.bmc_random = std::array::from_fn(|i| {
            (bmc_session as u8)
                .wrapping_mul(31)
                .wrapping_add(i as u8 * 7)
        });
        s.role = role;
        s.username = username;
        s.kuid = Key::new(account.password.as_bytes()).expect("a short password");
        let ex = Exchange {
            console_session: s.console_session,
            bmc_session,
            console_random,
            bmc_random: s.bmc_random,
            bmc_guid: self.guid,
            role,
            username: &s.username,
        };
        r.extend(s.bmc_random);
        r.extend(self.guid);
        r.extend(ex.rakp2_code(s.suite, &s.kuid));
        Some(packet(0x13, 0, 0, &r))
    }

    fn rakp3(&self, p: &[u8]) -> Option<Vec<u8>> {
        let tag = p[0];
        let bmc_session = u32::from_le_bytes(p.get(4..8)?.try_into().ok()?);
        let s = self.pending.lock().unwrap().remove(&bmc_session)?;
        let ex = Exchange {
            console_session: s.console_session,
            bmc_session,
            console_random: s.console_random,
            bmc_random: s.bmc_random,
            bmc_guid: self.guid,
            role: s.role,
            username: &s.username,
        };
        let mut r = vec![tag, 0x00, 0, 0];
        r.extend(s.console_session.to_le_bytes());
        if p[1] != 0 || ex.rakp3_code(s.suite, &s.kuid) != p.get(8..)? {
            r[1] = 0x0f; // invalid integrity check value
            return Some(packet(0x15, 0, 0, &r));
        }
        let sik = ex.sik(s.suite, &s.kuid);
        r.extend(ex.rakp4_icv(s.suite, &sik));
        let role = s.role & 0x0f;
        self.seen
            .lock()
            .unwrap()
            .activated
            .push((s.suite.id(), role));
        self.active.lock().unwrap().insert(
            bmc_session,
            Active {
                suite: s.suite,
                console_session: s.console_session,
                keys: SessionKeys::new(s.suite, &sik),
                max_privilege: role,
                // A session starts at User level (IPMI 2.0 §13.14).
                privilege: USER,
                sequence: 0,
            },
        );
        Some(packet(0x15, 0, 0, &r))
    }

    fn in_session(&self, bmc_session: u32, d: &[u8], len: usize) -> Option<Vec<u8>> {
        let mut active = self.active.lock().unwrap();
        let s = active.get_mut(&bmc_session)?;
        let tag = s.suite.tag_len();
        if d.len() < 16 + len + tag + 2
            || !s
                .keys
                .auth_code_matches(&d[4..d.len() - tag], &d[d.len() - tag..])
        {
            return None; // A packet that does not check out is dropped, as BMCs do.
        }
        let msg = s.keys.open(&d[16..16 + len]).ok()?;
        if msg.len() < 7 {
            return None;
        }
        let (netfn, cmd) = (msg[1] >> 2, msg[5]);
        self.seen.lock().unwrap().commands.push((netfn, cmd));
        let data = &msg[6..msg.len() - 1];
        let mut close = false;
        let reply = match (netfn, cmd) {
            // Set Session Privilege Level.
            (0x06, 0x3b) if self.silent_on_set_privilege.load(Ordering::SeqCst) => return None,
            (0x06, 0x3b) => {
                let want = data.first().copied().unwrap_or(0);
                if want == 0 {
                    response(&msg, 0, &[s.privilege])
                } else if want > s.max_privilege {
                    response(&msg, 0x81, &[])
                } else {
                    s.privilege = want;
                    response(&msg, 0, &[want])
                }
            }
            // Get Chassis Status: byte 1 bit 0 is power; User level is enough.
            (0x00, 0x01) => {
                let on = u8::from(self.powered_on.load(Ordering::SeqCst));
                response(&msg, 0, &[on, 0x00, 0x00])
            }
            // Get System GUID.
            (0x06, 0x37) => response(&msg, 0, &self.guid),
            // Get ACPI Power State: system, then device power state.
            (0x06, 0x07) => match *self.acpi.lock().unwrap() {
                Some(state) => response(&msg, 0, &[state, 0x00]),
                None => response(&msg, 0xc1, &[]),
            },
            // DCMI Get Power Reading (group DCh): current, min, max, average watts, timestamp,
            // period, state (bit 6: measurement active).
            (0x2c, 0x02) if data.first() == Some(&0xdc) => {
                match *self.power_reading.lock().unwrap() {
                    Some((watts, active)) => {
                        let w = watts.to_le_bytes();
                        let mut d = vec![0xdc];
                        for _ in 0..4 {
                            d.extend(w);
                        }
                        d.extend([0u8; 8]);
                        d.push(if active { 0x40 } else { 0x00 });
                        response(&msg, 0, &d)
                    }
                    None => response(&msg, 0xc1, &[]),
                }
            }
            // Close Session.
            (0x06, 0x3c) => {
                close = true;
                response(&msg, 0, &[])
            }
            _ => response(&msg, 0xc1, &[]),
        };
        s.sequence += 1;
        let iv: [u8; BLOCK] = std::array::from_fn(|i| (s.sequence as u8).wrapping_add(i as u8));
        let sealed = s.keys.seal(iv, &reply);
        let mut p = packet(0xc0, s.console_session, s.sequence, &sealed);
        // Integrity pad: from AuthType to Next Header a multiple of 4 bytes.
        let unpadded = p.len() - 4 + 2;
        let pad = (4 - unpadded % 4) % 4;
        p.extend(std::iter::repeat_n(0xffu8, pad));
        p.push(pad as u8);
        p.push(0x07);
        let code = s.keys.auth_code(&p[4..]);
        p.extend(code);
        if close {
            active.remove(&bmc_session);
            self.seen.lock().unwrap().closed += 1;
        }
        Some(p)
    }
}
