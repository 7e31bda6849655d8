//! A switched PDU for tests: `snmpsim` (PyPI, in the test virtualenv) serving the MIB of a rack
//! PDU from a `.snmprec` written here, on a free loopback UDP port, over SNMP v1, v2c and v3.
//! Each outlet's state is a file read on every GET and written by a SET on its control OID
//! (the variation module `snmp_pdu_outlet.py`), so the agent's own `off` and `on` switch it
//! and a test changes it between reads with [`SnmpPdu::set_outlet`].
//!
//! snmpsim refuses to run as root unless told which user to become: as root it runs as
//! `nobody`, so its directory, index cache and outlet files are opened to that user. The
//! simulator runs in its own process group, stopped by its ID on drop.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::ipmi_sim::{free_udp_port, which};

/// The SNMP v1/v2c community the PDU answers (its data file's name); a secret to the agent.
pub const COMMUNITY: &str = "pdu-rw-community";
/// The SNMPv3 user, its authentication (SHA) and privacy (AES) keys.
pub const V3_USER: &str = "pdu-reader";
pub const V3_AUTH_KEY: &str = "v3-auth-secret";
pub const V3_PRIV_KEY: &str = "v3-priv-secret";

/// How long snmpsim may take to answer its first GET (it builds its index first).
const START_DEADLINE: Duration = super::SERVER_START_BOUND;

/// One PDU family's MIB, as its fence agent reads it.
pub struct PduModel {
    pub what: &'static str,
    /// The fence agent that reads it.
    pub agent: &'static str,
    /// sysObjectID: the agent picks its OIDs by it.
    sys_object_id: &'static str,
    sys_descr: &'static str,
    /// The outlet table column the agent walks to find a plug by name.
    names: &'static str,
    /// That column holds the outlet's index (an integer), not a name.
    names_are_indexes: bool,
    /// Outlet state, read by `status`.
    status: &'static str,
    /// Outlet command, written by `on` and `off`.
    control: &'static str,
    /// The OID index of outlet 1, the number on the PDU's label.
    first_index: u32,
    pub on: i64,
    pub off: i64,
}

/// APC Switched Rack PDU (PowerNet-MIB rPDU: sysObjectID `.318.1.3.4.5`), as `fence_apc_snmp`
/// reads it: rPDUOutletStatusOutletName and ...OutletState (1 on, 2 off), switched through
/// rPDUOutletControlOutletCommand (1 immediateOn, 2 immediateOff).
pub const APC_RACK_PDU: PduModel = PduModel {
    what: "APC rack PDU",
    agent: "fence_apc_snmp",
    sys_object_id: "1.3.6.1.4.1.318.1.3.4.5",
    sys_descr: "APC Web/SNMP Management Card (MB:v4.1.0 PF:v6.4.6 PN:apc_hw05_aos_646.bin AN1:apc_hw05_rpdu2g_646.bin MN:AP8941 HR:02)",
    names: "1.3.6.1.4.1.318.1.1.12.3.5.1.1.2",
    names_are_indexes: false,
    status: "1.3.6.1.4.1.318.1.1.12.3.5.1.1.4",
    control: "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4",
    first_index: 1,
    on: 1,
    off: 2,
};

/// APC Master Switch on firmware 6 (sysObjectID `.318.1.3.4.6`), as `fence_apc_snmp` reads it
/// (and any PDU whose sysObjectID it does not know): sPDUOutletCtl for the state (1 on, 2 off,
/// 4 outletUnknown), sPDUOutletName for names, switched through the rack PDU's command OID.
pub const APC_MASTER_SWITCH_6: PduModel = PduModel {
    what: "APC Master Switch (firmware 6)",
    agent: "fence_apc_snmp",
    sys_object_id: "1.3.6.1.4.1.318.1.3.4.6",
    sys_descr: "APC Web/SNMP Management Card (MB:v3.6.9 PF:v6.0.6 PN:apc_hw02_aos_606.bin AN1:apc_hw02_sy_606.bin MN:AP9212 HR:B2)",
    names: "1.3.6.1.4.1.318.1.1.4.4.2.1.4",
    names_are_indexes: false,
    status: "1.3.6.1.4.1.318.1.1.4.4.2.1.3",
    control: "1.3.6.1.4.1.318.1.1.12.3.3.1.1.4",
    first_index: 1,
    on: 1,
    off: 2,
};

