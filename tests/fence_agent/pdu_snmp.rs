//! PDU outlets through Debian's real SNMP fence agents (`fence_apc_snmp`, `fence_eaton_snmp`)
//! against snmpsim playing the PDU's MIB, SET included: an outlet reads On and Off, by number
//! and by name, through the plain source and through the daemon's own (the endpoint's
//! `list-status` batch); the agent switches it; an outlet the PDU does not have, a name two
//! outlets share and a state other than on or off are errors, never Off; a PDU that does not
//! answer is a timeout and a wrong SNMPv3 key an auth error, which the levels skip.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oobfence::config::Config;
use oobfence::power::{
    ActionOutcome, PowerAction, PowerSource, PowerSources, PowerState, ReadErrorKind, Reply,
    checked,
};

use super::support::snmp_pdu::{
    self, APC_MASTER_SWITCH_6, APC_RACK_PDU, EATON_MANAGED_EPDU, PduModel, SnmpPdu, V3_AUTH_KEY,
    V3_PRIV_KEY, V3_USER,
};
use super::{entry, source};

/// Node `n1`'s source as the daemon builds it ([`PowerSources`]: the endpoint's `list-status`
/// batch where the agent lists its plugs).
async fn daemon_source(lines: &str) -> Arc<dyn PowerSource> {
    let text = format!(
        "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\n{lines}"
    );
    let cfg = Config::parse(&text, Path::new("test.toml")).unwrap_or_else(|e| panic!("{e}"));
    let sources = PowerSources::new(Arc::new(cfg), Default::default()).await;
    let mapped = sources.for_node("n1", None).expect("n1 is mapped");
    assert!(
        mapped.source.batches_reads(),
        "the daemon reads PDUs by list-status"
    );
    mapped.source
}

/// Both of `n1`'s sources for `lines`: the plain one (a `status` run per read, also the read
/// right before a power action) and the daemon's.
async fn both(dir: &Path, lines: &str) -> [Arc<dyn PowerSource>; 2] {
    let e = entry(dir, lines, None).unwrap_or_else(|e| panic!("{e}"));
    [Arc::new(source(&e)), daemon_source(lines).await]
}

/// `state` is an error whose detail names one of `any` (when given) and no secret; its kind.
fn assert_error(state: &PowerState, what: &str, any: &[&str]) -> ReadErrorKind {
    match state {
        PowerState::Error { kind, detail } => {
            assert!(
                any.is_empty() || any.iter().any(|w| detail.contains(w)),
                "{what}: {detail}"
            );
            assert!(!detail.contains(snmp_pdu::COMMUNITY), "{what}: {detail}");
            *kind
        }
        other => panic!("{what} read {other:?}, not an error"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_apc_snmp_reads_an_outlet_on_and_off_by_number_and_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(&APC_RACK_PDU, &[("n0", true), ("n1-psu", true)]);
    assert_eq!(
        pdu.snmpget("1.3.6.1.2.1.1.2.0"),
        "iso.3.6.1.4.1.318.1.3.4.5"
    );
    for plug in ["2", "n1-psu"] {
        let sources = both(dir.path(), &pdu.agent_lines("2c", plug)).await;
        for (path, src) in ["plain", "daemon"].iter().zip(&sources) {
            pdu.set_outlet(2, true);
            let reply = src.read_reply().await;
            assert_eq!(reply.state, PowerState::On, "{path} plug {plug}: {reply:?}");
            pdu.set_outlet(2, false);
            assert_eq!(src.read().await, PowerState::Off, "{path} plug {plug}");
            // The other outlet was never read for this one.
            assert!(pdu.outlet_on(1));
        }
        assert_eq!(
            sources[0].address(),
            format!("fence_apc_snmp 127.0.0.1 plug {plug}")
        );
    }
}

#[tokio::test]
async fn fence_apc_snmp_switches_an_outlet_off_and_on_after_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(&APC_RACK_PDU, &[("n0", true), ("n1", true)]);
    let e = entry(dir.path(), &pdu.agent_lines("2c", "n1"), None).unwrap();
    let src = source(&e);
    let support = src.action_support().await;
    assert!(support.off.is_ok() && support.on.is_ok(), "{support:?}");
    let on_only = |r: &Reply| {
        (r.state == PowerState::On)
            .then_some(())
            .ok_or_else(|| format!("not On: {}", r.state))
    };
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_only(r)))
        .await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    // The agent's SET went to the outlet's control OID, and its status OID follows.
    assert!(!pdu.outlet_on(2));
    assert!(pdu.outlet_on(1));
    assert_eq!(src.read().await, PowerState::Off);
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_only(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("not On")),
        "{outcome:?}"
    );
    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert!(pdu.outlet_on(2));
}

