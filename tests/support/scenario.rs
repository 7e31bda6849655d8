//! One test rig, set up in one place: a unique group of Nodes on the test kube-apiserver, the
//! emulated machines behind them (Redfish systems, IPMI simulators or EC2 instances), a scratch
//! directory, and the datacenter config that ties them together.
//!
//! ```ignore
//! let s = Scenario::redfish("fence", 2).await;  // emulator with systems 0 and 1, all On
//! let dead = s.node("a", 0).await;              // reports system 0's UUID, read from system 0
//! s.map("b", 0);                                // an entry that reads system 0 for node b,
//! let b = s.node_reporting("b", "boot-1", s.identity(1).await).await; // machine 1's kubelet
//! let daemon = s.daemon_with_policy("dry_run = true").await;
//! ```
//!
//! - Machines: [`Scenario::redfish`], [`Scenario::ipmi`], [`Scenario::ec2`],
//!   [`Scenario::without_machines`]; machine `i` is Redfish system `i`, IPMI simulator `i` or
//!   EC2 instance `i`.
//! - Nodes (`"a"` is `{group}-a`): [`Scenario::node`] (machine `i`'s node, the usual case),
//!   or [`Scenario::node_reporting`] (any identity) plus a mapping: [`Scenario::map`],
//!   [`Scenario::map_unreachable`], [`Scenario::map_unreachable_with_system_roots`].
//! - The config: [`DATACENTER`], the fast policy, a node selector for the group, the journal
//!   in the scenario's directory ([`Scenario::journal`]), `[aws]` or the `[[bmc]]` entries. It
//!   is written when a daemon starts ([`Scenario::daemon`] and its variants) or
//!   [`Scenario::write_config`] is called, so map every node first.
//! - The guards: a scenario's group of one or two nodes is a whole datacenter to its daemon, so
//!   `[guards]` starts wide open (`max_unhealthy = "100%"`); the tests of the guards set their
//!   own with [`Scenario::set_guards`]; the guards' record is the scenario's own ConfigMap
//!   ([`Scenario::guard_record`]). The pause file is `paused` in the scenario's directory
//!   ([`Scenario::pause_file`]); the pause ConfigMap is the default one, which no test creates,
//!   unless [`Scenario::set_pause_configmap`] names another.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::Client;
use oobfence::config::{BmcEntry, Config};

use super::ipmi_sim::{self, IpmiSim};
use super::k8s::{FakeNode, KubeletIdentity, RunningDaemon, TEST_LABEL, free_port};
use super::moto::{self, MotoServer};
use super::sushy::{self, SushyEmulator};

/// The `datacenter` every scenario's config names.
pub const DATACENTER: &str = "test";

/// The boot ID [`Scenario::node`] registers a node with.
pub const FIRST_BOOT: &str = "boot-1";

/// The password of a BMC entry nothing answers for ([`Scenario::map_unreachable`]): no
/// output, log or journal may show it.
pub const UNREACHABLE_BMC_PASSWORD: &str = "not-the-real-secret-4711";

/// Fast enough for tests, same rules as production.
const FAST_POLICY: &str = r#"not_ready_grace = "2s"
confirm_reads = 2
confirm_interval = "1s"
read_max_age = "10s"
recheck_interval = "2s"
"#;

/// The machines a scenario's nodes run on. Machine `i` is Redfish system `i`, IPMI simulator
/// `i`, or EC2 instance `i`.
enum Machines {
    None,
    Redfish(SushyEmulator),
    Ipmi(Vec<IpmiSim>),
    Ec2 {
        moto: MotoServer,
        instances: Vec<String>,
    },
}

