//! `outlet`: a Redfish entry that reads a PDU outlet. It must say `identity = "unchecked"`,
//! cannot also name a system, names an outlet path, goes with Redfish only, and an entry for
//! several nodes needs `{node}` in it; its machine key names the outlet.

use super::*;

const OUTLET: &str = "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/{node}";

fn outlet_entry(pw: &Path, nodes: &str, extra: &str) -> String {
    format!(
        r#"
datacenter = "dc1"
[[bmc]]
nodes = {nodes}
protocol = "redfish"
address = "https://pdu-r1.dc1.example"
username = "fence"
password_file = "{}"
{extra}
"#,
        pw.display()
    )
}

fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn an_outlet_entry_reads_each_nodes_outlet_and_keys_it_by_the_outlet() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&outlet_entry(
        &pw,
        r#"["A1", "A2"]"#,
        &format!("outlet = \"{OUTLET}\"\nidentity = \"unchecked\"\n"),
    ))
    .unwrap();
    let b = &cfg.bmc[0];
    assert_eq!(
        b.outlet_for("A1").as_deref(),
        Some("/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1")
    );
    assert_eq!(b.system_for("A1"), None);
    assert_eq!(
        b.machine_key("A1"),
        "redfish outlet https://pdu-r1.dc1.example:443/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1"
    );
    assert_ne!(b.machine_key("A1"), b.machine_key("A2"));
    assert_eq!(b.outlet_max_off_watts(), crate::decision::Watts::whole(20));
    let with_threshold = parse(&outlet_entry(
        &pw,
        r#"["A1"]"#,
        &format!(
            "outlet = \"{OUTLET}\"\nidentity = \"unchecked\"\ncorroborate = \"power-draw\"\nmax_off_watts = 5\n"
        ),
    ))
    .unwrap();
    assert_eq!(
        with_threshold.bmc[0].outlet_max_off_watts(),
        crate::decision::Watts::whole(5)
    );
}

#[test]
fn an_outlet_entry_must_say_its_identity_is_unchecked() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let e = error(&outlet_entry(
        &pw,
        r#"["A1"]"#,
        &format!("outlet = \"{OUTLET}\"\n"),
    ));
    assert!(
        e.contains("dc1.toml:3: [[bmc]] #1 identity: ")
            && e.contains("cannot tell whose machine it feeds")
            && e.contains("set identity = \"unchecked\""),
        "{e}"
    );
}

#[test]
fn outlet_and_system_exclude_each_other_and_outlet_is_redfish_only() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let e = error(&outlet_entry(
        &pw,
        r#"["A1"]"#,
        &format!(
            "outlet = \"{OUTLET}\"\nsystem = \"/redfish/v1/Systems/1\"\nidentity = \"unchecked\"\n"
        ),
    ));
    assert!(
        e.contains("[[bmc]] #1 outlet: ") && e.contains("set system") && e.contains("not both"),
        "{e}"
    );
    let ipmi = outlet_entry(
        &pw,
        r#"["A1"]"#,
        &format!("outlet = \"{OUTLET}\"\nidentity = \"unchecked\"\n"),
    )
    .replace("\"redfish\"", "\"ipmi\"")
    .replace("https://pdu-r1.dc1.example", "pdu-r1.dc1.example");
    let e = error(&ipmi);
    assert!(
        e.contains("[[bmc]] #1 outlet: applies to protocol = \"redfish\" only"),
        "{e}"
    );
}

#[test]
fn an_outlet_must_be_a_path_to_an_outlet() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    for (bad, says) in [
        (
            "https://pdu/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1",
            "must be a path on the PDU's Redfish service",
        ),
        (
            "redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1",
            "must be a path on the PDU's Redfish service",
        ),
        (
            "/redfish/v1/PowerEquipment/RackPDUs/1",
            "does not name a member of an Outlets collection",
        ),
        (
            "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/",
            "does not name a member of an Outlets collection",
        ),
    ] {
        let e = error(&outlet_entry(
            &pw,
            r#"["A1"]"#,
            &format!("outlet = \"{bad}\"\nidentity = \"unchecked\"\n"),
        ));
        assert!(
            e.contains("[[bmc]] #1 outlet: ") && e.contains(says) && e.contains("Outlets/{node}"),
            "{bad}: {e}"
        );
    }
}

/// One fixed outlet for several nodes would read one outlet for all of them; an entry per node
/// with a fixed outlet is fine, and its outlet is its machine.
#[test]
fn an_entry_for_several_nodes_needs_node_in_its_outlet() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let e = error(&outlet_entry(
        &pw,
        r#"["A1", "A2"]"#,
        "outlet = \"/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1\"\nidentity = \"unchecked\"\n",
    ));
    assert!(
        e.contains("[[bmc]] #1 address: ")
            && e.contains("neither address, system nor outlet contains {node}"),
        "{e}"
    );
    let one = parse(&outlet_entry(
        &pw,
        r#"["A1"]"#,
        "outlet = \"/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1\"\nidentity = \"unchecked\"\n",
    ))
    .unwrap();
    assert_eq!(
        one.bmc[0].fixed_target().as_deref(),
        Some(
            "redfish outlet https://pdu-r1.dc1.example:443/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1"
        )
    );
}

#[test]
fn a_fence_agent_entry_takes_no_outlet() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let text = format!(
        r#"
datacenter = "dc1"
[[bmc]]
nodes = ["A1"]
protocol = "fence-agent"
agent = "fence_ipmilan"
outlet = "{OUTLET}"
identity = "unchecked"
password_file = "{}"
"#,
        pw.display()
    );
    let e = error(&text);
    assert!(
        e.contains("[[bmc]] #1 outlet: does not apply to protocol = \"fence-agent\""),
        "{e}"
    );
}

/// check-config says what an outlet proves (the mapping only) and its threshold, and leaves out
/// the note on Redfish systems' Paused state, which is no outlet's.
#[test]
fn check_config_notes_what_an_outlet_proves() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&outlet_entry(
        &pw,
        r#"["A1"]"#,
        &format!("outlet = \"{OUTLET}\"\nidentity = \"unchecked\"\n"),
    ))
    .unwrap();
    let findings = crate::config::checks::warnings(&cfg);
    let note = findings
        .iter()
        .find(|f| f.key == "bmc[0].outlet")
        .unwrap_or_else(|| panic!("no outlet note in {findings:?}"));
    assert!(
        note.problem.contains("proves only this entry's mapping")
            && note.problem.contains("at most 20 W"),
        "{note:?}"
    );
    assert!(
        !findings.iter().any(|f| f.problem.contains("Paused")),
        "{findings:?}"
    );
}