/// fence_apc_snmp takes a plug of digits as the outlet's index without looking it up, and over
/// SNMP v2c or v3 the PDU answers a GET of an outlet it does not have with noSuchInstance,
/// which is not the on value: the agent says off. A name two outlets share resolves to the
/// last of them. Neither may read Off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outlet_the_pdu_does_not_have_or_a_shared_name_is_an_error_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(
        &APC_RACK_PDU,
        &[("n1", true), ("dual", true), ("dual", false), ("n4", false)],
    );
    // What names the plug: the agent's own words (the OID it could not read, the name it could
    // not find), or oobfence's.
    for (version, plug, names) in [
        ("1", "7", &["\"7\"", "1.1.4.7"][..]),
        ("2c", "7", &["\"7\"", "1.1.4.7"]),
        ("2c", "nowhere", &["\"nowhere\"", "name nowhere"]),
        ("2c", "dual", &["twice", "2 outlets"]),
    ] {
        let sources = both(dir.path(), &pdu.agent_lines(version, plug)).await;
        for (path, src) in ["plain", "daemon"].iter().zip(&sources) {
            let what = format!("{path} SNMP v{version} plug {plug}");
            assert_error(&src.read().await, &what, names);
        }
    }
    // Outlets that are there still read as they are, an Off included.
    let sources = both(dir.path(), &pdu.agent_lines("2c", "4")).await;
    for src in &sources {
        assert_eq!(src.read().await, PowerState::Off);
    }
}

/// fence_apc_snmp reads every state but on as off: on a Master Switch (firmware 6, or any
/// sysObjectID it does not know) that includes outletUnknown (4), which the PDU answers for an
/// outlet whose state it cannot determine. oobfence counts an Off only when the PDU answered
/// the table's off value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outlet_state_the_pdu_cannot_determine_is_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(&APC_MASTER_SWITCH_6, &[("n1", true), ("n2", true)]);
    for plug in ["1", "n1"] {
        let sources = both(dir.path(), &pdu.agent_lines("2c", plug)).await;
        for (path, src) in ["plain", "daemon"].iter().zip(&sources) {
            let what = format!("{path} plug {plug}");
            pdu.set_outlet(1, true);
            assert_eq!(src.read().await, PowerState::On, "{what}");
            pdu.set_outlet_value(1, 4);
            assert_error(&src.read().await, &what, &["answered 4"]);
            pdu.set_outlet(1, false);
            assert_eq!(src.read().await, PowerState::Off, "{what}");
        }
    }
}

/// An SNMP device that answers but has no outlet table (a PDU of another make, a switch behind
/// a wrong address with the same community): fence_apc_snmp lists net-snmp's "No more
/// variables left in this MIB View" line as an outlet, numbered by the last part of the table's
/// OID (2 for the rack PDU's, 4 for the Master Switch's it falls back to), and over v2c an
/// outlet number the device does not have reads off. Never Off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_without_outlets_is_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(&APC_RACK_PDU, &[]);
    for plug in ["2", "4"] {
        let sources = both(dir.path(), &pdu.agent_lines("2c", plug)).await;
        for (path, src) in ["plain", "daemon"].iter().zip(&sources) {
            assert_error(&src.read().await, &format!("{path} plug {plug}"), &[]);
        }
    }
}