pub struct Scenario {
    /// The test cluster's admin client.
    pub client: Client,
    /// The `TEST_LABEL` value of this scenario's nodes; the daemon watches only them.
    pub group: String,
    machines: Machines,
    dir: tempfile::TempDir,
    /// The `[[bmc]]` entries mapped so far, as TOML.
    bmc_entries: Mutex<Vec<String>>,
    /// The `[guards]` section's lines.
    guards: Mutex<String>,
    /// `[pause] configmap`.
    pause_configmap: Mutex<String>,
    /// `[guards] record`, when not the scenario's own ([`Scenario::guard_record`]).
    guard_record: Mutex<Option<String>>,
    /// `[aws] endpoint_url` for a scenario without machines (a fake EC2).
    aws_endpoint: Mutex<Option<String>>,
    /// Lines added to the `[aws]` section (`actuate = true`, ...).
    aws_extra: Mutex<String>,
    /// The `[policy]` section's lines before any per-daemon extra ([`FAST_POLICY`] unless set).
    policy: Mutex<String>,
}

/// The config text of a scenario, for a daemon the test runs itself (`oobfence run`): `extra`
/// is appended (sections such as `[ha]`). With `[ha]` there is no pause file (a pause is the
/// group's: the ConfigMap).
impl Scenario {
    pub fn config_text(&self, kubeconfig: &Path, listen: &str, extra: &str) -> String {
        let mut text = self.config(kubeconfig, listen, "");
        if extra.contains("[ha]") {
            let file = format!("file = \"{}\"\n", self.pause_file().display());
            text = text.replace(&file, "file = \"\"\n");
        }
        format!("{text}\n{extra}")
    }
}

/// The scenario's `[guards]` unless a test sets its own.
const OPEN_GUARDS: &str = "max_unhealthy = \"100%\"\n";

impl Scenario {
    /// Nodes without machines: no emulator, and no `[[bmc]]` entry but unreachable ones.
    pub async fn without_machines(group_prefix: &str) -> Scenario {
        Scenario::new(group_prefix, Machines::None).await
    }

    /// A sushy-tools Redfish emulator with `systems` machines, all On.
    pub async fn redfish(group_prefix: &str, systems: usize) -> Scenario {
        let emu = SushyEmulator::start(systems).await;
        Scenario::new(group_prefix, Machines::Redfish(emu)).await
    }

    /// `sims` IPMI simulators (one machine each), all On, each with its own System GUID.
    pub async fn ipmi(group_prefix: &str, sims: usize) -> Scenario {
        let sims = (0..sims).map(|_| IpmiSim::start()).collect();
        Scenario::new(group_prefix, Machines::Ipmi(sims)).await
    }

    /// moto's EC2 emulator with `instances` running instances in [`moto::ZONE`]; the config's
    /// `[aws]` section covers every node of the group.
    pub async fn ec2(group_prefix: &str, instances: usize) -> Scenario {
        let moto = MotoServer::start().await;
        let n = i32::try_from(instances).expect("a few instances");
        let instances = moto::run_instances(&moto.client(), n).await;
        Scenario::new(group_prefix, Machines::Ec2 { moto, instances }).await
    }

    async fn new(group_prefix: &str, machines: Machines) -> Scenario {
        Scenario {
            client: super::k8s::client().await,
            group: super::k8s::unique(group_prefix),
            machines,
            dir: tempfile::tempdir().expect("create the scenario's directory"),
            bmc_entries: Mutex::new(Vec::new()),
            guards: Mutex::new(OPEN_GUARDS.into()),
            pause_configmap: Mutex::new("oobfence/oobfence-pause".into()),
            guard_record: Mutex::new(None),
            aws_endpoint: Mutex::new(None),
            aws_extra: Mutex::new(String::new()),
            policy: Mutex::new(FAST_POLICY.into()),
        }
    }

    /// An `[aws]` section covering every node of the group, read from `endpoint` (a
    /// [`super::fake_ec2::FakeEc2`]), for a scenario without machines.
    pub fn set_aws_endpoint(&self, endpoint: &str) {
        *self.aws_endpoint.lock().unwrap() = Some(endpoint.to_string());
    }

    /// Adds lines to the `[aws]` section (`actuate = true\n`, ...).
    pub fn set_aws_extra(&self, lines: &str) {
        *self.aws_extra.lock().unwrap() = lines.to_string();
    }

