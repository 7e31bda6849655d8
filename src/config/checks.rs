//! What `check-config` looks at beyond the file's own syntax: the files it names (kubeconfig,
//! password files) and the settings that work but weaken the proof. `run` logs the warnings at
//! start; `check-config` prints everything and exits 2 on an error.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use kube::config::Kubeconfig;

use super::fence_agent::known;
use super::{BmcTls, Config, KubernetesConfig};
use crate::identity::IdentityCheck;

mod access;
mod entries;
pub use access::{DAEMON_USER, Reader, named_files, unreadable_by};
pub use entries::unmatched;

/// A token expiring sooner than this is a warning.
pub const TOKEN_EXPIRY_WARNING: jiff::SignedDuration = jiff::SignedDuration::from_hours(7 * 24);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// `run` cannot work (or not for long): `check-config` exits 2.
    Error,
    /// It works, with less safety or less secrecy than it should.
    Warning,
    /// Worth knowing (a token's expiry).
    Note,
}

/// One thing found, named by the config key it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub key: String,
    pub problem: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        };
        write!(
            f,
            "{word}: {}: {}",
            super::display_key(&self.key),
            self.problem
        )
    }
}

fn finding(severity: Severity, key: impl Into<String>, problem: impl Into<String>) -> Finding {
    Finding {
        severity,
        key: key.into(),
        problem: problem.into(),
    }
}

/// Settings that work but weaken the proof or expose a secret; no cluster needed.
pub fn warnings(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    // The entries Redfish's note is about: said once for all of them.
    let mut redfish = Vec::new();
    for b in &cfg.bmc {
        let key = |k: &str| format!("bmc[{}].{k}", b.index);
        if b.tls == BmcTls::Insecure {
            out.push(finding(
                Severity::Warning,
                key("tls_insecure"),
                format!(
                    "TLS certificate verification is off for {}: anyone on the management network could answer as this BMC (pin its certificate with ca_file instead)",
                    match &b.inventory {
                        Some(inv) => format!("the {} BMCs listed in {}", inv.len(), inv.file.display()),
                        None => b.address.clone(),
                    }
                ),
            ));
        }
        if let Some(fa) = &b.fence_agent {
            out.push(finding(
                Severity::Note,
                key("agent"),
                format!(
                    "{} at {}: a fence agent reports no machine identity, so this entry's mapping is trusted as written; its reads are one agent process each ({} per read at most)",
                    fa.version,
                    fa.agent.display(),
                    humantime::format_duration(b.timeout)
                ),
            ));
            if fa.vouched {
                let (k, why) = ("unlisted_agent_off_means", known::vouched_warning(&fa.name));
                out.push(finding(Severity::Warning, key(k), why));
            }
        }
        if b.identity == IdentityCheck::Unchecked {
            out.push(finding(
                Severity::Warning,
                key("identity"),
                "\"unchecked\": an Off read counts without the machine proving it is the node's; a wrong mapping can fence a running node",
            ));
        }
        if let Some(note) = entries::outlet(b) {
            out.push(note);
        } else if b.protocol == super::Protocol::Redfish {
            redfish.push(b.index);
        }
        if let Some(file) = &b.password_file
            && let Some(problem) = readable_by_others(file)
        {
            out.push(finding(Severity::Warning, key("password_file"), problem));
        }
        out.extend(entries::password_lines(b));
    }
    out.extend(redfish_note(&redfish));
    out.extend(entries::shadowed(cfg));
    out.extend(entries::listen(cfg));
    if let Some(a) = cfg
        .aws
        .as_ref()
        .filter(|a| a.identity == IdentityCheck::Unchecked)
    {
        out.push(finding(
            Severity::Warning,
            "aws.identity",
            format!(
                "\"unchecked\" for region {}: a stopped instance counts without its private address matching the node's; a terminated or not-found answer never counts unless these credentials found the node's instance first (another account's credentials see no instance at all)",
                a.region
            ),
        ));
    }
    if let Some(ha) = &cfg.ha
        && shared_host_name(&ha.identity)
    {
        out.push(finding(
            Severity::Warning,
            "ha.identity",
            format!(
                "{:?} is a name many hosts share (the host name of a fresh image or clone): if the other instance's is the same, only one of them ever writes and the other reports it, so there is no standby; give each host its own identity",
                ha.identity
            ),
        ));
    }
    if cfg.policy.dry_run {
        out.push(finding(
            Severity::Warning,
            "policy.dry_run",
            "true: decisions are logged and reported, nothing is written to any Node",
        ));
    }
    if cfg.policy.confirm_reads < 2 {
        out.push(finding(
            Severity::Warning,
            "policy.confirm_reads",
            "1: a single Off read is enough to fence",
        ));
    }
    if cfg.ha.is_some() && cfg.pause.configmap.is_none() {
        out.push(finding(
            Severity::Warning,
            "pause.configmap",
            "\"\" with [ha]: the group has no pause switch (`oobfence pause` cannot pause it, and a pause file is refused under [ha])",
        ));
    }
    if cfg.guard_record.is_none() {
        out.push(finding(
            Severity::Warning,
            "guards.record",
            "\"\": the fence budget and the storm cooldown are kept nowhere on the cluster; a restart counts only the journal on this host and the Nodes' fence records, and an [ha] instance that takes over does not count its predecessor's Node deletes at all",
        ));
    }
    out
}

