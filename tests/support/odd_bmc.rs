//! An HTTPS server that answers each path with one odd reply (Python's `http.server`, run from
//! the test virtualenv): replies no real BMC should send, to show that none of them ever reads
//! as Off. Its `/off` is a clean Off of the machine with UUID [`UUID`].

use std::path::PathBuf;

use super::OutputAside;

/// The UUID the odd server's machines report.
pub const UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";

/// The UUID of `/powering-off`: a machine of its own (a UUID two Nodes report proves nothing).
pub const POWERING_OFF_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e50";

/// The UUID of `/paused`.
pub const PAUSED_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e51";

/// The UUID of `/w/off-hot`, a system that reads Off while its chassis draws 180.5 W.
pub const HOT_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e40";

/// The UUID of the other `/w/` systems (read Off; `/w/off-cold` draws 4.5 W).
pub const COLD_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e41";

/// The UUID of `/hung/refuses`: a running system whose BMC answers every Reset 403.
pub const REFUSES_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e60";

/// The UUID of `/hung/ignores`: a running system whose BMC takes a Reset (204) and stays On.
pub const IGNORES_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e61";

/// The UUID of `/hung/graceful-only`: a running system that allows no ForceOff.
pub const GRACEFUL_ONLY_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e62";

/// An HTTPS server (Python's `http.server`) that answers each path with one odd reply.
const ODD_BMC: &str = r##"
import http.server, json, ssl, sys, time

TYPE = "#ComputerSystem.v1_13_0.ComputerSystem"

def system(odata_id, members):
    """A ComputerSystem that names itself `odata_id`, with `members` (raw JSON) besides."""
    head = '{"@odata.id": %s, "@odata.type": %s, ' % (json.dumps(odata_id), json.dumps(TYPE))
    return (head + members + "}").encode()

BIG = b'{"PowerState": "Off", "Pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
ROUTES = {
    "/off": (200, system("/off", '"PowerState": "Off", "UUID": "4C4C4544-0038-4B10-8052-B4C04F4A4E32", "SerialNumber": "SN-odd"')),
    "/off-url": (200, system("https://bmc.example/off-url/", '"PowerState": "Off"')),
    "/serial-echo": (200, system("/serial-echo", '"PowerState": "On", "UUID": "4c4c4544-0038-4b10-8052-b4c04f4a4e32", "SerialNumber": "Pa55-word-echoed"')),
    "/bad-uuid": (200, system("/bad-uuid", '"PowerState": "On", "UUID": "Pa55-word"')),
    "/other-system": (200, system("/redfish/v1/Systems/other", '"PowerState": "Off"')),
    "/anonymous": (200, b'{"@odata.type": "' + TYPE.encode() + b'", "PowerState": "Off"}'),
    "/chassis": (200, b'{"@odata.id": "/chassis", "@odata.type": "#Chassis.v1_0_0.Chassis", "PowerState": "Off"}'),
    "/untyped": (200, b'{"@odata.id": "/untyped", "PowerState": "Off"}'),
    "/html": (200, b"<html><body>Please log in</body></html>"),
    "/lower": (200, system("/lower", '"PowerState": "off"')),
    "/dup": (200, system("/dup", '"PowerState": "On", "PowerState": "Off"')),
    "/null": (200, system("/null", '"PowerState": null')),
    "/truncated": (200, b'{"PowerState": "Off"'),
    "/big": (200, BIG),
    "/error": (500, b'{"error": {"code": "Base.1.0.GeneralError"}}'),
    "/unavailable": (503, b'{"error": {"code": "Base.1.0.ServiceTemporarilyUnavailable"}}'),
    "/powering-off": (200, system("/powering-off", '"PowerState": "PoweringOff", "UUID": "4C4C4544-0038-4B10-8052-B4C04F4A4E50"')),
    "/paused": (200, system("/paused", '"PowerState": "Paused", "UUID": "4C4C4544-0038-4B10-8052-B4C04F4A4E51"')),
    "/forbidden": (403, b"{}"),
    "/empty": (204, b""),
}

