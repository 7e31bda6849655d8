//! `inventory = "FILE"` in a `[[bmc]]` entry: a file of `node = address` lines for nodes whose
//! BMC names do not follow their node names. Checked by the real binary at 5,000 lines (how
//! long loading takes is printed, not asserted); its errors name the inventory file and line;
//! a node or machine named twice across inventory and entries is an error; `oobfence probe`
//! reads a listed node's BMC at the address its line gives.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Instant;

use support::cli::oobfence;
use support::sushy::{self, SushyEmulator};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A config in `dir` whose one `[[bmc]]` entry takes its nodes from `inventory` (a path as
/// written in the config), then `extra`.
fn config(dir: &Path, inventory: &str, entry_extra: &str, extra: &str) -> String {
    let pw = dir.join("pw");
    std::fs::write(&pw, "sup3r-secret-pw\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    support::k8s::write_offline_kubeconfig(&dir.join("kubeconfig"));
    format!(
        "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = \"{}\"\n[[bmc]]\ninventory = \"{inventory}\"\nprotocol = \"redfish\"\nusername = \"admin\"\npassword_file = \"{}\"\n{entry_extra}\n{extra}",
        dir.join("kubeconfig").display(),
        pw.display()
    )
}

const PIN: &str =
    "tls_fingerprint = \"sha256:ABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABAB\"";

/// `n` lines `node-NNNNN = https://10.x.y.z`, each its own machine.
fn lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "node-{i:05} = https://10.{}.{}.{}\n",
                i / 65536,
                (i / 256) % 256,
                i % 256
            )
        })
        .collect()
}

/// 5,000 nodes, the inventory named relative to the config file: accepted; the time
/// check-config takes is printed.
#[test]
fn an_inventory_of_5000_nodes_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("inv")).unwrap();
    std::fs::write(
        d.join("inv/dc1.inventory"),
        format!("# node = BMC address, from the CMDB\n\n{}", lines(5000)),
    )
    .unwrap();
    let path = d.join("dc1.toml");
    std::fs::write(&path, config(d, "inv/dc1.inventory", PIN, "")).unwrap();
    let start = Instant::now();
    let o = oobfence(&["check-config"], &path);
    let took = start.elapsed();
    support::bench::figure("check_config_5000_inventory_lines", took.as_millis(), "ms");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .contains("OK (datacenter dc1, 1 [[bmc]] entries (5000 nodes from inventory files)"),
        "{}",
        stdout(&o)
    );
}

/// The same 5,000 nodes as one `[[bmc]]` entry each: accepted; the time check-config takes is
/// printed beside the inventory's (each entry's fixed machine is looked up, not compared with
/// every other entry's).
#[test]
fn five_thousand_bmc_entries_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = config(d, "unused", "", "");
    let cut = text.find("[[bmc]]").unwrap();
    text.truncate(cut);
    let pw = d.join("pw").display().to_string();
    for (i, line) in lines(5000).lines().enumerate() {
        let (node, address) = line.split_once(" = ").unwrap();
        text.push_str(&format!(
            "[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"redfish\"\naddress = \"{address}\"\nusername = \"u{}\"\npassword_file = \"{pw}\"\n{PIN}\n",
            i % 3
        ));
    }
    let path = d.join("dc1.toml");
    std::fs::write(&path, &text).unwrap();
    let start = Instant::now();
    let o = oobfence(&["check-config"], &path);
    let took = start.elapsed();
    support::bench::figure("check_config_5000_bmc_entries", took.as_millis(), "ms");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("OK (datacenter dc1, 5000 [[bmc]] entries, "),
        "{}",
        stdout(&o)
    );
}

/// An earlier glob that catches some of an inventory's nodes: a warning counting them and
/// naming the first; the check passes.
#[test]
fn inventory_lines_an_earlier_glob_hides_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("dc1.inventory"), lines(100)).unwrap();
    let pw = d.join("pw").display().to_string();
    let glob = format!(
        "[[bmc]]\nnodes = [\"node-0001*\"]\nprotocol = \"redfish\"\naddress = \"https://{{node}}.example\"\nusername = \"u\"\npassword_file = \"{pw}\"\n{PIN}\n"
    );
    let text =
        config(d, "dc1.inventory", PIN, "").replacen("[[bmc]]", &format!("{glob}[[bmc]]"), 1);
    let path = d.join("dc1.toml");
    std::fs::write(&path, &text).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "warning: [[bmc]] #2 inventory: 10 of the 100 nodes of {} are matched first by an earlier entry (the first: node-00010, by [[bmc]] #1 (line 4))",
            d.join("dc1.inventory").display()
        )),
        "{err}"
    );
}

