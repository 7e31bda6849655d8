//! Two Redfish BMCs behind one path-prefix proxy (Python's `http.server` over TLS, run from the
//! test virtualenv): `/bmc-07/...` and `/bmc-08/...` on one address, as a BMC proxy serves them.
//! Like a proxy (nginx, for one), it percent-decodes the path and resolves `.` and `..` before
//! it picks the BMC, so `/bmc-07/redfish/..%2f..%2fbmc-08/` reaches BMC 08.
//!
//! BMC 07 may be told to lure (`/_lure`): one path it hands out (its service root's
//! `Links.Sessions`, its Systems member, its session's `Location`, its Reset's
//! `@Redfish.ActionInfo` or `target`) is replaced with a path of the test's choosing; or it holds
//! its Reset's ActionInfo GET until `/_release`, as a slow BMC does. `/_stats`
//! counts, by BMC, the requests that carried credentials (HTTP Basic, `X-Auth-Token`, a login's
//! password) and the Reset POSTs; a request outside both prefixes counts as `elsewhere`.

use std::path::PathBuf;

pub const UUID_07: &str = "0b3c0007-0000-4000-8000-0000000000b7";
pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "Pr0xy-Pa55word";

const PROXY_BMC: &str = r##"
import base64, http.server, json, posixpath, secrets, ssl, sys, threading, urllib.parse

USER, PASSWORD = "admin", "Pr0xy-Pa55word"
UUIDS = {"bmc-07": "0B3C0007-0000-4000-8000-0000000000B7", "bmc-08": "0B3C0008-0000-4000-8000-0000000000B8"}
lock = threading.Lock()
lure = {"kind": "", "path": ""}
tokens = {}
released = threading.Event()

def fresh_stats():
    return {b: {"credentials": 0, "resets": 0, "deletes": 0, "action_info_gets": 0}
            for b in ("bmc-07", "bmc-08", "elsewhere")}
stats = fresh_stats()

def lured(bmc, kind, normal):
    return lure["path"] if bmc == "bmc-07" and lure["kind"] == kind else normal

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, doc=None, headers=()):
        body = b"" if doc is None else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def route(self):
        """(bmc, path below its prefix) as a proxy routes it: decoded, dot segments resolved."""
        raw = urllib.parse.unquote(self.path.split("?")[0])
        path = posixpath.normpath(raw)
        parts = path.split("/", 2)
        if len(parts) >= 2 and parts[1] in UUIDS:
            return parts[1], "/" + (parts[2] if len(parts) > 2 else "")
        return "elsewhere", path

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def count_credentials(self, bmc, raw=b""):
        carried = ("Authorization" in self.headers or "X-Auth-Token" in self.headers
                   or PASSWORD.encode() in raw)
        if carried:
            with lock:
                stats[bmc]["credentials"] += 1

    def authorized(self):
        token = self.headers.get("X-Auth-Token")
        if token is not None:
            return token in tokens
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
            return user == USER and pw == PASSWORD
        return False

    def do_GET(self):
        if self.path == "/_stats":
            with lock:
                return self.reply(200, stats)
        bmc, path = self.route()
        self.count_credentials(bmc)
        if bmc == "elsewhere":
            return self.reply(404, {"error": "no BMC here"})
        if path in ("/redfish/v1", "/redfish/v1/"):
            return self.reply(200, {
                "@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                "Systems": {"@odata.id": "/redfish/v1/Systems"},
                "Links": {"Sessions": {"@odata.id": lured(bmc, "sessions", "/redfish/v1/SessionService/Sessions")}}})
        if not self.authorized():
            return self.reply(401, {"error": "unauthorized"}, [("WWW-Authenticate", 'Basic realm="Redfish"')])
        if path == "/redfish/v1/Systems":
            return self.reply(200, {
                "@odata.id": "/redfish/v1/Systems",
                "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
                "Members@odata.count": 1,
                "Members": [{"@odata.id": lured(bmc, "member", "/redfish/v1/Systems/1")}]})
        if path == "/redfish/v1/Systems/1":
            reset = {"target": lured(bmc, "target", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset")}
            if bmc == "bmc-07" and lure["kind"] == "action-info":
                reset["@Redfish.ActionInfo"] = lure["path"]
            elif bmc == "bmc-07" and lure["kind"] == "held-action-info":
                reset["@Redfish.ActionInfo"] = "/redfish/v1/Systems/1/ResetActionInfo"
            else:
                reset["ResetType@Redfish.AllowableValues"] = ["On", "ForceOff"]
            return self.reply(200, {
                "@odata.id": "/redfish/v1/Systems/1",
                "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
                "Id": "1", "PowerState": "On", "UUID": UUIDS[bmc], "SerialNumber": bmc,
                "Actions": {"#ComputerSystem.Reset": reset}})
        if path == "/redfish/v1/Systems/1/ResetActionInfo":
            with lock:
                stats[bmc]["action_info_gets"] += 1
            if bmc == "bmc-07" and lure["kind"] == "held-action-info":
                released.wait(30)
            return self.reply(200, {"Parameters": [{"Name": "ResetType", "AllowableValues": ["On", "ForceOff"]}]})
        return self.reply(404, {"error": "not here"})

    def do_POST(self):
        raw = self.body()
        if self.path == "/_lure":
            doc = json.loads(raw)
            with lock:
                lure.update(doc)
                stats.clear()
                stats.update(fresh_stats())
                released.clear()
            return self.reply(204)
        if self.path == "/_release":
            released.set()
            return self.reply(204)
        bmc, path = self.route()
        self.count_credentials(bmc, raw)
        if bmc == "elsewhere":
            return self.reply(404, {"error": "no BMC here"})
        if path == "/redfish/v1/SessionService/Sessions":
            doc = json.loads(raw)
            if doc.get("UserName") != USER or doc.get("Password") != PASSWORD:
                return self.reply(401, {"error": "unauthorized"})
            token = secrets.token_hex(16)
            with lock:
                tokens[token] = bmc
            location = lured(bmc, "location", "/redfish/v1/SessionService/Sessions/1")
            return self.reply(201, {"@odata.id": location, "Id": "1"},
                              [("X-Auth-Token", token), ("Location", location)])
        if path == "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset":
            if not self.authorized():
                return self.reply(401, {"error": "unauthorized"})
            with lock:
                stats[bmc]["resets"] += 1
            return self.reply(204)
        return self.reply(404, {"error": "not here"})

    def do_DELETE(self):
        bmc, path = self.route()
        self.count_credentials(bmc)
        with lock:
            stats[bmc]["deletes"] += 1
        self.reply(204)

ctx = tls_context()
server = https_server(Handler, ctx)
server.serve_forever()
"##;

/// What one BMC (or the address outside both prefixes) counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Counts {
    /// Requests that carried credentials: HTTP Basic, a session token, a login's password.
    pub credentials: u64,
    pub resets: u64,
    pub deletes: u64,
    /// GETs of the Reset's ActionInfo that arrived (a held one counts on arrival).
    pub action_info_gets: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Stats {
    #[serde(rename = "bmc-07")]
    pub bmc_07: Counts,
    #[serde(rename = "bmc-08")]
    pub bmc_08: Counts,
    pub elsewhere: Counts,
}

/// Which path BMC 07 replaces with a lure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lure {
    /// The service root's `Links.Sessions`.
    SessionsLink,
    /// The Systems collection's one member.
    SystemsMember,
    /// The session login's `Location` and `@odata.id`.
    SessionLocation,
    /// The Reset action's `@Redfish.ActionInfo`.
    ActionInfo,
    /// The Reset action's `target`.
    ResetTarget,
    /// Not a lure: the Reset's allowed values are in its ActionInfo, whose GET is held until
    /// [`ProxyBmc::release`] (30 s at most), as a slow BMC holds it.
    HeldActionInfo,
}

impl Lure {
    fn kind(self) -> &'static str {
        match self {
            Lure::SessionsLink => "sessions",
            Lure::SystemsMember => "member",
            Lure::SessionLocation => "location",
            Lure::ActionInfo => "action-info",
            Lure::ResetTarget => "target",
            Lure::HeldActionInfo => "held-action-info",
        }
    }
}