/// A PDU that does not answer (gone, or a wrong community, which SNMP v1/v2c agents drop
/// without a word) is a timeout; a wrong SNMPv3 key or user is an auth error: both kinds a
/// level is skipped for, never Off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdu_that_does_not_answer_is_a_timeout_and_wrong_credentials_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let pdu = SnmpPdu::start(&APC_RACK_PDU, &[("n1", false)]);
    let gone_port = {
        let gone = SnmpPdu::start(&APC_RACK_PDU, &[("n1", false)]);
        gone.port()
    };
    let v3 = |user: &str| {
        format!(
            "agent = \"fence_apc_snmp\"\ntimeout = \"30s\"\nplug = \"1\"\nusername = \"{user}\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\", snmp_version = \"3\", snmp_sec_level = \"authPriv\", snmp_auth_prot = \"SHA\", snmp_priv_prot = \"AES\", snmp_priv_passwd = \"{V3_PRIV_KEY}\" }}\n",
            pdu.port()
        )
    };
    let cases: Vec<(&str, String, Option<&str>, ReadErrorKind)> = vec![
        (
            "a PDU gone",
            snmp_pdu::agent_lines("fence_apc_snmp", gone_port, "2c", snmp_pdu::COMMUNITY, "1"),
            None,
            ReadErrorKind::Timeout,
        ),
        (
            "a wrong community",
            snmp_pdu::agent_lines("fence_apc_snmp", pdu.port(), "2c", "not-the-community", "1"),
            None,
            ReadErrorKind::Timeout,
        ),
        (
            "a wrong SNMPv3 key",
            v3(V3_USER),
            Some("not-the-v3-key"),
            ReadErrorKind::Auth,
        ),
        (
            "an unknown SNMPv3 user",
            v3("nobody-here"),
            Some(V3_AUTH_KEY),
            ReadErrorKind::Auth,
        ),
    ];
    let started = Instant::now();
    let reads = cases.iter().map(|(what, lines, password, _)| {
        let e = entry(dir.path(), lines, *password).unwrap_or_else(|e| panic!("{what}: {e}"));
        async move { source(&e).read().await }
    });
    let states = futures::future::join_all(reads).await;
    for ((what, _, password, kind), state) in cases.iter().zip(&states) {
        let got = assert_error(state, what, &["fence_apc_snmp status failed"]);
        assert_eq!(got, *kind, "{what}: {state:?}");
        // No secret it was given shows: not the password, the community nor the v3 privacy key.
        let shown = state.to_string();
        for secret in [
            password.unwrap_or(V3_AUTH_KEY),
            "not-the-community",
            V3_PRIV_KEY,
        ] {
            assert!(!shown.contains(secret), "{what}: {shown}");
        }
    }
    // net-snmp gives up after 6 s (1 s, 5 retries); the agent's own deadline is longer.
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
}

/// fence_eaton_snmp reads on (1) and off (0) and fails on anything else (2: cycling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_eaton_snmp_reads_on_off_and_a_cycling_outlet_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let model: &PduModel = &EATON_MANAGED_EPDU;
    let pdu = SnmpPdu::start(model, &[("1", true), ("2", true), ("3", false)]);
    let sources = both(dir.path(), &pdu.agent_lines("1", "2")).await;
    for (path, src) in ["plain", "daemon"].iter().zip(&sources) {
        pdu.set_outlet(2, true);
        assert_eq!(src.read().await, PowerState::On, "{path}");
        pdu.set_outlet(2, false);
        assert_eq!(src.read().await, PowerState::Off, "{path}");
        pdu.set_outlet_value(2, 2);
        assert_error(&src.read().await, &format!("{path} cycling"), &[]);
    }
    assert!(pdu.outlet_on(1) && !pdu.outlet_on(3));
    for plug in ["9", "nowhere"] {
        for (path, src) in ["plain", "daemon"]
            .iter()
            .zip(both(dir.path(), &pdu.agent_lines("1", plug)).await)
        {
            assert_error(&src.read().await, &format!("{path} plug {plug}"), &[]);
        }
    }
    // Its own off and on switch the outlet.
    pdu.set_outlet(2, true);
    let src = &sources[0];
    let outcome = src
        .act(PowerAction::Off, &|_: &Reply| checked(Ok(())))
        .await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(pdu.outlet_value(2), model.off);
    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(pdu.outlet_value(2), model.on);
}
