//! A Redfish BMC farm for the scale benchmark: one HTTPS server (Python's threaded
//! `http.server`, run from the test virtualenv) answering for thousands of machines.
//! sushy-tools serves one emulated system per libvirt domain or fake entry and answers a few
//! hundred reads a second; this serves any number of systems from a table, as fast as one
//! Python process can.
//!
//! `/redfish/v1/Systems/NAME` is the ComputerSystem of machine NAME; its UUID comes from the
//! digits at the end of NAME ([`uuid_of`]), its power state from the table, which starts all
//! On. `power(off, from, to)` switches a range of machine numbers; `requests()` counts reads.

use std::io::{BufRead, Write};
use std::path::PathBuf;

const FARM: &str = r##"
import http.server, json, re, ssl, sys, threading

OFF = set()
LOCK = threading.Lock()
COUNT = [0]
TYPE = "#ComputerSystem.v1_13_0.ComputerSystem"
PREFIX = "/redfish/v1/Systems/"

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                return self.reply(200, json.dumps({"requests": COUNT[0]}).encode())
        m = re.search(r"(\d+)/?$", self.path)
        if not self.path.startswith(PREFIX) or m is None:
            return self.reply(404, b"{}")
        n = int(m.group(1))
        with LOCK:
            COUNT[0] += 1
            state = "Off" if n in OFF else "On"
        body = json.dumps({
            "@odata.id": self.path.rstrip("/"),
            "@odata.type": TYPE,
            "Id": str(n),
            "PowerState": state,
            "UUID": "00000000-0000-4000-8000-%012d" % n,
        }).encode()
        self.reply(200, body)

def control():
    for line in sys.stdin:
        verb, a, b = line.split()
        with LOCK:
            for n in range(int(a), int(b)):
                (OFF.add if verb == "off" else OFF.discard)(n)
        print("ok", flush=True)

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
class Server(http.server.ThreadingHTTPServer):
    # With SO_REUSEADDR (http.server's default) the kernel may hand port 0 a port another
    # socket holds, and listen() then fails with EADDRINUSE; without it, never.
    allow_reuse_address = False

server = Server(("127.0.0.1", 0), Handler)
server.daemon_threads = True
server.request_queue_size = 1024
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
threading.Thread(target=control, daemon=True).start()
server.serve_forever()
"##;

/// The UUID machine `n` reports.
pub fn uuid_of(n: usize) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// The farm above, stopped by PID on drop.
pub struct RedfishFarm {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    pub port: u16,
    pub cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl RedfishFarm {
    pub fn start() -> RedfishFarm {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "farm");
        let mut child = std::process::Command::new(super::venv_bin("python"))
            .arg("-c")
            .arg(FARM)
            .arg(&cert)
            .arg(&key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the Redfish farm");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the Redfish farm did not start (said {line:?})");
        };
        RedfishFarm {
            child,
            stdin,
            stdout,
            port,
            cert,
            _dir: dir,
        }
    }

    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Machines `from..to` go Off (`off`) or On.
    pub fn power(&mut self, off: bool, from: usize, to: usize) {
        let verb = if off { "off" } else { "on" };
        writeln!(self.stdin, "{verb} {from} {to}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ok", "the farm did not switch the power");
    }

    /// System reads answered so far.
    pub async fn requests(&self) -> u64 {
        let client = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .build()
            .unwrap();
        let v: serde_json::Value = client
            .get(format!("{}/stats", self.base_url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["requests"].as_u64().unwrap()
    }
}

impl Drop for RedfishFarm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
