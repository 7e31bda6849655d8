//! The IPMI (RMCP+) power source against real BMC simulators (OpenIPMI's `ipmi_sim`),
//! cross-checked with `ipmitool`; against peers that misbehave at the UDP level (nothing
//! listening, silence, nonsense, a replaying man in the middle); and end to end through the
//! CLI and the daemon on a real kube-apiserver.
//!
//! This file is the rig (entries built through the config parser, the UDP peers and relays
//! tests put between oobfence and a BMC); the tests live by family in `tests/ipmi/`: reads,
//! sessions, suites, errors, binary, against_ipmitool, native_session.

mod support;

#[path = "ipmi/actions.rs"]
mod actions;
#[path = "ipmi/against_ipmitool.rs"]
mod against_ipmitool;
#[path = "ipmi/binary.rs"]
mod binary;
#[path = "ipmi/errors.rs"]
mod errors;
#[path = "ipmi/native_session.rs"]
mod native_session;
#[path = "ipmi/reads.rs"]
mod reads;
#[path = "ipmi/sessions.rs"]
mod sessions;
#[path = "ipmi/suites.rs"]
mod suites;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use futures::future::join_all;
use std::time::{Duration, Instant};

use oobfence::config::BmcEntry;
use oobfence::identity::{MachineIdentity, NodeIdentity, verify};
use oobfence::power::ipmi::IpmiSource;
use oobfence::power::{PowerSource, PowerState, ReadErrorKind};
use support::cli::oobfence;
use support::ipmi_sim::{self, IpmiSim};
use support::scenario::{Scenario, parsed_bmc_entry};

/// ipmi_sim speaks cipher suite 3 only (oobfence's default is 17).
const SUITE_3: &str = "cipher_suite = 3\n";

/// A `[[bmc]]` entry built through the real config parser, for ipmi_sim's suite 3 unless
/// `extra` names a suite. `extra` adds TOML keys.
fn bmc(dir: &Path, address: &str, user: &str, password: &str, extra: &str) -> BmcEntry {
    let suite = if extra.contains("cipher_suite") {
        ""
    } else {
        SUITE_3
    };
    parsed_bmc_entry(
        "ipmi",
        dir,
        address,
        user,
        password,
        &format!("{suite}{extra}"),
    )
}

fn admin_source(sim: &IpmiSim, extra: &str) -> IpmiSource {
    let e = bmc(
        sim.dir(),
        &sim.address(),
        ipmi_sim::USERNAME,
        ipmi_sim::PASSWORD,
        extra,
    );
    IpmiSource::new(&e, "n1").unwrap_or_else(|e| panic!("IpmiSource::new: {e}"))
}

fn error_of(state: &PowerState) -> (ReadErrorKind, &str) {
    match state {
        PowerState::Error { kind, detail } => (*kind, detail.as_str()),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn label(state: &PowerState) -> &'static str {
    state.label()
}

/// How a test peer answers a datagram: with these bytes, or not at all.
type Answer = fn(&[u8]) -> Option<Vec<u8>>;

/// A UDP peer on loopback that answers every datagram with `answer(datagram)` (or nothing, for
/// `None`), in a thread bounded by a stop flag, 60 s and 1000 datagrams. Counts what it got.
struct Peer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    got: Arc<AtomicU32>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Peer {
    fn start(answer: Answer) -> Peer {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(AtomicU32::new(0));
        let (s, g) = (stop.clone(), got.clone());
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut buf = [0u8; 4096];
            let mut handled = 0;
            while !s.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    g.fetch_add(1, Ordering::Relaxed);
                    if let Some(reply) = answer(&buf[..n]) {
                        let _ = socket.send_to(&reply, from);
                    }
                    handled += 1;
                    if handled >= 1000 {
                        return;
                    }
                }
            }
        });
        Peer {
            addr,
            stop,
            got,
            thread: Some(thread),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn source_at(dir: &Path, address: &str, extra: &str) -> IpmiSource {
    let e = bmc(dir, address, "admin", "Peer-S3cret-pw", extra);
    IpmiSource::new(&e, "n1").unwrap()
}

/// What a [`Relay`] does with one datagram from oobfence.
enum Pass {
    /// Send it on to the BMC.
    Forward,
    /// Lose it.
    Drop,
    /// Answer it in the BMC's place.
    Answer(Vec<u8>),
}

/// A UDP relay between oobfence and a real BMC that lets a test tamper with the traffic:
/// `to_bmc` decides about each request, `to_client` sees each answer before it goes back.
/// Stops when dropped, and after 60 s whatever happens.
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(
        bmc: SocketAddr,
        mut to_bmc: impl FnMut(&[u8]) -> Pass + Send + 'static,
        mut to_client: impl FnMut(&[u8]) + Send + 'static,
    ) -> Relay {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        let back = UdpSocket::bind("127.0.0.1:0").unwrap();
        back.connect(bmc).unwrap();
        front.set_nonblocking(true).unwrap();
        back.set_nonblocking(true).unwrap();
        let addr = front.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut buf = [0u8; 2048];
            let mut client = None;
            while !s.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                let mut idle = true;
                if let Ok((n, from)) = front.recv_from(&mut buf) {
                    idle = false;
                    client = Some(from);
                    match to_bmc(&buf[..n]) {
                        Pass::Forward => {
                            let _ = back.send(&buf[..n]);
                        }
                        Pass::Drop => {}
                        Pass::Answer(reply) => {
                            let _ = front.send_to(&reply, from);
                        }
                    }
                }
                if let Ok(n) = back.recv(&mut buf) {
                    idle = false;
                    to_client(&buf[..n]);
                    if let Some(c) = client {
                        let _ = front.send_to(&buf[..n], c);
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Relay {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn in_session(d: &[u8]) -> bool {
    d.len() > 6 && d[3] == 0x07 && d[4] == 0x06 && d[5] == 0xC0
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().unwrap()
}