# The power draw witness: systems that read Off, and the chassis they link to.
def linked(odata_id, uuid, chassis):
    links = ""
    if chassis is not None:
        links = ', "Links": {"Chassis": [%s]}' % ", ".join('{"@odata.id": %s}' % json.dumps(c) for c in chassis)
    return system(odata_id, '"PowerState": "Off", "UUID": %s%s' % (json.dumps(uuid), links))

def resource(odata_id, odata_type, members):
    doc = {"@odata.id": odata_id, "@odata.type": odata_type}
    doc.update(members)
    return json.dumps(doc).encode()

HOT, COLD = "4c4c4544-0038-4b10-8052-b4c04f4a4e40", "4c4c4544-0038-4b10-8052-b4c04f4a4e41"
ROUTES.update({
    # A stale Off: the chassis still draws 180.5 W (in its second power control).
    "/w/off-hot": (200, linked("/w/off-hot", HOT, ["/w/chassis-hot"])),
    "/w/chassis-hot": (200, resource("/w/chassis-hot", "#Chassis.v1_10_0.Chassis", {"PowerState": "On", "Power": {"@odata.id": "/w/chassis-hot/Power"}})),
    "/w/chassis-hot/Power": (200, resource("/w/chassis-hot/Power", "#Power.v1_5_0.Power", {"PowerControl": [{"PowerConsumedWatts": 3}, {"PowerConsumedWatts": 180.5}]})),
    # A real Off: 4.5 W of standby power, through EnvironmentMetrics.
    "/w/off-cold": (200, linked("/w/off-cold", COLD, ["/w/chassis-cold"])),
    "/w/chassis-cold": (200, resource("/w/chassis-cold", "#Chassis.v1_15_0.Chassis", {"PowerState": "Off", "EnvironmentMetrics": {"@odata.id": "/w/chassis-cold/EnvironmentMetrics"}})),
    "/w/chassis-cold/EnvironmentMetrics": (200, resource("/w/chassis-cold/EnvironmentMetrics", "#EnvironmentMetrics.v1_3_0.EnvironmentMetrics", {"PowerWatts": {"Reading": 4.5}})),
    # No chassis linked.
    "/w/off-unlinked": (200, linked("/w/off-unlinked", COLD, None)),
    # A chassis that links no power resource, though one sits at the usual path: never guessed.
    "/w/off-bare": (200, linked("/w/off-bare", COLD, ["/w/chassis-bare"])),
    "/w/chassis-bare": (200, resource("/w/chassis-bare", "#Chassis.v1_10_0.Chassis", {"PowerState": "Off"})),
    "/w/chassis-bare/Power": (200, resource("/w/chassis-bare/Power", "#Power.v1_5_0.Power", {"PowerControl": [{"PowerConsumedWatts": 1}]})),
    # A power control without a reading.
    "/w/off-null": (200, linked("/w/off-null", COLD, ["/w/chassis-null"])),
    "/w/chassis-null": (200, resource("/w/chassis-null", "#Chassis.v1_10_0.Chassis", {"Power": {"@odata.id": "/w/chassis-null/Power"}})),
    "/w/chassis-null/Power": (200, resource("/w/chassis-null/Power", "#Power.v1_5_0.Power", {"PowerControl": [{"PowerConsumedWatts": None}]})),
    # A chassis link that answers with another resource.
    "/w/off-wrong": (200, linked("/w/off-wrong", COLD, ["/w/chassis-wrong"])),
    "/w/chassis-wrong": (200, resource("/w/chassis-hot", "#Chassis.v1_10_0.Chassis", {"Power": {"@odata.id": "/w/chassis-hot/Power"}})),
    # A linked chassis that is not there.
    "/w/off-missing": (200, linked("/w/off-missing", COLD, ["/w/chassis-missing"])),
})

# Running systems with a Reset action, for power actions: what each does with a POST to it.
def hung(name, uuid, allowed):
    odata_id = "/hung/" + name
    return system(odata_id, '"PowerState": "On", "UUID": %s, "Actions": {"#ComputerSystem.Reset": {"target": %s, "ResetType@Redfish.AllowableValues": %s}}' % (
        json.dumps(uuid), json.dumps(odata_id + "/Actions/ComputerSystem.Reset"), json.dumps(allowed)))

