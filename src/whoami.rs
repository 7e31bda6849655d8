//! Who a daemon is, so that a command talks to the daemon of the config it was given and to
//! no other: what a daemon serves on `/whoami`, asking whatever answers on an address, and
//! whether that is the daemon of a config.
//!
//! "The daemon of this config" is the daemon of the same datacenter started from the same
//! file (both paths resolved: absolute, symlinks followed). The digest is not part of it: a
//! file edited and not yet reloaded, or reloaded since, is still that daemon's config; a
//! copy of the file elsewhere is not (its relative paths, its pause file, may name others).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Config;

/// Where a daemon says who it is.
pub const PATH: &str = "/whoami";

/// What a daemon says of itself on [`PATH`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    /// Always `oobfence`: what tells this answer from another program's JSON.
    pub program: String,
    pub datacenter: String,
    /// The config file it was started from, resolved ([`resolved`]).
    pub config: PathBuf,
    /// SHA-256 of the config as last loaded (at start or by the last reload that took).
    pub config_digest: String,
    pub version: String,
    pub pid: u32,
    /// `[ha] identity`, when `[ha]` is set.
    pub ha_identity: Option<String>,
}

impl Whoami {
    /// This process, running `cfg`.
    pub fn of(cfg: &Config) -> Whoami {
        Whoami {
            program: "oobfence".into(),
            datacenter: cfg.datacenter.clone(),
            config: resolved(&cfg.source),
            config_digest: cfg.digest.clone(),
            version: crate::VERSION_LONG.into(),
            pid: std::process::id(),
            ha_identity: cfg.ha.as_ref().map(|h| h.identity.clone()),
        }
    }

    /// "the daemon of datacenter dc1 (config /etc/oobfence/dc1.toml, pid 1234, [ha] identity
    /// host-a)": what a message names it by.
    pub fn describe(&self) -> String {
        let ha = self
            .ha_identity
            .as_ref()
            .map(|i| format!(", [ha] identity {i}"))
            .unwrap_or_default();
        format!(
            "the daemon of datacenter {} (config {}, pid {}{ha})",
            self.datacenter,
            self.config.display(),
            self.pid
        )
    }
}

/// A config path as a daemon names itself: absolute, symlinks followed; as given when it
/// cannot be resolved (the file is gone).
pub fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The URL of a daemon listening on `listen`, a wildcard address turned into loopback.
pub fn url_of(listen: SocketAddr) -> String {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    format!("http://{addr}")
}

/// What answers on a daemon's address, as judged against one config.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The daemon of this config; `reload_pending` when the file now differs from what it
    /// runs (edited, not yet reloaded).
    Ours { who: Whoami, reload_pending: bool },
    /// Another daemon: another datacenter's, or one started from another file.
    Other(Whoami),
    /// Something answers but does not say who it is: another program, or an oobfence from
    /// before `/whoami`. Why, in a few words.
    Unknown(String),
    /// Nothing answers: the connection's root cause.
    Nobody(String),
}

impl Answer {
    /// Judges who answered against `cfg`.
    pub fn judge(cfg: &Config, who: Whoami) -> Answer {
        if who.datacenter == cfg.datacenter && who.config == resolved(&cfg.source) {
            let reload_pending = who.config_digest != cfg.digest;
            Answer::Ours {
                who,
                reload_pending,
            }
        } else {
            Answer::Other(who)
        }
    }

    /// Asks whatever listens on `cfg`'s `[server] listen` who it is, and judges the answer.
    pub async fn of(cfg: &Config, timeout: Duration) -> Answer {
        match ask(cfg.server.listen, timeout).await {
            Asked::Said(who) => Answer::judge(cfg, who),
            Asked::Unknown(why) => Answer::Unknown(why),
            Asked::Nobody(why) => Answer::Nobody(why),
        }
    }
}

/// What answered on an address, unjudged.
#[derive(Debug, Clone)]
pub enum Asked {
    Said(Whoami),
    Unknown(String),
    Nobody(String),
}

/// Asks whatever listens on `listen` who it is.
pub async fn ask(listen: SocketAddr, timeout: Duration) -> Asked {
    let url = format!("{}{PATH}", url_of(listen));
    let client = match reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .build()
    {
        Ok(c) => c,
        Err(e) => return Asked::Nobody(root_cause(&e)),
    };
    let resp = match client.get(&url).send().await {
        Ok(r) => r,
        Err(e) => return Asked::Nobody(root_cause(&e)),
    };
    let status = resp.status();
    if !status.is_success() {
        return Asked::Unknown(format!("GET {PATH} answered {status}"));
    }
    match resp.json::<Whoami>().await {
        Ok(who) if who.program == "oobfence" => Asked::Said(who),
        Ok(who) => Asked::Unknown(format!("GET {PATH} names program {:?}", who.program)),
        Err(e) => Asked::Unknown(format!(
            "GET {PATH} answered what is not a daemon's identity ({})",
            root_cause(&e)
        )),
    }
}

/// The innermost cause of an error: what went wrong, without the layers that carried it.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, datacenter: &str, text_extra: &str) -> Config {
        let path = dir.join(format!("{datacenter}.toml"));
        let text = format!(
            "datacenter = \"{datacenter}\"\n[kubernetes]\nkubeconfig = \"{}\"\n{text_extra}",
            dir.join("kubeconfig").display()
        );
        std::fs::write(&path, &text).unwrap();
        Config::load_without_secrets(&path).expect("valid config")
    }

    /// The same file and datacenter is ours whatever the digest (a reload pending or done);
    /// another datacenter's, or the same datacenter's from another file, is not.
    #[test]
    fn the_daemon_of_a_config_is_its_datacenter_and_file_not_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let dc1 = config(dir.path(), "dc1", "");
        let running = Whoami::of(&dc1);
        assert!(matches!(
            Answer::judge(&dc1, running.clone()),
            Answer::Ours {
                reload_pending: false,
                ..
            }
        ));
        let edited = config(dir.path(), "dc1", "# edited\n");
        assert!(matches!(
            Answer::judge(&edited, running.clone()),
            Answer::Ours {
                reload_pending: true,
                ..
            }
        ));
        let dc2 = config(dir.path(), "dc2", "");
        assert!(matches!(
            Answer::judge(&dc2, running.clone()),
            Answer::Other(_)
        ));
        let copy_dir = tempfile::tempdir().unwrap();
        let copy = config(copy_dir.path(), "dc1", "");
        assert!(matches!(Answer::judge(&copy, running), Answer::Other(_)));
    }
}
