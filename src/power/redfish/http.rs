//! The HTTP side of the Redfish source: each `[[bmc]]` entry's client (its TLS settings, no
//! redirects, no proxies), what an entry's sources share, and one request read whole under a
//! size bound, its failures classified.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{StatusCode, Url};

use super::errors::{classify, error_chain, quote};
use super::{MAX_BODY, session};
use crate::config::{BmcEntry, BmcTls};
use crate::pinning;
use crate::power::{PowerState, ReadErrorKind};

/// The HTTP client of a `[[bmc]]` entry: its TLS settings and timeout.
pub fn client_for(entry: &BmcEntry) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(entry.timeout)
        .connect_timeout(entry.timeout)
        // A redirect is never followed: a BMC that redirects the system resource is
        // misconfigured for us, and some put credentials into the Location header.
        .redirect(reqwest::redirect::Policy::none())
        // BMC networks are reached directly; credentials must not go through a proxy
        // picked up from the environment.
        .no_proxy()
        .https_only(true)
        .pool_idle_timeout(Duration::from_secs(30))
        .user_agent(concat!("oobfence/", env!("CARGO_PKG_VERSION")));
    match &entry.tls {
        BmcTls::Insecure => builder = builder.tls_danger_accept_invalid_certs(true),
        BmcTls::Pinned {
            ca_certs,
            fingerprints,
            validity,
            ..
        } => {
            let entry_name = format!("bmc[{}]", entry.index);
            let verifier =
                pinning::PinningVerifier::new(ca_certs, fingerprints, *validity, &entry_name)?;
            builder = builder.tls_backend_preconfigured(pinning::client_config(verifier));
        }
        BmcTls::System => {}
    }
    builder
        .build()
        .map_err(|e| format!("cannot build the HTTPS client: {}", error_chain(&e)))
}

/// What the sources of one `[[bmc]]` entry share: its HTTP client and its BMCs' logins.
pub struct EntryShared {
    pub client: reqwest::Client,
    pub logins: session::Slots,
}

impl EntryShared {
    pub fn new(entry: &BmcEntry) -> Result<EntryShared, String> {
        Ok(EntryShared {
            client: client_for(entry)?,
            logins: Default::default(),
        })
    }
}

/// An answer read whole: its status, headers and body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// `path` (a path on the BMC, `/redfish/v1/...`) below `base` (the address and its prefix,
/// ending in `/`).
pub fn url_of(base: &Url, path: &str) -> Result<Url, PowerState> {
    base.join(path.trim_start_matches('/')).map_err(|e| {
        PowerState::error(
            ReadErrorKind::Config,
            format!("cannot join {} to the BMC address: {e}", quote(path)),
        )
    })
}

/// Sends `request` (`method` of `path`, for messages) and reads the whole answer, at most
/// [`MAX_BODY`] bytes of it.
pub async fn fetch(
    request: reqwest::RequestBuilder,
    method: &str,
    path: &str,
) -> Result<Answer, PowerState> {
    let named = |state: PowerState| match state {
        PowerState::Error { kind, detail } if method != "GET" => PowerState::Error {
            kind,
            detail: match detail.strip_prefix("GET ") {
                Some(rest) => format!("{method} {rest}"),
                None => detail,
            },
        },
        other => other,
    };
    let mut response = request.send().await.map_err(|e| named(classify(e, path)))?;
    let status = response.status();
    let headers = std::mem::take(response.headers_mut());
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(PowerState::error(
                        ReadErrorKind::BadReply,
                        format!("reply to {method} {path} is larger than {MAX_BODY} bytes"),
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => {
                return Ok(Answer {
                    status,
                    headers,
                    body,
                });
            }
            Err(e) => return Err(named(classify(e, path))),
        }
    }
}
