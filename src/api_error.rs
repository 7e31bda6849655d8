//! What a failed API request means, in words an operator can act on.
//!
//! The client's own errors say `ServiceError: client error (Connect)` for nothing listening, a
//! certificate from another cluster and a name that does not resolve alike, and print a 401 as
//! a Rust struct. Here a connection failure is named by the API server's address and its cause
//! (refused, DNS, TLS and why, timeout), and an answer by its status and what to do about it.
//! The daemon's client (`cluster::connect`) wraps every failed connection in [`Unreachable`],
//! so every request of every caller carries the address; [`ApiError`] and [`WatchError`] are
//! the words every log line and message uses. It stands apart from `cluster` because `leader`
//! and `pause`, which `cluster` uses, speak these words too.

use std::error::Error as StdError;
use std::fmt;

use kube::runtime::watcher;
use rustls::CertificateError;

/// A request that never reached the API server: where it was going and why it did not get there.
#[derive(Debug)]
pub struct Unreachable {
    pub server: String,
    pub cause: Cause,
}

/// Why a connection to the API server failed, as far as its error chain tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    Refused,
    /// The host name did not resolve; the resolver's words.
    Dns(String),
    /// The TLS handshake failed; what about the certificate or the handshake.
    Tls(String),
    TimedOut,
    /// Any other transport failure: the error chain, joined.
    Other(String),
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = &self.server;
        match &self.cause {
            Cause::Refused => write!(
                f,
                "cannot reach the API server at {server}: connection refused (nothing listens \
                 there: is kube-apiserver running, and is the kubeconfig's `server` right?)"
            ),
            Cause::Dns(why) => write!(
                f,
                "cannot reach the API server at {server}: its host name does not resolve ({why}); \
                 check the kubeconfig's `server` and this host's DNS"
            ),
            Cause::Tls(why) => write!(
                f,
                "cannot reach the API server at {server}: TLS handshake failed: {why}"
            ),
            Cause::TimedOut => write!(
                f,
                "cannot reach the API server at {server}: no answer in time (a firewall dropping \
                 the packets, a wrong address, or an overloaded API server)"
            ),
            Cause::Other(chain) => write!(f, "cannot reach the API server at {server}: {chain}"),
        }
    }
}

impl StdError for Unreachable {}

/// Names the cause of a failed connection, from the transport's error chain; `None` when the
/// chain is not a connection failure (an exec credential plugin's error, say), which is then
/// passed on unchanged.
pub fn connection_cause(e: &(dyn StdError + 'static)) -> Option<Cause> {
    let mut texts = Vec::new();
    let mut tls = None;
    let mut io_kind = None;
    let mut next: Option<&(dyn StdError + 'static)> = Some(e);
    // Bounded: a chain is a handful of links; a cycle would be a bug elsewhere.
    for _ in 0..16 {
        let Some(err) = next else { break };
        texts.push(err.to_string());
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            tls = Some(tls_words(r));
        }
        // An io::Error's source() skips the error it wraps (which may be another io::Error
        // wrapping the TLS error): look inside directly.
        let mut io = err.downcast_ref::<std::io::Error>();
        for _ in 0..4 {
            let Some(e) = io else { break };
            io_kind.get_or_insert(e.kind());
            let Some(inner) = e.get_ref() else { break };
            if let Some(r) = inner.downcast_ref::<rustls::Error>() {
                tls = Some(tls_words(r));
            }
            texts.push(inner.to_string());
            io = inner.downcast_ref::<std::io::Error>();
        }
        next = err.source();
    }
    texts.dedup();
    let chain = texts.join(": ");
    if let Some(why) = tls {
        return Some(Cause::Tls(why));
    }
    match io_kind {
        Some(std::io::ErrorKind::ConnectionRefused) => return Some(Cause::Refused),
        Some(std::io::ErrorKind::TimedOut) => return Some(Cause::TimedOut),
        _ => {}
    }
    if texts.iter().any(|t| t == "dns error") {
        let why = texts
            .iter()
            .rev()
            .find(|t| *t != "dns error")
            .cloned()
            .unwrap_or_else(|| "no address".to_string());
        return Some(Cause::Dns(why));
    }
    if texts
        .iter()
        .any(|t| t.contains("timed out") || t.contains("deadline has elapsed"))
    {
        return Some(Cause::TimedOut);
    }
    if texts
        .iter()
        .any(|t| t.starts_with("client error (Connect)") || t.contains("tcp connect error"))
    {
        return Some(Cause::Other(chain));
    }
    None
}

/// The certificate problems an operator meets, in words that point at the fix.
fn tls_words(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => "its certificate is not signed by the kubeconfig's \
                 certificate-authority (a kubeconfig for another cluster, or a rotated cluster CA): \
                 set the cluster's certificate-authority in the kubeconfig to this cluster's CA \
                 (kubeadm: /etc/kubernetes/pki/ca.crt), or write the kubeconfig again with \
                 `oobfence make-kubeconfig --kubeconfig ADMIN-KUBECONFIG --output FILE` from an \
                 administrator's kubeconfig that reaches this cluster"
                .to_string(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "its certificate is not valid for the host name in the kubeconfig's `server` \
                 (use a name the certificate lists, or set tls-server-name in the kubeconfig)"
                    .to_string()
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "its certificate has expired".to_string()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "its certificate is not valid yet (is this host's clock right?)".to_string()
            }
            other => format!("its certificate was refused: {other:?}"),
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("{e} (does the address speak plain HTTP, or is it not an API server at all?)")
        }
        other => other.to_string(),
    }
}

