//! A real IPMI BMC for tests: OpenIPMI's `ipmi_sim`, serving RMCP+ on a free loopback UDP port,
//! with its power state kept in a file through a `chassis_control` hook, so a test "pulls the
//! plug" by writing `0` into it. The reference client is `ipmitool -I lanplus -C 3`.
//!
//! Each simulator runs in its own process group; dropping it stops the group by its ID (the
//! simulator and any hook process it spawned) and reaps the simulator.
//!
//! Each simulator has its own System GUID (the `guid` line of its lan.conf). ipmi_sim answers
//! Get System GUID (NetFn App, command 37h) with the 16 bytes of that line verbatim, in the
//! order they are written: `guid 00112233445566778899aabbccddeeff` is answered with
//! `00 11 22 ... ff` (checked with `ipmitool raw 0x06 0x37`: ipmitool 1.8.19, OpenIPMI 2.0.33).
//! It applies no byte order of its own, so read in network (RFC 4122) order the bytes are the
//! configured hex with hyphens: [`IpmiSim::uuid`]. (ipmi_sim also needs the line: without it
//! no RMCP+ session can be opened, as the GUID takes part in the RAKP exchange.)

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "password";
/// An account whose role is Operator only.
pub const OPERATOR: &str = "oper";
pub const OPERATOR_PASSWORD: &str = "operpass";
/// An account whose role is User only: enough to read the power state.
pub const READER: &str = "reader";
pub const READER_PASSWORD: &str = "readerpass";

/// How long the simulator may take to answer an RMCP ping after being started.
const START_DEADLINE: Duration = super::SERVER_START_BOUND;

/// The `chassis_control` hook: `HOOK STATEFILE get power` prints `power:0|1`,
/// `HOOK STATEFILE set power 0|1` writes it.
const HOOK: &str = r#"#!/bin/sh
f="$1"
shift
case "$1 $2" in
  "get power") v=$(cat "$f" 2>/dev/null); echo "power:${v:-0}" ;;
  "set power") echo "$3" > "$f" ;;
  "get boot") echo "boot:default" ;;
esac
exit 0
"#;

const EMU: &str = "mc_setbmc 0x20\n\
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\n\
sel_enable 0x20 1000 0x0a\n\
mc_enable 0x20\n";

/// One running `ipmi_sim`.
pub struct IpmiSim {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    /// The System GUID, as the 32 hex digits of the `guid` line.
    guid: String,
}

impl IpmiSim {
    /// Starts a simulator whose machine is powered on, with a System GUID no other simulator
    /// of this test run has.
    pub fn start() -> IpmiSim {
        use std::sync::atomic::{AtomicU32, Ordering};
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        IpmiSim::start_with_guid(&format!(
            "a123456789abcdef{:08x}{n:08x}",
            std::process::id()
        ))
    }

    /// Starts a simulator whose machine is powered on, with this System GUID (32 hex digits,
    /// the bytes in the order the simulator sends them).
    pub fn start_with_guid(guid: &str) -> IpmiSim {
        assert!(
            guid.len() == 32 && guid.bytes().all(|b| b.is_ascii_hexdigit()),
            "a System GUID is 32 hex digits, not {guid:?}"
        );
        let guid = guid.to_ascii_lowercase();
        let dir = tempfile::Builder::new()
            .prefix("ipmi-sim")
            .tempdir()
            .expect("create a temporary directory for ipmi_sim");
        let hook = dir.path().join("chassis-control.sh");
        std::fs::write(&hook, HOOK).unwrap();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(dir.path().join("power"), "1\n").unwrap();
        std::fs::write(dir.path().join("node.emu"), EMU).unwrap();

        // A free port is only free until someone else takes it: retry on a lost race.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let port = free_udp_port();
            match launch(dir.path(), port, &guid, &format!("{attempt}")) {
                Ok(child) => {
                    return IpmiSim {
                        child,
                        dir,
                        port,
                        guid,
                    };
                }
                Err(log) => {
                    if !log.to_ascii_lowercase().contains("in use") {
                        panic!("ipmi_sim did not come up\n--- log ---\n{log}");
                    }
                    last_log = log;
                }
            }
        }
        panic!("ipmi_sim could not get a free port in 3 tries\n--- log ---\n{last_log}");
    }

    /// Stops the simulator and starts a new one on the same port: every session it had is
    /// forgotten, as after a BMC reset.
    pub fn restart(&mut self) {
        stop_group(&mut self.child);
        static RESTARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = RESTARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("restart-{n}");
        self.child = launch(self.dir.path(), self.port, &self.guid, &tag)
            .unwrap_or_else(|log| panic!("ipmi_sim did not come back\n--- log ---\n{log}"));
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, as an `address` in a `[[bmc]]` entry.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The 16 bytes the simulator answers Get System GUID with.
    pub fn guid_bytes(&self) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&self.guid[2 * i..2 * i + 2], 16).unwrap();
        }
        bytes
    }

    /// The UUID the simulator's GUID bytes spell in the order they are sent (RFC 4122): the
    /// configured hex with hyphens. One of the forms a read must report.
    pub fn uuid(&self) -> String {
        let g = &self.guid;
        format!(
            "{}-{}-{}-{}-{}",
            &g[0..8],
            &g[8..12],
            &g[12..16],
            &g[16..20],
            &g[20..32]
        )
    }

    /// Every canonical UUID the simulator's GUID may stand for (SMBIOS, IPMI and RFC 4122 byte
    /// orders), as oobfence reports them.
    pub fn uuid_forms(&self) -> Vec<String> {
        oobfence::identity::uuid_forms_of_ipmi_guid(&self.guid_bytes())
    }

    /// Powers the simulated machine on or off (what the next Get Chassis Status reports).
    pub fn set_power(&self, on: bool) {
        let file = self.dir.path().join("power");
        let tmp = self.dir.path().join("power.tmp");
        std::fs::write(&tmp, if on { "1\n" } else { "0\n" }).unwrap();
        std::fs::rename(tmp, file).unwrap();
    }

    /// `ipmitool -I lanplus -C 3 ... ARGS` against this simulator, as admin; its stdout.
    pub fn ipmitool(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(which("ipmitool"));
        cmd.args(["-I", "lanplus", "-H", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args([
                "-U", USERNAME, "-P", PASSWORD, "-C", "3", "-N", "1", "-R", "3",
            ])
            .args(args)
            .stdin(Stdio::null());
        let out = super::blocking(|| cmd.output()).expect("run ipmitool");
        assert!(
            out.status.success(),
            "ipmitool {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What `ipmitool chassis power status` says: `"on"` or `"off"`.
    pub fn ipmitool_power(&self) -> String {
        let out = self.ipmitool(&["chassis", "power", "status"]);
        match out.trim() {
            "Chassis Power is on" => "on".into(),
            "Chassis Power is off" => "off".into(),
            other => panic!("unexpected ipmitool output {other:?}"),
        }
    }

    /// Active sessions on the simulator other than the one ipmitool opens to ask (Get Session
    /// Info, "active sessions").
    pub fn other_sessions(&self) -> u32 {
        let out = self.ipmitool(&["session", "info", "active"]);
        let n: u32 = out
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "active sessions").then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no active session count in {out:?}"));
        n.checked_sub(1)
            .unwrap_or_else(|| panic!("ipmitool's own session is not counted: {out:?}"))
    }

    /// The privilege levels of all active sessions, from `session info all`.
    pub fn session_privileges(&self) -> Vec<String> {
        self.ipmitool(&["session", "info", "all"])
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "privilege level").then(|| v.trim().to_string())
            })
            .collect()
    }
}

