//! The CLI talks to the daemon of the config it was given, or says it cannot: two datacenters'
//! configs on one host with one `[server] listen`, a pause with and without a daemon to
//! honour it, a config edited and reloaded, a second unit on a taken address. Real `oobfence
//! run` processes against the test API server, the real binary as an operator runs it. And
//! two small CLI matters: a closed pipe (`| head -1`) and a library's log line.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use support::cli::oobfence_async;
use support::daemon_process::{DaemonProcess, write_bare_config};
use support::k8s::{FakeNode, free_port, unique};

const READY: Duration = Duration::from_secs(120);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The daemon of datacenter `dc1` from `dir`, serving on a port of its own, watching `group`.
async fn dc1_daemon(dir: &Path, group: &str) -> (DaemonProcess, std::path::PathBuf) {
    let listen = format!("127.0.0.1:{}", free_port());
    let config = write_bare_config(dir, "dc1", &listen, group);
    let daemon = DaemonProcess::start(&config, &listen, dir, &[], &[]).await;
    (daemon, config)
}

/// A config for datacenter dc2 copied from dc1's, its listen address left as it was: every
/// command that asks a daemon refuses with exit 3, naming both datacenters and dc1's config
/// and pid, instead of showing dc1's nodes as dc2's; `pause` writes dc2's pause file but does
/// not claim that dc2's daemon honours it. dc1's own config is still believed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_datacenters_daemon_on_the_same_address_is_refused_naming_both() {
    let client = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let group = unique("rd-two-dc");
    let node = FakeNode::create(&client, &group, &group, "boot-1").await;
    let (daemon, dc1) = dc1_daemon(dir.path(), &group).await;
    let dc2 = write_bare_config(dir.path(), "dc2", &daemon.listen, &group);
    let pid = daemon.pid().to_string();

    for args in [
        vec!["nodes"],
        vec!["why", &node.name],
        vec!["nodes", "--json"],
    ] {
        let o = oobfence_async(&args, &dc2).await;
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        for named in [
            "datacenter dc2",
            "datacenter dc1",
            &dc1.display().to_string(),
            &format!("pid {pid}"),
            "[server] listen",
        ] {
            assert!(err.contains(named), "{args:?} names {named:?}: {err}");
        }
        assert!(
            !stdout(&o).contains(&node.name) || args[0] == "why",
            "{args:?} shows dc1's node as dc2's: {}",
            stdout(&o)
        );
    }
    // `why` still shows dc2's own journal, which is no daemon's word.
    let o = oobfence_async(&["why", &node.name], &dc2).await;
    assert!(stdout(&o).contains("no live report"), "{}", stdout(&o));

    let o = oobfence_async(&["drill", &node.name, "--json"], &dc2).await;
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("drill --json");
    let check = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["check"] == "daemon"))
        .unwrap_or_else(|| panic!("a daemon check: {report:#}"));
    assert_eq!(check["outcome"], "fail", "{report:#}");
    assert!(
        check["detail"]
            .as_str()
            .is_some_and(|d| d.contains("datacenter dc1")),
        "{report:#}"
    );

    let o = oobfence_async(&["pause", "--reason", "rack 7"], &dc2).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        dir.path().join("dc2.paused").exists(),
        "the pause is written"
    );
    assert!(
        err.contains("cannot be told") && err.contains("datacenter dc1"),
        "{err}"
    );
    assert!(
        !stdout(&o).contains("answers"),
        "no claim that a daemon honours it: {}",
        stdout(&o)
    );
    let o = oobfence_async(&["resume"], &dc2).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));

    // dc1's own config: believed.
    let o = oobfence_async(&["nodes"], &dc1).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&node.name), "{}", stdout(&o));
    daemon.stop().await;
    node.delete().await;
}

/// `pause` says whether a daemon is there to honour it: with none, the pause file is written
/// and takes effect when the daemon starts; with the daemon of the config, it names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_says_whether_a_daemon_is_there_to_honour_it() {
    let dir = tempfile::tempdir().unwrap();
    let group = unique("rd-pause");
    let listen = format!("127.0.0.1:{}", free_port());
    let config = write_bare_config(dir.path(), "dc1", &listen, &group);
    let paused = dir.path().join("dc1.paused");

    let o = oobfence_async(&["pause", "--reason", "rack 7"], &config).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(paused.exists());
    assert!(
        out.contains(&format!("no daemon answers at http://{listen}"))
            && out.contains("takes effect when it starts"),
        "{out}"
    );
    assert!(!out.contains("writes nothing within"), "{out}");

    let daemon = DaemonProcess::start(&config, &listen, dir.path(), &[], &[]).await;
    let o = oobfence_async(&["pause", "--reason", "rack 7"], &config).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("the daemon of datacenter dc1 answers")
            && out.contains(&format!("pid {}", daemon.pid())),
        "{out}"
    );
    let o = oobfence_async(&["resume"], &config).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("the daemon of datacenter dc1 answers"),
        "{}",
        stdout(&o)
    );
    assert!(!paused.exists());
    daemon.stop().await;
}

/// Serves "404 Not Found" to every request on a port of its own, as a program that is not
/// oobfence (or an oobfence from before `/whoami`) would: its address.
fn not_oobfence() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = conn.read(&mut [0u8; 4096]);
            let _ = conn.write_all(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    addr
}