/// Eaton Managed ePDU (sysObjectID `.534.6.6.6`), as `fence_eaton_snmp` reads it: outlets
/// indexed from 0 (the agent subtracts one from the plug), one OID for state and command
/// (0 off, 1 on, 2 cycling).
pub const EATON_MANAGED_EPDU: PduModel = PduModel {
    what: "Eaton Managed ePDU",
    agent: "fence_eaton_snmp",
    sys_object_id: "1.3.6.1.4.1.534.6.6.6",
    sys_descr: "Eaton ePDU MA 1P IN:C20 16A OUT:20xC13, 4xC19",
    names: "1.3.6.1.4.1.534.6.6.6.1.2.2.1.1",
    names_are_indexes: true,
    status: "1.3.6.1.4.1.534.6.6.6.1.2.2.1.3",
    control: "1.3.6.1.4.1.534.6.6.6.1.2.2.1.3",
    first_index: 0,
    on: 1,
    off: 0,
};

/// One running simulated PDU.
pub struct SnmpPdu {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    model: &'static PduModel,
}

impl SnmpPdu {
    /// Starts a PDU of `model` whose outlets 1, 2, ... are named and powered as `outlets` say.
    pub fn start(model: &'static PduModel, outlets: &[(&str, bool)]) -> SnmpPdu {
        let dir = tempfile::Builder::new()
            .prefix("snmp-pdu")
            .tempdir()
            .expect("create a temporary directory for snmpsim");
        for sub in ["data", "modules", "cache", "outlets"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::fs::write(
            dir.path().join("modules/outlet.py"),
            include_str!("snmp_pdu_outlet.py"),
        )
        .unwrap();
        let pdu_dir = dir.path().to_path_buf();
        let mut records = vec![
            (
                "1.3.6.1.2.1.1.1.0".to_string(),
                format!("4|{}", model.sys_descr),
            ),
            (
                "1.3.6.1.2.1.1.2.0".to_string(),
                format!("6|{}", model.sys_object_id),
            ),
        ];
        for (i, (name, on)) in outlets.iter().enumerate() {
            let n = i as u32 + 1;
            let index = n - 1 + model.first_index;
            let state = pdu_dir.join(format!("outlets/{n}"));
            std::fs::write(
                &state,
                format!("{}\n", if *on { model.on } else { model.off }),
            )
            .unwrap();
            let name = if model.names_are_indexes {
                format!("2|{index}")
            } else {
                format!("4|{name}")
            };
            records.push((format!("{}.{index}", model.names), name));
            records.push((
                format!("{}.{index}", model.status),
                format!("2:outlet|{}", state.display()),
            ));
            if model.control != model.status {
                records.push((
                    format!("{}.{index}", model.control),
                    format!("2:outlet|{}", state.display()),
                ));
            }
        }
        // snmpsim answers GETNEXT (the agent's walks) in the file's order: sorted by OID.
        let key = |oid: &str| -> Vec<u64> { oid.split('.').map(|p| p.parse().unwrap()).collect() };
        records.sort_by_key(|a| key(&a.0));
        let text: String = records
            .iter()
            .map(|(oid, rest)| format!("{oid}|{rest}\n"))
            .collect();
        std::fs::write(dir.path().join(format!("data/{COMMUNITY}.snmprec")), text).unwrap();
        open_to_everyone(dir.path());

        // A free port is only free until someone else takes it: retry on a lost race.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let port = free_udp_port();
            match launch(dir.path(), port, attempt) {
                Ok(child) => {
                    return SnmpPdu {
                        child,
                        dir,
                        port,
                        model,
                    };
                }
                Err(log) => {
                    if !log.contains("in use") {
                        panic!("snmpsim did not come up\n--- log ---\n{log}");
                    }
                    last_log = log;
                }
            }
        }
        panic!("snmpsim could not get a free port in 3 tries\n--- log ---\n{last_log}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn outlet_file(&self, n: u32) -> PathBuf {
        let f = self.dir.path().join(format!("outlets/{n}"));
        assert!(f.is_file(), "the {} has no outlet {n}", self.model.what);
        f
    }

    /// Switches outlet `n` on or off, as a person at the PDU would.
    pub fn set_outlet(&self, n: u32, on: bool) {
        self.set_outlet_value(n, if on { self.model.on } else { self.model.off });
    }

    /// Sets outlet `n`'s state OID to `value` (a state other than on and off: cycling, pending).
    pub fn set_outlet_value(&self, n: u32, value: i64) {
        let f = self.outlet_file(n);
        let tmp = f.with_extension("tmp");
        std::fs::write(&tmp, format!("{value}\n")).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::rename(tmp, f).unwrap();
    }

    /// A `[[bmc]]` entry's lines (after `protocol` and `identity`) reading outlet `plug` (its
    /// number or name) through the model's agent over SNMP `version` ("1" or "2c") with the
    /// PDU's community.
    pub fn agent_lines(&self, version: &str, plug: &str) -> String {
        agent_lines(self.model.agent, self.port, version, COMMUNITY, plug)
    }

    /// Outlet `n`'s state OID as the PDU answers it now.
    pub fn outlet_value(&self, n: u32) -> i64 {
        let text = std::fs::read_to_string(self.outlet_file(n)).unwrap();
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("outlet {n} holds {text:?}"))
    }

