//! The `oobfence` binary as an operator runs it.

use std::path::Path;
use std::process::Output;

/// `oobfence COMMAND --config CONFIG ARGS...` for `args = [COMMAND, ARGS...]`, as an operator's
/// shell runs it (no `$CREDENTIALS_DIRECTORY`).
pub fn oobfence(args: &[&str], config: &Path) -> Output {
    super::blocking(|| oobfence_command(args, config).output()).expect("run oobfence")
}

/// [`oobfence`], without blocking the async runtime (a daemon may run in this process).
pub async fn oobfence_async(args: &[&str], config: &Path) -> Output {
    tokio::process::Command::from(oobfence_command(args, config))
        .output()
        .await
        .expect("run oobfence")
}

/// A password file (`dir/pw`, mode 0600) and an offline kubeconfig (`dir/kubeconfig`); the
/// top of a config that uses them: `datacenter` and `[kubernetes]`.
pub fn config_head(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let pw = dir.join("pw");
    std::fs::write(&pw, "sup3r-secret-pw\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    super::k8s::write_offline_kubeconfig(&dir.join("kubeconfig"));
    format!(
        "datacenter = \"dc1\"\n[kubernetes]\nkubeconfig = \"{}\"\n",
        dir.join("kubeconfig").display()
    )
}

/// Writes `text` as `dir/dc1.toml` and runs `check-config` on it: its output, its stderr, and
/// the file's path as the messages name it.
pub fn check_config_text(dir: &Path, text: &str) -> (Output, String, String) {
    let path = dir.join("dc1.toml");
    std::fs::write(&path, text).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, err, path.display().to_string())
}

/// `check-config`'s `--daemon-user` for the tests: their daemons run as the user that runs
/// them (root, in CI), so the files their configs name are checked as it.
pub const DAEMON_USER_ENV: (&str, &str) = ("OOBFENCE_DAEMON_USER", "root");

fn oobfence_command(args: &[&str], config: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
    cmd.args(&args[..1])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .env(DAEMON_USER_ENV.0, DAEMON_USER_ENV.1)
        .env_remove("CREDENTIALS_DIRECTORY");
    cmd
}
