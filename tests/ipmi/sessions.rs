//! RMCP+ sessions: kept across the GUID question (whose silence costs only the identity), one
//! per BMC whatever the concurrency, renewed when the BMC forgot one, never leaked.

use super::*;

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
