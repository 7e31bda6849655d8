//! Which agents' Off counts: an exit status 2 is a proof of power-off only from an agent whose
//! "off" means the machine has no power and no saved state. `fence_vmware_rest` is run for
//! real against a vCenter REST server the project owns to show why it is refused; fabric
//! agents, agents oobfence does not list, `missing_as_off`, line breaks in what goes to an
//! agent's stdin and its secrets echoed back are each refused or scrubbed.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use oobfence::config::checks::{Severity, warnings};
use oobfence::config::{BmcEntry, Config};
use oobfence::power::{PowerSource, PowerState};

use super::support::vcenter::{self, VcenterRest};
use super::{VOUCH, entry, fixture_agent, source, vouched};

/// Runs Debian's `fence_vmware_rest` once with `action=status` for `plug` against `server`:
/// its exit status and what it printed.
fn vmware_rest_status(server: &VcenterRest, plug: &str) -> (Option<i32>, String) {
    let mut child = Command::new("/usr/sbin/fence_vmware_rest")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fence_vmware_rest (Debian: apt install fence-agents)");
    write!(
        child.stdin.take().unwrap(),
        "action=status\nip=127.0.0.1\nipport={}\nusername={}\npassword={}\nplug={plug}\nshell_timeout=10\n",
        server.port(),
        vcenter::USERNAME,
        vcenter::PASSWORD
    )
    .unwrap();
    let out = super::support::blocking(|| child.wait_with_output()).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn fence_vmware_rest_reads_suspended_as_off_and_a_shared_name_as_its_first_vm_so_it_is_refused() {
    let server = VcenterRest::start(&[
        ("vm-101", "db-1", "POWERED_ON"),
        ("vm-102", "db-2", "POWERED_OFF"),
        ("vm-103", "db-3", "SUSPENDED"),
    ]);
    let (code, out) = vmware_rest_status(&server, "db-1");
    assert_eq!(code, Some(0), "POWERED_ON: {out}");
    let (code, out) = vmware_rest_status(&server, "db-2");
    assert_eq!(code, Some(2), "POWERED_OFF: {out}");
    // The reason it is refused: a suspended VM, which resumes with its memory, exits 2.
    let (code, out) = vmware_rest_status(&server, "db-3");
    assert_eq!(code, Some(2), "SUSPENDED: {out}");
    assert!(
        server.log().contains("filter.names=db-3"),
        "{}",
        server.log()
    );
    // Two VMs named alike: the agent gives the first one's state to whichever is meant.
    server.set_vms(&[
        ("vm-201", "web", "POWERED_OFF"),
        ("vm-202", "web", "POWERED_ON"),
    ]);
    assert_eq!(vmware_rest_status(&server, "web").0, Some(2));
    server.set_vms(&[
        ("vm-202", "web", "POWERED_ON"),
        ("vm-201", "web", "POWERED_OFF"),
    ]);
    assert_eq!(vmware_rest_status(&server, "web").0, Some(0));

    let dir = tempfile::tempdir().unwrap();
    let lines = format!(
        "agent = \"fence_vmware_rest\"\nusername = \"admin\"\nplug = \"db-3\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\" }}\n",
        server.port()
    );
    let e = entry(dir.path(), &lines, Some(vcenter::PASSWORD)).unwrap_err();
    assert!(e.contains("[[bmc]] #1 agent"), "{e}");
    assert!(e.contains("fence_vmware_rest is refused"), "{e}");
    assert!(e.contains("SUSPENDED"), "{e}");
    // No opt-in for an agent refused for a known reason.
    let e = entry(
        dir.path(),
        &format!("{lines}{VOUCH}"),
        Some(vcenter::PASSWORD),
    )
    .unwrap_err();
    assert!(e.contains("fence_vmware_rest is refused"), "{e}");
    assert!(e.contains("cannot be vouched for"), "{e}");
}

#[test]
fn agents_whose_off_is_not_power_off_are_refused_naming_why_and_what_to_use() {
    let dir = tempfile::tempdir().unwrap();
    for (agent, why) in [
        ("fence_virsh", "pmsuspended"),
        ("fence_aws", "protocol = \"ec2\""),
        ("fence_zvmip", "missing_as_off"),
        ("fence_pve", "hibernated"),
        ("fence_scsi", "storage reservation"),
        ("fence_mpath", "storage reservation"),
        ("fence_sbd", "poison-pill"),
        ("fence_ifmib", "switch port"),
        ("fence_brocade", "switch port"),
        ("fence_cisco_mds", "switch port"),
        ("fence_kdump", "crash-dump"),
        ("fence_heuristics_ping", "ping heuristic"),
    ] {
        let e = entry(dir.path(), &format!("agent = \"{agent}\"\n{VOUCH}"), None).unwrap_err();
        assert!(e.contains("[[bmc]] #1 agent"), "{agent}: {e}");
        assert!(e.contains(&format!("{agent} is refused")), "{agent}: {e}");
        assert!(e.contains(why), "{agent}: {e}");
        assert!(e.contains("cannot be vouched for"), "{agent}: {e}");
    }
}

#[tokio::test]
async fn an_unlisted_agent_counts_only_when_vouched_for_and_then_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fixture_agent(dir.path(), "fence_homegrown", "exit 2");
    let bare = format!("agent = \"{}\"\n", agent.display());
    let e = entry(dir.path(), &bare, None).unwrap_err();
    assert!(e.contains("[[bmc]] #1 agent"), "{e}");
    assert!(
        e.contains("fence_homegrown is not an agent oobfence has read"),
        "{e}"
    );
    assert!(e.contains("fence_ipmilan"), "names the accepted ones: {e}");
    assert!(e.contains(VOUCH.trim()), "says how to vouch: {e}");
    let e = entry(
        dir.path(),
        &format!("{bare}unlisted_agent_off_means = \"yes\"\n"),
        None,
    )
    .unwrap_err();
    assert!(e.contains("[[bmc]] #1 unlisted_agent_off_means"), "{e}");
    assert!(e.contains("\"no power and no saved state\""), "{e}");

    let vouched_entry = entry(dir.path(), &vouched(&agent), None).unwrap();
    let reply = source(&vouched_entry).read_reply().await;
    assert_eq!(reply.state, PowerState::Off);
    assert!(
        reply.identity.to_string().contains("the operator vouched"),
        "{}",
        reply.identity
    );
    let cfg = config_of(&vouched(&agent));
    let found: Vec<_> = warnings(&cfg)
        .into_iter()
        .filter(|f| f.key == "bmc[0].unlisted_agent_off_means")
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].severity, Severity::Warning);
    assert!(
        found[0].problem.contains("fence_homegrown"),
        "{}",
        found[0].problem
    );

    // An agent the table accepts needs no vouching; saying so anyway is a mistake to fix.
    let e = entry(
        dir.path(),
        &format!("agent = \"fence_ipmilan\"\noptions = {{ ip = \"h\" }}\n{VOUCH}"),
        None,
    )
    .unwrap_err();
    assert!(e.contains("[[bmc]] #1 unlisted_agent_off_means"), "{e}");
    assert!(e.contains("fence_ipmilan is accepted"), "{e}");
}