/// What Redfish cannot tell, once for the Redfish entries `indexes` (0-based) if any: keyed
/// by the one entry's `protocol` where there is one, else by `bmc` with their numbers.
fn redfish_note(indexes: &[usize]) -> Option<Finding> {
    const NOTE: &str = "Redfish has no sleep state but Paused: a machine hibernated (ACPI S4), or a virtual machine saved to disk behind a Redfish service in front of a hypervisor (sushy-tools over libvirt: a managed save, as libvirt-guests does on a host shutdown), reads Off with its own UUID and resumes with the same bootID; for VMs set libvirt-guests ON_SHUTDOWN=shutdown, or corroborate = \"power-draw\" (a VM has no power draw to read, so its Off never counts)";
    match indexes {
        [] => None,
        [one] => Some(finding(
            Severity::Note,
            format!("bmc[{one}].protocol"),
            NOTE,
        )),
        many => {
            let numbers: Vec<String> = many.iter().map(|i| format!("#{}", i + 1)).collect();
            Some(finding(
                Severity::Note,
                "bmc",
                format!(
                    "the {} Redfish entries ({}): {NOTE}",
                    many.len(),
                    numbers.join(", ")
                ),
            ))
        }
    }
}

/// Host names that distributions and cloud images ship with, so that two hosts left with the
/// default `[ha] identity` (the host name) may well carry the same one.
fn shared_host_name(identity: &str) -> bool {
    let name = identity.to_ascii_lowercase();
    let short = name.split('.').next().unwrap_or_default();
    short.starts_with("localhost")
        || [
            "ubuntu",
            "debian",
            "fedora",
            "centos",
            "rocky",
            "almalinux",
            "rhel",
            "archlinux",
            "raspberrypi",
            "node",
            "host",
            "server",
            "(none)",
        ]
        .contains(&short)
}

/// A secret file that users other than its owner and group can read.
fn readable_by_others(path: &Path) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o004 != 0).then(|| {
        format!(
            "{} is readable by every user of this host (mode {:04o}): chmod 0640 (owner root, group oobfence) or 0600",
            path.display(),
            mode & 0o7777
        )
    })
}

