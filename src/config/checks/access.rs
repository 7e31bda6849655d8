//! Whether the user the daemon runs as can read every file the config names (password and CA
//! files, inventories, the kubeconfig and the files it names). `check-config` is often run as
//! root, who reads everything: the unit then fails at start as `oobfence` with "permission
//! denied". So, run as root, the files are checked as the `oobfence` system user
//! (packaging/sysusers.conf) where it exists; run as anyone else, as that user.
//!
//! By the mode bits of each file and of the directories above it (owner, group and the
//! user's groups, other), as the kernel grants them without ACLs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;
use nix::unistd::{Gid, Group, Uid, User};

use super::{Finding, Severity, finding};

/// The system user the packaged units run as.
pub const DAEMON_USER: &str = "oobfence";

/// Who the files are checked as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reader {
    pub name: String,
    pub uid: u32,
    /// The primary group and every supplementary one.
    pub gids: Vec<u32>,
    /// The group to give a file it must read: the daemon user's own.
    pub group: String,
    /// The daemon's user (run as root), rather than whoever runs `check-config`.
    pub is_daemon_user: bool,
}

impl Reader {
    /// As root, `daemon_user` (the daemon's, `oobfence` unless its unit says otherwise)
    /// where it exists (else root: nothing to learn); as anyone else, that user.
    pub fn for_this_run(daemon_user: &str) -> Reader {
        let me = nix::unistd::geteuid();
        if me.is_root()
            && let Some(reader) = Reader::of_user(daemon_user)
        {
            return reader;
        }
        let mut gids: Vec<u32> = nix::unistd::getgroups()
            .unwrap_or_default()
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        gids.push(nix::unistd::getegid().as_raw());
        Reader {
            name: User::from_uid(me)
                .ok()
                .flatten()
                .map_or_else(|| me.to_string(), |u| u.name),
            uid: me.as_raw(),
            gids,
            group: DAEMON_USER.to_string(),
            is_daemon_user: false,
        }
    }

    /// A named user with its groups, as a login (initgroups) would have them.
    pub fn of_user(name: &str) -> Option<Reader> {
        let user = User::from_name(name).ok().flatten()?;
        let c_name = std::ffi::CString::new(name).ok()?;
        let gids = nix::unistd::getgrouplist(&c_name, user.gid)
            .unwrap_or_else(|_| vec![user.gid])
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        let group = Group::from_gid(user.gid)
            .ok()
            .flatten()
            .map_or_else(|| user.gid.to_string(), |g| g.name);
        Some(Reader {
            group,
            name: user.name,
            uid: user.uid.as_raw(),
            gids,
            is_daemon_user: true,
        })
    }

    /// Whether this user may do `want` (r 4, x 1) to a file of this metadata.
    fn may(&self, meta: &std::fs::Metadata, want: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        let mode = meta.mode();
        let bits = if meta.uid() == self.uid {
            mode >> 6
        } else if self.gids.contains(&meta.gid()) {
            mode >> 3
        } else {
            mode
        };
        bits & want == want
    }
}

/// The files the config file at `config` names, each with its key, as written in the file
/// (whether or not the rest of it loads): the config file itself (key ""),
/// `kubernetes.kubeconfig` and the files it names,
/// each `[[bmc]]` entry's `password_file`, `ca_file` and `inventory`.
pub fn named_files(config: &Path) -> Vec<(String, PathBuf)> {
    let Some(doc) = std::fs::read_to_string(config)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
    else {
        return Vec::new();
    };
    // The daemon reads the config file itself first.
    let mut out = vec![(String::new(), config.to_path_buf())];
    let kubernetes = doc.get("kubernetes").and_then(toml::Value::as_table);
    if let Some(kc) = kubernetes
        .and_then(|k| k.get("kubeconfig"))
        .and_then(toml::Value::as_str)
    {
        let kc = PathBuf::from(kc);
        let context = kubernetes
            .and_then(|k| k.get("context"))
            .and_then(toml::Value::as_str);
        let inner = kubeconfig_files(&kc, context);
        out.push(("kubernetes.kubeconfig".to_string(), kc));
        out.extend(
            inner
                .into_iter()
                .map(|f| ("kubernetes.kubeconfig".into(), f)),
        );
    }
    let entries = doc.get("bmc").and_then(toml::Value::as_array);
    for (i, entry) in entries.into_iter().flatten().enumerate() {
        let Some(entry) = entry.as_table() else {
            continue;
        };
        for key in ["password_file", "ca_file", "inventory"] {
            if let Some(file) = entry.get(key).and_then(toml::Value::as_str) {
                let file = match key {
                    "inventory" => super::super::inventory::resolve(config, Path::new(file)),
                    _ => PathBuf::from(file),
                };
                out.push((format!("bmc[{i}].{key}"), file));
            }
        }
    }
    out
}