/// A client error in an operator's words: see the module header.
pub struct ApiError<'a>(pub &'a kube::Error);

impl fmt::Display for ApiError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", ApiErrorAt(self.0, "(the kubeconfig's server)"))
    }
}

/// [`ApiError`] from a client that did not name its address in its errors (one made straight
/// from a kubeconfig, as `make-kubeconfig` makes it): a failed connection names `server`.
pub struct ApiErrorAt<'a>(pub &'a kube::Error, pub &'a str);

impl fmt::Display for ApiErrorAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            kube::Error::Api(s) => write!(f, "{}", StatusWords(s)),
            // The layer below already put the address and cause into the error.
            kube::Error::Service(inner) => match inner.downcast_ref::<Unreachable>() {
                Some(u) => write!(f, "{u}"),
                None => match connection_cause(inner.as_ref()) {
                    Some(cause) => write!(
                        f,
                        "{}",
                        Unreachable {
                            server: self.1.to_string(),
                            cause
                        }
                    ),
                    None => write!(f, "Kubernetes client: {inner}"),
                },
            },
            other => write!(f, "Kubernetes client: {other}"),
        }
    }
}

/// A watch's error in an operator's words.
pub struct WatchError<'a>(pub &'a watcher::Error);

impl fmt::Display for WatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            watcher::Error::InitialListFailed(e) => write!(f, "list failed: {}", ApiError(e)),
            watcher::Error::WatchStartFailed(e) => write!(f, "watch failed: {}", ApiError(e)),
            watcher::Error::WatchFailed(e) => write!(f, "watch broke: {}", ApiError(e)),
            watcher::Error::WatchError(s) => write!(f, "watch ended: {}", StatusWords(s)),
            other => write!(f, "{other}"),
        }
    }
}

/// Whether the API server refused a watch for want of permission (and so RBAC is to blame).
pub fn watch_forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(s) if s.code == 403),
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// An API server's answer: its code, and for the two an operator must act on, what to do.
struct StatusWords<'a>(&'a kube::core::Status);

impl fmt::Display for StatusWords<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let message = if s.message.is_empty() {
            s.reason.as_str()
        } else {
            s.message.as_str()
        };
        match s.code {
            401 => write!(
                f,
                "the API server refused oobfence's credentials (401 Unauthorized): the token \
                 expired or was revoked (its ServiceAccount or Secret deleted, or the signing key \
                 rotated). Mint a new one with `oobfence make-kubeconfig`, then \
                 `systemctl reload oobfence@DATACENTER` (a reload reads the kubeconfig again)"
            ),
            403 => write!(
                f,
                "the API server forbids it (403): {message}; grant what deploy/rbac.yaml grants \
                 (`oobfence check-config --probe` names every missing permission)"
            ),
            0 => write!(f, "the API server answered: {message}"),
            code => write!(f, "the API server answered {code} {}: {message}", s.reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.to_string(),
            message: message.to_string(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_401_says_the_token_expired_or_was_revoked_and_what_to_run() {
        let text = ApiError(&status(401, "Unauthorized", "Unauthorized")).to_string();
        assert!(text.contains("401 Unauthorized"), "{text}");
        assert!(text.contains("expired or was revoked"), "{text}");
        assert!(text.contains("oobfence make-kubeconfig"), "{text}");
        assert!(!text.contains("Status {"), "no Rust struct: {text}");
    }

    #[test]
    fn only_a_403_blames_permissions() {
        let forbidden = watcher::Error::InitialListFailed(status(403, "Forbidden", "no"));
        assert!(watch_forbidden(&forbidden));
        let unreachable =
            watcher::Error::InitialListFailed(kube::Error::Service(Box::new(Unreachable {
                server: "https://127.0.0.1:1".into(),
                cause: Cause::Refused,
            })));
        assert!(!watch_forbidden(&unreachable));
        let text = WatchError(&unreachable).to_string();
        assert!(
            text.contains("https://127.0.0.1:1") && text.contains("connection refused"),
            "{text}"
        );
    }

    #[test]
    fn an_io_error_wrapping_a_certificate_error_is_a_tls_cause() {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        match connection_cause(&e) {
            Some(Cause::Tls(why)) => assert!(why.contains("certificate-authority"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
