//! Cipher suites a BMC does not offer: refused at once (ipmi_sim answers an Open Session for
//! suite 17 with two bytes, tag and status), named with what to set, and `[17, 3]` falling back
//! to suite 3 without waiting for a timeout.

use super::*;

fn session_of(reply: &oobfence::power::Reply) -> String {
    reply
        .details
        .iter()
        .find(|d| d.name == "session")
        .map(|d| d.value.clone())
        .unwrap_or_default()
}

/// A read whose deadline is 10 s: a refusal that is not understood waits it out.
const SLOW_DEADLINE: &str = "timeout = \"10s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_sim_without_suite_17_is_read_with_suite_3_when_17_then_3_is_allowed() {
    let sim = IpmiSim::start();
    let src = admin_source(&sim, &format!("cipher_suite = [17, 3]\n{SLOW_DEADLINE}"));
    let started = Instant::now();
    let reply = src.read_reply().await;
    let took = started.elapsed();
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    assert_eq!(session_of(&reply), "cipher suite 3, User");
    // The refusal of 17 is answered at once; falling back costs no timeout.
    assert!(took < Duration::from_secs(3), "{took:?}");
    sim.set_power(false);
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::Off, "{reply:?}");
    assert_eq!(session_of(&reply), "cipher suite 3, User");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_sim_refusing_suite_17_alone_fails_at_once_naming_the_status_and_the_fix() {
    let sim = IpmiSim::start();
    let src = admin_source(&sim, &format!("cipher_suite = 17\n{SLOW_DEADLINE}"));
    let started = Instant::now();
    let state = src.read().await;
    let took = started.elapsed();
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    for want in [
        "Open Session Response has status 0x04 (invalid authentication algorithm)",
        "the BMC does not offer cipher suite 17: set cipher_suite = 3 or [17, 3]",
    ] {
        assert!(detail.contains(want), "{want:?} not in {detail}");
    }
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(sim.other_sessions(), 0, "a refused suite leaves no session");
}

/// The project's own BMC, answering refusals as briefly as ipmi_sim: the same fallback, the
/// same error; a BMC offering neither suite says so without contradicting advice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brief_refusals_of_the_test_bmc_fall_back_or_fail_at_once() {
    use oobfence::power::ipmi::rakp::Suite;
    use support::rmcp_bmc::{ACCOUNTS, RmcpBmc};
    let guid: [u8; 16] = std::array::from_fn(|i| 0x70 + i as u8);
    let dir = tempfile::tempdir().unwrap();
    let reader = &ACCOUNTS[0];
    let source = |addr: &str, extra: &str| {
        let e = parsed_bmc_entry(
            "ipmi",
            dir.path(),
            addr,
            reader.name,
            reader.password,
            &format!("{extra}\n{SLOW_DEADLINE}"),
        );
        IpmiSource::new(&e, "n1").unwrap()
    };
    let only_3 = RmcpBmc::start(&[Suite::Three], guid).await;
    only_3.refuse_briefly();
    let started = Instant::now();
    let reply = source(&only_3.address(), "cipher_suite = [17, 3]")
        .read_reply()
        .await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    assert_eq!(session_of(&reply), "cipher suite 3, User");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(only_3.seen(|s| s.activated.clone()), vec![(3, 2)]);

    let state = source(&only_3.address(), "cipher_suite = 17").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(
        detail.contains("status 0x11 (no cipher suite match with proposed security algorithms)"),
        "{detail}"
    );
    assert!(
        detail.contains("set cipher_suite = 3 or [17, 3]"),
        "{detail}"
    );

    let neither = RmcpBmc::start(&[], guid).await;
    neither.refuse_briefly();
    let started = Instant::now();
    let state = source(&neither.address(), "cipher_suite = [17, 3]")
        .read()
        .await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(
        detail.contains("the BMC offers none of cipher suites 17 and 3"),
        "{detail}"
    );
    assert!(!detail.contains("set cipher_suite"), "{detail}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
