//! The IPMI (RMCP+) power source against real BMC simulators (OpenIPMI's `ipmi_sim`),
//! cross-checked with `ipmitool`; against peers that misbehave at the UDP level (nothing
//! listening, silence, nonsense, a replaying man in the middle); and end to end through the
//! CLI and the daemon on a real kube-apiserver.

mod support;

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

/// Reads through oobfence and through ipmitool; both must say `want`, and oobfence must
/// report the simulator's System GUID.
async fn both_say(src: &IpmiSource, sim: &IpmiSim, want: PowerState) -> Duration {
    let start = Instant::now();
    let reply = src.read_reply().await;
    let took = start.elapsed();
    let details = reply.details;
    assert_eq!(reply.state, want, "details: {details:?}");
    assert_eq!(
        reply.identity,
        MachineIdentity::SystemUuid {
            forms: sim.uuid_forms(),
            serial: None
        }
    );
    assert_eq!(
        sim.ipmitool_power(),
        label(&want),
        "ipmitool disagrees with oobfence"
    );
    let names: Vec<&str> = details.iter().map(|d| d.name.as_str()).collect();
    let mut expected = vec![
        "chassis power faults",
        "last power event",
        "chassis status bytes",
        "session",
    ];
    if want == PowerState::Off {
        // ipmi_sim has no Get ACPI Power State: an off chassis says it cannot tell.
        expected.push("ACPI power state");
        assert!(details[4].value.starts_with("cannot tell"), "{details:?}");
    }
    assert_eq!(names, expected);
    assert_eq!(details[0].value, "none", "{details:?}");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_off_and_flips_as_ipmitool_does() {
    let sim = IpmiSim::start();
    let src = admin_source(&sim, "");
    assert_eq!(src.backend(), "ipmi");
    assert_eq!(src.address(), sim.address());

    let first = both_say(&src, &sim, PowerState::On).await;
    let again = both_say(&src, &sim, PowerState::On).await;
    sim.set_power(false);
    let off = both_say(&src, &sim, PowerState::Off).await;
    sim.set_power(true);
    both_say(&src, &sim, PowerState::On).await;
    sim.set_power(false);
    both_say(&src, &sim, PowerState::Off).await;
    sim.set_power(true);
    both_say(&src, &sim, PowerState::On).await;
    eprintln!("ipmi_sim read latency: new session {first:?}, kept session {again:?} and {off:?}");
    // One session was kept for all of them.
    assert_eq!(sim.other_sessions(), 1);
    // It runs at the User privilege level it started with: oobfence only reads.
    let privileges = sim.session_privileges();
    assert!(
        privileges.iter().any(|p| p == "USER"),
        "sessions: {privileges:?}"
    );
    drop(src);
    // Dropping the last source closes its session on the BMC.
    assert_eq!(sim.other_sessions(), 0);
}

// --- identity: Get System GUID ------------------------------------------------------------------

/// The bytes of `ipmitool raw` output (`" 00 11 22 ..."`, possibly over several lines).
fn raw_bytes(out: &str) -> Vec<u8> {
    out.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{h:?} in {out:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_reply_reports_the_simulators_system_guid() {
    let sim = IpmiSim::start_with_guid("00112233445566778899AABBCCDDEEFF");
    // What ipmi_sim sends for that `guid` line: the bytes as written, no reordering.
    let raw = raw_bytes(&sim.ipmitool(&["raw", "0x06", "0x37"]));
    assert_eq!(raw, sim.guid_bytes(), "ipmitool raw 0x06 0x37");
    assert_eq!(
        raw,
        (0..16).map(|i| i * 0x11).collect::<Vec<u8>>(),
        "ipmi_sim reordered its GUID"
    );
    assert_eq!(sim.uuid(), "00112233-4455-6677-8899-aabbccddeeff");

    let src = admin_source(&sim, "");
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    let MachineIdentity::SystemUuid { forms, serial } = &reply.identity else {
        panic!("{:?}", reply.identity);
    };
    assert_eq!(serial, &None);
    // The bytes in the order sent (RFC 4122), with the first three fields swapped (SMBIOS) and
    // all sixteen reversed (IPMI): a node whose kubelet reports any of them is this machine.
    assert_eq!(
        forms,
        &[
            "33221100-5544-7766-8899-aabbccddeeff",
            "ffeeddcc-bbaa-9988-7766-554433221100",
            "00112233-4455-6677-8899-aabbccddeeff",
        ]
    );
    assert!(forms.contains(&sim.uuid()));
    let node = |uuid: &str| NodeIdentity {
        system_uuid: uuid.into(),
        addresses: Vec::new(),
        uuid_shared_with: Vec::new(),
    };
    assert!(verify(&node(&sim.uuid()), &reply.identity).is_match());
    assert!(
        verify(
            &node("33221100-5544-7766-8899-AABBCCDDEEFF"),
            &reply.identity
        )
        .is_match()
    );

    // The GUID rides in the power read's session: an Off read carries it the same way, and
    // the BMC still holds one session.
    sim.set_power(false);
    let off = src.read_reply().await;
    assert_eq!(off.state, PowerState::Off);
    assert_eq!(off.identity, reply.identity);
    assert_eq!(sim.other_sessions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_simulators_with_different_guids_are_different_machines() {
    let a = IpmiSim::start();
    let b = IpmiSim::start();
    assert_ne!(a.guid_bytes(), b.guid_bytes());
    let read_a = admin_source(&a, "").read_reply().await;
    let read_b = admin_source(&b, "").read_reply().await;
    assert_eq!(
        (&read_a.state, &read_b.state),
        (&PowerState::On, &PowerState::On)
    );
    let forms = |identity: &MachineIdentity| match identity {
        MachineIdentity::SystemUuid { forms, .. } => forms.clone(),
        other => panic!("{other:?}"),
    };
    let (forms_a, forms_b) = (forms(&read_a.identity), forms(&read_b.identity));
    assert_eq!(forms_a, a.uuid_forms());
    assert_eq!(forms_b, b.uuid_forms());
    assert!(
        forms_a.iter().all(|f| !forms_b.contains(f)),
        "{forms_a:?} vs {forms_b:?}"
    );
    // A node mapped to the wrong BMC is told apart.
    let node_a = NodeIdentity {
        system_uuid: a.uuid(),
        addresses: Vec::new(),
        uuid_shared_with: Vec::new(),
    };
    assert!(verify(&node_a, &read_a.identity).is_match());
    let wrong = verify(&node_a, &read_b.identity);
    assert_eq!(wrong.label(), "mismatch", "{wrong}");
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

fn open_session_request(d: &[u8]) -> bool {
    d.len() > 6 && d[3] == 0x07 && d[4] == 0x06 && d[5] == 0x10
}

/// A relay that counts the RMCP+ sessions opened through it (Open Session Requests) and,
/// while `drop_guid` is set, swallows the second in-session request of each session (Get
/// System GUID: the first is Get Chassis Status) and every resend of it.
struct GuidSwallower {
    addr: SocketAddr,
    opened: Arc<AtomicU32>,
    swallowed: Arc<AtomicU32>,
    drop_guid: Arc<AtomicBool>,
    _relay: Relay,
}

impl GuidSwallower {
    fn start(bmc: SocketAddr) -> GuidSwallower {
        let opened = Arc::new(AtomicU32::new(0));
        let swallowed = Arc::new(AtomicU32::new(0));
        let drop_guid = Arc::new(AtomicBool::new(false));
        let (o, w, d) = (opened.clone(), swallowed.clone(), drop_guid.clone());
        let mut requests = 0;
        let mut victim: Option<Vec<u8>> = None;
        let relay = Relay::start(
            bmc,
            move |req| {
                if open_session_request(req) {
                    o.fetch_add(1, Ordering::Relaxed);
                    requests = 0;
                }
                if victim.as_deref() == Some(req) {
                    w.fetch_add(1, Ordering::Relaxed);
                    return Pass::Drop;
                }
                if in_session(req) {
                    requests += 1;
                    if requests == 2 && d.load(Ordering::Relaxed) {
                        victim = Some(req.to_vec());
                        w.fetch_add(1, Ordering::Relaxed);
                        return Pass::Drop;
                    }
                }
                Pass::Forward
            },
            |_| {},
        );
        GuidSwallower {
            addr: relay.addr,
            opened,
            swallowed,
            drop_guid,
            _relay: relay,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guid_question_keeps_the_session_and_its_silence_costs_only_the_identity() {
    let sim = IpmiSim::start();
    let relay = GuidSwallower::start(format!("127.0.0.1:{}", sim.port()).parse().unwrap());
    let e = bmc(
        sim.dir(),
        &relay.addr.to_string(),
        ipmi_sim::USERNAME,
        ipmi_sim::PASSWORD,
        "timeout = \"2s\"",
    );
    let src = IpmiSource::new(&e, "n1").unwrap();
    let want = MachineIdentity::SystemUuid {
        forms: sim.uuid_forms(),
        serial: None,
    };

    // Three reads, chassis status and GUID each, through the one session opened first.
    for _ in 0..3 {
        let reply = src.read_reply().await;
        assert_eq!(reply.state, PowerState::On, "{reply:?}");
        assert_eq!(reply.identity, want);
    }
    assert_eq!(relay.opened.load(Ordering::Relaxed), 1, "sessions opened");
    drop(src);
    // Let the answer to its Close Session pass the relay first: the relay sends every answer to
    // its latest client, and the next source's ping must not get it.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A BMC that never answers Get System GUID: the power state is still read, within the
    // deadline, with no identity; the session, whose last request went unanswered, is closed.
    let src = IpmiSource::new(&e, "n1").unwrap();
    relay.drop_guid.store(true, Ordering::Relaxed);
    sim.set_power(false);
    let start = Instant::now();
    let reply = src.read_reply().await;
    let took = start.elapsed();
    relay.drop_guid.store(false, Ordering::Relaxed);
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    let MachineIdentity::Unreported { reason } = &reply.identity else {
        panic!("{:?}", reply.identity);
    };
    assert!(reason.starts_with("Get System GUID failed: "), "{reason}");
    assert!(reason.contains("within the deadline"), "{reason}");
    assert!(!reason.contains(ipmi_sim::PASSWORD), "{reason}");
    // One request and its two resends.
    assert_eq!(relay.swallowed.load(Ordering::Relaxed), 3);
    // Within the deadline: bounded by twice the read's, for a loaded machine's late timers.
    assert!(took < Duration::from_millis(4000), "{took:?}");
    assert_eq!(sim.other_sessions(), 0, "the failed session was kept");
    // The next read opens a new session and has its identity back.
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off);
    assert_eq!(reply.identity, want);
    assert_eq!(relay.opened.load(Ordering::Relaxed), 3, "sessions opened");
    assert_eq!(sim.other_sessions(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_auth_and_never_shown() {
    let sim = IpmiSim::start();
    let wrong = "Wr0ng-but-S3cret";
    let e = bmc(sim.dir(), &sim.address(), ipmi_sim::USERNAME, wrong, "");
    let src = IpmiSource::new(&e, "n1").unwrap();
    let start = Instant::now();
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(detail.contains("password"), "{detail}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    for text in [
        state.to_string(),
        format!("{state:?}"),
        format!("{src:?}"),
        format!("{e:?}"),
    ] {
        assert!(!text.contains(wrong), "password leaked: {text}");
    }
    assert_eq!(sim.other_sessions(), 0, "a refused login leaves no session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_user_is_auth() {
    let sim = IpmiSim::start();
    let e = bmc(sim.dir(), &sim.address(), "nobody", ipmi_sim::PASSWORD, "");
    let state = IpmiSource::new(&e, "n1").unwrap().read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(detail.contains("no such user"), "{detail}");
}

/// An Operator-only account reads as Operator and as User (the default), its session at that
/// level as ipmi_sim reports it. (ipmi_sim grants such an account Administrator too when asked
/// by name alone, as ipmitool asks: the test BMC, which refuses it, checks that refusal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_account_reads_as_operator_and_as_user() {
    let sim = IpmiSim::start();
    let source = |privilege: &str| {
        let extra = if privilege.is_empty() {
            String::new()
        } else {
            format!("privilege = \"{privilege}\"")
        };
        let e = bmc(
            sim.dir(),
            &sim.address(),
            ipmi_sim::OPERATOR,
            ipmi_sim::OPERATOR_PASSWORD,
            &extra,
        );
        IpmiSource::new(&e, "n1").unwrap()
    };
    for (privilege, level) in [("operator", "OPERATOR"), ("", "USER")] {
        let src = source(privilege);
        assert_eq!(src.read().await, PowerState::On, "as {privilege:?}");
        // Ours (kept for the next read) and ipmitool's own, which asks as Administrator.
        let mut levels = sim.session_privileges();
        levels.sort();
        assert_eq!(levels, ["ADMINISTRATOR", level], "as {privilege:?}");
        drop(src);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sim.other_sessions(), 0, "closed when its source went");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_unreachable_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = ipmi_sim::free_udp_port();
    let src = source_at(dir.path(), &format!("127.0.0.1:{port}"), "timeout = \"3s\"");
    let start = Instant::now();
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Unreachable, "{detail}");
    assert!(detail.contains("port unreachable"), "{detail}");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_times_out_within_the_deadline_after_resending() {
    let peer = Peer::start(|_| None);
    let dir = tempfile::tempdir().unwrap();
    let src = source_at(dir.path(), &peer.addr.to_string(), "timeout = \"1s\"");
    let start = Instant::now();
    let state = src.read().await;
    let took = start.elapsed();
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Timeout, "{detail}");
    assert!(
        detail.contains("Get Channel Authentication Capabilities: no answer"),
        "{detail}"
    );
    assert!(took >= Duration::from_millis(900), "{took:?}");
    // Within the 1 s deadline: bounded by 2.5 s, for a loaded machine's late timers.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    // The ping went out three times: once, then twice more while no answer came.
    assert_eq!(peer.got.load(Ordering::Relaxed), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_answers_are_bad_replies_at_once() {
    let answers: [Answer; 4] = [
        |_| Some(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()),
        |_| Some(vec![0x06; 2000]),
        // An ASF pong cut short after its header.
        |_| {
            Some(vec![
                0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x40, 0xC8, 0x00, 0x10,
            ])
        },
        // A full-length pong that answers another ping (wrong message tag).
        |_| {
            let mut d = vec![
                0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x40, 0x01, 0x00,
            ];
            d.push(0x10);
            d.extend([
                0x00, 0x00, 0x11, 0xBE, 0, 0, 0, 0, 0x81, 0x00, 0, 0, 0, 0, 0, 0,
            ]);
            Some(d)
        },
    ];
    for answer in answers {
        let peer = Peer::start(answer);
        let dir = tempfile::tempdir().unwrap();
        let src = source_at(dir.path(), &peer.addr.to_string(), "timeout = \"5s\"");
        let start = Instant::now();
        let state = src.read().await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, ReadErrorKind::BadReply, "{detail}");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert!(!detail.contains("Peer-S3cret-pw"), "{detail}");
    }
}

/// A man in the middle between oobfence and a real BMC that, once armed, answers every
/// in-session request with the first in-session answer it saw (a genuine, authenticated,
/// but old answer).
struct Replayer {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    replays: Arc<AtomicU32>,
    _relay: Relay,
}

impl Replayer {
    fn start(bmc: SocketAddr) -> Replayer {
        let armed = Arc::new(AtomicBool::new(false));
        let replays = Arc::new(AtomicU32::new(0));
        let recorded: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Arc::default();
        let (a, r, seen) = (armed.clone(), replays.clone(), recorded.clone());
        let relay = Relay::start(
            bmc,
            move |req| {
                let old = recorded.lock().unwrap().clone();
                match old {
                    Some(old) if a.load(Ordering::Relaxed) && in_session(req) => {
                        r.fetch_add(1, Ordering::Relaxed);
                        Pass::Answer(old)
                    }
                    _ => Pass::Forward,
                }
            },
            move |reply| {
                let mut first = seen.lock().unwrap();
                if first.is_none() && in_session(reply) {
                    *first = Some(reply.to_vec());
                }
            },
        );
        Replayer {
            addr: relay.addr,
            armed,
            replays,
            _relay: relay,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_old_off_answer_is_refused() {
    let sim = IpmiSim::start();
    let mitm = Replayer::start(format!("127.0.0.1:{}", sim.port()).parse().unwrap());
    let e = bmc(
        sim.dir(),
        &mitm.addr.to_string(),
        ipmi_sim::USERNAME,
        ipmi_sim::PASSWORD,
        "timeout = \"2s\"",
    );
    let src = IpmiSource::new(&e, "n1").unwrap();
    sim.set_power(false);
    assert_eq!(src.read().await, PowerState::Off);
    // The machine comes back on; the man in the middle replays the authenticated Off answer.
    sim.set_power(true);
    mitm.armed.store(true, Ordering::Relaxed);
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::BadReply, "{detail}");
    // The kept session refuses it by its sequence number, a new one by its session ID.
    assert!(detail.contains("replayed or reordered"), "{detail}");
    assert!(detail.contains("not ours"), "{detail}");
    assert!(mitm.replays.load(Ordering::Relaxed) >= 2);
    // Let the Close Session requests of the refused sessions pass the (still armed) relay
    // before it is disarmed: it sends every answer to its latest client.
    tokio::time::sleep(Duration::from_millis(200)).await;
    mitm.armed.store(false, Ordering::Relaxed);
    assert_eq!(src.read().await, PowerState::On);
    assert_eq!(sim.ipmitool_power(), "on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_per_bmc_whatever_the_concurrency() {
    let sim = IpmiSim::start();
    let a = Arc::new(admin_source(&sim, ""));
    let reads = join_all((0..8).map(|_| a.read())).await;
    assert!(reads.iter().all(|r| *r == PowerState::On), "{reads:?}");
    assert_eq!(sim.other_sessions(), 1);
    // A second source for the same BMC takes the slot over: still one session.
    let b = admin_source(&sim, "");
    let both = join_all([a.read(), b.read(), a.read(), b.read()]).await;
    assert!(both.iter().all(|r| *r == PowerState::On), "{both:?}");
    assert_eq!(sim.other_sessions(), 1);
    drop(a);
    assert_eq!(sim.other_sessions(), 1, "b still holds the slot");
    drop(b);
    assert_eq!(sim.other_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bmc_that_forgot_the_session_is_read_through_a_new_one() {
    let mut sim = IpmiSim::start();
    let src = admin_source(&sim, "timeout = \"2s\"");
    assert_eq!(src.read().await, PowerState::On);
    sim.restart();
    sim.set_power(false);
    let start = Instant::now();
    let state = src.read().await;
    let took = start.elapsed();
    assert_eq!(state, PowerState::Off, "after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(sim.other_sessions(), 1);
    eprintln!("read after a BMC restart took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_bmcs_read_concurrently_without_session_leaks() {
    let started = Instant::now();
    let sims: Vec<IpmiSim> = (0..20).map(|_| IpmiSim::start()).collect();
    eprintln!("20 simulators up in {:?}", started.elapsed());
    for sim in sims.iter().step_by(2) {
        sim.set_power(false);
    }
    let sources: Vec<IpmiSource> = sims.iter().map(|s| admin_source(s, "")).collect();
    let want = |i: usize| {
        if i.is_multiple_of(2) {
            PowerState::Off
        } else {
            PowerState::On
        }
    };
    let mut rounds = Vec::new();
    for round in 0..5 {
        let start = Instant::now();
        let reads = join_all(sources.iter().map(|s| s.read())).await;
        rounds.push(start.elapsed());
        for (i, r) in reads.iter().enumerate() {
            assert_eq!(*r, want(i), "round {round}, BMC {i}");
        }
    }
    eprintln!("20 concurrent reads per round: {rounds:?}");
    let counts: Vec<u32> = sims.iter().map(|s| s.other_sessions()).collect();
    eprintln!("sessions per simulator after 100 reads: {counts:?}");
    assert!(counts.iter().all(|&c| c == 1), "{counts:?}");
    for (i, sim) in sims.iter().enumerate() {
        assert_eq!(sim.ipmitool_power(), label(&want(i)), "BMC {i}");
    }
    drop(sources);
    let counts: Vec<u32> = sims.iter().map(|s| s.other_sessions()).collect();
    assert!(counts.iter().all(|&c| c == 0), "left open: {counts:?}");
}

// --- the binary: probe and check-config ----------------------------------------------------

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ipmi_config(dir: &Path, kubeconfig: &Path, nodes: &str, address: &str, extra: &str) -> String {
    format!(
        r#"datacenter = "dc1"
[kubernetes]
kubeconfig = "{}"
[server]
listen = "127.0.0.1:{}"
[[bmc]]
nodes = [{nodes}]
protocol = "ipmi"
address = "{address}"
username = "{}"
password_file = "{}"
{}{extra}
"#,
        kubeconfig.display(),
        support::k8s::free_port(),
        ipmi_sim::USERNAME,
        dir.join("pw").display(),
        if extra.contains("cipher_suite") {
            ""
        } else {
            SUITE_3
        },
    )
}

#[test]
fn probe_reads_an_ipmi_node_from_the_config_alone() {
    let sim = IpmiSim::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), format!("{}\n", ipmi_sim::PASSWORD)).unwrap();
    let path = dir.path().join("dc1.toml");
    // No kubeconfig exists: probe must not need the cluster for a BMC-mapped node.
    let kubeconfig = dir.path().join("kubeconfig");
    let cfg = ipmi_config(dir.path(), &kubeconfig, "\"rack1-01\"", &sim.address(), "");
    std::fs::write(&path, cfg).unwrap();

    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with("rack1-01: On"), "{out}");
    assert!(out.contains(&format!("ipmi {}", sim.address())), "{out}");
    // Logged in as the default role with the entry's suite, and says so.
    assert!(out.contains("session: cipher suite 3, User"), "{out}");

    sim.set_power(false);
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert!(
        text(&o.stdout).starts_with("rack1-01: Off"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(sim.ipmitool_power(), "off");
    // Each probe closed its session on the way out.
    assert_eq!(sim.other_sessions(), 0);

    std::fs::write(dir.path().join("pw"), "Wr0ng-pw-4711\n").unwrap();
    let o = oobfence(&["probe", "rack1-01"], &path);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("auth"), "{err}");
    assert!(!err.contains("Wr0ng-pw-4711"), "{err}");
}

/// What this build cannot do is a config error: exit 2, one line naming file and key.
#[test]
fn unsupported_ipmi_settings_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw"), "sup3r-secret-pw\n").unwrap();
    // check-config also checks the kubeconfig `run` would use: one it can load (no cluster
    // is contacted).
    let kubeconfig = dir.path().join("kubeconfig");
    support::k8s::write_offline_kubeconfig(&kubeconfig);
    let good = ipmi_config(
        dir.path(),
        &kubeconfig,
        "\"rack1-*\"",
        "{node}-ipmi.dc1.example",
        "",
    );
    let path = dir.path().join("dc1.toml");
    std::fs::write(&path, &good).unwrap();
    let o = oobfence(&["check-config"], &path);
    assert!(o.status.success(), "{}", text(&o.stderr));

    // Suite 17, 17 then 3, and every role from User up are accepted.
    for (suite, privilege) in [
        ("17", "user"),
        ("[17, 3]", "operator"),
        ("3", "administrator"),
    ] {
        let cfg = good.replace("cipher_suite = 3", &format!("cipher_suite = {suite}"))
            + &format!("privilege = \"{privilege}\"\n");
        std::fs::write(&path, &cfg).unwrap();
        let o = oobfence(&["check-config"], &path);
        assert!(
            o.status.success(),
            "{suite}/{privilege}: {}",
            text(&o.stderr)
        );
    }

    let with = |extra: &str| good.clone() + extra + "\n";
    let suite = |s: &str| good.replace("cipher_suite = 3", &format!("cipher_suite = {s}"));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            suite("5"),
            "bmc[0].cipher_suite",
            "cipher suite 5 is not spoken by oobfence: use 17",
        ),
        (suite("0"), "bmc[0].cipher_suite", "refused"),
        (suite("[3, 3]"), "bmc[0].cipher_suite", "two different ones"),
        (
            with("privilege = \"root\""),
            "bmc[0].privilege",
            "\"root\" is not a privilege",
        ),
        (
            with("system = \"/redfish/v1/Systems/1\""),
            "bmc[0].system",
            "redfish",
        ),
        (
            with("tls_insecure = true"),
            "bmc[0].tls_insecure",
            "redfish",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "ipmi.dc1.example"),
            "bmc[0].address",
            "same machine",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "https://{node}-ipmi.dc1.example"),
            "bmc[0].address",
            "without a scheme",
        ),
        (
            good.replace("{node}-ipmi.dc1.example", "{node}-ipmi.dc1.example:99999"),
            "bmc[0].address",
            "bad port",
        ),
        (
            good.replace(
                "username = \"admin\"",
                "username = \"a-very-long-user-name\"",
            ),
            "bmc[0].username",
            "at most 16",
        ),
    ];
    for (cfg, key, want) in cases {
        std::fs::write(&path, &cfg).unwrap();
        let o = oobfence(&["check-config"], &path);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{key}: {err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(
            err.contains(key) && err.contains(want),
            "{key}/{want}: {err}"
        );
        assert!(!err.contains("sup3r-secret-pw"), "{err}");
    }
    // A password no IPMI 2.0 BMC can hold.
    std::fs::write(dir.path().join("pw"), format!("{}\n", "p".repeat(21))).unwrap();
    std::fs::write(&path, &good).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bmc[0].password_file") && err.contains("21 bytes"),
        "{err}"
    );
    assert!(!err.contains("ppppp"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_reads_ipmi_nodes_of_the_cluster() {
    let s = Scenario::ipmi("ipmiprobe", 1).await;
    let sim = s.ipmi_sim(0);
    let a = s.node("a", 0).await;
    let path = s.write_config(&support::k8s::kubeconfig_path(), "127.0.0.1:0");
    let o = support::cli::oobfence_async(&["check-config", "--probe"], &path).await;
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out} {}", text(&o.stderr));
    let row = out
        .lines()
        .find(|l| l.starts_with(&a.name))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("ipmi") && row.contains(" On"), "{row}");
    assert!(row.contains("match: system UUID"), "{row}");
    // The suite and role the read logged in with (the scenario's entries: 3, Administrator).
    assert!(
        row.contains("ipmi (cipher suite 3, Administrator)"),
        "{row}"
    );
    assert_eq!(sim.other_sessions(), 0);
    a.delete().await;
}

// --- end to end: the daemon on a real kube-apiserver ------------------------------------------

const DECISION: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fences_an_ipmi_node_that_reads_off_never_one_that_reads_on() {
    use oobfence::cluster;
    use support::k8s::{FakeNode, KubeletIdentity, annotation, keep_taint, taints, wait_for};

    let s = Scenario::ipmi("ipmi", 3).await;
    let client = s.client.clone();
    let (off_sim, on_sim) = (s.ipmi_sim(0), s.ipmi_sim(1));
    let other_sim = s.ipmi_sim(2);
    // The kubelets report their SMBIOS UUID; each BMC's System GUID stands for it in one of the
    // byte orders BMCs use (the SMBIOS layout for one, as sent for the other).
    let smbios_form = off_sim.uuid_forms()[0].clone();
    assert_ne!(smbios_form, off_sim.uuid(), "the SMBIOS decoding differs");
    s.map("off", 0);
    let dead_node = s
        .node_reporting("off", "boot-1", KubeletIdentity::uuid(&smbios_form))
        .await;
    let alive_node = s.node("on", 1).await;
    // Mapped to other_sim's BMC, but its kubelet is the machine behind on_sim: a re-cabled BMC.
    s.map("impostor", 2);
    let impostor_node = s
        .node_reporting("impostor", "boot-1", s.identity(1).await)
        .await;
    let (dead, alive, impostor) = (
        dead_node.name.clone(),
        alive_node.name.clone(),
        impostor_node.name.clone(),
    );
    let daemon = s.daemon().await;

    off_sim.set_power(false);
    other_sim.set_power(false);
    dead_node.die("boot-1").await;
    alive_node.die("boot-1").await;
    impostor_node.die("boot-1").await;

    let has_taint = |name: String| {
        let client = client.clone();
        async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
            let n = api.get(&name).await.ok()?;
            FakeNode::has_oos_taint(&n).then_some(n)
        }
    };
    let fenced = wait_for("IPMI node that reads Off is tainted", DECISION, || {
        has_taint(dead.clone())
    })
    .await;
    assert!(taints(&fenced).contains(&keep_taint()));
    assert_eq!(
        annotation(&fenced, cluster::ANNOTATION_FENCED_BOOT_ID).as_deref(),
        Some("boot-1")
    );
    let report = daemon
        .wait_rule(&dead, "fenced-awaiting-recovery", DECISION)
        .await;
    assert_eq!(report["power_source"]["backend"], "ipmi");
    assert_eq!(report["power_source"]["address"], off_sim.address());
    let reads = report["reads"].as_array().unwrap();
    let offs: Vec<_> = reads.iter().filter(|r| r["result"] == "off").collect();
    assert!(
        offs.len() >= 2,
        "fenced on at least two Off reads: {reads:?}"
    );
    let details = offs[0]["details"].to_string();
    assert!(details.contains("chassis power faults: none"), "{details}");
    assert_eq!(off_sim.ipmitool_power(), "off");

    // The node whose BMC says On is blocked and never tainted.
    let report = daemon.wait_rule(&alive, "power-on", DECISION).await;
    assert_eq!(report["state"], "blocked");
    assert_eq!(on_sim.ipmitool_power(), "on");
    // The BMC that answers Off for another machine fences nothing.
    let report = daemon
        .wait_rule(&impostor, "identity-mismatch", DECISION)
        .await;
    assert_eq!(report["state"], "blocked");
    assert!(!FakeNode::has_oos_taint(&impostor_node.get().await));

    // `why` shows the IPMI evidence.
    let out = support::cli::oobfence_async(&["why", &dead], &daemon.config_path).await;
    let why = text(&out.stdout);
    assert!(out.status.success(), "{why} {}", text(&out.stderr));
    assert!(why.contains("ipmi"), "{why}");
    assert!(why.contains("chassis power faults: none"), "{why}");

    // Power back on with a new boot: the fence comes off, as for Redfish nodes.
    off_sim.set_power(true);
    dead_node.come_back("boot-2").await;
    // A live kubelet from now on: the unfence must not race the controller marking the node
    // NotReady again for want of renewals.
    let _back_kubelet = FakeNode::keep_alive(&[&dead_node], "boot-2");
    wait_for("taint removed", DECISION, || {
        let client = client.clone();
        let name = dead.clone();
        async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
            let n = api.get(&name).await.ok()?;
            (!FakeNode::has_oos_taint(&n)).then_some(())
        }
    })
    .await;
    assert!(!FakeNode::has_oos_taint(&alive_node.get().await));
    let metrics = daemon.metrics().await;
    assert!(
        metrics.contains("oobfence_power_reads_total{backend=\"ipmi\",result=\"off\""),
        "{metrics}"
    );
    assert!(!FakeNode::has_oos_taint(&impostor_node.get().await));
    daemon.stop().await;
    dead_node.delete().await;
    alive_node.delete().await;
    impostor_node.delete().await;
    // The daemon closed its sessions when it stopped.
    assert_eq!(off_sim.other_sessions(), 0);
    assert_eq!(on_sim.other_sessions(), 0);
}

/// One datagram the capturing relay passed on.
struct Datagram {
    from_console: bool,
    bytes: Vec<u8>,
}

/// Runs `ipmitool -C 3 -L PRIVILEGE chassis power status` against `sim` through a UDP relay on
/// 127.0.0.1 that records every datagram both ways (bounded: 20 s, 200 datagrams).
async fn ipmitool_through_recorder(
    sim: &IpmiSim,
    user: &str,
    password: &str,
    privilege: &str,
) -> Vec<Datagram> {
    let relay = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let upstream = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    upstream.connect(sim.address()).await.unwrap();
    let port = relay.local_addr().unwrap().port().to_string();
    let mut ipmitool = tokio::process::Command::new(ipmi_sim::which("ipmitool"))
        .args([
            "-I",
            "lanplus",
            "-H",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            user,
            "-P",
        ])
        .args([password, "-C", "3", "-L", privilege, "-N", "1", "-R", "3"])
        .args(["chassis", "power", "status"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run ipmitool");
    let mut stdout = ipmitool.stdout.take().unwrap();
    let mut stderr = ipmitool.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut console = None;
    let (mut a, mut b) = ([0u8; 2048], [0u8; 2048]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        assert!(seen.len() < 200, "ipmitool and ipmi_sim kept talking");
        tokio::select! {
            r = relay.recv_from(&mut a) => {
                let (n, from) = r.unwrap();
                console = Some(from);
                seen.push(Datagram { from_console: true, bytes: a[..n].to_vec() });
                upstream.send(&a[..n]).await.unwrap();
            }
            r = upstream.recv(&mut b) => {
                let n = r.unwrap();
                seen.push(Datagram { from_console: false, bytes: b[..n].to_vec() });
                relay.send_to(&b[..n], console.expect("a reply before any request")).await.unwrap();
            }
            s = ipmitool.wait() => break s.unwrap(),
            _ = tokio::time::sleep_until(deadline) => panic!("ipmitool did not finish in 20 s"),
        }
    };
    use tokio::io::AsyncReadExt;
    let (mut out, mut err) = (String::new(), String::new());
    stdout.read_to_string(&mut out).await.unwrap();
    stderr.read_to_string(&mut err).await.unwrap();
    assert!(status.success(), "ipmitool: {out}{err}");
    assert_eq!(out.trim(), "Chassis Power is on", "{err}");
    seen
}

/// The RMCP+ payload of a datagram (after the RMCP and session headers), if it is one of
/// `payload_type` (low six bits).
fn rmcp_plus(d: &Datagram, payload_type: u8) -> Option<&[u8]> {
    let b = &d.bytes;
    if b.len() < 16 || b[4] != 0x06 || b[5] & 0x3f != payload_type {
        return None;
    }
    let len = usize::from(u16::from_le_bytes([b[14], b[15]]));
    b.get(16..16 + len)
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().unwrap()
}

/// The RMCP+ key exchange and session crypto of `oobfence::power::ipmi::rakp` agree with
/// ipmitool's and ipmi_sim's on a real exchange (suite 3, as Administrator and as Operator):
/// the code ipmi_sim sends in RAKP 2 and the one ipmitool sends in RAKP 3 are the ones the
/// module computes, ipmi_sim's RAKP 4 checks out under the module's SIK, and the first
/// encrypted, signed packet each way verifies and decrypts to a well-formed IPMI message
/// under the module's K1 and K2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keys_agree_with_ipmitool_and_ipmi_sim() {
    use oobfence::power::ipmi::rakp::{Exchange, Key, SessionKeys, Suite};
    let sim = IpmiSim::start();
    for (user, password, privilege) in [
        (ipmi_sim::USERNAME, ipmi_sim::PASSWORD, "ADMINISTRATOR"),
        (ipmi_sim::OPERATOR, ipmi_sim::OPERATOR_PASSWORD, "OPERATOR"),
    ] {
        let seen = ipmitool_through_recorder(&sim, user, password, privilege).await;
        let find = |from_console: bool, ty: u8| {
            seen.iter()
                .filter(|d| d.from_console == from_console)
                .find_map(|d| rmcp_plus(d, ty))
                .unwrap_or_else(|| panic!("no payload type {ty:#x} in the exchange ({user})"))
        };
        let open_req = find(true, 0x10);
        let open_resp = find(false, 0x11);
        let rakp1 = find(true, 0x12);
        let rakp2 = find(false, 0x13);
        let rakp3 = find(true, 0x14);
        let rakp4 = find(false, 0x15);
        assert_eq!(open_resp[1], 0, "Open Session refused ({user})");
        let name_len = usize::from(rakp1[27]);
        let ex = Exchange {
            console_session: u32::from_le_bytes(array(&open_req[4..])),
            bmc_session: u32::from_le_bytes(array(&open_resp[8..])),
            console_random: array(&rakp1[8..]),
            bmc_random: array(&rakp2[8..]),
            bmc_guid: array(&rakp2[24..]),
            role: rakp1[24],
            username: &rakp1[28..28 + name_len],
        };
        assert_eq!(ex.username, user.as_bytes());
        let kuid = Key::new(password.as_bytes()).unwrap();
        let suite = Suite::Three;
        assert!(
            ex.rakp2_matches(suite, &kuid, &rakp2[40..]),
            "ipmi_sim's RAKP 2 code ({user})"
        );
        assert_eq!(ex.rakp2_code(suite, &kuid), &rakp2[40..]);
        assert_eq!(
            ex.rakp3_code(suite, &kuid),
            &rakp3[8..],
            "ipmitool's RAKP 3 code ({user})"
        );
        let sik = ex.sik(suite, &kuid);
        assert!(
            ex.rakp4_matches(suite, &sik, &rakp4[8..]),
            "ipmi_sim's RAKP 4 ({user})"
        );
        let keys = SessionKeys::new(suite, &sik);
        for from_console in [true, false] {
            // The first packet of the session: encrypted (bit 7) and signed (bit 6).
            let d = seen
                .iter()
                .find(|d| {
                    d.from_console == from_console && d.bytes.len() > 16 && d.bytes[5] == 0xc0
                })
                .unwrap_or_else(|| panic!("no session packet ({user}, console {from_console})"));
            let b = &d.bytes;
            let tag = suite.tag_len();
            assert!(
                keys.auth_code_matches(&b[4..b.len() - tag], &b[b.len() - tag..]),
                "AuthCode ({user}, console {from_console})"
            );
            let len = usize::from(u16::from_le_bytes([b[14], b[15]]));
            let msg = keys.open(&b[16..16 + len]).expect("decrypts");
            // An IPMI LAN message: its header checksum holds, and one way is a request to the
            // BMC's address 0x20, the other its answer to the console.
            assert!(msg.len() >= 7, "{msg:02x?}");
            assert_eq!(
                msg[0].wrapping_add(msg[1]).wrapping_add(msg[2]),
                0,
                "{msg:02x?}"
            );
            let to_bmc = if from_console { 0x20 } else { 0x81 };
            assert_eq!(msg[0], to_bmc, "{msg:02x?}");
        }
    }
}

/// `ipmitool -I lanplus -C SUITE -L PRIVILEGE` against 127.0.0.1:`port`: (success, stdout,
/// stderr). Bounded: one retry, a second each.
async fn ipmitool_at(
    port: u16,
    user: &str,
    password: &str,
    suite: u8,
    privilege: &str,
    args: &[&str],
) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(ipmi_sim::which("ipmitool"))
            .args(["-I", "lanplus", "-H", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", user, "-P", password, "-C", &suite.to_string()])
            .args(["-L", privilege, "-N", "1", "-R", "1"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ipmitool finished in 30 s")
    .expect("run ipmitool");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The test BMC that serves cipher suite 17 (which ipmi_sim cannot) is itself checked against
/// ipmitool before it checks anything of oobfence's: ipmitool reads it with suite 17 and with
/// suite 3, as Operator and as User, on and off, closing every session; it refuses a wrong
/// password, a role above the account's, and a suite it was not given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_17_test_bmc_is_read_by_ipmitool() {
    use oobfence::power::ipmi::rakp::Suite;
    use support::rmcp_bmc::{ACCOUNTS, OPERATOR, RmcpBmc, USER};
    let guid = std::array::from_fn(|i| 0x90 + i as u8);
    let bmc = RmcpBmc::start(&[Suite::Seventeen, Suite::Three], guid).await;
    let (reader, oper, admin) = (&ACCOUNTS[0], &ACCOUNTS[1], &ACCOUNTS[2]);
    let status = ["chassis", "power", "status"];
    let mut expected_sessions = Vec::new();
    for (on, word) in [(true, "on"), (false, "off")] {
        bmc.set_power(on);
        for (account, privilege, level) in [(oper, "OPERATOR", OPERATOR), (reader, "USER", USER)] {
            for suite in [17, 3] {
                let (ok, out, err) = ipmitool_at(
                    bmc.port(),
                    account.name,
                    account.password,
                    suite,
                    privilege,
                    &status,
                )
                .await;
                assert!(ok, "suite {suite} as {}: {out} {err}", account.name);
                assert_eq!(out, format!("Chassis Power is {word}"), "{err}");
                expected_sessions.push((suite, level));
                assert_eq!(bmc.open_sessions(), 0, "ipmitool closes its session");
            }
        }
    }
    bmc.seen(|s| {
        assert_eq!(s.activated, expected_sessions);
        assert_eq!(s.closed, expected_sessions.len());
        // Get Chassis Status was asked in each session.
        assert_eq!(
            s.commands.iter().filter(|c| **c == (0x00, 0x01)).count(),
            expected_sessions.len(),
            "{:?}",
            s.commands
        );
    });
    // Refusals, each before a session exists.
    let wrong_password = ipmitool_at(
        bmc.port(),
        admin.name,
        "not-it",
        17,
        "ADMINISTRATOR",
        &status,
    )
    .await;
    assert!(
        !wrong_password.0,
        "a wrong password was accepted: {wrong_password:?}"
    );
    let above_role = ipmitool_at(
        bmc.port(),
        oper.name,
        oper.password,
        17,
        "ADMINISTRATOR",
        &status,
    )
    .await;
    assert!(
        !above_role.0,
        "Administrator granted to an Operator account: {above_role:?}"
    );
    let only_17 = RmcpBmc::start(&[Suite::Seventeen], guid).await;
    let suite_3 = ipmitool_at(
        only_17.port(),
        oper.name,
        oper.password,
        3,
        "OPERATOR",
        &status,
    )
    .await;
    assert!(
        !suite_3.0,
        "suite 3 accepted by a suite-17 BMC: {suite_3:?}"
    );
    bmc.seen(|s| assert_eq!(s.activated.len(), expected_sessions.len()));
    assert_eq!(only_17.seen(|s| s.activated.len()), 0);
}

mod native_session {
    //! The native RMCP+ session (`oobfence::power::ipmi::session`) against the suite-17 test
    //! BMC (checked against ipmitool above) and against ipmi_sim.

    use super::*;
    use oobfence::power::ipmi::rakp::{Key, Suite};
    use oobfence::power::ipmi::session::{ADMINISTRATOR, Login, OPERATOR, Session, Timing, USER};
    use support::rmcp_bmc::{ACCOUNTS, RmcpBmc};

    fn timing() -> Timing {
        Timing {
            resend_every: Duration::from_millis(500),
            resends: 2,
            deadline: tokio::time::Instant::now() + Duration::from_millis(1500),
        }
    }

    fn guid() -> [u8; 16] {
        std::array::from_fn(|i| 0x40 + i as u8)
    }

    async fn open(
        addr: &str,
        suite: Suite,
        privilege: u8,
        user: &str,
        password: &str,
    ) -> Result<Session, oobfence::power::ReadErrorKind> {
        let kuid = Key::new(password.as_bytes()).unwrap();
        let login = Login {
            suite,
            privilege,
            username: user.as_bytes(),
            kuid: &kuid,
        };
        Session::open(addr.parse().unwrap(), &login, timing())
            .await
            .map_err(|t| {
                eprintln!("{suite:?} as {user}: {}", t.detail);
                t.kind
            })
    }

    /// A login that fails after the BMC activated the session (Set Session Privilege Level
    /// unanswered) still closes that session: a BMC has few session slots, and a fencer that
    /// leaks one per failed read locks the operators' own ipmitool out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_login_that_stalls_after_activation_closes_its_session() {
        let bmc = RmcpBmc::start(&[Suite::Seventeen], guid()).await;
        bmc.stall_set_privilege();
        let oper = &ACCOUNTS[1];
        let refused = open(
            &bmc.address(),
            Suite::Seventeen,
            OPERATOR,
            oper.name,
            oper.password,
        )
        .await;
        assert_eq!(
            refused.err(),
            Some(oobfence::power::ReadErrorKind::Timeout),
            "an unanswered Set Session Privilege Level is a timeout"
        );
        let closed = async {
            for _ in 0..50 {
                if bmc.open_sessions() == 0 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        };
        assert!(
            closed.await,
            "the activated session is left open on the BMC"
        );
        bmc.seen(|s| {
            assert_eq!(s.activated, vec![(17, OPERATOR)]);
            assert_eq!(s.closed, 1);
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_with_suite_17_and_3_as_operator_and_as_user_and_closes() {
        let bmc = RmcpBmc::start(&[Suite::Seventeen, Suite::Three], guid()).await;
        let (reader, oper) = (&ACCOUNTS[0], &ACCOUNTS[1]);
        let mut expected = Vec::new();
        for on in [true, false] {
            bmc.set_power(on);
            for suite in [Suite::Seventeen, Suite::Three] {
                for (account, privilege) in [(oper, OPERATOR), (reader, USER)] {
                    let mut s = open(
                        &bmc.address(),
                        suite,
                        privilege,
                        account.name,
                        account.password,
                    )
                    .await
                    .unwrap_or_else(|k| panic!("{suite:?} as {}: {k:?}", account.name));
                    assert_eq!(s.privilege(), privilege);
                    let status = s.chassis_status().await.expect("Get Chassis Status");
                    assert_eq!(status.completion, 0);
                    assert_eq!(status.data[0] & 1 == 1, on, "{status:?}");
                    let g = s.system_guid().await.expect("Get System GUID");
                    assert_eq!(g.data, guid());
                    assert_eq!(s.stray_and_resent(), (0, 0));
                    s.close().await;
                    assert_eq!(bmc.open_sessions(), 0, "the session is closed");
                    expected.push((suite.id(), privilege));
                }
            }
        }
        bmc.seen(|s| {
            assert_eq!(s.activated, expected);
            assert_eq!(s.closed, expected.len());
            assert_eq!(s.pings, 0, "no presence ping is needed");
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ipmi_sim_agrees_with_ipmitool_through_a_native_session() {
        let sim = IpmiSim::start();
        for (user, password, privilege) in [
            (ipmi_sim::USERNAME, ipmi_sim::PASSWORD, ADMINISTRATOR),
            (ipmi_sim::OPERATOR, ipmi_sim::OPERATOR_PASSWORD, OPERATOR),
            (ipmi_sim::OPERATOR, ipmi_sim::OPERATOR_PASSWORD, USER),
            (ipmi_sim::READER, ipmi_sim::READER_PASSWORD, USER),
        ] {
            for on in [true, false] {
                sim.set_power(on);
                let mut s = open(&sim.address(), Suite::Three, privilege, user, password)
                    .await
                    .unwrap_or_else(|k| panic!("as {user}: {k:?}"));
                let status = s.chassis_status().await.expect("Get Chassis Status");
                let word = if status.data[0] & 1 == 1 { "on" } else { "off" };
                let g = s.system_guid().await.expect("Get System GUID");
                assert_eq!(g.data, sim.guid_bytes());
                s.close().await;
                assert_eq!(word, sim.ipmitool_power(), "as {user}");
                assert_eq!(word, if on { "on" } else { "off" });
                assert_eq!(sim.other_sessions(), 0, "the session is closed");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refusals_are_named_errors_never_a_session() {
        use oobfence::power::ReadErrorKind;
        let bmc = RmcpBmc::start(&[Suite::Seventeen], guid()).await;
        let (reader, oper) = (&ACCOUNTS[0], &ACCOUNTS[1]);
        let addr = bmc.address();
        assert_eq!(
            open(&addr, Suite::Seventeen, OPERATOR, oper.name, "wrong")
                .await
                .unwrap_err(),
            ReadErrorKind::Auth
        );
        assert_eq!(
            open(
                &addr,
                Suite::Seventeen,
                OPERATOR,
                reader.name,
                reader.password
            )
            .await
            .unwrap_err(),
            ReadErrorKind::Auth,
            "a User account asking for Operator"
        );
        assert_eq!(
            open(&addr, Suite::Seventeen, OPERATOR, "nobody", "x")
                .await
                .unwrap_err(),
            ReadErrorKind::Auth
        );
        assert_eq!(
            open(&addr, Suite::Three, OPERATOR, oper.name, oper.password)
                .await
                .unwrap_err(),
            ReadErrorKind::Protocol,
            "suite 3 on a suite-17 BMC"
        );
        assert_eq!(bmc.seen(|s| s.activated.len()), 0);
        // Silence, and nothing listening.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let nothing = format!("127.0.0.1:{}", ipmi_sim::free_udp_port());
        for (addr, want) in [
            (
                silent.local_addr().unwrap().to_string(),
                ReadErrorKind::Timeout,
            ),
            (nothing, ReadErrorKind::Unreachable),
        ] {
            let started = Instant::now();
            let got = open(&addr, Suite::Seventeen, USER, "a", "b")
                .await
                .unwrap_err();
            assert_eq!(got, want, "{addr}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        }
    }
}

/// The whole read path (`IpmiSource`, as the daemon reads) with the defaults — suite 17, the
/// User role — and with an Operator account, against the suite-17 test BMC; `[17, 3]` falls
/// back to suite 3 on a BMC that refuses 17, and only there; a BMC without either suite is an
/// error read naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_path_logs_in_with_suite_17_as_user_by_default_and_falls_back_only_when_asked() {
    use oobfence::power::ipmi::rakp::Suite;
    use support::rmcp_bmc::{ACCOUNTS, RmcpBmc};
    let guid: [u8; 16] = std::array::from_fn(|i| 0x60 + i as u8);
    let dir = tempfile::tempdir().unwrap();
    let (reader, oper) = (&ACCOUNTS[0], &ACCOUNTS[1]);
    let source = |addr: &str, account: &support::rmcp_bmc::Account, extra: &str| {
        // Not through `bmc()`: these entries keep oobfence's own default suite.
        let e = parsed_bmc_entry(
            "ipmi",
            dir.path(),
            addr,
            account.name,
            account.password,
            extra,
        );
        IpmiSource::new(&e, "n1").unwrap()
    };
    let session_of = |reply: &oobfence::power::Reply| {
        reply
            .details
            .iter()
            .find(|d| d.name == "session")
            .map(|d| d.value.clone())
            .unwrap_or_default()
    };

    let only_17 = RmcpBmc::start(&[Suite::Seventeen], guid).await;
    for (account, extra, session) in [
        (reader, "", "cipher suite 17, User"),
        (
            oper,
            "privilege = \"operator\"",
            "cipher suite 17, Operator",
        ),
    ] {
        let src = source(&only_17.address(), account, extra);
        for on in [true, false] {
            only_17.set_power(on);
            let reply = src.read_reply().await;
            let want = if on { PowerState::On } else { PowerState::Off };
            assert_eq!(reply.state, want, "{reply:?}");
            assert_eq!(session_of(&reply), session);
            let MachineIdentity::SystemUuid { forms, .. } = &reply.identity else {
                panic!("{:?}", reply.identity);
            };
            assert_eq!(forms, &oobfence::identity::uuid_forms_of_ipmi_guid(&guid));
        }
        drop(src);
        // Closed without waiting for the answer: give the datagram a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(only_17.open_sessions(), 0, "closed when its source went");
    }
    // Suite 3 on a suite-17 BMC: refused, and said so; never Off.
    let state = source(&only_17.address(), reader, "cipher_suite = 3")
        .read()
        .await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(detail.contains("cipher suite 3 refused"), "{detail}");

    // [17, 3] on a suite-3 BMC: 17 is refused by the BMC, 3 reads.
    let only_3 = RmcpBmc::start(&[Suite::Three], guid).await;
    only_3.set_power(false);
    let reply = source(
        &only_3.address(),
        oper,
        "cipher_suite = [17, 3]\nprivilege = \"operator\"",
    )
    .read_reply()
    .await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(session_of(&reply), "cipher suite 3, Operator");
    // The default (17 alone) does not fall back.
    let state = source(&only_3.address(), oper, "").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(detail.contains("cipher suite 17 refused"), "{detail}");
    // A wrong password on the first suite is not a reason to try the second.
    let state = source(
        &only_17.address(),
        &support::rmcp_bmc::Account {
            password: "nope",
            ..oper.clone()
        },
        "cipher_suite = [17, 3]",
    )
    .read()
    .await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    // One session per account, kept for its second read; none for the refused logins.
    assert_eq!(only_17.seen(|s| s.activated.len()), 2);
}
