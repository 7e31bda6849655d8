//! Scenarios of BMCs that misbehave in every way a Redfish or an IPMI BMC can.

use super::*;

/// A TCP peer that accepts connections and never says a word.
pub(super) struct SilentTcpPeer {
    pub(super) port: u16,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl SilentTcpPeer {
    pub(super) async fn start() -> SilentTcpPeer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            // Bounded: a few hundred connections at most in a test.
            for _ in 0..1000 {
                let Ok((c, _)) = listener.accept().await else {
                    return;
                };
                held.push(c);
            }
        });
        SilentTcpPeer { port, task }
    }
}

impl Drop for SilentTcpPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Dead nodes whose BMCs misbehave in every way a Redfish BMC can: none is fenced, each is
/// refused with the rule that names why; the control node beside them, behind a BMC that
/// answers a clean Off, is fenced.
pub(super) fn dead_nodes_behind_faulty_redfish_bmcs() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-redfish", 1).await;
        // Each BMC fails on its own here: the freeze (most sources failing at once) would hold
        // the control node too, which is the freeze's scenario, not this one.
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        let odd = OddBmc::start();
        let expired = OddBmc::start_expired();
        let silent = SilentTcpPeer::start().await;
        let (other_ca, _) = support::sushy::self_signed_cert(s.dir(), "other");
        let at = |port: u16| format!("https://127.0.0.1:{port}");
        let pinned = |cert: &std::path::Path, system: &str| {
            format!(
                "system = \"{system}\"\nca_file = \"{}\"\ntimeout = \"2s\"",
                cert.display()
            )
        };
        let emu = s.redfish_emulator();
        let cases: Vec<(&str, String, &str, String, &str)> = vec![
            (
                "control",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/off"),
                "FENCED",
            ),
            (
                "http-500",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/error"),
                "power-unknown",
            ),
            (
                "http-503",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/unavailable"),
                "power-unknown",
            ),
            (
                "garbage",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/html"),
                "power-unknown",
            ),
            (
                "truncated",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/truncated"),
                "power-unknown",
            ),
            (
                "oversized",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/big"),
                "power-unknown",
            ),
            (
                "stalled-body",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/slow-body"),
                "power-unknown",
            ),
            (
                "forbidden",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/forbidden"),
                "power-unknown",
            ),
            (
                "powering-off",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/powering-off"),
                "power-transitional",
            ),
            (
                "paused",
                at(odd.port),
                "pw",
                pinned(&odd.cert, "/paused"),
                "power-suspended",
            ),
            (
                "tls-mismatch",
                at(odd.port),
                "pw",
                pinned(&other_ca, "/tls"),
                "power-unknown",
            ),
            (
                "tls-expired",
                at(expired.port),
                "pw",
                // A pinned certificate is read past its expiry unless the entry enforces it.
                format!(
                    "{}\ntls_pin_validity = \"enforce\"",
                    pinned(&expired.cert, "/off")
                ),
                "power-unknown",
            ),
            (
                "timeout",
                at(silent.port),
                "pw",
                pinned(&odd.cert, "/off"),
                "power-unknown",
            ),
            (
                "wrong-password",
                emu.base_url(),
                "not-the-password",
                pinned(&emu.cert_pem_path(), &emu.system_path(0)),
                "power-unknown",
            ),
        ];
        let mut nodes = Vec::new();
        for (i, (suffix, address, password, extra, _)) in cases.iter().enumerate() {
            s.map_redfish(suffix, address, password, extra);
            // Each node reports its own machine's UUID: one that two Nodes report proves none
            // of them (duplicate-system-uuid). Those whose BMC never answers get one nothing
            // else reports.
            let identity = match *suffix {
                "wrong-password" => s.identity(0).await,
                "control" => KubeletIdentity::uuid(odd_bmc::UUID),
                "powering-off" => KubeletIdentity::uuid(odd_bmc::POWERING_OFF_UUID),
                "paused" => KubeletIdentity::uuid(odd_bmc::PAUSED_UUID),
                _ => KubeletIdentity::uuid(&format!("4c4c4544-0038-4b10-8052-{i:012x}")),
            };
            nodes.push(s.node_reporting(suffix, FIRST_BOOT, identity).await);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&nodes[0], EVENT_BOUND).await;
        for ((suffix, _, _, _, rule), n) in cases.iter().zip(&nodes).skip(1) {
            let r = daemon.wait_rule(&n.name, rule, EVENT_BOUND).await;
            assert!(r["fence"].is_null(), "{suffix}: {r}");
        }
        for n in &nodes[1..] {
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        conclude("Redfish: timeout, 500, 503, garbage, truncated, oversized, stalled, 403, TLS mismatch, expired cert, wrong password, PoweringOff, Paused", vec![Write::Taint(nodes[0].name.clone())], daemon, &rec, &nodes_of(&nodes)).await
    })
}

/// IPMI: a peer that never answers and a BMC that refuses the password fence nothing; the
/// control node, whose simulator reads off, is fenced.
pub(super) fn dead_nodes_behind_faulty_ipmi_bmcs() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::ipmi("fm-ipmi", 2).await;
        s.set_guards("max_unhealthy = \"100%\"\nfreeze_min_failing = 1000\n");
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let control = s.node("control", 0).await;
        s.map_ipmi(
            "wrong-password",
            &s.ipmi_sim(1).address(),
            "not-the-password",
            "timeout = \"3s\"",
        );
        let wrong = s
            .node_reporting("wrong-password", FIRST_BOOT, s.identity(1).await)
            .await;
        s.map_ipmi("silent", &silent_addr, "whatever", "timeout = \"2s\"");
        let quiet = s
            .node_reporting("silent", FIRST_BOOT, s.identity(1).await)
            .await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        s.ipmi_sim(0).set_power(false);
        for n in [&control, &wrong, &quiet] {
            n.die(FIRST_BOOT).await;
        }
        wait_taint(&control, EVENT_BOUND).await;
        for n in [&wrong, &quiet] {
            daemon
                .wait_rule(&n.name, "power-unknown", EVENT_BOUND)
                .await;
            assert!(
                !FakeNode::has_oos_taint(&n.get().await),
                "{} fenced",
                n.name
            );
        }
        let expected = vec![Write::Taint(control.name.clone())];
        let nodes = [&control, &wrong, &quiet];
        let outcome = conclude(
            "IPMI: silent peer, wrong password",
            expected,
            daemon,
            &rec,
            &nodes,
        )
        .await;
        drop(silent);
        outcome
    })
}