/// The files a kubeconfig names for the context in use: its cluster's CA, its user's client
/// certificate, key and token file (paths as kube resolves them, beside the kubeconfig).
fn kubeconfig_files(kubeconfig: &Path, context: Option<&str>) -> Vec<PathBuf> {
    let Ok(kc) = Kubeconfig::read_from(kubeconfig) else {
        return Vec::new();
    };
    let Some(name) = context.map(String::from).or(kc.current_context.clone()) else {
        return Vec::new();
    };
    let Some(ctx) = kc
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(ca) = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority.as_ref())
    {
        out.push(PathBuf::from(ca));
    }
    if let Some(user) = kc
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == ctx.user.as_ref())
        .and_then(|a| a.auth_info.as_ref())
    {
        for file in [&user.client_certificate, &user.client_key, &user.token_file]
            .into_iter()
            .flatten()
        {
            out.push(PathBuf::from(file));
        }
    }
    out
}

/// An error for each named file `reader` cannot read (or reach: a directory above it it may
/// not search), with the commands that fix it. Files that do not exist are left to the
/// checks that read them.
pub fn unreadable_by(reader: &Reader, files: &[(String, PathBuf)]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (key, file) in files {
        let Ok(full) = std::fs::canonicalize(file) else {
            continue;
        };
        if !seen.insert((key.clone(), full.clone())) {
            continue;
        }
        if let Some(problem) = blocked(reader, file, &full) {
            out.push(finding(Severity::Error, key, problem));
        }
    }
    out
}

/// Why `reader` cannot read `full` (the canonical path of `file`, as written), if it cannot.
fn blocked(reader: &Reader, file: &Path, full: &Path) -> Option<String> {
    let who = match reader.is_daemon_user {
        true => format!(
            "user {}, which the daemon runs as (checked as it because check-config runs as root; --daemon-user names another)",
            reader.name
        ),
        false => format!(
            "you (user {}; run check-config as root to check as user {DAEMON_USER}, which the daemon runs as)",
            reader.name
        ),
    };
    let group = &reader.group;
    let dirs: Vec<&Path> = full.ancestors().skip(1).collect();
    for dir in dirs.into_iter().rev() {
        let meta = std::fs::metadata(dir).ok()?;
        if !reader.may(&meta, 1) {
            return Some(format!(
                "{} cannot be read by {who}: its directory {} is {}, which it may not enter; fix: chgrp {group} {} && chmod 750 {}",
                file.display(),
                dir.display(),
                owned(&meta),
                quoted(dir),
                quoted(dir)
            ));
        }
    }
    let meta = std::fs::metadata(full).ok()?;
    (!reader.may(&meta, 4)).then(|| {
        format!(
            "{} cannot be read by {who}: it is {}; fix: chgrp {group} {} && chmod 640 {}",
            file.display(),
            owned(&meta),
            quoted(file),
            quoted(file)
        )
    })
}

/// `owner root, group root, mode 0600`.
fn owned(meta: &std::fs::Metadata) -> String {
    let owner = User::from_uid(Uid::from_raw(meta.uid()))
        .ok()
        .flatten()
        .map_or_else(|| meta.uid().to_string(), |u| u.name);
    let group = Group::from_gid(Gid::from_raw(meta.gid()))
        .ok()
        .flatten()
        .map_or_else(|| meta.gid().to_string(), |g| g.name);
    format!(
        "owner {owner}, group {group}, mode {:04o}",
        meta.mode() & 0o7777
    )
}

/// A path as a shell takes it, so that the printed fix runs as pasted.
fn quoted(path: &Path) -> String {
    let text = path.to_string_lossy();
    shlex::try_quote(&text).map_or_else(|_| text.to_string(), |q| q.into_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn reader(uid: u32, gids: &[u32]) -> Reader {
        Reader {
            name: "someone".into(),
            uid,
            gids: gids.to_vec(),
            group: "oobfence".into(),
            is_daemon_user: true,
        }
    }

    /// Owner bits for the owner, group bits for a member of the file's group, other bits for
    /// the rest; a directory above that may not be searched blocks the file whatever its mode.
    #[test]
    fn mode_bits_decide_by_owner_group_and_other() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let meta = std::fs::metadata(&file).unwrap();
        let (uid, gid) = (meta.uid(), meta.gid());
        assert!(reader(uid.wrapping_add(1), &[gid]).may(&meta, 4), "group");
        assert!(
            !reader(uid.wrapping_add(1), &[gid + 1]).may(&meta, 4),
            "other"
        );
        if uid != 0 {
            assert!(reader(uid, &[]).may(&meta, 4), "owner");
        }
        let files = [("bmc[0].password_file".to_string(), file.clone())];
        let stranger = reader(uid.wrapping_add(1), &[gid.wrapping_add(1)]);
        let f = unreadable_by(&stranger, &files);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].problem.contains("mode 0640") && f[0].problem.contains("chmod 640"),
            "{f:?}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(unreadable_by(&stranger, &files).is_empty());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let f = unreadable_by(&stranger, &files);
        assert!(
            f.len() == 1 && f[0].problem.contains("may not enter"),
            "{f:?}"
        );
    }
}