    /// Replaces the `[policy]` section's fast lines ("" for the built-in defaults, which are the
    /// example config's).
    pub fn set_policy(&self, lines: &str) {
        *self.policy.lock().unwrap() = lines.to_string();
    }

    /// The `[policy]` section's lines as they stand.
    pub fn policy_lines(&self) -> String {
        self.policy.lock().unwrap().clone()
    }

    /// Replaces the `[guards]` section's lines.
    pub fn set_guards(&self, lines: &str) {
        *self.guards.lock().unwrap() = lines.to_string();
    }

    /// `[pause] configmap = "oobfence/NAME"`.
    pub fn set_pause_configmap(&self, namespace_and_name: &str) {
        *self.pause_configmap.lock().unwrap() = namespace_and_name.to_string();
    }

    /// `[guards] record`: the scenario's own ConfigMap in `default` (every scenario's
    /// datacenter is [`DATACENTER`]: one record for all would carry one test's fences and
    /// storms into another's daemons), unless [`Scenario::set_guard_record`] names another.
    pub fn guard_record(&self) -> String {
        self.guard_record
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_else(|| format!("default/{}-guards", self.group))
    }

    /// `[guards] record = "NAMESPACE/NAME"` (deploy/rbac.yaml's, for a daemon with its token).
    pub fn set_guard_record(&self, namespace_and_name: &str) {
        *self.guard_record.lock().unwrap() = Some(namespace_and_name.to_string());
    }

    /// The pause file of the scenario's daemons.
    pub fn pause_file(&self) -> PathBuf {
        self.dir().join("paused")
    }

    /// The scenario's Redfish emulator.
    pub fn redfish_emulator(&self) -> &SushyEmulator {
        match &self.machines {
            Machines::Redfish(emu) => emu,
            _ => panic!("not a Redfish scenario"),
        }
    }

    /// IPMI simulator `i`.
    pub fn ipmi_sim(&self, i: usize) -> &IpmiSim {
        match &self.machines {
            Machines::Ipmi(sims) => &sims[i],
            _ => panic!("not an IPMI scenario"),
        }
    }

    /// The scenario's EC2 emulator.
    pub fn moto(&self) -> &MotoServer {
        match &self.machines {
            Machines::Ec2 { moto, .. } => moto,
            _ => panic!("not an EC2 scenario"),
        }
    }

    /// The instance ID of EC2 machine `i`.
    pub fn instance(&self, i: usize) -> &str {
        match &self.machines {
            Machines::Ec2 { instances, .. } => &instances[i],
            _ => panic!("not an EC2 scenario"),
        }
    }

    /// Scratch space that lives as long as the scenario (password files, extra configs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The decision journal of the scenario's daemons; it outlives them.
    pub fn journal(&self) -> PathBuf {
        self.dir().join("state/journal.jsonl")
    }

    /// The journal's record of `node`'s fence that landed, once written (it follows the write,
    /// so it is waited for, within `bound`).
    pub async fn fence_record(
        &self,
        node: &str,
        bound: std::time::Duration,
    ) -> oobfence::journal::Record {
        super::k8s::wait_for("the fence's journal record", bound, || async {
            oobfence::journal::tail(&self.journal(), node, 100)
                .ok()?
                .records
                .into_iter()
                .find(|r| r.action == "taint" && r.result == "success")
        })
        .await
    }

