//! Fence agents as power sources, with Debian's real agents against real parts:
//! `fence_ipmilan` against OpenIPMI's `ipmi_sim`, `fence_redfish` against sushy-tools, the SNMP
//! PDU agents against snmpsim (`fence_agent/pdu_snmp.rs`). Each
//! reads On and Off through the agent's own interface (options on stdin, the exit status);
//! a wrong password, a hang killed at the deadline, garbage and a missing agent never read
//! Off. The hang and the garbage come from small fixture agents written here.

mod support;

#[path = "fence_agent/daemon.rs"]
mod daemon;
#[path = "fence_agent/kubevirt.rs"]
mod kubevirt;
#[path = "fence_agent/levels.rs"]
mod levels;
#[path = "fence_agent/list.rs"]
mod list;
#[path = "fence_agent/pdu_snmp.rs"]
mod pdu_snmp;
#[path = "fence_agent/trust.rs"]
mod trust;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oobfence::config::{BmcEntry, Config};
use oobfence::power::fence_agent::FenceAgentSource;
use oobfence::power::{PowerSource, PowerState, ReadErrorKind};
use support::ipmi_sim::{self, IpmiSim};
use support::sushy::{self, SushyEmulator};

/// A `protocol = "fence-agent"` entry for node `n1` through the real config parser; `password`
/// goes to a file in `dir`.
pub(crate) fn entry(dir: &Path, lines: &str, password: Option<&str>) -> Result<BmcEntry, String> {
    let password_line = match password {
        Some(pw) => {
            let file = dir.join("agent-password");
            std::fs::write(&file, format!("{pw}\n")).unwrap();
            format!("password_file = \"{}\"\n", file.display())
        }
        None => String::new(),
    };
    let text = format!(
        "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\n{password_line}{lines}"
    );
    Config::parse(&text, Path::new("test.toml"))
        .map(|c| c.bmc.into_iter().next().unwrap())
        .map_err(|e| e.to_string())
}

pub(crate) fn source(entry: &BmcEntry) -> FenceAgentSource {
    FenceAgentSource::new(entry, "n1").unwrap()
}

