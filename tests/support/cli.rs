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

/// Writes `text` as `dir/dc1.toml` and runs `check-config` on it: its output, its stderr, and
/// the file's path as the messages name it.
pub fn check_config_text(dir: &Path, text: &str) -> (Output, String, String) {
    let path = dir.join("dc1.toml");
    std::fs::write(&path, text).unwrap();
    let o = oobfence(&["check-config"], &path);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, err, path.display().to_string())
}

fn oobfence_command(args: &[&str], config: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_oobfence"));
    cmd.args(&args[..1])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .env_remove("CREDENTIALS_DIRECTORY");
    cmd
}
