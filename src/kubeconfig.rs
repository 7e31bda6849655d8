//! `oobfence make-kubeconfig`: a kubeconfig for oobfence's ServiceAccount, to copy to the
//! management host.
//!
//! An administrator runs it with their own credentials. It asks the API server for a token of
//! the ServiceAccount that `deploy/rbac.yaml` creates (the TokenRequest API, with an expiry),
//! writes a kubeconfig holding that token plus the cluster's address and CA, then uses the new
//! kubeconfig to ask the API server (SelfSubjectAccessReview) whether the token may do what the
//! daemon needs, and whether it may do things it should not.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::api_error::ApiErrorAt;
use crate::cluster::{ApiError, NODE_LEASE_NAMESPACE};

/// The shortest token lifetime the API server accepts.
pub const MIN_DURATION: Duration = Duration::from_secs(600);

/// One API permission: `verb` on `resource` of API group `group`, in `namespace` or cluster-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub namespace: Option<&'static str>,
    /// One object by name (RBAC `resourceNames`), or every object.
    pub name: Option<&'static str>,
}

const fn perm(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    namespace: Option<&'static str>,
) -> Permission {
    Permission {
        verb,
        group,
        resource,
        namespace,
        name: None,
    }
}

/// Everything the daemon does with the API: watch Nodes and fence them (taint through a patch,
/// or delete with `action = "delete-node"`), watch VolumeAttachments (and delete those of a
/// Node it deleted), list and force-delete a fenced node's pods (`release_at_attestation`),
/// watch node Leases, and report through core/v1 Events in "default".
pub const NEEDED: &[Permission] = &[
    perm("get", "", "nodes", None),
    perm("list", "", "nodes", None),
    perm("watch", "", "nodes", None),
    perm("patch", "", "nodes", None),
    perm("delete", "", "nodes", None),
    perm("list", "storage.k8s.io", "volumeattachments", None),
    perm("watch", "storage.k8s.io", "volumeattachments", None),
    perm("delete", "storage.k8s.io", "volumeattachments", None),
    // Release at attestation: a fenced node's pods, listed and force-deleted.
    perm("list", "", "pods", None),
    perm("delete", "", "pods", None),
    perm(
        "get",
        "coordination.k8s.io",
        "leases",
        Some(NODE_LEASE_NAMESPACE),
    ),
    perm(
        "list",
        "coordination.k8s.io",
        "leases",
        Some(NODE_LEASE_NAMESPACE),
    ),
    perm(
        "watch",
        "coordination.k8s.io",
        "leases",
        Some(NODE_LEASE_NAMESPACE),
    ),
    perm("create", "", "events", Some("default")),
    // The pause switch (`[pause] configmap`, its default name).
    Permission {
        name: Some("oobfence-pause"),
        ..perm("get", "", "configmaps", Some("oobfence"))
    },
    // The guards' record (`[guards] record`, its default name).
    Permission {
        name: Some("oobfence-guards"),
        ..perm("get", "", "configmaps", Some("oobfence"))
    },
    Permission {
        name: Some("oobfence-guards"),
        ..perm("patch", "", "configmaps", Some("oobfence"))
    },
];

/// A sample of what the daemon must not be able to do; any of these being allowed means the
/// ServiceAccount is bound to more than `deploy/rbac.yaml` grants.
pub const NOT_NEEDED: &[Permission] = &[
    perm("list", "", "secrets", None),
    perm("get", "", "secrets", Some("kube-system")),
    perm("get", "", "pods", Some("default")),
    perm("create", "", "pods", Some("default")),
    perm("update", "", "pods", Some("default")),
    perm("create", "", "nodes", None),
    perm("update", "", "nodes", None),
    perm(
        "create",
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        None,
    ),
];

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        let name = self.name.map(|n| format!(" {n}")).unwrap_or_default();
        match self.namespace {
            Some(ns) => write!(
                f,
                "{} {}{group}{name} in namespace {ns}",
                self.verb, self.resource
            ),
            None => write!(f, "{} {}{group} (cluster-wide)", self.verb, self.resource),
        }
    }
}