/// Reads until the source says `want`, for at most 30 s (sushy applies a reset late).
async fn reads_until(src: &FenceAgentSource, want: PowerState) {
    let start = Instant::now();
    loop {
        let state = src.read().await;
        if state == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still {state:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(crate) fn ipmilan(sim: &IpmiSim) -> String {
    format!(
        "agent = \"fence_ipmilan\"\nusername = \"{}\"\ntimeout = \"30s\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\", lanplus = \"1\", cipher = \"3\", privlvl = \"administrator\" }}\n",
        ipmi_sim::USERNAME,
        sim.port()
    )
}

#[tokio::test]
async fn fence_ipmilan_reads_ipmi_sim_on_and_off_and_a_wrong_password_never_off() {
    let dir = tempfile::tempdir().unwrap();
    let sim = IpmiSim::start();
    let e = entry(dir.path(), &ipmilan(&sim), Some(ipmi_sim::PASSWORD)).unwrap();
    let fa = e.fence_agent.as_ref().unwrap();
    assert_eq!(fa.name, "fence_ipmilan");
    assert!(fa.version.starts_with("fence_ipmilan "), "{}", fa.version);
    let src = source(&e);
    assert_eq!(src.backend(), "fence-agent");
    assert_eq!(src.address(), "fence_ipmilan 127.0.0.1");
    let reply = src.read_reply().await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    assert!(
        reply
            .identity
            .to_string()
            .contains("identity = \"unchecked\""),
        "{}",
        reply.identity
    );
    sim.set_power(false);
    reads_until(&src, PowerState::Off).await;
    assert_eq!(sim.ipmitool_power(), "off");

    let wrong = entry(dir.path(), &ipmilan(&sim), Some("not-the-password")).unwrap();
    match source(&wrong).read().await {
        PowerState::Error { detail, .. } => {
            assert!(detail.contains("fence_ipmilan status failed"), "{detail}");
            assert!(!detail.contains("not-the-password"), "{detail}");
        }
        other => panic!("a wrong password read {other:?}"),
    }
}

/// Debian's `fence_raritan` (over telnet) says "Unable to connect/login to fencing device" for
/// a host name that does not resolve as for a wrong password: the read is `unreachable`, naming the
/// host, never `auth` (which would send an operator to the credentials). `.invalid` never
/// resolves (RFC 6761), so no machine is reached.
#[tokio::test]
async fn an_agent_that_cannot_resolve_its_host_is_unreachable_not_auth() {
    let dir = tempfile::tempdir().unwrap();
    let lines = "agent = \"fence_raritan\"\nusername = \"admin\"\nplug = \"1\"\ntimeout = \"60s\"\noptions = { ip = \"nonexistent.invalid\" }\n";
    let e = entry(dir.path(), lines, Some("an-Agent-pw")).unwrap();
    match source(&e).read().await {
        PowerState::Error { kind, detail } => {
            assert_eq!(kind, ReadErrorKind::Unreachable, "{detail}");
            assert!(detail.contains("fence_raritan status failed"), "{detail}");
            assert!(
                detail.contains("\"nonexistent.invalid\" does not resolve"),
                "{detail}"
            );
            assert!(!detail.contains("an-Agent-pw"), "{detail}");
        }
        other => panic!("an unresolvable host read {other:?}"),
    }
}

#[tokio::test]
async fn fence_redfish_reads_sushy_on_and_off() {
    let dir = tempfile::tempdir().unwrap();
    let emu = SushyEmulator::start(1).await;
    let lines = format!(
        "agent = \"fence_redfish\"\nusername = \"{}\"\ntimeout = \"30s\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\", ssl_insecure = \"1\", systems_uri = \"{}\" }}\n",
        sushy::USERNAME,
        emu.port(),
        emu.system_path(0)
    );
    let e = entry(dir.path(), &lines, Some(sushy::PASSWORD)).unwrap();
    let src = source(&e);
    assert_eq!(src.read().await, PowerState::On);
    emu.set_power(0, false).await;
    reads_until(&src, PowerState::Off).await;
}

#[test]
fn an_agent_missing_or_an_option_it_does_not_declare_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = entry(dir.path(), "agent = \"fence_no_such_agent\"\n", None).unwrap_err();
    assert!(
        e.contains("[[bmc]] #1 agent") && e.contains("apt install fence-agents"),
        "{e}"
    );
    let e = entry(
        dir.path(),
        "agent = \"fence_ipmilan\"\noptions = { ip = \"h\", colour = \"blue\" }\n",
        None,
    )
    .unwrap_err();
    assert!(
        e.contains("[[bmc]] #1 options") && e.contains("declares no option \"colour\""),
        "{e}"
    );
    assert!(e.contains("fence_ipmilan 4."), "names the version: {e}");
    let e = entry(
        dir.path(),
        "agent = \"fence_ipmilan\"\noptions = { ip = \"h\" }\naddress = \"h\"\n",
        None,
    )
    .unwrap_err();
    assert!(
        e.contains("[[bmc]] #1 address") && e.contains("does not apply"),
        "{e}"
    );
    // An agent's reads prove no machine: the entry must say so.
    let text = "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nagent = \"fence_ipmilan\"\noptions = { ip = \"h\" }\n";
    let e = Config::parse(text, Path::new("test.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[[bmc]] #1 identity") && e.contains("identity = \"unchecked\""),
        "{e}"
    );
}

/// What an operator writes to run an agent oobfence does not list, its Off vouched for.
pub(crate) const VOUCH: &str = "unlisted_agent_off_means = \"no power and no saved state\"\n";

/// `agent = PATH` for a fixture agent (which oobfence does not list), vouched for.
pub(crate) fn vouched(agent: &Path) -> String {
    format!("agent = \"{}\"\n{VOUCH}", agent.display())
}

/// A fixture agent: answers `-o metadata` (and `-V`) as an agent does, and for a read runs
/// `body` (POSIX sh) after reading its stdin into `$input`.
pub(crate) fn fixture_agent(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let script = format!(
        r#"#!/bin/sh
case "$1 $2" in
  "-o metadata") cat <<'XML'
<?xml version="1.0" ?>
<resource-agent name="{name}" shortdesc="fixture">
<parameters>
  <parameter name="action" unique="0" required="1"><content type="string"/></parameter>
  <parameter name="password" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="plug" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="username" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="community" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="snmp_priv_passwd" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="secret_key" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="access_key" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="apikey" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="token" unique="0" required="0"><content type="string"/></parameter>
  <parameter name="hexadecimal_kg" unique="0" required="0"><content type="string"/><shortdesc lang="en">Hexadecimal-encoded Kg key for IPMIv2 authentication</shortdesc></parameter>
  <parameter name="missing_as_off" unique="0" required="0"><content type="boolean"/></parameter>
  <parameter name="ip" unique="0" required="0"><content type="string"/></parameter>
</parameters>
<actions><action name="status"/><action name="off"/><action name="list-status"/><action name="metadata"/></actions>
</resource-agent>
XML
  exit 0;;
  "-V ") echo 1.0; exit 0;;
esac
input=$(cat)
{body}
"#
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_hung_agent_is_killed_with_its_children_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("child.pid");
    let agent = fixture_agent(
        dir.path(),
        "fence_hangs",
        &format!("sleep 300 &\necho $! > {}\nwait", pids.display()),
    );
    let e = entry(
        dir.path(),
        &format!("{}timeout = \"2s\"\n", vouched(&agent)),
        None,
    )
    .unwrap();
    let started = Instant::now();
    match source(&e).read().await {
        PowerState::Error { kind, detail } => {
            assert_eq!(kind, ReadErrorKind::Timeout, "{detail}");
            assert!(detail.contains("process group was killed"), "{detail}");
        }
        other => panic!("a hung agent read {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid = std::fs::read_to_string(&pids).unwrap();
    let proc = PathBuf::from(format!("/proc/{}", pid.trim()));
    // The child the agent left is gone with it (reaped by init shortly after the kill).
    let gone = Instant::now();
    while proc.exists() && gone.elapsed() < Duration::from_secs(5) {
        let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
        if stat.split_whitespace().nth(2) == Some("Z") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z"),
        "the agent's child still runs: {stat}"
    );
}

#[tokio::test]
async fn garbage_exit_statuses_and_failures_never_read_off_and_the_password_is_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let odd = fixture_agent(
        dir.path(),
        "fence_odd",
        "echo 'Status: OFF (honest)'\nexit 7",
    );
    let e = entry(dir.path(), &vouched(&odd), Some("hunter2-secret")).unwrap();
    match source(&e).read().await {
        PowerState::Error { kind, detail } => {
            assert_eq!(kind, ReadErrorKind::BadReply, "{detail}");
            assert!(detail.contains("exited 7"), "{detail}");
        }
        other => panic!("exit 7 read {other:?}"),
    }
    // A failure that echoes what it was given: the password never shows.
    let failing = fixture_agent(
        dir.path(),
        "fence_fails",
        "echo \"$input\" >&2\necho 'Failed: Unable to obtain correct plug status' >&2\nexit 1",
    );
    let e = entry(
        dir.path(),
        &format!("{}plug = \"vm-n1\"\n", vouched(&failing)),
        Some("hunter2-secret"),
    )
    .unwrap();
    let src = source(&e);
    assert_eq!(src.address(), "fence_fails plug vm-n1");
    match src.read().await {
        PowerState::Error { detail, .. } => {
            assert!(
                detail.contains("Unable to obtain correct plug status"),
                "{detail}"
            );
            assert!(!detail.contains("hunter2-secret"), "{detail}");
            assert!(detail.contains("<password>"), "{detail}");
        }
        other => panic!("exit 1 read {other:?}"),
    }
    assert!(!format!("{src:?}").contains("hunter2-secret"));
    // The options reach the agent on stdin, never on its command line.
    let echo = fixture_agent(
        dir.path(),
        "fence_echo",
        &format!(
            "echo \"$input\" > {}\necho \"$@\" >> {}\nexit 2",
            dir.path().join("stdin").display(),
            dir.path().join("stdin").display()
        ),
    );
    let e = entry(
        dir.path(),
        &format!("{}plug = \"vm-n1\"\n", vouched(&echo)),
        Some("hunter2-secret"),
    )
    .unwrap();
    assert_eq!(source(&e).read().await, PowerState::Off);
    let seen = std::fs::read_to_string(dir.path().join("stdin")).unwrap();
    assert_eq!(
        seen, "action=status\nplug=vm-n1\npassword=hunter2-secret\n\n",
        "stdin lines, then an empty command line"
    );
}

#[test]
fn two_entries_of_one_agent_endpoint_and_plug_are_one_machine() {
    let text = |port2: u16| {
        format!(
            "datacenter = \"test\"\n\
             [[bmc]]\nnodes = [\"a\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"fence_ipmilan\"\noptions = {{ ip = \"10.0.0.1\", ipport = \"623\" }}\n\
             [[bmc]]\nnodes = [\"b\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"fence_ipmilan\"\noptions = {{ ip = \"10.0.0.1\", ipport = \"{port2}\" }}\n"
        )
    };
    let e = Config::parse(&text(623), Path::new("test.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("[[bmc]] #2 options") && e.contains("reads the same machine as [[bmc]] #1"),
        "{e}"
    );
    assert!(Config::parse(&text(624), Path::new("test.toml")).is_ok());
}

/// Opt-in actuation through an agent: `action=off` and `action=on` by fence_ipmilan, each only
/// after the check passed on the agent's own status read right before it.
#[tokio::test]
async fn fence_ipmilan_powers_ipmi_sim_off_and_on_after_the_check() {
    use oobfence::power::{ActionOutcome, PowerAction, Reply, checked};
    let dir = tempfile::tempdir().unwrap();
    let sim = IpmiSim::start();
    let e = entry(dir.path(), &ipmilan(&sim), Some(ipmi_sim::PASSWORD)).unwrap();
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
    assert_eq!(sim.ipmitool_power(), "off");
    // Off now: the check refuses and nothing is sent.
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_only(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("not On")),
        "{outcome:?}"
    );
    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    assert_eq!(sim.ipmitool_power(), "on");
}
