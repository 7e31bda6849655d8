//! Reads that fail, and how: wrong credentials (never shown), nothing listening, a silent peer,
//! nonsense answers, and a man in the middle replaying an old authenticated Off.

use super::*;

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
