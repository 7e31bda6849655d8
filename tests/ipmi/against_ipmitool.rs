//! oobfence's RMCP+ crypto and the suite-17 test BMC, each checked against ipmitool: the keys
//! of a recorded exchange between ipmitool and ipmi_sim, and ipmitool reading the test BMC
//! before that BMC checks anything of oobfence's.

use super::*;

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
