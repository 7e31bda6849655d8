//! The native RMCP+ session (`oobfence::power::ipmi::session`) against the suite-17 test
//! BMC (itself checked against ipmitool, in `against_ipmitool`) and against ipmi_sim.

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
