//! The bearer token oobfence's requests carry, replaceable while the daemon runs.
//!
//! A kubeconfig minted by `oobfence make-kubeconfig` holds its token inline. kube builds its
//! auth layer once, from the token it was given: a kubeconfig replaced under the daemon would
//! change nothing until a restart, and the daemon would go blind when the old token expires
//! or is revoked. So the inline token is taken out of kube's config and carried by this layer
//! instead, for the one client every watch and write shares; a reload (SIGHUP) reads the
//! kubeconfig again and puts its token in (after the API server has accepted it), and every
//! request from then on — fresh reads, writes, the watches' next requests — carries the new
//! one. A kubeconfig whose user names a `tokenFile` needs none of this: kube reads that file
//! again within a minute of it changing. Client certificates and exec plugins are left to kube
//! and take a restart to change.

use super::ApiError;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::HeaderValue;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use secrecy::{ExposeSecret as _, SecretString};

/// The check of a new token before it replaces the one in use may take this long.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The token in use, shared by the client's layer and the daemon (cheap to clone).
#[derive(Clone, Default)]
pub struct Credentials(Arc<RwLock<Option<InUse>>>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(..)")
    }
}

/// What the requests go to and carry; the header is marked sensitive.
struct InUse {
    header: HeaderValue,
    expiry: Option<Timestamp>,
    server: Server,
}

/// What only a restart changes: where the requests go and what they trust.
#[derive(Clone, PartialEq)]
struct Server {
    url: String,
    root_cert: Option<Vec<Vec<u8>>>,
    tls_server_name: Option<String>,
    accept_invalid_certs: bool,
    proxy_url: Option<String>,
}

impl Server {
    fn of(config: &kube::Config) -> Server {
        Server {
            url: config.cluster_url.to_string(),
            root_cert: config.root_cert.clone(),
            tls_server_name: config.tls_server_name.clone(),
            accept_invalid_certs: config.accept_invalid_certs,
            proxy_url: config.proxy_url.as_ref().map(ToString::to_string),
        }
    }
}

/// A new token, checked, ready to take over ([`Credentials::replace`]).
pub struct Replacement {
    in_use: InUse,
}

impl Replacement {
    /// When the new token expires (its JWT `exp`), if it says.
    pub fn expiry(&self) -> Option<Timestamp> {
        self.in_use.expiry
    }
}

fn bearer(token: &SecretString) -> Result<HeaderValue, String> {
    let mut h = HeaderValue::try_from(format!("Bearer {}", token.expose_secret().trim()))
        .map_err(|_| "the kubeconfig's token is not a valid HTTP header value".to_string())?;
    h.set_sensitive(true);
    Ok(h)
}

fn expiry_of(token: &SecretString) -> Option<Timestamp> {
    crate::config::checks::token_expiry(token.expose_secret().trim())
}

impl Credentials {
    /// Takes the inline token out of `config`, to be carried by [`Credentials::apply`]; a
    /// config without one (a token file, client certificates, exec, none) is left to kube and
    /// the credentials stay empty.
    pub fn take_from(config: &mut kube::Config) -> Result<Credentials, String> {
        let creds = Credentials::default();
        if let Some(token) = config.auth_info.token.take() {
            let in_use = InUse {
                header: bearer(&token)?,
                expiry: expiry_of(&token),
                server: Server::of(config),
            };
            *creds.0.write().map_err(|_| "credentials lock poisoned")? = Some(in_use);
        }
        Ok(creds)
    }

    /// Whether the requests carry a token of this layer's (an inline kubeconfig token).
    pub fn carries_token(&self) -> bool {
        self.0.read().is_ok_and(|c| c.is_some())
    }

    /// When the token in use expires (its JWT `exp`); `None` without an inline token.
    pub fn token_expiry(&self) -> Option<Timestamp> {
        self.0.read().ok()?.as_ref()?.expiry
    }

