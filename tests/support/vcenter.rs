//! A small vCenter REST server the project owns (`vcenter_rest.py`, Python's standard library
//! only): the `/rest` API `fence_vmware_rest` speaks, on a free loopback port, plain HTTP, basic
//! auth admin / password. Its VMs are a JSON file read on every request, rewritten by
//! [`VcenterRest::set_vms`]. Killed (by PID) and reaped on drop.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "password";

/// How long the server may take to print its port.
const START_DEADLINE: Duration = super::SERVER_START_BOUND;

pub struct VcenterRest {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl VcenterRest {
    /// Starts the server with `vms`: (VM id, name, power_state) each.
    pub fn start(vms: &[(&str, &str, &str)]) -> VcenterRest {
        let dir = tempfile::Builder::new()
            .prefix("vcenter-rest")
            .tempdir()
            .expect("create a directory for the vCenter server");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/vcenter_rest.py");
        let vms_file = dir.path().join("vms.json");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("create the log");
        VcenterRest::write(&vms_file, vms);
        let mut child = Command::new("/usr/bin/python3")
            .arg(&script)
            .arg(&vms_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the vCenter REST server");
        // The first line of its stdout is the port, once it listens.
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let started = Instant::now();
        let line = rx
            .recv_timeout(START_DEADLINE)
            .unwrap_or_else(|_| panic!("the vCenter server printed no port in {START_DEADLINE:?}"));
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the vCenter server printed {line:?}, not a port"));
        assert!(started.elapsed() < START_DEADLINE);
        VcenterRest { child, dir, port }
    }

    fn write(file: &std::path::Path, vms: &[(&str, &str, &str)]) {
        let list: Vec<serde_json::Value> = vms
            .iter()
            .map(|(vm, name, state)| serde_json::json!({"vm": vm, "name": name, "power_state": state}))
            .collect();
        // Written aside and renamed: a request never reads half a file.
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(&list).unwrap()).expect("write the VMs");
        std::fs::rename(&tmp, file).expect("replace the VMs");
    }

    /// Replaces the server's VMs.
    pub fn set_vms(&self, vms: &[(&str, &str, &str)]) {
        VcenterRest::write(&self.dir.path().join("vms.json"), vms);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The requests it served, one `METHOD PATH` a line.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for VcenterRest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