ROUTES.update({
    "/hung/refuses": (200, hung("refuses", "4c4c4544-0038-4b10-8052-b4c04f4a4e60", ["On", "ForceOff"])),
    "/hung/ignores": (200, hung("ignores", "4c4c4544-0038-4b10-8052-b4c04f4a4e61", ["On", "ForceOff"])),
    "/hung/graceful-only": (200, hung("graceful-only", "4c4c4544-0038-4b10-8052-b4c04f4a4e62", ["On", "GracefulShutdown"])),
})
RESETS = {
    "/hung/refuses/Actions/ComputerSystem.Reset": (403, b'{"error": {"code": "Base.1.0.InsufficientPrivilege", "message": "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation."}}'),
    "/hung/ignores/Actions/ComputerSystem.Reset": (204, b""),
    "/hung/graceful-only/Actions/ComputerSystem.Reset": (204, b""),
}
POSTS = {}   # path -> the POST bodies received, in order

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 204:
            self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        POSTS.setdefault(self.path, []).append(body)
        self.reply(*RESETS.get(self.path, (404, b"{}")))

    def do_GET(self):
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "https://elsewhere.invalid/redfish/v1/Systems/1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/slow-body":
            body = b'{"PowerState": "Off"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:5])
            self.wfile.flush()
            time.sleep(30)
            return
        if self.path == "/_posts":
            # What the tests ask: every POST received, by path.
            return self.reply(200, json.dumps(POSTS).encode())
        self.reply(*ROUTES.get(self.path, (404, b"{}")))

ctx = tls_context()
if sys.argv[3:] == ["tls1.1"]:
    # An old BMC: TLS 1.0 and 1.1 only. OpenSSL 3 offers them at security level 0 alone.
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
server = https_server(Handler, ctx)
server.serve_forever()
"##;

/// The odd HTTPS server above, stopped by PID on drop.
pub struct OddBmc {
    child: std::process::Child,
    pub port: u16,
    pub cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl OddBmc {
    pub fn start() -> OddBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "odd");
        OddBmc::start_with(dir, cert, key)
    }

    /// Serving a certificate that expired yesterday (otherwise the same one).
    pub fn start_expired() -> OddBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "odd");
        let expired = dir.path().join("expired-cert.pem");
        let out = std::process::Command::new("openssl")
            .args(["x509", "-days", "-1", "-in"])
            .arg(&cert)
            .arg("-signkey")
            .arg(&key)
            .arg("-out")
            .arg(&expired)
            .output_aside()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl x509: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        OddBmc::start_with(dir, expired, key)
    }

    /// Serving `cert` (with `key`), both in `dir`.
    pub fn start_with_cert(dir: tempfile::TempDir, cert: PathBuf, key: PathBuf) -> OddBmc {
        OddBmc::start_with(dir, cert, key)
    }

    /// Offering TLS 1.0 and 1.1 only, as old BMC firmware does (otherwise the same server).
    pub fn start_tls_1_1_only() -> OddBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "odd");
        OddBmc::launch(dir, cert, key, Some("tls1.1"))
    }

    fn start_with(dir: tempfile::TempDir, cert: PathBuf, key: PathBuf) -> OddBmc {
        OddBmc::launch(dir, cert, key, None)
    }

    /// Starts the server; `mode` is its optional third argument (`tls1.1`).
    fn launch(dir: tempfile::TempDir, cert: PathBuf, key: PathBuf, mode: Option<&str>) -> OddBmc {
        let mut args = vec![cert.as_os_str(), key.as_os_str()];
        args.extend(mode.map(std::ffi::OsStr::new));
        let (child, port) = super::start_python_server(ODD_BMC, &args, "the odd HTTPS server");
        OddBmc {
            child,
            port,
            cert,
            _dir: dir,
        }
    }
}

impl OddBmc {
    /// The bodies of the POSTs the server received at `path` (a Reset target), in order.
    pub async fn posts(&self, path: &str) -> Vec<String> {
        let client = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        let all: std::collections::BTreeMap<String, Vec<String>> = client
            .get(format!("https://127.0.0.1:{}/_posts", self.port))
            .send()
            .await
            .expect("ask the odd server for its POSTs")
            .json()
            .await
            .expect("the odd server's POSTs as JSON");
        all.get(path).cloned().unwrap_or_default()
    }
}

impl Drop for OddBmc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
