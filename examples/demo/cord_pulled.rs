//! The demo's pulled power cord: the machine and its BMC go dark together, so level 1 cannot
//! answer; the Redfish PDU outlet that feeds it (level 2, the project's test PDU) stays
//! switched On but draws 0 W, and oobfence fences on it, unattested, and `why` says which level
//! spoke and why the one above it could not.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use tokio::sync::Mutex;

use super::support;
use super::{Clock, follow};
use support::gate::Gate;
use support::k8s::FakeNode;
use support::redfish_pdu::RedfishPdu;

/// The outlet that feeds the machine.
pub(super) const OUTLET: &str = "A4";

/// What `why` says when the outlet decided because the BMC could not answer.
const LEVEL_2_SPOKE: &str = "level 2 speaks (level 1 cannot answer";

/// The `[[bmc]]` entries of the machine: its BMC at level 1 (read through `bmc`, which the cord
/// takes down with the machine) and its PDU outlet at level 2.
pub(super) fn config_entries(
    node: &str,
    bmc: &Gate,
    system: &str,
    bmc_ca: &Path,
    pdu: &RedfishPdu,
    password_file: &Path,
    pdu_password_file: &Path,
) -> String {
    format!(
        r#"
[[bmc]]
nodes = ["{node}"]
protocol = "redfish"
address = "{}"
system = "{system}"
username = "admin"
password_file = "{}"
ca_file = "{}"

# The outlet that feeds {node}: it cannot tell whose machine it feeds, so the mapping is the
# operator's word; read only when the BMC cannot answer.
[[bmc]]
nodes = ["{node}"]
level = 2
protocol = "redfish"
identity = "unchecked"
address = "{}"
outlet = "{}"
username = "{}"
password_file = "{}"
ca_file = "{}"
"#,
        bmc.base_url(),
        password_file.display(),
        bmc_ca.display(),
        pdu.base_url(),
        RedfishPdu::outlet(OUTLET),
        support::redfish_pdu::USERNAME,
        pdu_password_file.display(),
        pdu.cert.display(),
    )
}

/// The cord pulled on machine `i`'s node, followed until it is fenced.
pub(super) struct CordPulled<'a> {
    pub(super) clock: &'a Clock,
    pub(super) http: &'a reqwest::Client,
    pub(super) listen: &'a str,
    pub(super) client: &'a kube::Client,
    pub(super) alive: &'a Mutex<HashSet<usize>>,
    pub(super) bin: &'a str,
    pub(super) config_path: &'a Path,
}

impl CordPulled<'_> {
    /// Pulls the cord: the kubelet falls silent, the BMC's port closes, the outlet draws 0 W.
    /// Whether the node was fenced through level 2 and `why` says so.
    pub(super) async fn run(&self, node: &FakeNode, i: usize, bmc: Gate, pdu: &RedfishPdu) -> bool {
        self.clock.say(&format!(
            "=== {}: its power cord is pulled — the machine and its BMC go dark; its PDU outlet {OUTLET} stays switched On, drawing 0 W ===",
            node.name
        ));
        self.alive.lock().await.remove(&i);
        let _dark = bmc.close();
        pdu.set_outlet(OUTLET, "On", Some(0.0));
        let Some(fenced) = follow(
            self.clock,
            self.http,
            self.listen,
            self.client,
            &node.name,
            "fenced-awaiting-recovery",
            Duration::from_secs(150),
            None,
        )
        .await
        else {
            eprintln!(
                "{} was not fenced within 150 s of the cord pulled: see the oobfence log",
                node.name
            );
            return false;
        };
        self.clock.say(&format!(
            "{}: FENCED through its PDU outlet (out-of-service taint: {})",
            node.name,
            FakeNode::has_oos_taint(&fenced)
        ));
        println!("\n$ oobfence why --config demo.toml {}", node.name);
        let why = std::process::Command::new(self.bin)
            .args(["why", "--config"])
            .arg(self.config_path)
            .arg(&node.name)
            .output()
            .expect("run oobfence why");
        let why = String::from_utf8_lossy(&why.stdout);
        print!("{why}");
        FakeNode::has_oos_taint(&fenced) && why.contains(LEVEL_2_SPOKE)
    }
}
