//! Shared fixtures for the integration tests: real emulators started on loopback.
//!
//! Each test binary includes this with `mod support;` and uses only part of it.
#![allow(dead_code)]

// Cargo names the `oobfence` binary to integration tests only (`cfg(test)`), not to examples.
pub mod bench;
pub mod certs;
#[cfg(test)]
pub mod cli;
pub mod corpus_bmc;
#[cfg(test)]
pub mod daemon_process;
pub mod fake_ec2;
pub mod gate;
pub mod ipmi_sim;
pub mod k8s;
pub mod moto;
pub mod odd_bmc;
pub mod proxy_bmc;
pub mod redfish_farm;
pub mod redfish_pdu;
pub mod rmcp_bmc;
pub mod scenario;
pub mod session_bmc;
pub mod slow_api;
pub mod snmp_pdu;
pub mod sushy;
pub mod vcenter;

use std::path::PathBuf;
use std::time::Duration;

/// How long a test server (a Python emulator, `ipmi_sim`, moto, snmpsim, the daemon's HTTP
/// port) may take to start answering. Generous: on a loaded 2-core machine the fault matrix
/// starts dozens of Python servers at once behind other builds, and an import-heavy one took
/// over 20 s there. A server that exits early fails at once, not at the bound.
pub const SERVER_START_BOUND: Duration = Duration::from_secs(120);

/// Runs blocking work (a child process waited for) so that it holds up no other task: on a
/// multi-thread runtime the worker first hands its queue to another thread. Otherwise a task
/// parked on this worker (its LIFO slot cannot be stolen) waits as long as the work does, and
/// a scenario running beside it sees seconds pass for nothing.
pub fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// `Command::output`, run through [`blocking`].
pub trait OutputAside {
    fn output_aside(&mut self) -> std::io::Result<std::process::Output>;
}

impl OutputAside for std::process::Command {
    fn output_aside(&mut self) -> std::io::Result<std::process::Output> {
        blocking(|| self.output())
    }
}

/// The Python virtualenv holding the emulators: `$OOBFENCE_VENV`, else `venv` under the
/// oobfence cache (`$OOBFENCE_CACHE`, else `$XDG_CACHE_HOME/oobfence`, else
/// `$HOME/.cache/oobfence`), as `scripts/install-deps` lays it out.
pub fn venv_dir() -> PathBuf {
    if let Some(dir) = non_empty_env("OOBFENCE_VENV") {
        return PathBuf::from(dir);
    }
    let cache = match non_empty_env("OOBFENCE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => match non_empty_env("XDG_CACHE_HOME") {
            Some(dir) => PathBuf::from(dir).join("oobfence"),
            None => PathBuf::from(non_empty_env("HOME").expect("HOME is not set"))
                .join(".cache/oobfence"),
        },
    };
    cache.join("venv")
}

/// A program in the test virtualenv. Panics, telling how to install it, when it is missing:
/// a test that needs an emulator must fail rather than pass without running.
pub fn venv_bin(name: &str) -> PathBuf {
    let path = venv_dir().join("bin").join(name);
    if !path.is_file() {
        panic!(
            "{} not found: run scripts/install-deps to create the test virtualenv \
             (or point OOBFENCE_VENV at one that has sushy-tools, sushy and bcrypt)",
            path.display()
        );
    }
    path
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Python shared by the test HTTPS servers, put before each one's script: `tls_context()`, the
/// server's TLS settings (certificate and key from `argv[1]` and `argv[2]`), and
/// `https_server(handler, ctx)`, a threading server on 127.0.0.1 at a port the kernel picks,
/// printed on the first line of output.
pub const HTTPS_SERVER_PY: &str = r#"
import http.server as _http_server, ssl as _ssl, sys as _sys

def tls_context():
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(_sys.argv[1], _sys.argv[2])
    return ctx

class _Server(_http_server.ThreadingHTTPServer):
    # With SO_REUSEADDR (http.server's default) the kernel may hand port 0 a port another
    # socket holds, and listen() then fails with EADDRINUSE; without it, never.
    allow_reuse_address = False

def https_server(handler, ctx):
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    return server
"#;

/// Starts `script` (after [`HTTPS_SERVER_PY`]) with the test virtualenv's Python and `args`: an
/// HTTPS test server that prints its port on its first line of output. The child (stop it by PID) and the port; panics
/// naming `what` when it does not start.
pub fn start_python_server(
    script: &str,
    args: &[&std::ffi::OsStr],
    what: &str,
) -> (std::process::Child, u16) {
    start_python_server_logging(script, args, std::process::Stdio::inherit(), what)
}

/// [`start_python_server`], with the server's standard error sent to `stderr` (a log file the
/// test reads).
pub fn start_python_server_logging(
    script: &str,
    args: &[&std::ffi::OsStr],
    stderr: impl Into<std::process::Stdio>,
    what: &str,
) -> (std::process::Child, u16) {
    use std::io::BufRead;

    let mut child = std::process::Command::new(venv_bin("python"))
        .arg("-c")
        .arg(format!("{HTTPS_SERVER_PY}{script}"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    match line.trim().parse() {
        Ok(port) => (child, port),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not start (said {line:?})");
        }
    }
}
