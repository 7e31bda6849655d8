//! A Redfish rack PDU the project owns (`redfish_pdu.py`, Python's standard library only): DMTF's
//! rack PDU examples (`tests/data/redfish-pdu`) served over HTTPS on a free loopback port, HTTP
//! Basic admin / password. Each outlet's `PowerState` and `PowerWatts` come from a JSON file
//! read on every request, rewritten by [`RedfishPdu::set_outlet`]; `Outlet.PowerControl` POSTs
//! change it. Killed (by PID) and reaped on drop.

use std::path::{Path, PathBuf};
use std::process::Child;

pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "password";

/// The rack PDU's path, as DMTF's example names it.
pub const PDU: &str = "/redfish/v1/PowerEquipment/RackPDUs/1";

pub struct RedfishPdu {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    pub cert: PathBuf,
}

impl RedfishPdu {
    /// Starts the PDU with `outlets`: (outlet id, PowerState, PowerWatts reading or none).
    pub fn start(outlets: &[(&str, &str, Option<f64>)]) -> RedfishPdu {
        let dir = tempfile::Builder::new()
            .prefix("redfish-pdu")
            .tempdir()
            .expect("create a directory for the PDU");
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "pdu");
        let state = dir.path().join("state.json");
        let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/redfish-pdu");
        let mut doc = serde_json::json!({ "outlets": {} });
        for (id, state, watts) in outlets {
            doc["outlets"][*id] = serde_json::json!({ "PowerState": state, "PowerWatts": watts });
        }
        write(&state, &doc);
        let log = std::fs::File::create(dir.path().join("requests.log")).expect("create the log");
        let args = [
            cert.as_os_str(),
            key.as_os_str(),
            data.as_os_str(),
            state.as_os_str(),
        ];
        let (child, port) = super::start_python_server_logging(
            include_str!("redfish_pdu.py"),
            &args,
            log,
            "the Redfish PDU",
        );
        RedfishPdu {
            child,
            dir,
            port,
            cert,
        }
    }

    fn state_file(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }

    fn state(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.state_file()).expect("read the PDU state"))
            .expect("the PDU state is JSON")
    }

    /// Sets outlet `id`'s PowerState and PowerWatts reading (`None`: no PowerWatts at all).
    pub fn set_outlet(&self, id: &str, power_state: &str, watts: Option<f64>) {
        let mut doc = self.state();
        doc["outlets"][id] = serde_json::json!({ "PowerState": power_state, "PowerWatts": watts });
        write(&self.state_file(), &doc);
    }

    /// Makes outlet `id` name `target` as its `#Outlet.PowerControl` target.
    pub fn set_power_control_target(&self, id: &str, target: &str) {
        let mut doc = self.state();
        doc["targets"][id] = serde_json::json!(target);
        write(&self.state_file(), &doc);
    }

    /// Makes a GET of outlet `id` answer the PDU's resource at `path` (the PDU itself, its
    /// PowerEquipment) as it is.
    pub fn alias(&self, id: &str, path: &str) {
        let mut doc = self.state();
        doc["aliases"][id] = serde_json::json!(path);
        write(&self.state_file(), &doc);
    }

    /// Outlet `id`'s PowerState as the PDU holds it now.
    pub fn power_state(&self, id: &str) -> String {
        self.state()["outlets"][id]["PowerState"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// `https://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The path of outlet `id`.
    pub fn outlet(id: &str) -> String {
        format!("{PDU}/Outlets/{id}")
    }

    /// A directory for config files that lives as long as the server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The requests it served, one `METHOD PATH` a line.
    pub fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default()
    }
}

/// Written aside and renamed: a request never reads half a file.
fn write(file: &Path, doc: &serde_json::Value) {
    let tmp = file.with_extension("test");
    std::fs::write(&tmp, serde_json::to_vec(doc).unwrap()).expect("write the PDU state");
    std::fs::rename(&tmp, file).expect("replace the PDU state");
}

impl Drop for RedfishPdu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