    /// Puts the token in use on a request (none when the kubeconfig has no inline token).
    pub fn apply(
        &self,
        mut req: http::Request<kube::client::Body>,
    ) -> http::Request<kube::client::Body> {
        if let Ok(c) = self.0.read()
            && let Some(c) = c.as_ref()
        {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, c.header.clone());
        }
        req
    }

    /// Compares a freshly loaded kubeconfig (`new`) with what is in use: `Ok(None)` when the
    /// token is the same (or is not this layer's), a [`Replacement`] when the API server
    /// accepted its new token, an error (one line, nothing changed) when it names another
    /// server, changes the kind of user, or its token is refused.
    pub async fn replacement(&self, new: kube::Config) -> Result<Option<Replacement>, String> {
        let (running_server, running_header) = match self.0.read() {
            Ok(c) => match c.as_ref() {
                Some(c) => (Some(c.server.clone()), Some(c.header.clone())),
                None => (None, None),
            },
            Err(_) => return Err("credentials lock poisoned".into()),
        };
        let Some(running_server) = running_server else {
            if new.auth_info.token.is_some() {
                return Err("the kubeconfig now holds a token inline where it had none: only a restart applies it".into());
            }
            return Ok(None);
        };
        let Some(token) = new.auth_info.token.clone() else {
            return Err("the kubeconfig's user no longer holds a token inline (a token file, a certificate, exec?): only a restart applies it".into());
        };
        if Server::of(&new) != running_server {
            return Err(format!(
                "the kubeconfig now names another API server or CA ({}): only a restart applies it",
                new.cluster_url
            ));
        }
        let header = bearer(&token)?;
        if running_header.as_ref().map(HeaderValue::as_bytes) == Some(header.as_bytes()) {
            return Ok(None);
        }
        // The new token must work before the old one is let go: a token pasted wrong, expired
        // or of an account without the daemon's rights is refused here, not at the next fence.
        let client = kube::Client::try_from(new.clone())
            .map_err(|e| format!("the kubeconfig's new token cannot be used: {e}"))?;
        let nodes: Api<Node> = Api::all(client);
        match tokio::time::timeout(
            CHECK_TIMEOUT,
            nodes.list_metadata(&ListParams::default().limit(1)),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(kube::Error::Api(s))) => {
                return Err(format!(
                    "the API server refuses the kubeconfig's new token ({} {}): the daemon keeps the one it had",
                    s.code, s.reason
                ));
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "the kubeconfig's new token could not be checked ({}): the daemon keeps the one it had",
                    ApiError(&e)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "checking the kubeconfig's new token took longer than {CHECK_TIMEOUT:?}: the daemon keeps the one it had"
                ));
            }
        }
        let in_use = InUse {
            header,
            expiry: expiry_of(&token),
            server: Server::of(&new),
        };
        Ok(Some(Replacement { in_use }))
    }

    /// From now on every request carries the replacement's token.
    pub fn replace(&self, r: Replacement) {
        if let Ok(mut c) = self.0.write() {
            *c = Some(r.in_use);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(server: &str, token: Option<&str>) -> kube::Config {
        let mut c = kube::Config::new(server.parse().unwrap());
        c.auth_info.token = token.map(|t| SecretString::from(t.to_string()));
        c
    }

    fn header(c: &Credentials) -> Option<String> {
        let req = http::Request::new(kube::client::Body::empty());
        c.apply(req)
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|h| h.to_str().unwrap().to_string())
    }

    #[tokio::test]
    async fn only_the_token_may_change_without_a_restart() {
        let mut running = config("https://127.0.0.1:6443", Some("old"));
        let c = Credentials::take_from(&mut running).unwrap();
        assert_eq!(
            running.auth_info.token.as_ref().map(|_| ()),
            None,
            "kube carries none"
        );
        assert!(c.carries_token());
        assert_eq!(header(&c).as_deref(), Some("Bearer old"));
        assert!(!format!("{c:?}").contains("old"), "no token in Debug");

        // The same token: nothing to do, and no call made (the address is not listening).
        let same = c
            .replacement(config("https://127.0.0.1:6443", Some("old")))
            .await;
        assert!(matches!(same, Ok(None)));
        let e = c
            .replacement(config("https://10.0.0.9:6443", Some("new")))
            .await
            .err()
            .unwrap();
        assert!(e.contains("another API server"), "{e}");
        let e = c
            .replacement(config("https://127.0.0.1:6443", None))
            .await
            .err()
            .unwrap();
        assert!(e.contains("no longer holds a token inline"), "{e}");
        assert_eq!(header(&c).as_deref(), Some("Bearer old"), "unchanged");

        // No inline token at start (a token file, certificates): left to kube.
        let mut other = config("https://127.0.0.1:6443", None);
        let c = Credentials::take_from(&mut other).unwrap();
        assert!(!c.carries_token());
        assert_eq!(header(&c), None);
        assert!(matches!(
            c.replacement(config("https://127.0.0.1:6443", None)).await,
            Ok(None)
        ));
        let e = c
            .replacement(config("https://127.0.0.1:6443", Some("new")))
            .await
            .err()
            .unwrap();
        assert!(e.contains("only a restart"), "{e}");
    }
}