fn config_of(lines: &str) -> Config {
    let text = format!(
        "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\n{lines}"
    );
    Config::parse(&text, Path::new("test.toml")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn missing_as_off_is_refused_in_either_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fixture_agent(dir.path(), "fence_knows_missing", "exit 2");
    for spelling in ["missing_as_off", "missing-as-off"] {
        let e = entry(
            dir.path(),
            &format!("{}options = {{ {spelling} = \"1\" }}\n", vouched(&agent)),
            None,
        )
        .unwrap_err();
        assert!(e.contains("[[bmc]] #1 options"), "{spelling}: {e}");
        assert!(
            e.contains("a plug the device does not know"),
            "{spelling}: {e}"
        );
    }
}

#[test]
fn a_line_break_in_any_value_written_to_the_agents_stdin_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fixture_agent(dir.path(), "fence_lines", "exit 0");
    let base = vouched(&agent);
    for (line, key) in [
        ("plug = \"vm-1\\naction=off\"\n", "plug"),
        ("plug = \"vm-1\\raction=off\"\n", "plug"),
        ("plug = \"vm-1\\u0000\"\n", "plug"),
        ("username = \"admin\\naction=off\"\n", "username"),
        ("options = { ip = \"h\\naction=off\" }\n", "options"),
    ] {
        let e = entry(dir.path(), &format!("{base}{line}"), None).unwrap_err();
        assert!(e.contains(&format!("[[bmc]] #1 {key}")), "{line}: {e}");
        assert!(e.contains("line break"), "{line}: {e}");
    }
    // A password file of two lines: the second would be an option of its own.
    let e = entry(dir.path(), &base, Some("pw-s3cret\naction=off")).unwrap_err();
    assert!(e.contains("[[bmc]] #1 password_file"), "{e}");
    assert!(e.contains("line break"), "{e}");
    assert!(!e.contains("pw-s3cret"), "the password is not shown: {e}");
    // Its one trailing newline is not part of it.
    entry(dir.path(), &base, Some("pw")).unwrap();
}