/// Something that answers on the address without saying who it is is not believed: `nodes`
/// exits 3 saying so; `pause` writes the file and does not claim it is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_does_not_say_who_it_is_is_not_believed() {
    let dir = tempfile::tempdir().unwrap();
    let listen = not_oobfence();
    let config = write_bare_config(dir.path(), "dc1", &listen, &unique("rd-unknown"));
    let o = oobfence_async(&["nodes"], &config).await;
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("does not say it is the daemon of datacenter dc1") && err.contains("404"),
        "{err}"
    );
    let o = oobfence_async(&["pause", "--reason", "rack 7"], &config).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(dir.path().join("dc1.paused").exists());
    assert!(stderr(&o).contains("cannot be told"), "{}", stderr(&o));
}

/// The daemon of a config stays recognized when the file changes: edited and not yet
/// reloaded (a note says a reload applies it), then reloaded (no note; `/whoami` carries the
/// new digest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_then_reloaded_config_is_still_its_daemons() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, config) = dc1_daemon(dir.path(), &unique("rd-reload")).await;
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("# rack 7 rewired\n");
    std::fs::write(&config, &text).unwrap();

    let o = oobfence_async(&["nodes"], &config).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("systemctl reload oobfence@dc1"),
        "{}",
        stderr(&o)
    );

    daemon.reload().await;
    let o = oobfence_async(&["nodes"], &config).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("reload"), "{}", stderr(&o));
    let who: serde_json::Value = reqwest::get(format!("http://{}/whoami", daemon.listen))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        who["config_digest"],
        oobfence::config::sha256_hex(text.as_bytes()),
        "{who}"
    );
    assert_eq!(who["datacenter"], "dc1");
    assert_eq!(who["pid"], daemon.pid());
    daemon.stop().await;
}

/// Two units on one host with one listen address: the second start fails (exit 2) naming
/// the daemon that holds the address, its datacenter, config and pid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_unit_on_the_same_address_fails_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let group = unique("rd-second");
    let (first, dc1) = dc1_daemon(dir.path(), &group).await;
    let second_dir = tempfile::tempdir().unwrap();
    let dc2 = write_bare_config(second_dir.path(), "dc2", &first.listen, &group);
    let second = DaemonProcess::spawn(&dc2, &first.listen, second_dir.path(), &[], &[]);
    let (status, log) = second.wait_exit(READY).await;
    assert_eq!(status.code(), Some(2), "{log}");
    for named in [
        "held by the daemon of datacenter dc1",
        &dc1.display().to_string(),
        &format!("pid {}", first.pid()),
        "[server] listen of its own",
    ] {
        assert!(log.contains(named), "names {named:?}: {log}");
    }
    first.stop().await;
}

/// `oobfence why NODE | head -1` and `oobfence nodes | head -1`: the reader gone, the command
/// ends quietly (as `cat` does, by SIGPIPE), with no panic about a broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_ends_why_and_nodes_quietly() {
    let client = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let group = unique("rd-pipe");
    let node = FakeNode::create(&client, &group, &group, "boot-1").await;
    let (daemon, config) = dc1_daemon(dir.path(), &group).await;
    for args in [vec!["why", node.name.as_str()], vec!["nodes"]] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
        cmd.arg(args[0])
            .arg("--config")
            .arg(&config)
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start oobfence");
        // The reader is gone before anything is printed: every line printed meets a closed pipe.
        drop(child.stdout.take());
        let o = tokio::time::timeout(READY, child.wait_with_output())
            .await
            .expect("the command ends")
            .unwrap();
        let err = stderr(&o);
        assert!(
            !err.contains("panicked") && err.is_empty(),
            "{args:?}: {err}"
        );
        assert_eq!(
            o.status.signal(),
            Some(nix::sys::signal::Signal::SIGPIPE as i32),
            "{args:?}: {:?} {err}",
            o.status
        );
    }
    daemon.stop().await;
    node.delete().await;
}

/// A library's log line stays out of a command's output: the AWS SDK's INFO lines about the
/// credentials it loaded from a profile (naming the access key) are not printed by `probe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_librarys_log_line_stays_out_of_a_commands_output() {
    let client = support::k8s::client().await;
    let dir = tempfile::tempdir().unwrap();
    let name = unique("rd-quiet");
    let node = FakeNode::create(&client, &name, &name, "boot-1").await;
    node.set_provider_id("aws:///us-east-1a/i-0123456789abcdef0")
        .await;
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/config"),
        "[profile ops]\nregion = us-east-1\n",
    )
    .unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        "[ops]\naws_access_key_id = AKIDQUIETTEST\naws_secret_access_key = testing\n",
    )
    .unwrap();
    let config = dir.path().join("dc1.toml");
    std::fs::write(
        &config,
        format!(
            "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = \"{}\"\n\
             [aws]\nregion = \"us-east-1\"\nnodes = [\"{name}\"]\nprofile = \"ops\"\n\
             endpoint_url = \"http://127.0.0.1:{}\"\ntimeout = \"2s\"\n",
            support::k8s::kubeconfig_path().display(),
            free_port()
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
    cmd.args(["probe", "--config"])
        .arg(&config)
        .arg(&name)
        .env("HOME", &home)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env_remove("OOBFENCE_LOG")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let o = cmd.output().await.expect("run oobfence probe");
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        err.contains("cannot reach EC2") || err.contains("timed out"),
        "the probe ran and failed on its own words: {out}{err}"
    );
    for leak in ["aws_config", "AKIDQUIETTEST", " INFO ", " WARN "] {
        assert!(
            !out.contains(leak) && !err.contains(leak),
            "{leak:?} leaked: {out}{err}"
        );
    }
    node.delete().await;
}