/// Every bad line of an inventory in one pass, each named by the inventory file and line.
#[test]
fn inventory_errors_name_the_inventory_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let inv = d.join("dc1.inventory");
    let mut text = lines(100);
    text.push_str("node-00007 = https://10.9.9.9\n");
    text.push_str("Rack1_07 = https://10.9.9.8\n");
    text.push_str("node-x = http://10.9.9.7\n");
    text.push_str("node-y https://10.9.9.6\n");
    text.push_str("node-z = https://10.0.0.3\n");
    std::fs::write(&inv, text).unwrap();
    let path = d.join("dc1.toml");
    std::fs::write(&path, config(d, &inv.display().to_string(), PIN, "")).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let f = inv.display().to_string();
    for want in [
        format!("{f}:101: node-00007: listed twice: first on line 8"),
        format!("{f}:102: \"Rack1_07\" is not a Kubernetes node name"),
        format!("{f}:103: node-x: \"http://10.9.9.7\" must use https://"),
        format!("{f}:104: \"node-y https://10.9.9.6\" is not a `node = address` line"),
        format!("{f}:105: node-z: reads the same machine as {f}:4 ([[bmc]] #1 (line 4))"),
        format!("5 errors in {}", path.display()),
    ] {
        assert!(err.contains(&want), "want {want} in:\n{err}");
    }
    assert!(!err.contains("sup3r-secret-pw"), "{err}");
}

/// A node both in an inventory and named by another entry, or an inventory line reading the
/// machine of another entry: errors, naming both places.
#[test]
fn a_node_or_machine_in_an_inventory_and_an_entry_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("dc1.inventory"), lines(10)).unwrap();
    let pw = d.join("pw").display().to_string();
    let entry = |nodes: &str, address: &str| {
        format!(
            "[[bmc]]\nnodes = [\"{nodes}\"]\nprotocol = \"redfish\"\naddress = \"{address}\"\nusername = \"u\"\npassword_file = \"{pw}\"\n{PIN}\n"
        )
    };
    let path = d.join("dc1.toml");
    let inv = d.join("dc1.inventory").display().to_string();
    for (extra, want) in [
        (
            entry("node-00003", "https://10.7.7.7"),
            format!(
                "{}:11: [[bmc]] #2 nodes: node \"node-00003\" is named twice: first by {inv}:4 ([[bmc]] #1 (line 4))",
                path.display()
            ),
        ),
        (
            entry("db-1", "https://10.0.0.5"),
            format!("{inv}:6: node-00005: reads the same machine as [[bmc]] #1 (line 4)"),
        ),
    ] {
        // The other entry first: the inventory's line is the second to name it.
        let text = if want.starts_with(&inv) {
            config(d, "dc1.inventory", PIN, "").replacen("[[bmc]]", &format!("{extra}[[bmc]]"), 1)
        } else {
            config(d, "dc1.inventory", PIN, &extra)
        };
        std::fs::write(&path, &text).unwrap();
        let o = oobfence(&["check-config"], &path);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{text}\n{err}");
        assert!(err.contains(&want), "want {want} in:\n{err}");
    }
}

/// `oobfence probe` of a node listed in an inventory reads the BMC at its line's address; one
/// the inventory does not list is not mapped.
#[tokio::test(flavor = "multi_thread")]
async fn probe_reads_a_listed_node_at_its_inventory_address() {
    let emu = SushyEmulator::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("dc1.inventory"),
        format!("{}db-primary = {}\n", lines(50), emu.base_url()),
    )
    .unwrap();
    let text = config(
        d,
        "dc1.inventory",
        &format!("ca_file = \"{}\"", emu.cert_pem_path().display()),
        "",
    )
    .replace(
        "username = \"admin\"",
        &format!("username = \"{}\"", sushy::USERNAME),
    );
    let path = d.join("dc1.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::write(d.join("pw"), format!("{}\n", sushy::PASSWORD)).unwrap();
    let o = support::cli::oobfence_async(&["probe", "db-primary"], &path).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(
        out.starts_with(&format!("db-primary: On (redfish {}", emu.base_url())),
        "{out}"
    );
    let o = support::cli::oobfence_async(&["probe", "db-secondary"], &path).await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("matches node \"db-secondary\""),
        "{}",
        stderr(&o)
    );
}