impl Drop for IpmiSim {
    fn drop(&mut self) {
        stop_group(&mut self.child);
    }
}

/// Starts `ipmi_sim` on `port` with the files in `dir` and System GUID `guid`; on failure, its
/// log.
fn launch(dir: &Path, port: u16, guid: &str, tag: &str) -> Result<Child, String> {
    let bin = which("ipmi_sim");
    let conf = dir.join(format!("lan-{tag}.conf"));
    std::fs::write(
        &conf,
        lan_conf(
            port,
            guid,
            &dir.join("chassis-control.sh"),
            &dir.join("power"),
        ),
    )
    .unwrap();
    // A fresh state directory: ipmi_sim keeps users and the SEL there.
    let state = dir.join(format!("state-{tag}"));
    std::fs::create_dir_all(&state).unwrap();
    let log_path = dir.join(format!("sim-{tag}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(&bin)
        .arg("-c")
        .arg(&conf)
        .arg("-f")
        .arg(dir.join("node.emu"))
        .arg("-s")
        .arg(&state)
        .arg("-n")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(why) => {
            stop_group(&mut child);
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            Err(format!("{why}\n{log}"))
        }
    }
}

/// Stops the simulator's process group (the simulator and the hook processes it spawned), by
/// its ID, and reaps the simulator.
fn stop_group(child: &mut Child) {
    let pgid = Pid::from_raw(child.id() as i32);
    let _ = killpg(pgid, Signal::SIGKILL);
    let _ = child.wait();
}

fn lan_conf(port: u16, guid: &str, hook: &Path, power: &Path) -> String {
    format!(
        r#"name "sim{port}"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid {guid}
  endlan
  chassis_control "{} {}"
  user 1 false ""      "test"     user  10 none md2 md5 straight
  user 2 true  "{USERNAME}" "{PASSWORD}" admin 10 none md2 md5 straight
  user 3 true  "{OPERATOR}" "{OPERATOR_PASSWORD}" operator 10 none md2 md5 straight
  user 4 true  "{READER}" "{READER_PASSWORD}" user 10 none md2 md5 straight
"#,
        hook.display(),
        power.display()
    )
}

/// Waits until the simulator answers an RMCP presence ping.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let ping = [
        0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x80, 0x11, 0x00, 0x00,
    ];
    let start = Instant::now();
    let mut buf = [0u8; 512];
    while start.elapsed() < START_DEADLINE {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("it exited with {status}"));
        }
        let _ = socket.send_to(&ping, target);
        if let Ok((n, from)) = socket.recv_from(&mut buf)
            && from == target
            && n >= 12
            && buf[8] == 0x40
        {
            return Ok(());
        }
    }
    Err(format!(
        "no answer to an RMCP ping on UDP {port} within {START_DEADLINE:?}"
    ))
}

/// A loopback UDP port that was free a moment ago.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind an ephemeral loopback UDP port")
        .port()
}

pub fn which(program: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin"] {
        let p = Path::new(dir).join(program);
        if p.is_file() {
            return p;
        }
    }
    panic!("{program} not found: run scripts/install-deps (Debian packages openipmi, ipmitool)");
}
