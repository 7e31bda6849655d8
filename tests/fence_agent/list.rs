//! `list-status` batching: reads of many plugs of one endpoint at once take one agent call; a
//! plug the list leaves unknown is read with its own `status`; a plug it does not name is an
//! error, never Off; an agent whose `list-status` gives no list is read plug by plug.

use std::path::Path;
use std::sync::Arc;

use oobfence::config::Config;
use oobfence::power::fence_agent::{FenceAgentSource, Lister, agent_for};
use oobfence::power::{PowerSource, PowerState};

use super::fixture_agent;

/// An entry for nodes `n*` through `agent`, one plug per node (`vm-{node}`).
fn entry_for(agent: &Path) -> oobfence::config::BmcEntry {
    let text = format!(
        "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n*\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"{}\"\n{}plug = \"vm-{{node}}\"\ntimeout = \"20s\"\n",
        agent.display(),
        super::VOUCH
    );
    Config::parse(&text, Path::new("test.toml"))
        .unwrap_or_else(|e| panic!("{e}"))
        .bmc
        .remove(0)
}

/// A fixture agent that logs each action it is asked for to `log`; `list-status` prints
/// `list`, and `status` answers `status_code`.
fn listing_agent(dir: &Path, name: &str, list: &str, status_code: u8) -> std::path::PathBuf {
    let log = dir.join(format!("{name}.log"));
    fixture_agent(
        dir,
        name,
        &format!(
            "action=$(printf '%s\\n' \"$input\" | sed -n 's/^action=//p')\necho \"$action\" >> {log}\ncase \"$action\" in\n  list-status) printf '{list}'; exit 0;;\n  status) exit {status_code};;\nesac\nexit 1",
            log = log.display()
        ),
    )
}

fn actions_run(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(format!("{name}.log")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_plugs_read_at_once_take_one_list_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut list = String::new();
    for i in 0..20 {
        let state = match i {
            0..=9 => "on",
            10..=18 => "OFF",
            _ => "UNKNOWN",
        };
        list.push_str(&format!("vm-n{i},alias {i},{state}\\n"));
    }
    // Status answers 2 (off) for the one the list leaves unknown.
    let agent = listing_agent(dir.path(), "fence_lists", &list, 2);
    let e = entry_for(&agent);
    let lister = Arc::new(Lister::new(agent_for(&e, "n0").unwrap()));
    let sources: Vec<FenceAgentSource> = (0..21)
        .map(|i| FenceAgentSource::with_lister(&e, &format!("n{i}"), Some(lister.clone())).unwrap())
        .collect();
    assert!(sources[0].batches_reads());
    let states = futures::future::join_all(sources.iter().map(|s| s.read())).await;
    for (i, state) in states.iter().enumerate() {
        match i {
            0..=9 => assert_eq!(*state, PowerState::On, "n{i}"),
            10..=19 => assert_eq!(*state, PowerState::Off, "n{i}"),
            _ => match state {
                PowerState::Error { detail, .. } => {
                    assert!(detail.contains("does not name plug \"vm-n20\""), "{detail}")
                }
                other => panic!("a plug missing from the list read {other:?}"),
            },
        }
    }
    let actions = actions_run(dir.path(), "fence_lists");
    let lists = actions.iter().filter(|a| *a == "list-status").count();
    let statuses = actions.iter().filter(|a| *a == "status").count();
    assert_eq!(lists, 1, "{actions:?}");
    assert_eq!(statuses, 1, "only the unknown plug: {actions:?}");
    assert_eq!(lister.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_list_is_a_notice_is_read_plug_by_plug() {
    let dir = tempfile::tempdir().unwrap();
    let agent = listing_agent(
        dir.path(),
        "fence_nolist",
        "NOTICE: List option is not working on this device yet\\n",
        0,
    );
    let e = entry_for(&agent);
    let lister = Arc::new(Lister::new(agent_for(&e, "n0").unwrap()));
    let sources: Vec<FenceAgentSource> = (0..3)
        .map(|i| FenceAgentSource::with_lister(&e, &format!("n{i}"), Some(lister.clone())).unwrap())
        .collect();
    for s in &sources {
        assert_eq!(s.read().await, PowerState::On);
    }
    let actions = actions_run(dir.path(), "fence_nolist");
    assert_eq!(
        actions.iter().filter(|a| *a == "list-status").count(),
        1,
        "asked once: {actions:?}"
    );
    assert_eq!(actions.iter().filter(|a| *a == "status").count(), 3);
}

/// An agent that lists a plug twice (two VMs of one name on a vCenter): that plug's read is an
/// error, never either line's state, and never a `status` run that picks one of them; the
/// other plugs of the list read as listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plug_listed_twice_is_an_error_for_that_plug_only() {
    let dir = tempfile::tempdir().unwrap();
    let agent = listing_agent(
        dir.path(),
        "fence_twice",
        "vm-n0,first,off\\nvm-n0,second,on\\nvm-n1,,off\\nvm-n2,,on\\n",
        2,
    );
    let e = entry_for(&agent);
    let lister = Arc::new(Lister::new(agent_for(&e, "n0").unwrap()));
    let sources: Vec<FenceAgentSource> = (0..3)
        .map(|i| FenceAgentSource::with_lister(&e, &format!("n{i}"), Some(lister.clone())).unwrap())
        .collect();
    let states = futures::future::join_all(sources.iter().map(|s| s.read())).await;
    match &states[0] {
        PowerState::Error { detail, .. } => {
            assert!(detail.contains("names plug \"vm-n0\" twice"), "{detail}")
        }
        other => panic!("a plug listed twice read {other:?}"),
    }
    assert_eq!(states[1], PowerState::Off);
    assert_eq!(states[2], PowerState::On);
    // A later read of the same plug is still an error: the endpoint is not read plug by plug.
    assert!(matches!(sources[0].read().await, PowerState::Error { .. }));
    let actions = actions_run(dir.path(), "fence_twice");
    assert!(!actions.iter().any(|a| a == "status"), "{actions:?}");
}

/// An SNMP PDU agent (here a fixture under `fence_apc_snmp`'s name) whose `list-status` gives
/// no list is read plug by plug, and there too an Off counts only for an outlet its list names:
/// never Off, for an outlet number nothing confirms the PDU has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outlet_agent_without_a_list_never_reads_off_plug_by_plug() {
    let dir = tempfile::tempdir().unwrap();
    let agent = listing_agent(dir.path(), "fence_apc_snmp", "\\n", 2);
    let text = format!(
        "datacenter = \"test\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\nagent = \"{}\"\nplug = \"3\"\n",
        agent.display()
    );
    let e = Config::parse(&text, Path::new("test.toml"))
        .unwrap_or_else(|e| panic!("{e}"))
        .bmc
        .remove(0);
    let lister = Arc::new(Lister::new(agent_for(&e, "n1").unwrap()));
    let src = FenceAgentSource::with_lister(&e, "n1", Some(lister)).unwrap();
    // The first read finds no list; the second goes plug by plug.
    for read in 1..=2 {
        match src.read().await {
            PowerState::Error { detail, .. } => {
                assert!(
                    detail.contains("no outlet whose number is \"3\""),
                    "{detail}"
                )
            }
            other => panic!("read {read} of an outlet no list names: {other:?}"),
        }
    }
    let actions = actions_run(dir.path(), "fence_apc_snmp");
    assert!(actions.iter().any(|a| a == "status"), "{actions:?}");
}