/// The proxy and its two BMCs, stopped by PID on drop.
pub struct ProxyBmc {
    child: std::process::Child,
    pub port: u16,
    pub cert: PathBuf,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl ProxyBmc {
    pub fn start() -> ProxyBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "proxy-bmc");
        let (child, port) = super::start_python_server(
            PROXY_BMC,
            &[cert.as_os_str(), key.as_os_str()],
            "the proxy BMC",
        );
        let client = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap();
        ProxyBmc {
            child,
            port,
            cert,
            client,
            _dir: dir,
        }
    }

    /// BMC 07's address: the proxy and its prefix.
    pub fn address_07(&self) -> String {
        format!("https://127.0.0.1:{}/bmc-07/", self.port)
    }

    /// The proxy's address itself (no prefix).
    pub fn origin(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// `ca_file = "…"`: the proxy's self-signed certificate, pinned.
    pub fn pinned(&self) -> String {
        format!("ca_file = \"{}\"", self.cert.display())
    }

    /// BMC 07 hands out `path` in place of the one `lure` names (`None`: none), and the counts
    /// start again.
    pub async fn lure(&self, lure: Option<(Lure, &str)>) {
        let (kind, path) = lure.map_or(("", ""), |(l, p)| (l.kind(), p));
        let r = self
            .client
            .post(format!("{}/_lure", self.origin()))
            .json(&serde_json::json!({"kind": kind, "path": path}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }

    /// Answers the held ActionInfo GET (and any after it).
    pub async fn release(&self) {
        let r = self
            .client
            .post(format!("{}/_release", self.origin()))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }

    /// Polls `/_stats` until `done` holds, at most `within`; the last stats.
    pub async fn stats_until(
        &self,
        within: std::time::Duration,
        done: impl Fn(&Stats) -> bool,
    ) -> Stats {
        let until = std::time::Instant::now() + within;
        loop {
            let s = self.stats().await;
            if done(&s) || std::time::Instant::now() >= until {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    pub async fn stats(&self) -> Stats {
        self.client
            .get(format!("{}/_stats", self.origin()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for ProxyBmc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
