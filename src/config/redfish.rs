//! The rules of a Redfish `[[bmc]]` entry beyond address and TLS: how it logs in, and what its
//! address may carry. Plain string checks, so that the config refuses a bad entry at load
//! without knowing the Redfish source.

use std::fmt;

/// `auth = "basic" | "session" | "auto"`: how oobfence proves who it is to a Redfish service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedfishAuth {
    /// HTTP Basic on every request.
    Basic,
    /// A Redfish session: one login (`POST` to the service root's `Links.Sessions`), its
    /// `X-Auth-Token` on every read, kept and re-used, deleted when no longer needed.
    Session,
    /// HTTP Basic until the BMC answers a 401 that shows it refuses Basic (no
    /// `WWW-Authenticate: Basic`, or a message naming sessions); a session from then on.
    #[default]
    Auto,
}

impl RedfishAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            RedfishAuth::Basic => "basic",
            RedfishAuth::Session => "session",
            RedfishAuth::Auto => "auto",
        }
    }
}

impl fmt::Display for RedfishAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Redfish-only settings of a `[[bmc]]` entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedfishOptions {
    pub auth: RedfishAuth,
}

/// `auth`, checked.
pub fn check_auth(value: &str) -> Result<RedfishAuth, String> {
    match value {
        "basic" => Ok(RedfishAuth::Basic),
        "session" => Ok(RedfishAuth::Session),
        "auto" => Ok(RedfishAuth::Auto),
        other => Err(format!(
            "{other:?} is not a way to log in: use \"basic\" (HTTP Basic on every request), \
             \"session\" (a Redfish session, for BMCs with Basic turned off) or \"auto\" \
             (Basic, and a session once the BMC refuses Basic; the default)"
        )),
    }
}

/// The path part of a Redfish `address` (already a parsed `https` URL): a prefix put before
/// every path oobfence asks for, as some BMC proxies need (`https://proxy/bmc1/`). It must not
/// already be Redfish's own path, which oobfence adds itself.
pub fn check_address_path(path: &str) -> Result<(), String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed
        .to_ascii_lowercase()
        .split('/')
        .any(|s| s == "redfish")
    {
        return Err(format!(
            "has the path {path:?}: give the BMC's address without /redfish/v1 (oobfence \
             asks for /redfish/v1/... itself; a path here is a proxy's prefix put before it)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_takes_three_words_and_names_them_when_wrong() {
        assert_eq!(check_auth("basic"), Ok(RedfishAuth::Basic));
        assert_eq!(check_auth("session"), Ok(RedfishAuth::Session));
        assert_eq!(check_auth("auto"), Ok(RedfishAuth::Auto));
        for bad in ["Basic", "token", ""] {
            let e = check_auth(bad).unwrap_err();
            assert!(
                e.contains("\"basic\"") && e.contains("\"session\"") && e.contains("\"auto\""),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn an_address_path_is_a_prefix_never_redfish_itself() {
        for ok in ["/", "", "/bmc1/", "/dc1/rack4/node7", "/{node}/"] {
            assert_eq!(check_address_path(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/redfish/v1",
            "/redfish/v1/",
            "/bmc1/redfish",
            "/Redfish/v1/Systems",
        ] {
            let e = check_address_path(bad).unwrap_err();
            assert!(e.contains("without /redfish/v1"), "{bad}: {e}");
        }
    }
}