/// What to mint.
#[derive(Debug, Clone)]
pub struct Request {
    /// The administrator's kubeconfig; `None`: $KUBECONFIG, then ~/.kube/config.
    pub admin_kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub service_account: String,
    pub duration: Duration,
    pub output: PathBuf,
}

/// What was written, and what the new token may do.
#[derive(Debug)]
pub struct Minted {
    pub expires: jiff::Timestamp,
    /// The token is valid for less than was asked (asked, got): the API server caps tokens
    /// (`--service-account-max-token-expiration`), and rotation must follow its limit.
    pub shortened: Option<(std::time::Duration, std::time::Duration)>,
    /// Permissions from [`NEEDED`] the token lacks.
    pub missing: Vec<Permission>,
    /// Permissions from [`NOT_NEEDED`] the token has.
    pub excess: Vec<Permission>,
}

#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("token duration {0} is too short: the API server needs at least 10m")]
    TooShort(String),
    #[error("cannot load the administrator's kubeconfig {path}: {source}")]
    AdminKubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{}", ApiError(.0))]
    Client(#[source] kube::Error),
    #[error(
        "ServiceAccount {0} not found: apply deploy/rbac.yaml (or /usr/share/doc/oobfence/examples/rbac.yaml) first"
    )]
    NoServiceAccount(String),
    #[error("TokenRequest for ServiceAccount {account} failed: {}", ApiErrorAt(.source, .server))]
    TokenRequest {
        account: String,
        /// The administrator's kubeconfig's API server URL, which failed connections name.
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server returned no token for ServiceAccount {0}")]
    NoToken(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use the new kubeconfig {path}: {reason}")]
    Check { path: String, reason: String },
}

/// Mints the token, writes the kubeconfig (mode 0600, replaced atomically) and checks it.
pub async fn make(req: &Request) -> Result<Minted, MintError> {
    if req.duration < MIN_DURATION {
        return Err(MintError::TooShort(
            humantime::format_duration(req.duration).to_string(),
        ));
    }
    let admin = admin_config(req).await?;
    let asked_at = jiff::Timestamp::now();
    let client = kube::Client::try_from(admin.clone()).map_err(MintError::Client)?;
    let account = format!("{}/{}", req.namespace, req.service_account);
    let accounts: Api<ServiceAccount> = Api::namespaced(client, &req.namespace);
    let token_request = TokenRequest {
        spec: TokenRequestSpec {
            // Empty: the API server's own audiences, which is what it accepts back.
            audiences: Vec::new(),
            expiration_seconds: Some(req.duration.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(&req.service_account, &PostParams::default(), &token_request)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.code == 404 => MintError::NoServiceAccount(account.clone()),
            _ => MintError::TokenRequest {
                account: account.clone(),
                server: admin.cluster_url.to_string(),
                source: e,
            },
        })?;
    let status = answer
        .status
        .filter(|s| !s.token.is_empty())
        .ok_or_else(|| MintError::NoToken(account.clone()))?;
    let expires = status.expiration_timestamp.0;

    let text = render(&admin, &account, &status.token, expires);
    write_private(&req.output, &text).map_err(|source| MintError::Write {
        path: req.output.display().to_string(),
        source,
    })?;

    let (missing, excess) = check(&req.output).await?;
    Ok(Minted {
        expires,
        shortened: shortened(req.duration, asked_at, expires),
        missing,
        excess,
    })
}

/// The token's validity when the API server gave less than `asked` (asked at `asked_at`, valid
/// until `expires`): (asked, got). A minute's slack for the round trip and clock steps.
pub fn shortened(
    asked: std::time::Duration,
    asked_at: jiff::Timestamp,
    expires: jiff::Timestamp,
) -> Option<(std::time::Duration, std::time::Duration)> {
    let got = std::time::Duration::try_from(expires.duration_since(asked_at)).unwrap_or_default();
    (got + std::time::Duration::from_secs(60) < asked).then_some((asked, got))
}

async fn admin_config(req: &Request) -> Result<kube::Config, MintError> {
    let options = KubeConfigOptions {
        context: req.context.clone(),
        ..Default::default()
    };
    match &req.admin_kubeconfig {
        Some(path) => {
            let wrap = |source| MintError::AdminKubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kc = Kubeconfig::read_from(path).map_err(wrap)?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(wrap)
        }
        None => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|source| MintError::AdminKubeconfig {
                path: "$KUBECONFIG or ~/.kube/config".into(),
                source,
            }),
    }
}

/// The kubeconfig text: the administrator's view of the cluster (address, CA, TLS options)
/// and the ServiceAccount's token, nothing else of the administrator's.
fn render(admin: &kube::Config, account: &str, token: &str, expires: jiff::Timestamp) -> String {
    // A JSON string is a valid YAML double-quoted scalar.
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let mut cluster = format!("    server: {}\n", q(&admin.cluster_url.to_string()));
    if let Some(certs) = admin.root_cert.as_ref().filter(|c| !c.is_empty()) {
        let pem: String = certs.iter().map(|der| pem_certificate(der)).collect();
        cluster.push_str(&format!(
            "    certificate-authority-data: {}\n",
            base64(pem.as_bytes())
        ));
    }
    if admin.accept_invalid_certs {
        cluster.push_str("    insecure-skip-tls-verify: true\n");
    }
    if let Some(name) = &admin.tls_server_name {
        cluster.push_str(&format!("    tls-server-name: {}\n", q(name)));
    }
    if let Some(proxy) = &admin.proxy_url {
        cluster.push_str(&format!("    proxy-url: {}\n", q(&proxy.to_string())));
    }
    format!(
        "# Written by `oobfence make-kubeconfig` for ServiceAccount {account}.\n\
         # The token expires at {expires}: run the command again before then and reload\n\
         # the oobfence@ units that use this file.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: oobfence\n  cluster:\n{cluster}\
         users:\n\
         - name: oobfence\n  user:\n    token: {}\n\
         contexts:\n\
         - name: oobfence\n  context:\n    cluster: oobfence\n    user: oobfence\n\
         current-context: oobfence\n",
        q(token)
    )
}

fn base64(bytes: &[u8]) -> String {
    // k8s-openapi's ByteString serializes as standard base64.
    match serde_json::to_value(ByteString(bytes.to_vec())) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn pem_certificate(der: &[u8]) -> String {
    let body = base64(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// Writes `text` to a new file beside `path`, readable by its owner only, then renames it over
/// `path`: a reader never sees half a kubeconfig, and the token is never world-readable.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the output path names no file"))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    fn write_then_rename(tmp: &Path, path: &Path, text: &str) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(tmp, path)
    }
    let result = write_then_rename(&tmp, path, text);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Asks the API server, with the new kubeconfig, which of [`NEEDED`] it lacks and which of
/// [`NOT_NEEDED`] it has.
async fn check(path: &Path) -> Result<(Vec<Permission>, Vec<Permission>), MintError> {
    let fail = |reason: String| MintError::Check {
        path: path.display().to_string(),
        reason,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| fail(e.to_string()))?;
    let missing = lacking(&client, NEEDED).await.map_err(fail)?;
    let mut excess = Vec::new();
    for p in NOT_NEEDED {
        if allowed(&client, p).await.map_err(fail)? {
            excess.push(*p);
        }
    }
    Ok((missing, excess))
}

/// What of [`NEEDED`] a daemon run with `cfg` uses: the pod permissions only with
/// `release_at_attestation`, a ConfigMap's only where the config names it (under its default
/// name: another name is the operator's own Role).
pub fn needed_by(cfg: &crate::config::Config) -> Vec<Permission> {
    let names = |r: &Option<crate::config::ConfigMapRef>| {
        r.as_ref().map(|r| (r.namespace.clone(), r.name.clone()))
    };
    let configmaps = [names(&cfg.pause.configmap), names(&cfg.guard_record)];
    NEEDED
        .iter()
        .filter(|p| p.resource != "pods" || cfg.policy.release_at_attestation)
        .filter(|p| {
            p.resource != "configmaps"
                || configmaps.iter().flatten().any(|(ns, name)| {
                    Some(ns.as_str()) == p.namespace && Some(name.as_str()) == p.name
                })
        })
        .copied()
        .collect()
}

/// Which of `needed` the client's identity lacks, as the API server's authorizer says.
pub async fn lacking(
    client: &kube::Client,
    needed: &[Permission],
) -> Result<Vec<Permission>, String> {
    let mut missing = Vec::new();
    for p in needed {
        if !allowed(client, p).await? {
            missing.push(*p);
        }
    }
    Ok(missing)
}

/// One SelfSubjectAccessReview (every authenticated identity may create them).
pub async fn allowed(client: &kube::Client, p: &Permission) -> Result<bool, String> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(p.verb.into()),
                group: Some(p.group.into()),
                resource: Some(p.resource.into()),
                namespace: p.namespace.map(Into::into),
                name: p.name.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        api.create(&PostParams::default(), &review),
    )
    .await
    .map_err(|_| format!("access review for {p} timed out"))?
    .map_err(|e| format!("access review for {p}: {}", ApiError(&e)))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An API server that caps tokens (`--service-account-max-token-expiration`) issues less
    /// than was asked: the answer is compared with the request, a minute's slack aside.
    #[test]
    fn a_token_shorter_than_asked_is_told() {
        let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let year = std::time::Duration::from_secs(8760 * 3600);
        let hour = std::time::Duration::from_secs(3600);
        let plus = |d: std::time::Duration| at + jiff::SignedDuration::try_from(d).unwrap();
        assert_eq!(shortened(year, at, plus(hour)), Some((year, hour)));
        assert_eq!(shortened(year, at, plus(year)), None);
        assert_eq!(
            shortened(year, at, plus(year - std::time::Duration::from_secs(30))),
            None,
            "a round trip's seconds are no shortening"
        );
    }

    #[test]
    fn pem_wraps_base64_at_64_columns() {
        let der: Vec<u8> = (0..=255u8).collect();
        let pem = pem_certificate(&der);
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines.first(), Some(&"-----BEGIN CERTIFICATE-----"));
        assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
        let body = &lines[1..lines.len() - 1];
        assert!(body[..body.len() - 1].iter().all(|l| l.len() == 64));
        assert_eq!(body.concat(), base64(&der));
        assert_eq!(base64(b"oob"), "b29i");
    }

    #[test]
    fn private_file_is_replaced_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.kubeconfig");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn rendered_kubeconfig_parses_and_holds_only_the_token() {
        let mut admin = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        admin.root_cert = Some(vec![vec![1, 2, 3]]);
        admin.tls_server_name = Some("api.dc1".into());
        let text = render(
            &admin,
            "oobfence/oobfence",
            "tok\"en",
            jiff::Timestamp::UNIX_EPOCH,
        );
        let kc = Kubeconfig::from_yaml(&text).expect("valid kubeconfig YAML");
        assert_eq!(kc.current_context.as_deref(), Some("oobfence"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443/"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("api.dc1"));
        let ca = cluster.certificate_authority_data.as_deref().unwrap();
        assert_eq!(ca, base64(pem_certificate(&[1, 2, 3]).as_bytes()));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        let user_json = serde_json::to_value(user).unwrap();
        assert_eq!(user_json["token"], "tok\"en");
        assert!(user.client_certificate_data.is_none() && user.client_key_data.is_none());
    }
}