    /// The name of node `suffix`: `{group}-{suffix}`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.group)
    }

    /// What the kubelet of machine `i` reports: its system UUID (Redfish, IPMI), or its
    /// private IP and DNS name (EC2).
    pub async fn identity(&self, machine: usize) -> KubeletIdentity {
        match &self.machines {
            Machines::Redfish(emu) => KubeletIdentity::uuid(&emu.uuid(machine)),
            Machines::Ipmi(sims) => KubeletIdentity::uuid(&sims[machine].uuid()),
            Machines::Ec2 { moto, instances } => {
                moto::kubelet_of(&moto.client(), &instances[machine]).await
            }
            Machines::None => panic!("this scenario has no machines"),
        }
    }

    /// Registers node `suffix` as machine `i`: booted as [`FIRST_BOOT`], Ready, its kubelet
    /// reporting the machine's identity, its power read from the machine's BMC (Redfish,
    /// IPMI) or instance (EC2, through the node's providerID).
    pub async fn node(&self, suffix: &str, machine: usize) -> FakeNode {
        let identity = self.identity(machine).await;
        if let Machines::Ec2 { instances, .. } = &self.machines {
            let node = self.node_reporting(suffix, FIRST_BOOT, identity).await;
            node.set_provider_id(&moto::provider_id(moto::ZONE, &instances[machine]))
                .await;
            return node;
        }
        self.map(suffix, machine);
        self.node_reporting(suffix, FIRST_BOOT, identity).await
    }

    /// Registers node `suffix`, Ready and booted as `boot_id`, whose kubelet reports
    /// `identity` (`KubeletIdentity::default()`: nothing usable). Maps it to nothing.
    pub async fn node_reporting(
        &self,
        suffix: &str,
        boot_id: &str,
        identity: KubeletIdentity,
    ) -> FakeNode {
        FakeNode::create_as(
            &self.client,
            &self.name(suffix),
            &self.group,
            boot_id,
            identity,
        )
        .await
    }

    /// Registers node `suffix` on Redfish system `machine`, read through `base_url` (a
    /// [`super::gate::Gate`] in front of the emulator) instead of the emulator's own address.
    pub async fn node_through(&self, suffix: &str, machine: usize, base_url: &str) -> FakeNode {
        let Machines::Redfish(emu) = &self.machines else {
            panic!("node_through is for Redfish scenarios");
        };
        let node = self.name(suffix);
        let entry = bmc_entry(
            &node,
            "redfish",
            base_url,
            sushy::USERNAME,
            &self.password_file(&node, sushy::PASSWORD),
            &format!(
                "system = \"{}\"\nca_file = \"{}\"\ntimeout = \"2s\"",
                emu.system_path(machine),
                emu.cert_pem_path().display()
            ),
        );
        self.add_bmc_entry(&entry);
        let identity = self.identity(machine).await;
        self.node_reporting(suffix, FIRST_BOOT, identity).await
    }

    /// A Redfish `[[bmc]]` entry for node `suffix` at any `address`, with `password` and extra
    /// TOML keys (`system`, `ca_file`, `timeout`...): BMCs that are not the scenario's machines.
    pub fn map_redfish(&self, suffix: &str, address: &str, password: &str, extra: &str) {
        let node = self.name(suffix);
        let entry = bmc_entry(
            &node,
            "redfish",
            address,
            sushy::USERNAME,
            &self.password_file(&node, password),
            extra,
        );
        self.add_bmc_entry(&entry);
    }

    /// An IPMI `[[bmc]]` entry for node `suffix` at any `address` (`host:port`).
    pub fn map_ipmi(&self, suffix: &str, address: &str, password: &str, extra: &str) {
        let node = self.name(suffix);
        let entry = bmc_entry(
            &node,
            "ipmi",
            address,
            ipmi_sim::USERNAME,
            &self.password_file(&node, password),
            &format!("cipher_suite = 3\nprivilege = \"administrator\"\n{extra}"),
        );
        self.add_bmc_entry(&entry);
    }

    /// A `[[bmc]]` entry that reads node `suffix`'s power from machine `i` (Redfish system `i`
    /// with the emulator's pinned certificate, or IPMI simulator `i`).
    pub fn map(&self, suffix: &str, machine: usize) {
        self.map_with(suffix, machine, "");
    }

    /// As [`map`](Self::map), with `extra` lines in the entry (`actuate = true`, ...).
    pub fn map_with(&self, suffix: &str, machine: usize, extra: &str) {
        let node = self.name(suffix);
        let entry = match &self.machines {
            Machines::Redfish(emu) => bmc_entry(
                &node,
                "redfish",
                &emu.base_url(),
                sushy::USERNAME,
                &self.password_file(&node, sushy::PASSWORD),
                &format!(
                    "system = \"{}\"\nca_file = \"{}\"\ntimeout = \"5s\"\n{extra}",
                    emu.system_path(machine),
                    emu.cert_pem_path().display()
                ),
            ),
            Machines::Ipmi(sims) => bmc_entry(
                &node,
                "ipmi",
                &sims[machine].address(),
                ipmi_sim::USERNAME,
                &self.password_file(&node, ipmi_sim::PASSWORD),
                &format!(
                    "cipher_suite = 3\nprivilege = \"administrator\"\ntimeout = \"3s\"\n{extra}"
                ),
            ),
            Machines::Ec2 { .. } => panic!(
                "an EC2 node is mapped by its providerID: Scenario::node or FakeNode::set_provider_id"
            ),
            Machines::None => panic!("this scenario has no machines"),
        };
        self.add_bmc_entry(&entry);
    }

    /// A `[[bmc]]` entry for node `suffix` that nothing answers: a Redfish address on a free
    /// loopback port, with [`UNREACHABLE_BMC_PASSWORD`] and no certificate check.
    pub fn map_unreachable(&self, suffix: &str) {
        self.add_unreachable(suffix, "tls_insecure = true");
    }

    /// As [`map_unreachable`](Self::map_unreachable), but verifying the BMC's certificate
    /// against the system's roots, which the daemon loads (`SSL_CERT_FILE`, ...) when it first
    /// builds the node's power source.
    pub fn map_unreachable_with_system_roots(&self, suffix: &str) {
        self.add_unreachable(suffix, "");
    }

    fn add_unreachable(&self, suffix: &str, tls: &str) {
        let node = self.name(suffix);
        let entry = bmc_entry(
            &node,
            "redfish",
            &format!("https://127.0.0.1:{}", free_port()),
            "admin",
            &self.password_file(&node, UNREACHABLE_BMC_PASSWORD),
            &format!("system = \"/redfish/v1/Systems/1\"\n{tls}\ntimeout = \"1s\""),
        );
        self.add_bmc_entry(&entry);
    }

    /// A `protocol = "fence-agent"` entry for node `suffix` (`identity = "unchecked"`, as
    /// these entries must say), with `password` in a file and `lines` (agent, options, ...).
    pub fn map_fence_agent(&self, suffix: &str, password: &str, lines: &str) {
        let node = self.name(suffix);
        let entry = format!(
            "\n[[bmc]]\nnodes = [\"{node}\"]\nprotocol = \"fence-agent\"\nidentity = \"unchecked\"\npassword_file = \"{}\"\n{lines}\n",
            self.password_file(&node, password).display()
        );
        self.add_bmc_entry(&entry);
    }

    fn add_bmc_entry(&self, toml: &str) {
        self.bmc_entries.lock().unwrap().push(toml.to_string());
    }

    /// The datacenter config: [`DATACENTER`], `kubeconfig`, a node selector for the group,
    /// the fast policy plus `policy_extra` lines, `listen`, the [`journal`](Self::journal),
    /// `[aws]` for EC2, and every `[[bmc]]` entry mapped so far.
    fn config(&self, kubeconfig: &Path, listen: &str, policy_extra: &str) -> String {
        let mut text = format!(
            r#"datacenter = "{DATACENTER}"
[kubernetes]
kubeconfig = "{}"
node_selector = "{TEST_LABEL}={}"
[policy]
{}{policy_extra}
[server]
listen = "{listen}"
[journal]
path = "{}"
[guards]
{}
record = "{}"
[pause]
file = "{}"
configmap = "{}"
"#,
            kubeconfig.display(),
            self.group,
            self.policy.lock().unwrap(),
            self.journal().display(),
            self.guards.lock().unwrap(),
            self.guard_record(),
            self.pause_file().display(),
            self.pause_configmap.lock().unwrap(),
        );
        let aws_endpoint = match &self.machines {
            Machines::Ec2 { moto, .. } => Some(moto.endpoint()),
            _ => self.aws_endpoint.lock().unwrap().clone(),
        };
        if let Some(endpoint) = aws_endpoint {
            text.push_str(&format!(
                "[aws]\nregion = \"{}\"\nnodes = [\"{}-*\"]\nendpoint_url = \"{endpoint}\"\n{}",
                moto::REGION,
                self.group,
                self.aws_extra.lock().unwrap(),
            ));
        }
        for entry in self.bmc_entries.lock().unwrap().iter() {
            text.push_str(entry);
        }
        text
    }

    /// Writes the config (no extra policy) to `dc.toml` in the scenario's directory, for the
    /// `oobfence` binary: `probe`, `check-config`, or a `run` the test starts itself.
    pub fn write_config(&self, kubeconfig: &Path, listen: &str) -> PathBuf {
        let path = self.dir().join("dc.toml");
        std::fs::write(&path, self.config(kubeconfig, listen, "")).unwrap();
        path
    }

    /// Starts a daemon in this process with the test cluster's kubeconfig.
    pub async fn daemon(&self) -> RunningDaemon {
        self.daemon_with_policy("").await
    }

    /// Starts a daemon whose `[policy]` also has these lines (`dry_run = true`, ...).
    pub async fn daemon_with_policy(&self, policy_extra: &str) -> RunningDaemon {
        self.start_daemon(&super::k8s::kubeconfig_path(), policy_extra)
            .await
    }

    /// Starts a daemon that reaches the API server through `kubeconfig` alone.
    pub async fn daemon_with_kubeconfig(&self, kubeconfig: &Path) -> RunningDaemon {
        self.start_daemon(kubeconfig, "").await
    }

    async fn start_daemon(&self, kubeconfig: &Path, policy_extra: &str) -> RunningDaemon {
        // The daemon fills in `{listen}`; its own directory holds the config file.
        let text = self.config(kubeconfig, "{listen}", policy_extra);
        let dir = tempfile::tempdir().expect("create the daemon's directory");
        RunningDaemon::start(&text, dir).await
    }

    /// A password file for one entry of `node`.
    fn password_file(&self, node: &str, password: &str) -> PathBuf {
        let n = self.bmc_entries.lock().unwrap().len();
        let path = self.dir().join(format!("pw-{n}-{node}"));
        std::fs::write(&path, format!("{password}\n")).unwrap();
        path
    }
}

