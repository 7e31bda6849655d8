//! A Redfish BMC with sessions (Python's `http.server` over TLS, run from the test virtualenv):
//! one ComputerSystem, a service root naming its Sessions collection, and logins as firmware
//! does them (`POST` of user name and password, `X-Auth-Token` and `Location` in the answer,
//! `DELETE` of the session to log out, a few session slots).
//!
//! In [`Basic::Refused`] it answers HTTP Basic as a BMC whose Basic is turned off does
//! (OpenBMC's bmcweb with `BasicAuth` disabled, hardened iDRAC/iLO): 401, no `Basic`
//! challenge, a `NoValidSession` message. `/_stats` counts what clients did; `/_expire`
//! forgets every session, as a BMC does when its session timeout passes; `/_power/On|Off`
//! sets the power state. A prefix (`/bmc1`) serves everything below it, as a BMC proxy does.

use std::path::PathBuf;

/// The UUID of the session BMC's machine.
pub const UUID: &str = "5e55a0b1-0000-4000-8000-00000000b0c1";
pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "Sess10n-Pa55word";

/// How the BMC treats HTTP Basic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basic {
    /// Basic and sessions both work; a wrong Basic password gets `WWW-Authenticate: Basic`.
    AndSessions,
    /// Basic is turned off: every Basic request is refused, whatever its password.
    Refused,
    /// Basic only, as old firmware: no session service in the service root, and a wrong
    /// password answered 401 without a `WWW-Authenticate` challenge.
    OnlyNoChallenge,
}

const SESSION_BMC: &str = r##"
import base64, http.server, json, secrets, ssl, sys, threading

MODE, PREFIX, MAX_SESSIONS = sys.argv[3], sys.argv[4], int(sys.argv[5])
USER, PASSWORD, UUID = "admin", "Sess10n-Pa55word", "5E55A0B1-0000-4000-8000-00000000B0C1"
lock = threading.Lock()
sessions = {}   # token -> session id
stats = {"logins": 0, "login_failures": 0, "deletes": 0, "basic_reads": 0,
         "token_reads": 0, "refused": 0, "max_open": 0}
power = ["On"]
next_id = [1]

