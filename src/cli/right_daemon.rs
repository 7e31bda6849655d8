//! Which daemon answers on a config's `[server] listen`, and what a command says of it. Only
//! the daemon of the config it was given is believed (what that means: [`crate::whoami`]):
//! another datacenter's, one started from another file, or a program that does not say who
//! it is, is refused with [`EXIT_OTHER_DAEMON`], naming both sides and what to do.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::say_error;
use crate::config::Config;
use crate::whoami::{Answer, Whoami, url_of};

/// The exit code of a command refused because the daemon answering is not its config's.
pub(super) const EXIT_OTHER_DAEMON: u8 = 3;

/// How long a command waits for a daemon to say who it is.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Who answers on `cfg`'s `[server] listen`, judged against `cfg`.
pub(super) async fn answer(cfg: &Config) -> Answer {
    Answer::of(cfg, ASK_TIMEOUT).await
}

/// The daemon of `cfg` (read from `path`), or the exit code after the line that says why not:
/// 1 when nothing answers, [`EXIT_OTHER_DAEMON`] when something else does. A config edited
/// since the daemon last read it is still its config: a note says a reload would apply it.
pub(super) async fn the_daemon(cfg: &Config, path: &Path) -> Result<Whoami, ExitCode> {
    match answer(cfg).await {
        Answer::Ours {
            who,
            reload_pending,
        } => {
            if reload_pending {
                note_reload_pending(cfg, path, &who);
            }
            Ok(who)
        }
        Answer::Nobody(cause) => {
            say_error(format!(
                "no oobfence daemon answers at {} (server.listen in {}): {cause}. Is it running? \
                 (systemctl status oobfence@{})",
                url_of(cfg.server.listen),
                path.display(),
                cfg.datacenter
            ));
            Err(ExitCode::from(1))
        }
        other => Err(refuse(cfg, path, &other)),
    }
}

/// Says why the answer is not believed (another daemon, or one that does not say who it is)
/// and returns [`EXIT_OTHER_DAEMON`]; for an answer of ours or none, only the exit code 1.
pub(super) fn refuse(cfg: &Config, path: &Path, answer: &Answer) -> ExitCode {
    match not_ours(cfg, path, answer) {
        Some(why) => {
            say_error(why);
            ExitCode::from(EXIT_OTHER_DAEMON)
        }
        None => ExitCode::from(1),
    }
}

/// Why an answer is not from the daemon of `cfg` (None: it is, or nothing answered).
pub(super) fn not_ours(cfg: &Config, path: &Path, answer: &Answer) -> Option<String> {
    let url = url_of(cfg.server.listen);
    match answer {
        Answer::Other(who) => Some(format!(
            "the daemon answering at {url} (server.listen in {}) is not the daemon of this \
             config (datacenter {}): it is {}. Nothing it says is about datacenter {}. Use its \
             config (--config {}) to ask it, or give {} a [server] listen of its own and \
             restart oobfence@{}",
            path.display(),
            cfg.datacenter,
            who.describe(),
            cfg.datacenter,
            who.config.display(),
            path.display(),
            cfg.datacenter
        )),
        Answer::Unknown(why) => Some(format!(
            "something answers at {url} (server.listen in {}) but does not say it is the daemon \
             of datacenter {} ({why}): another program, or an oobfence older than this command. \
             `ss -ltnp` names what listens there; restart oobfence@{} with this version",
            path.display(),
            cfg.datacenter,
            cfg.datacenter
        )),
        Answer::Ours { .. } | Answer::Nobody(_) => None,
    }
}

/// The daemon runs an earlier reading of the file: what it says is from that config.
fn note_reload_pending(cfg: &Config, path: &Path, who: &Whoami) {
    let short = |d: &str| d.chars().take(12).collect::<String>();
    eprintln!(
        "oobfence: note: the daemon of datacenter {} runs {} as it was before its last change \
         (digest {} running, {} on disk): `systemctl reload oobfence@{}` applies it",
        cfg.datacenter,
        path.display(),
        short(&who.config_digest),
        short(&cfg.digest),
        cfg.datacenter
    );
}