/// One `[[bmc]]` entry for node `n1` through the real config parser, for the tests of one
/// power source: `protocol`, `address`, `username`, a new password file in `dir` holding
/// `password`, and `extra` TOML keys.
pub fn parsed_bmc_entry(
    protocol: &str,
    dir: &Path,
    address: &str,
    username: &str,
    password: &str,
    extra: &str,
) -> BmcEntry {
    static FILES: AtomicU64 = AtomicU64::new(0);
    let pw = dir.join(format!("pw-{}", FILES.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&pw, format!("{password}\n")).unwrap();
    let text = format!(
        "datacenter = \"{DATACENTER}\"\n{}",
        bmc_entry("n1", protocol, address, username, &pw, extra)
    );
    let cfg = Config::parse(&text, Path::new("test.toml"))
        .unwrap_or_else(|e| panic!("test config does not parse: {e}\n{text}"));
    cfg.bmc.into_iter().next().unwrap()
}

/// A `[[bmc]]` entry for `node`; `extra` adds TOML keys.
fn bmc_entry(
    node: &str,
    protocol: &str,
    address: &str,
    username: &str,
    password_file: &Path,
    extra: &str,
) -> String {
    format!(
        r#"
[[bmc]]
nodes = ["{node}"]
protocol = "{protocol}"
address = "{address}"
username = "{username}"
password_file = "{}"
{extra}
"#,
        password_file.display()
    )
}
