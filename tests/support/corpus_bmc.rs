//! An HTTPS server that answers with captured replies of real BMCs (Python's `http.server`, run
//! from the test virtualenv): each Redfish path is bound to a file, served byte for byte. The
//! only change it ever makes is on request, in memory: the value of a ComputerSystem's
//! top-level `PowerState`, so that one capture can be read both On and Off.
//!
//! Controlled through its stdin, one command a line, each answered on stdout with `ok` or
//! `error: <why>`:
//! - `serve <path> <file>`: GET `<path>` (with or without a trailing slash) answers `<file>`;
//! - `power <path> <On|Off>`: the reply for `<path>` says that PowerState;
//! - `clear`: forget every path.
//!
//! Anything else answers 404. Network: 127.0.0.1 only, port 0, printed on stdout first.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

const CORPUS_BMC: &str = r##"
import http.server, json, ssl, sys, threading

ROUTES = {}   # path without trailing slash -> [file, power override or None]
LOCK = threading.Lock()

def key(path):
    return path[:-1] if len(path) > 1 and path.endswith("/") else path

def top_level_power_state(text):
    """(start, end) of the value string of the one top-level "PowerState", or an error."""
    depth, i, found, n = 0, 0, [], len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            token = text[i + 1:j]
            k = j + 1
            while k < n and text[k] in " \t\r\n":
                k += 1
            if depth == 1 and k < n and text[k] == ":" and token == "PowerState":
                v = k + 1
                while text[v] in " \t\r\n":
                    v += 1
                if text[v] != '"':
                    raise ValueError("PowerState is not a string")
                e = v + 1
                while text[e] != '"':
                    e += 2 if text[e] == "\\" else 1
                found.append((v, e + 1))
            i = j + 1
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    if len(found) != 1:
        raise ValueError("%d top-level PowerState members" % len(found))
    return found[0]

def body_of(path):
    with LOCK:
        route = ROUTES.get(key(path))
        if route is None:
            return None
        file, power = route
    with open(file, "rb") as f:
        body = f.read()
    if power is None:
        return body
    text = body.decode("utf-8")
    start, end = top_level_power_state(text)
    return (text[:start] + json.dumps(power) + text[end:]).encode("utf-8")

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = None
        if "?" not in self.path and "#" not in self.path and ".." not in self.path:
            body = body_of(self.path)
        status = 200 if body is not None else 404
        body = body if body is not None else b'{"error": {"code": "Base.1.0.ResourceMissingAtURI"}}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

def control():
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["serve"] and len(words) == 3:
                open(words[2], "rb").close()
                with LOCK:
                    ROUTES[key(words[1])] = [words[2], None]
            elif words[:1] == ["power"] and len(words) == 3 and words[2] in ("On", "Off"):
                with LOCK:
                    route = ROUTES[key(words[1])]
                with open(route[0], "rb") as f:
                    top_level_power_state(f.read().decode("utf-8"))
                with LOCK:
                    route[1] = words[2]
            elif words == ["clear"]:
                with LOCK:
                    ROUTES.clear()
            else:
                raise ValueError("unknown command %r" % line.strip())
            print("ok", flush=True)
        except Exception as e:
            print("error: %s" % e, flush=True)

ctx = tls_context()
server = https_server(Handler, ctx)
threading.Thread(target=server.serve_forever, daemon=True).start()
control()
"##;

/// How long one control command may take to be answered.
const CONTROL_DEADLINE: Duration = Duration::from_secs(10);

/// The captured-reply server above, stopped by PID on drop.
pub struct CorpusBmc {
    child: Child,
    stdin: ChildStdin,
    replies: std::sync::mpsc::Receiver<String>,
    pub port: u16,
    pub cert: PathBuf,
    dir: tempfile::TempDir,
}

impl CorpusBmc {
    pub fn start() -> CorpusBmc {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::sushy::self_signed_cert(dir.path(), "corpus");
        let mut child = std::process::Command::new(super::venv_bin("python"))
            .arg("-c")
            .arg(format!("{}{CORPUS_BMC}", super::HTTPS_SERVER_PY))
            .arg(&cert)
            .arg(&key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the captured-reply HTTPS server");
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        // Lines arrive on a thread, so that a silent server fails a test by its deadline
        // rather than hanging it.
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut bmc = CorpusBmc {
            child,
            stdin,
            replies,
            port: 0,
            cert,
            dir,
        };
        let line = bmc.next_line();
        bmc.port = line.trim().parse().unwrap_or_else(|_| {
            panic!("the captured-reply HTTPS server did not start (said {line:?})")
        });
        bmc
    }

    /// `https://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A directory for config files that lives as long as the server.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// GET `path` answers the bytes of `file`.
    pub fn serve(&mut self, path: &str, file: &Path) {
        self.command(&format!("serve {path} {}", file.display()));
    }

    /// Serves a captured BMC laid out as its paths (`<dir>/redfish/v1/Systems/index.json`
    /// answers `/redfish/v1/Systems`); forgets what was served before. Returns the paths.
    pub fn serve_tree(&mut self, root: &Path) -> Vec<String> {
        self.command("clear");
        let mut files = Vec::new();
        collect_index_files(root, &mut files);
        let mut paths = Vec::new();
        for file in files {
            let rel = file.parent().unwrap().strip_prefix(root).unwrap();
            let path = format!("/{}", rel.to_string_lossy());
            self.serve(&path, &file);
            paths.push(path);
        }
        paths.sort();
        paths
    }

    /// The reply for `path` says `PowerState` `state` ("On" or "Off"); nothing else changes.
    pub fn set_power(&mut self, path: &str, state: &str) {
        self.command(&format!("power {path} {state}"));
    }

    fn command(&mut self, line: &str) {
        assert!(
            !line.contains('\n') && line.split_whitespace().count() <= 3,
            "a control command is one line of at most three words (paths without spaces): {line:?}"
        );
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("send {line:?} to the captured-reply server: {e}"));
        let answer = self.next_line();
        assert_eq!(answer, "ok", "the captured-reply server refused {line:?}");
    }

    fn next_line(&self) -> String {
        let start = Instant::now();
        match self.replies.recv_timeout(CONTROL_DEADLINE) {
            Ok(line) => line,
            Err(e) => panic!(
                "the captured-reply server said nothing within {:?} ({e})",
                start.elapsed()
            ),
        }
    }
}

/// Every `index.json` under `dir`, at most 16 levels down.
fn collect_index_files(dir: &Path, out: &mut Vec<PathBuf>) {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        assert!(depth < 16, "{} is nested too deep", dir.display());
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, depth + 1, out);
            } else if path.file_name().is_some_and(|n| n == "index.json") {
                out.push(path);
            }
        }
    }
    walk(dir, 0, out);
}

impl Drop for CorpusBmc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
