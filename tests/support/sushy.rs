//! A real Redfish service for tests: sushy-tools' `sushy-emulator` with its fake driver,
//! serving HTTPS on a free loopback port with basic auth (admin / password).
//!
//! Systems are addressed by UUID (`/Systems/<name>` answers a redirect). The fake driver
//! applies a power change 1 to 11 seconds after the Reset action, so tests poll with a
//! deadline ([`SushyEmulator::wait_power`]).

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{OutputAside, venv_bin};

pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "password";

/// How long the emulator may take to answer its service root after being started.
const START_DEADLINE: Duration = super::SERVER_START_BOUND;

/// One running `sushy-emulator` process; killed (by PID) and reaped on drop.
pub struct SushyEmulator {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    systems: usize,
    client: reqwest::Client,
}

impl SushyEmulator {
    /// Starts an emulator with `systems` fake systems named `node000`, `node001`, ..., all On.
    pub async fn start(systems: usize) -> SushyEmulator {
        let emulator_bin = venv_bin("sushy-emulator");
        let python = venv_bin("python");
        let dir = tempfile::Builder::new()
            .prefix("sushy-emulator")
            .tempdir()
            .expect("create a temporary directory for the emulator");
        let (cert, key) = self_signed_cert(dir.path(), "emulator");
        let htpasswd = dir.path().join("htpasswd");
        write_htpasswd(&python, &htpasswd);
        let pem = std::fs::read(&cert).expect("read the emulator certificate");
        let client = reqwest::Client::builder()
            .tls_certs_only(reqwest::Certificate::from_pem_bundle(&pem).expect("parse cert"))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("build the fixture's HTTPS client");

        // A free port is only free until someone else takes it: retry on a lost race.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let port = free_port();
            let state_dir = dir.path().join(format!("state-{attempt}"));
            let config = dir.path().join(format!("emulator-{attempt}.conf"));
            std::fs::write(
                &config,
                python_config(port, &cert, &key, &htpasswd, &state_dir, systems),
            )
            .expect("write the emulator config");
            let log_path = dir.path().join(format!("emulator-{attempt}.log"));
            let log = std::fs::File::create(&log_path).expect("create the emulator log");
            let mut child = Command::new(&emulator_bin)
                .arg("--config")
                .arg(&config)
                .arg("--fake")
                .env("PYTHONUNBUFFERED", "1")
                .env_remove("SUSHY_EMULATOR_CONFIG")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", emulator_bin.display()));
            let root = format!("https://127.0.0.1:{port}/redfish/v1/");
            match wait_ready(&mut child, &client, &root).await {
                Ok(()) => {
                    return SushyEmulator {
                        child,
                        dir,
                        port,
                        systems,
                        client,
                    };
                }
                Err(why) => {
                    // Only this child, by its PID.
                    let _ = child.kill();
                    let _ = child.wait();
                    last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    if !last_log.contains("Address already in use") {
                        panic!("sushy-emulator did not come up: {why}\n--- log ---\n{last_log}");
                    }
                }
            }
        }
        panic!("sushy-emulator could not get a free port in 3 tries\n--- log ---\n{last_log}");
    }

    /// `https://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The fixed UUID of system `i`.
    pub fn uuid(&self, i: usize) -> String {
        assert!(i < self.systems, "system {i} of {}", self.systems);
        uuid(i)
    }

    /// `/redfish/v1/Systems/<uuid>` of system `i`.
    pub fn system_path(&self, i: usize) -> String {
        format!("/redfish/v1/Systems/{}", self.uuid(i))
    }

    /// The emulator's self-signed certificate, usable as `ca_file`.
    pub fn cert_pem_path(&self) -> PathBuf {
        self.dir.path().join("emulator-cert.pem")
    }

    /// The emulator's scratch directory (removed on drop); tests may put files there.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Asks system `i` to power on (`On`) or off (`ForceOff`). The change lands later.
    pub async fn set_power(&self, i: usize, on: bool) {
        let url = format!(
            "{}{}/Actions/ComputerSystem.Reset",
            self.base_url(),
            self.system_path(i)
        );
        let reset = if on { "On" } else { "ForceOff" };
        // The fake driver keeps its state in SQLite, which answers "database is locked" (a
        // 500) when the daemon's reads hold it at that moment: tried again, a few times.
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let response = self
                .client
                .post(&url)
                .basic_auth(USERNAME, Some(PASSWORD))
                .json(&serde_json::json!({ "ResetType": reset }))
                .send()
                .await
                .unwrap_or_else(|e| panic!("POST {url}: {e}"));
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            if status.as_u16() == 500 && body.contains("database is locked") && attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            assert_eq!(status.as_u16(), 204, "Reset {reset} on system {i}: {body}");
            return;
        }
    }

    /// The `PowerState` string the emulator reports for system `i` right now.
    pub async fn power(&self, i: usize) -> String {
        self.system_doc(i).await["PowerState"]
            .as_str()
            .unwrap_or("<missing>")
            .to_string()
    }

    /// The ComputerSystem resource of system `i` as the emulator serves it.
    pub async fn system_doc(&self, i: usize) -> serde_json::Value {
        let url = format!("{}{}", self.base_url(), self.system_path(i));
        let response = self
            .client
            .get(&url)
            .basic_auth(USERNAME, Some(PASSWORD))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert!(
            response.status().is_success(),
            "GET {url}: {}",
            response.status()
        );
        response.json().await.expect("system resource JSON")
    }

    /// Polls until system `i` reports `want` ("On" or "Off"); panics after `deadline`, with
    /// the emulator's log.
    ///
    /// The fake driver applies a reset 1 to 11 s after it accepted it, keeping the pending
    /// change in an SQLite-backed dict that its request threads read and write without a lock.
    /// Once, in a full test run with many emulators and daemons reading at once, a ForceOff
    /// was never applied (never seen with the test alone). So a reset not applied 13 s after
    /// the call is sent again, once, and said on stderr.
    pub async fn wait_power(&self, i: usize, want: &str, deadline: Duration) {
        const RESEND_AFTER: Duration = Duration::from_secs(13);
        let start = Instant::now();
        let mut resent = false;
        loop {
            let now = self.power(i).await;
            if now == want {
                return;
            }
            if !resent && start.elapsed() >= RESEND_AFTER {
                resent = true;
                eprintln!(
                    "sushy fixture: system {i} still {now:?} {RESEND_AFTER:?} after the reset; sending it again"
                );
                self.set_power(i, want == "On").await;
            }
            if start.elapsed() >= deadline {
                panic!(
                    "system {i} still {now:?} after {deadline:?}, wanted {want:?}\n--- emulator log ---\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The last lines of the emulator's log, for failure messages.
    fn log_tail(&self) -> String {
        let mut out = String::new();
        for attempt in 0..3 {
            let path = self.dir.path().join(format!("emulator-{attempt}.log"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                let lines: Vec<&str> = text.lines().collect();
                out = lines[lines.len().saturating_sub(40)..].join("\n");
            }
        }
        out
    }

    fn stop(&mut self) {
        // Only this child, by its PID; then reap it so no zombie is left behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SushyEmulator {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn wait_ready(child: &mut Child, client: &reqwest::Client, url: &str) -> Result<(), String> {
    let start = Instant::now();
    let mut last = String::from("no attempt yet");
    while start.elapsed() < START_DEADLINE {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("it exited with {status}"));
        }
        match client.get(url).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("HTTP {}", r.status()),
            Err(e) => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(inner) = source {
                    text = format!("{text}: {inner}");
                    source = inner.source();
                }
                last = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "{url} did not answer within {START_DEADLINE:?} (last: {last})"
    ))
}

/// The fixed UUID the emulator gives system `i`.
pub fn uuid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// Writes `<stem>-cert.pem` and `<stem>-key.pem` into `dir`: a self-signed P-256 certificate
/// for `IP:127.0.0.1`, valid for two days.
pub fn self_signed_cert(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{stem}-cert.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:P-256")
        .args(["-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={stem} test BMC"))
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "keyUsage=critical,digitalSignature"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output_aside()
        .unwrap_or_else(|e| panic!("cannot run openssl (install the openssl CLI): {e}"));
    assert!(
        out.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// A certificate made the way most BMCs' are, with `openssl req -x509` and nothing more: the
/// default extensions (`basicConstraints = critical, CA:TRUE`), a CN that is no address the
/// BMC is reached by, no subjectAltName. `days` may be negative (expired).
pub fn bmc_style_cert(dir: &Path, stem: &str, days: i32) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{stem}-cert.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    let run = |args: &[&str]| super::certs::openssl(dir, args);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let subj = format!("/CN={stem}.bmc.example");
    run(&[
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", &subj, "-keyout",
        k, "-out", c,
    ]);
    if days < 0 {
        // Signed again by its own key with a validity period that ended.
        let expired = dir.join(format!("{stem}-expired.pem"));
        let e = expired.to_str().unwrap();
        run(&[
            "x509",
            "-days",
            &days.to_string(),
            "-in",
            c,
            "-signkey",
            k,
            "-out",
            e,
            "-copy_extensions",
            "copyall",
        ]);
        std::fs::rename(&expired, &cert).unwrap();
    }
    let text = run(&["x509", "-noout", "-text", "-in", c]);
    assert!(
        text.contains("CA:TRUE"),
        "openssl req -x509 made no CA certificate: {text}"
    );
    (cert, key)
}

/// `openssl x509 -noout -fingerprint -sha256`'s answer for `cert`, as an operator copies it:
/// `sha256 Fingerprint=AB:CD:…`.
pub fn openssl_fingerprint(cert: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(cert)
        .output_aside()
        .expect("run openssl");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn write_htpasswd(python: &Path, path: &Path) {
    // Cost 4: the emulator checks the hash on every request.
    let script = format!(
        "import bcrypt\n\
         h = bcrypt.hashpw(b'{PASSWORD}', bcrypt.gensalt(rounds=4)).decode()\n\
         open({path:?}, 'w').write('{USERNAME}:' + h + '\\n')\n",
        path = path.to_str().expect("UTF-8 temporary path"),
    );
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .output_aside()
        .expect("run the venv's python");
    assert!(
        out.status.success(),
        "writing htpasswd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn python_config(
    port: u16,
    cert: &Path,
    key: &Path,
    htpasswd: &Path,
    state_dir: &Path,
    systems: usize,
) -> String {
    let s = |p: &Path| format!("{:?}", p.to_str().expect("UTF-8 temporary path"));
    let mut c = String::new();
    writeln!(c, "SUSHY_EMULATOR_LISTEN_IP = \"127.0.0.1\"").unwrap();
    writeln!(c, "SUSHY_EMULATOR_LISTEN_PORT = {port}").unwrap();
    writeln!(c, "SUSHY_EMULATOR_SSL_CERT = {}", s(cert)).unwrap();
    writeln!(c, "SUSHY_EMULATOR_SSL_KEY = {}", s(key)).unwrap();
    writeln!(c, "SUSHY_EMULATOR_AUTH_FILE = {}", s(htpasswd)).unwrap();
    writeln!(c, "SUSHY_EMULATOR_FAKE_DRIVER = True").unwrap();
    writeln!(c, "SUSHY_EMULATOR_STATE_DIR = {}", s(state_dir)).unwrap();
    writeln!(c, "SUSHY_EMULATOR_FEATURE_SET = \"minimum\"").unwrap();
    writeln!(c, "SUSHY_EMULATOR_FAKE_SYSTEMS = [").unwrap();
    writeln!(
        c,
        "    {{\"uuid\": \"00000000-0000-4000-8000-%012d\" % i, \"name\": \"node%03d\" % i,\n\
         \x20    \"power_state\": \"On\", \"external_notifier\": False,\n\
         \x20    \"nics\": [{{\"mac\": \"00:5c:52:31:%02x:%02x\" % (i // 256, i % 256), \"ip\": \"127.0.0.1\"}}]}}"
    )
    .unwrap();
    writeln!(c, "    for i in range({systems})]").unwrap();
    c
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}