const SECRETS: [(&str, &str); 7] = [
    ("community", "c0mmunity-s3cret"),
    ("snmp_priv_passwd", "pr1v-s3cret"),
    ("secret_key", "s3cret-key-value"),
    ("access_key", "AKIA-s3cret-id"),
    ("apikey", "api-s3cret-value"),
    ("token", "t0ken-s3cret-value"),
    // Secret by its metadata's description ("Kg key"), not by its name.
    ("hexadecimal_kg", "0123abcd-s3cret-kg"),
];

/// The options of an entry that gives every one of [`SECRETS`].
pub(crate) fn secret_options() -> String {
    let pairs: Vec<String> = SECRETS
        .iter()
        .map(|(k, v)| format!("{k} = \"{v}\""))
        .collect();
    format!("options = {{ {} }}\n", pairs.join(", "))
}

/// Whether `text` shows any of [`SECRETS`] or the password `hunter2-secret`.
pub(crate) fn leaked(text: &str) -> Vec<&'static str> {
    SECRETS
        .iter()
        .map(|(_, v)| *v)
        .chain(["hunter2-secret"])
        .filter(|v| text.contains(v))
        .collect()
}

#[tokio::test]
async fn every_secret_option_an_agent_echoes_is_scrubbed_and_debug_shows_none() {
    let dir = tempfile::tempdir().unwrap();
    let echoes = fixture_agent(
        dir.path(),
        "fence_echoes",
        "echo \"$input\" | tr '\\n' ' ' >&2\necho 'Failed: Unable to obtain correct plug status' >&2\nexit 1",
    );
    let e: BmcEntry = entry(
        dir.path(),
        &format!("{}plug = \"vm-n1\"\n{}", vouched(&echoes), secret_options()),
        Some("hunter2-secret"),
    )
    .unwrap();
    let src = source(&e);
    match src.read().await {
        PowerState::Error { detail, .. } => {
            assert!(detail.contains("community=<community>"), "{detail}");
            assert!(
                detail.contains("hexadecimal_kg=<hexadecimal_kg>"),
                "{detail}"
            );
            assert!(
                leaked(&detail).is_empty(),
                "{:?} in {detail}",
                leaked(&detail)
            );
        }
        other => panic!("exit 1 read {other:?}"),
    }
    let debug = format!("{src:?} {e:?}");
    assert!(leaked(&debug).is_empty(), "{:?} in {debug}", leaked(&debug));
    assert!(debug.contains("community"), "names the option: {debug}");
}

#[test]
fn two_entries_of_one_machine_are_refused_without_showing_their_secret_options() {
    let dir = tempfile::tempdir().unwrap();
    let agent = fixture_agent(dir.path(), "fence_pdu_like", "exit 2");
    let one = |node: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\n{}plug = \"7\"\noptions = {{ ip = \"10.0.0.9\", community = \"c0mmunity-s3cret\" }}\n",
            vouched(&agent)
        )
    };
    let text = format!("datacenter = \"test\"\n{}{}", one("a"), one("b"));
    let e = Config::parse(&text, Path::new("test.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("reads the same machine as [[bmc]] #1"), "{e}");
    assert!(e.contains("community=<redacted>"), "{e}");
    assert!(leaked(&e).is_empty(), "{e}");
}
