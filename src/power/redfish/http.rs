//! The HTTP side of the Redfish source: each `[[bmc]]` entry's client (its TLS settings, no
//! redirects, no proxies), what an entry's sources share, and one request read whole under a
//! size bound, its failures classified.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{StatusCode, Url};

use super::errors::{classify, error_chain, quote, truncate};
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
/// ending in `/`). A path that leaves the prefix is refused, naming it: behind a path-prefix
/// proxy (`https://proxy/bmc-07/`) it reaches another BMC, with this one's credentials. Every
/// path the BMC hands out (`Links.Sessions`, a collection's members, an action's target, a
/// session's `Location`) comes through here.
pub fn url_of(base: &Url, path: &str) -> Result<Url, PowerState> {
    let off_prefix = || {
        PowerState::error(
            ReadErrorKind::BadReply,
            format!(
                "the path \"{}\" leaves the BMC address's prefix {} ('..', spelled out or \
                 percent-encoded): not followed, so no credentials go beyond the prefix; the BMC \
                 (or the proxy in front of it) must name its paths below its own",
                // Whole, as far as a path goes: the operator must see where it led.
                truncate(path, 400).escape_debug(),
                base.path()
            ),
        )
    };
    if climbs(path) {
        return Err(off_prefix());
    }
    let url = base.join(path.trim_start_matches('/')).map_err(|e| {
        PowerState::error(
            ReadErrorKind::Config,
            format!("cannot join {} to the BMC address: {e}", quote(path)),
        )
    })?;
    let same_origin = url.scheme() == base.scheme()
        && url.host_str() == base.host_str()
        && url.port_or_known_default() == base.port_or_known_default();
    if !same_origin || !url.path().starts_with(base.path()) {
        return Err(off_prefix());
    }
    Ok(url)
}

/// Whether `path` has a `..` segment as written or once percent-decoded (`%2e%2e`, `..%2f`,
/// encoded again and again): a proxy decodes before it routes, so any of them may climb out.
pub fn climbs(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut text = std::borrow::Cow::Borrowed(path);
    // Each round peels one layer of encoding; a path still encoded after these is refused.
    for _ in 0..4 {
        if text.split(['/', '\\']).any(|segment| segment == "..") {
            return true;
        }
        let decoded = percent_encoding::percent_decode_str(&text)
            .decode_utf8_lossy()
            .into_owned();
        if decoded == text {
            return false;
        }
        text = std::borrow::Cow::Owned(decoded);
    }
    true
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_climbs_out_of_the_prefix_is_refused_however_spelled() {
        let base = Url::parse("https://proxy.example/bmc-07/").unwrap();
        for path in [
            "/redfish/v1/Systems/1",
            "/redfish/v1/Systems/1.2",
            "/redfish/v1/Systems/..1",
        ] {
            assert!(url_of(&base, path).is_ok(), "{path}");
        }
        for path in [
            "/redfish/../../bmc-08/redfish/v1",
            "/redfish/%2e%2e/%2E%2e/bmc-08/redfish/v1",
            "/redfish/..%2f..%2fbmc-08/redfish/v1",
            "/redfish/%252e%252e%252f%252e%252e%252fbmc-08/redfish/v1",
            "/redfish/..\\..\\bmc-08/redfish/v1",
            "/redfish/v1/..",
            "https://proxy.example/bmc-08/redfish/v1",
            "https://other.example/bmc-07/redfish/v1",
        ] {
            match url_of(&base, path) {
                Err(PowerState::Error { detail, .. }) => assert!(
                    detail.contains("leaves the BMC address's prefix /bmc-07/"),
                    "{path}: {detail}"
                ),
                other => panic!("{path}: {other:?}"),
            }
        }
    }
}
