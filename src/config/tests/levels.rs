//! Fencing levels: `level = N` on `[[bmc]]`, every entry that matches a node a source of its
//! level, and the one exception (a second level-1 BMC of a machine is an entry's globs
//! reaching too far, as before levels).

use super::*;

/// A second entry, for the PDU outlets of rack 1 (`level` and `extra` as given).
fn outlet(pw: &Path, address: &str, extra: &str) -> String {
    format!(
        r#"
[[bmc]]
nodes = ["rack1-*"]
protocol = "redfish"
address = "{address}"
username = "pdu"
password_file = "{}"
{extra}
"#,
        pw.display()
    )
}

fn levels_of(cfg: &Config, node: &str) -> Vec<(u32, usize)> {
    cfg.mappings_for(node)
        .iter()
        .map(|m| match m {
            Mapping::Bmc(b) => (m.level(), b.index),
            Mapping::Aws(_) => (m.level(), usize::MAX),
        })
        .collect()
}

#[test]
fn a_level_is_an_integer_from_1_and_defaults_to_1() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let cfg = parse(&minimal(&pw)).unwrap();
    assert_eq!(cfg.bmc[0].level, 1, "default");
    let cfg = parse(&format!(
        "{}{}",
        minimal(&pw),
        outlet(&pw, "https://{node}-pdu.dc1.example", "level = 2")
    ))
    .unwrap();
    assert_eq!(cfg.bmc[1].level, 2);
    for bad in ["level = 0", "level = -1", "level = 10"] {
        let text = format!(
            "{}{}",
            minimal(&pw),
            outlet(&pw, "https://{node}-pdu.dc1.example", bad)
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("[[bmc]] #2 level:") && e.contains("is not a fencing level"),
            "{bad}: {e}"
        );
        assert!(e.contains("from 1") && e.contains("to 9"), "{bad}: {e}");
    }
    let e = parse(&format!(
        "{}{}",
        minimal(&pw),
        outlet(&pw, "https://{node}-pdu.dc1.example", "level = \"2\"")
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("level"), "{e}");
}

/// Every entry that matches a node is one of its sources, tried by level whatever their
/// order in the file; two of one level are both that level's (a machine fed by two
/// outlets); a level may be left empty below an occupied one.
#[test]
fn every_entry_matching_a_node_is_a_source_of_its_level() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let text = format!(
        "datacenter = \"dc1\"\n{}{}{}",
        outlet(&pw, "https://{node}-pdu-a.dc1.example", "level = 3"),
        minimal(&pw).replace("datacenter = \"dc1\"", ""),
        outlet(&pw, "https://{node}-pdu-b.dc1.example", "level = 3"),
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(levels_of(&cfg, "rack1-07"), [(1, 1), (3, 0), (3, 2)]);
    assert_eq!(
        levels_of(&cfg, "db-3"),
        [(1, 1)],
        "only the BMC entry matches"
    );
    assert!(matches!(cfg.mapping_for("rack1-07"), Some(Mapping::Bmc(b)) if b.index == 1));
    assert!(cfg.shadowed_sources("rack1-07").is_empty());
}

/// Two level-1 entries that both read the machine itself (Redfish, IPMI, `[aws]`) cannot
/// both be its BMC: the first is its only one, as before levels (a config written then keeps
/// its meaning), and the later one is named with the first.
#[test]
fn a_second_level_1_bmc_of_a_node_is_shadowed_by_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let text = format!(
        "{}{}\n[aws]\nregion = \"us-east-1\"\nnodes = [\"rack1-0*\"]\nendpoint_url = \"http://127.0.0.1:5000\"\n",
        minimal(&pw),
        outlet(&pw, "https://{node}-other.dc1.example", "")
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(levels_of(&cfg, "rack1-07"), [(1, 0)]);
    let shadowed: Vec<(String, String)> = cfg
        .shadowed_sources("rack1-07")
        .iter()
        .map(|(m, by)| (m.label(), by.label()))
        .collect();
    assert_eq!(
        shadowed,
        [
            (
                "[[bmc]] #2 (line 10)".to_string(),
                "[[bmc]] #1 (line 3)".to_string()
            ),
            ("[aws]".to_string(), "[[bmc]] #1 (line 3)".to_string()),
        ]
    );
    // At level 2 it is a source of its own.
    let cfg = parse(&format!(
        "{}{}",
        minimal(&pw),
        outlet(&pw, "https://{node}-other.dc1.example", "level = 2")
    ))
    .unwrap();
    assert_eq!(levels_of(&cfg, "rack1-07"), [(1, 0), (2, 1)]);
}

/// One outlet may feed several nodes above level 1 (a twin server on one feed): two entries
/// naming it are not two nodes on one machine. At level 1 they still are.
#[test]
fn entries_above_level_1_may_share_a_fixed_outlet() {
    let dir = tempfile::tempdir().unwrap();
    let pw = write_pw(dir.path());
    let twin = |level: &str| {
        format!(
            "{}{}{}",
            minimal(&pw),
            outlet(&pw, "https://pdu-7.dc1.example", level).replace("rack1-*", "rack1-01"),
            outlet(&pw, "https://pdu-7.dc1.example", level).replace("rack1-*", "rack1-02"),
        )
    };
    let cfg = parse(&twin("level = 2")).unwrap();
    assert_eq!(levels_of(&cfg, "rack1-01"), [(1, 0), (2, 1)]);
    assert_eq!(levels_of(&cfg, "rack1-02"), [(1, 0), (2, 2)]);
    let e = parse(&twin("")).unwrap_err().to_string();
    assert!(e.contains("reads the same machine as [[bmc]] #2"), "{e}");
}