/// The kubeconfig `run` will use: found, readable, parsed, its context, cluster and user
/// present, the files it names readable, and its token's expiry. No API call.
pub fn kubeconfig(k: &KubernetesConfig, now: Timestamp) -> Vec<Finding> {
    let mut out = Vec::new();
    let (kc, origin) = match &k.kubeconfig {
        Some(path) => {
            if let Some(problem) = readable_by_others(path) {
                out.push(finding(
                    Severity::Warning,
                    "kubernetes.kubeconfig",
                    format!("{problem}; it holds oobfence's credentials"),
                ));
            }
            match Kubeconfig::read_from(path) {
                Ok(kc) => (kc, path.display().to_string()),
                Err(e) => {
                    out.push(finding(
                        Severity::Error,
                        "kubernetes.kubeconfig",
                        format!("cannot load {}: {}", path.display(), error_chain(&e)),
                    ));
                    return out;
                }
            }
        }
        None => match Kubeconfig::read() {
            Ok(kc) => (kc, "$KUBECONFIG or ~/.kube/config".to_string()),
            // In a pod the daemon would use its ServiceAccount: nothing more to check here.
            Err(_) if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => return out,
            Err(e) => {
                out.push(finding(
                    Severity::Error,
                    "kubernetes.kubeconfig",
                    format!(
                        "not set, and no kubeconfig in $KUBECONFIG or ~/.kube/config ({}): set it to the file `oobfence make-kubeconfig` wrote",
                        error_chain(&e)
                    ),
                ));
                return out;
            }
        },
    };
    let context_key = if k.context.is_some() {
        "kubernetes.context"
    } else {
        "kubernetes.kubeconfig"
    };
    let Some(context_name) = k.context.clone().or(kc.current_context.clone()) else {
        out.push(finding(
            Severity::Error,
            context_key,
            format!("{origin} has no current-context and [kubernetes] context is not set"),
        ));
        return out;
    };
    let Some(context) = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
    else {
        let known: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        out.push(finding(
            Severity::Error,
            context_key,
            format!(
                "context {context_name:?} is not in {origin} (it has: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        ));
        return out;
    };
    match kc
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
    {
        None => out.push(finding(
            Severity::Error,
            context_key,
            format!(
                "context {context_name:?} names cluster {:?}, which is not in {origin}",
                context.cluster
            ),
        )),
        Some(cluster) => {
            if cluster.server.as_deref().is_none_or(str::is_empty) {
                out.push(finding(
                    Severity::Error,
                    context_key,
                    format!("cluster {:?} has no server address", context.cluster),
                ));
            }
            if let Some(ca) = &cluster.certificate_authority {
                out.extend(unreadable(context_key, "certificate-authority", ca));
            }
            if cluster.insecure_skip_tls_verify == Some(true) {
                out.push(finding(
                    Severity::Warning,
                    context_key,
                    format!(
                        "cluster {:?} has insecure-skip-tls-verify: anyone between this host and the API server could answer as it",
                        context.cluster
                    ),
                ));
            }
        }
    }
    let user = context.user.as_deref().and_then(|name| {
        kc.auth_infos
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.auth_info.as_ref())
    });
    let Some(user) = user else {
        if let Some(name) = &context.user {
            out.push(finding(
                Severity::Error,
                context_key,
                format!("context {context_name:?} names user {name:?}, which is not in {origin}"),
            ));
        }
        return out;
    };
    for (what, file) in [
        ("client-certificate", &user.client_certificate),
        ("client-key", &user.client_key),
        ("tokenFile", &user.token_file),
    ] {
        if let Some(file) = file {
            out.extend(unreadable(context_key, what, file));
        }
    }
    let token = match (&user.token, &user.token_file) {
        (Some(t), _) => Some(secrecy::ExposeSecret::expose_secret(t).to_string()),
        (None, Some(f)) => std::fs::read_to_string(f)
            .ok()
            .map(|t| t.trim().to_string()),
        _ => None,
    };
    if let Some(exp) = token.as_deref().and_then(token_expiry) {
        let left = exp.duration_since(now);
        let when = exp.strftime("%Y-%m-%d %H:%M UTC");
        if left.is_negative() {
            out.push(finding(
                Severity::Error,
                context_key,
                format!(
                    "the token of user {:?} expired on {when}: mint a new one: {}",
                    context.user.as_deref().unwrap_or(""),
                    mint_hint(k)
                ),
            ));
        } else if left < TOKEN_EXPIRY_WARNING {
            out.push(finding(
                Severity::Warning,
                context_key,
                format!(
                    "the token of user {:?} expires on {when}, in {:.0} hours: mint a new one: {}",
                    context.user.as_deref().unwrap_or(""),
                    left.as_secs_f64() / 3600.0,
                    mint_hint(k)
                ),
            ));
        } else {
            out.push(finding(
                Severity::Note,
                context_key,
                format!("the token expires on {when}"),
            ));
        }
    }
    out
}

/// The commands that replace the kubeconfig `k` names with a freshly minted one, readable by
/// the daemon's group (make-kubeconfig writes mode 0600), as an administrator runs them.
fn mint_hint(k: &KubernetesConfig) -> String {
    let Some(path) = &k.kubeconfig else {
        return "`oobfence make-kubeconfig --output FILE`, then set [kubernetes] kubeconfig to FILE"
            .into();
    };
    let file = path.to_string_lossy();
    let new = format!("{file}.new");
    let quote = |s: &str| shlex::try_quote(s).map_or_else(|_| s.to_string(), |q| q.into_owned());
    format!(
        "`oobfence make-kubeconfig --output {0} && install -m 0640 -g {1} {0} {2} && rm {0}`, then reload the daemon's unit (a reload reads the kubeconfig again)",
        quote(&new),
        access::DAEMON_USER,
        quote(&file)
    )
}

fn unreadable(key: &str, what: &str, file: &str) -> Option<Finding> {
    let path = PathBuf::from(file);
    std::fs::File::open(&path).err().map(|e| {
        finding(
            Severity::Error,
            key,
            format!("its {what} {} cannot be read: {e}", path.display()),
        )
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        // Many errors already quote their source in their own message.
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// The `exp` claim of a JWT (a ServiceAccount token), if the token is one and has it. The
/// signature is not checked: this only says when the API server will stop accepting it.
pub fn token_expiry(token: &str) -> Option<Timestamp> {
    use base64::Engine as _;
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Timestamp::from_second(claims.get("exp")?.as_i64()?).ok()
}

/// When the token `run` would use expires: for the `oobfence_kubeconfig_token_expiry` metric.
pub fn configured_token_expiry(k: &KubernetesConfig) -> Option<Timestamp> {
    let kc = match &k.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).ok()?,
        None => Kubeconfig::read().ok()?,
    };
    let context_name = k.context.clone().or(kc.current_context.clone())?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)?
        .context
        .as_ref()?;
    let user = kc
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == context.user.as_ref())?
        .auth_info
        .as_ref()?;
    let token = match (&user.token, &user.token_file) {
        (Some(t), _) => secrecy::ExposeSecret::expose_secret(t).to_string(),
        (None, Some(f)) => std::fs::read_to_string(f).ok()?.trim().to_string(),
        _ => return None,
    };
    token_expiry(&token)
}

#[cfg(test)]
mod tests;