    /// Whether outlet `n` is on, as the PDU would say.
    pub fn outlet_on(&self, n: u32) -> bool {
        let v = self.outlet_value(n);
        assert!(
            v == self.model.on || v == self.model.off,
            "outlet {n} is {v}, neither on nor off"
        );
        v == self.model.on
    }

    /// `snmpget -v2c` of `oid` through net-snmp (the tool the agents run): its `-Oqv` value.
    pub fn snmpget(&self, oid: &str) -> String {
        let out = super::blocking(|| {
            Command::new(which("snmpget"))
                .args([
                    "-v2c", "-c", COMMUNITY, "-t", "1", "-r", "2", "-m", "", "-Oqv",
                ])
                .arg(format!("127.0.0.1:{}", self.port))
                .arg(oid)
                .stdin(Stdio::null())
                .output()
        })
        .expect("run snmpget");
        assert!(out.status.success(), "snmpget {oid}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A `[[bmc]]` entry's lines reading `plug` through `agent` at `127.0.0.1:port` over SNMP
/// `version` with `community`.
pub fn agent_lines(agent: &str, port: u16, version: &str, community: &str, plug: &str) -> String {
    format!(
        "agent = \"{agent}\"\ntimeout = \"30s\"\nplug = \"{plug}\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{port}\", snmp_version = \"{version}\", community = \"{community}\" }}\n"
    )
}

impl Drop for SnmpPdu {
    fn drop(&mut self) {
        stop_group(&mut self.child);
    }
}

/// Starts snmpsim on `port` with the data in `dir`; on failure, its log.
fn launch(dir: &Path, port: u16, attempt: u32) -> Result<Child, String> {
    let log_path = dir.join(format!("snmpsim-{attempt}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(super::venv_bin("snmpsim-command-responder"));
    cmd.arg("--logging-method=stderr")
        .arg(format!("--v3-user={V3_USER}"))
        .arg(format!("--v3-auth-key={V3_AUTH_KEY}"))
        .arg("--v3-auth-proto=SHA")
        .arg(format!("--v3-priv-key={V3_PRIV_KEY}"))
        .arg("--v3-priv-proto=AES")
        .arg(format!("--agent-udpv4-endpoint=127.0.0.1:{port}"))
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .arg(format!(
            "--variation-modules-dir={}",
            dir.join("modules").display()
        ));
    if running_as_root() {
        // snmpsim will not serve as root: it drops to this user once its port is bound.
        cmd.arg("--process-user=nobody")
            .arg(format!("--process-group={}", nobodys_group()));
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start snmpsim-command-responder: {e}"));
    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(why) => {
            stop_group(&mut child);
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            Err(format!("{why}\n{log}"))
        }
    }
}

/// Waits until the simulator answers a GET of sysObjectID (snmpget, one try of 0.5 s each).
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let snmpget = which("snmpget");
    let start = Instant::now();
    while start.elapsed() < START_DEADLINE {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("it exited with {status}"));
        }
        let out = super::blocking(|| {
            Command::new(&snmpget)
                .args(["-v2c", "-c", COMMUNITY, "-t", "0.5", "-r", "0", "-m", ""])
                .arg(format!("127.0.0.1:{port}"))
                .arg("1.3.6.1.2.1.1.2.0")
                .stdin(Stdio::null())
                .output()
        })
        .map_err(|e| format!("snmpget: {e} (run scripts/install-deps: Debian package snmp)"))?;
        if out.status.success() {
            return Ok(());
        }
    }
    Err(format!(
        "no answer to an SNMP GET on UDP {port} within {START_DEADLINE:?}"
    ))
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `nobody`'s group: `nogroup` on Debian, `nobody` elsewhere.
fn nobodys_group() -> &'static str {
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    if groups.lines().any(|l| l.starts_with("nogroup:")) {
        "nogroup"
    } else {
        "nobody"
    }
}

/// The simulator reads its data and modules, and writes its index and the outlets' files, as
/// `nobody`: the test's directory is opened to it.
fn open_to_everyone(dir: &Path) {
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(dir, 0o755).unwrap();
    for sub in ["data", "modules"] {
        mode(&dir.join(sub), 0o755).unwrap();
    }
    for sub in ["cache", "outlets"] {
        mode(&dir.join(sub), 0o777).unwrap();
    }
    for f in std::fs::read_dir(dir.join("outlets")).unwrap() {
        mode(&f.unwrap().path(), 0o666).unwrap();
    }
}

/// Stops the simulator's process group by its ID and reaps it.
fn stop_group(child: &mut Child) {
    let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
}