def message(code, message_id, text):
    return {"error": {"code": message_id, "message": text,
                      "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": text}]}}

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

    def path_below_prefix(self):
        if not self.path.startswith(PREFIX + "/"):
            return None
        return self.path[len(PREFIX):]

    def who(self):
        """'basic', 'token', or None (refused); a refusal already answered."""
        token = self.headers.get("X-Auth-Token")
        if token is not None:
            with lock:
                ok = token in sessions
                if ok:
                    stats["token_reads"] += 1
                else:
                    stats["refused"] += 1
            if ok:
                return "token"
            self.reply(401, message(401, "Base.1.8.NoValidSession", "There is no valid session established with the implementation."))
            return None
        auth = self.headers.get("Authorization", "")
        with lock:
            stats["refused"] += 1
        if MODE == "basic-refused":
            self.reply(401, message(401, "Base.1.8.NoValidSession", "There is no valid session established with the implementation."))
            return None
        if auth.startswith("Basic "):
            user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
            if user == USER and pw == PASSWORD:
                with lock:
                    stats["refused"] -= 1
                    stats["basic_reads"] += 1
                return "basic"
        challenge = [] if MODE == "basic-only-no-challenge" else [("WWW-Authenticate", 'Basic realm="Redfish"')]
        self.reply(401, message(401, "Base.1.8.InsufficientPrivilege", "Unauthorized"), challenge)
        return None

    def do_GET(self):
        if self.path == "/_stats":
            with lock:
                doc = dict(stats, open=len(sessions))
            return self.reply(200, doc)
        if self.path == "/_expire":
            with lock:
                sessions.clear()
            return self.reply(204)
        if self.path.startswith("/_power/"):
            power[0] = self.path[len("/_power/"):]
            return self.reply(204)
        path = self.path_below_prefix()
        if path is None:
            return self.reply(404, message(404, "Base.1.8.ResourceMissingAtURI", "not here"))
        if path in ("/redfish/v1", "/redfish/v1/"):
            root = {"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                    "RedfishVersion": "1.8.0", "Systems": {"@odata.id": "/redfish/v1/Systems"}}
            if MODE != "basic-only-no-challenge":
                root["SessionService"] = {"@odata.id": "/redfish/v1/SessionService"}
                root["Links"] = {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}
            return self.reply(200, root)
        if self.who() is None:
            return
        if path == "/redfish/v1/Systems":
            return self.reply(200, {
                "@odata.id": "/redfish/v1/Systems",
                "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
                "Members@odata.count": 1, "Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})
        # Systems/1 is the one listed; any other name answers as a blade of the same chassis.
        name = path[len("/redfish/v1/Systems/"):] if path.startswith("/redfish/v1/Systems/") else ""
        if name and "/" not in name:
            return self.reply(200, {
                "@odata.id": path,
                "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
                "Id": name, "PowerState": power[0], "UUID": UUID, "SerialNumber": "SESS-1"})
        return self.reply(404, message(404, "Base.1.8.ResourceMissingAtURI", "not here"))

    def do_POST(self):
        path = self.path_below_prefix()
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        if path != "/redfish/v1/SessionService/Sessions" or MODE == "basic-only-no-challenge":
            return self.reply(405, message(405, "Base.1.8.OperationNotAllowed", "no"))
        try:
            doc = json.loads(raw)
        except ValueError:
            return self.reply(400, message(400, "Base.1.8.MalformedJSON", "bad"))
        if doc.get("UserName") != USER or doc.get("Password") != PASSWORD:
            with lock:
                stats["login_failures"] += 1
            return self.reply(401, message(401, "Base.1.8.ResourceAtURIUnauthorized", "Unauthorized"))
        with lock:
            if len(sessions) >= MAX_SESSIONS:
                return self.reply(400, message(400, "Base.1.8.SessionLimitExceeded",
                                               "The session establishment failed due to the number of simultaneous sessions exceeding the limit of the implementation."))
            token = secrets.token_hex(16)
            sid = str(next_id[0]); next_id[0] += 1
            sessions[token] = sid
            stats["logins"] += 1
            stats["max_open"] = max(stats["max_open"], len(sessions))
        location = "/redfish/v1/SessionService/Sessions/" + sid
        self.reply(201, {"@odata.id": location, "@odata.type": "#Session.v1_0_0.Session",
                         "Id": sid, "UserName": USER},
                   [("X-Auth-Token", token), ("Location", location)])

    def do_DELETE(self):
        path = self.path_below_prefix()
        token = self.headers.get("X-Auth-Token")
        prefix = "/redfish/v1/SessionService/Sessions/"
        if path is None or not path.startswith(prefix):
            return self.reply(405, message(405, "Base.1.8.OperationNotAllowed", "no"))
        sid = path[len(prefix):]
        with lock:
            if sessions.get(token) != sid:
                return self.reply(401, message(401, "Base.1.8.NoValidSession", "no session"))
            del sessions[token]
            stats["deletes"] += 1
        self.reply(204)

ctx = tls_context()
server = https_server(Handler, ctx)
server.serve_forever()
"##;

/// What the BMC counted (`/_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Stats {
    pub logins: u64,
    pub login_failures: u64,
    pub deletes: u64,
    pub basic_reads: u64,
    pub token_reads: u64,
    pub refused: u64,
    pub max_open: u64,
    pub open: u64,
}

/// The session BMC above, stopped by PID on drop.
pub struct SessionBmc {
    child: std::process::Child,
    pub port: u16,
    pub cert: PathBuf,
    prefix: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl SessionBmc {
    /// A BMC at the address's root, with four session slots.
    pub fn start(mode: Basic) -> SessionBmc {
        SessionBmc::start_with(mode, "", 4)
    }

    /// `prefix` ("" or "/bmc1") before every Redfish path; at most `slots` sessions at once.
    pub fn start_with(mode: Basic, prefix: &str, slots: u32) -> SessionBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "session-bmc");
        let mode_arg = match mode {
            Basic::AndSessions => "basic-and-sessions",
            Basic::Refused => "basic-refused",
            Basic::OnlyNoChallenge => "basic-only-no-challenge",
        };
        let slots = slots.to_string();
        let (child, port) = super::start_python_server(
            SESSION_BMC,
            &[
                cert.as_os_str(),
                key.as_os_str(),
                mode_arg.as_ref(),
                prefix.as_ref(),
                slots.as_ref(),
            ],
            "the session BMC",
        );
        let client = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .unwrap();
        SessionBmc {
            child,
            port,
            cert,
            prefix: prefix.to_string(),
            client,
            _dir: dir,
        }
    }

    /// The address to configure: `https://127.0.0.1:PORT` and the prefix.
    pub fn address(&self) -> String {
        format!("https://127.0.0.1:{}{}", self.port, self.prefix)
    }

    /// `ca_file = "…"`: the BMC's self-signed certificate, pinned.
    pub fn pinned(&self) -> String {
        format!("ca_file = \"{}\"", self.cert.display())
    }

    async fn control(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("https://127.0.0.1:{}{path}", self.port))
            .send()
            .await
            .unwrap_or_else(|e| panic!("session BMC {path}: {e}"))
    }

    pub async fn stats(&self) -> Stats {
        self.control("/_stats").await.json().await.unwrap()
    }

    /// Forgets every session, as the BMC's session timeout would.
    pub async fn expire_sessions(&self) {
        assert!(self.control("/_expire").await.status().is_success());
    }

    pub async fn set_power(&self, state: &str) {
        assert!(
            self.control(&format!("/_power/{state}"))
                .await
                .status()
                .is_success()
        );
    }

    /// Logs in as another client would, taking one session slot; the token.
    pub async fn take_a_slot(&self) -> Option<String> {
        let r = self
            .client
            .post(format!(
                "{}/redfish/v1/SessionService/Sessions",
                self.address()
            ))
            .json(&serde_json::json!({"UserName": USERNAME, "Password": PASSWORD}))
            .send()
            .await
            .unwrap();
        r.headers()
            .get("x-auth-token")
            .map(|t| t.to_str().unwrap().to_string())
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
}

impl Drop for SessionBmc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
