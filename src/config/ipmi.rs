//! The rules of an IPMI `[[bmc]]` entry: its address, user name, password length, cipher
//! suite and privilege. Plain string checks, so that the config can refuse a bad entry at load
//! without knowing the IPMI source; the source builds on the same rules.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::secret::Secret;

/// The RMCP+ port (IANA "asf-rmcp").
pub const DEFAULT_PORT: u16 = 623;

/// The one cipher suite this build speaks: RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128.
pub const CIPHER_SUITE: u8 = 3;

/// The most a user name may have: 16 bytes in RAKP message 1.
const MAX_USERNAME: usize = 16;

/// The most an IPMI 2.0 password may have.
const MAX_PASSWORD: usize = 20;

/// IPMI-only settings of a `[[bmc]]` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpmiOptions {
    pub cipher_suite: u8,
    pub privilege: Privilege,
}

impl Default for IpmiOptions {
    fn default() -> Self {
        IpmiOptions {
            cipher_suite: CIPHER_SUITE,
            privilege: Privilege::Administrator,
        }
    }
}

/// The role an account logs in with (requested maximum privilege level in RAKP message 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privilege {
    User,
    Operator,
    Administrator,
}

impl Privilege {
    pub fn as_str(self) -> &'static str {
        match self {
            Privilege::User => "user",
            Privilege::Operator => "operator",
            Privilege::Administrator => "administrator",
        }
    }
}

/// Validates the `cipher_suite` key: only suite 3 can be spoken by this build.
pub fn check_cipher_suite(suite: u8) -> Result<u8, String> {
    match suite {
        CIPHER_SUITE => Ok(suite),
        0..=2 => Err(format!(
            "cipher suite {suite} has no {}: refused; use 3",
            if suite == 2 {
                "encryption"
            } else {
                "integrity protection"
            }
        )),
        4..=19 => Err(format!(
            "cipher suite {suite} is not supported by this build (its IPMI library, ipmi-rs 0.6, \
             speaks only suite 3: RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128); enable suite 3 \
             on the BMC, or use protocol = \"redfish\""
        )),
        _ => Err(format!(
            "{suite} is not an IPMI cipher suite (0 to 19); use 3"
        )),
    }
}

/// Validates the `privilege` key. Only "administrator" can work with this build.
pub fn check_privilege(s: &str) -> Result<Privilege, String> {
    let p = match s {
        "administrator" => return Ok(Privilege::Administrator),
        "operator" => Privilege::Operator,
        "user" => Privilege::User,
        other => {
            return Err(format!(
                "{other:?} is not a privilege: use \"administrator\" (\"operator\" and \"user\" \
                 are not supported by this build)"
            ));
        }
    };
    Err(format!(
        "privilege = \"{}\" is not supported by this build: its IPMI library (ipmi-rs 0.6) \
         always asks for the Administrator role when logging in, which the BMC refuses to a \
         {} account; use an account with the Administrator role (oobfence only reads: its \
         sessions stay at the User level, and it never sends a power command), or use protocol \
         = \"redfish\"",
        p.as_str(),
        p.as_str()
    ))
}

/// Validates an IPMI user name: at most 16 printable ASCII characters. (The library silently
/// shortens longer names, and logs in with an empty name — anonymously — when it meets a
/// non-ASCII character.)
pub fn check_username(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_USERNAME || !name.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return Err(format!(
            "{name:?} is not an IPMI user name: at most {MAX_USERNAME} printable ASCII characters"
        ));
    }
    Ok(())
}

/// Validates an IPMI 2.0 password's length (at most 20 bytes); never shows it.
pub fn check_password(password: &Secret) -> Result<(), String> {
    let n = password.expose().len();
    if n > MAX_PASSWORD {
        return Err(format!(
            "the password has {n} bytes; IPMI 2.0 passwords have at most {MAX_PASSWORD}"
        ));
    }
    Ok(())
}

/// Parses an IPMI address: `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
/// The port defaults to 623.
pub fn parse_address(address: &str) -> Result<(String, u16), String> {
    let example = "examples: \"{node}-ipmi.dc1.example\", \"10.0.0.5:623\", \"[fd00::5]\"";
    let s = address.trim();
    if s.is_empty() {
        return Err(format!("is empty; {example}"));
    }
    if s.contains('@') {
        // Never echo it: the part before '@' may be a password.
        return Err("must not contain credentials; use username and password_file".into());
    }
    if s.contains("://") {
        return Err(format!(
            "{s:?} must be host or host:port, without a scheme; {example}"
        ));
    }
    let port = |p: &str| -> Result<u16, String> {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("{s:?} has a bad port {p:?} (1 to 65535)")),
            Ok(n) => Ok(n),
        }
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else {
            return Err(format!("{s:?} has an unclosed '['"));
        };
        if h.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{s:?}: {h:?} is not an IPv6 address"));
        }
        match after {
            "" => (h.to_string(), DEFAULT_PORT),
            p if p.starts_with(':') => (h.to_string(), port(&p[1..])?),
            _ => return Err(format!("{s:?} must be [IPv6] or [IPv6]:port")),
        }
    } else if s.parse::<Ipv6Addr>().is_ok() {
        (s.to_string(), DEFAULT_PORT)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), port(p)?),
            None => (s.to_string(), DEFAULT_PORT),
        }
    };
    if host.parse::<Ipv6Addr>().is_err() && host.parse::<Ipv4Addr>().is_err() {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        let name = host.strip_suffix('.').unwrap_or(&host);
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(format!(
                "{s:?} must be host or host:port (a DNS name or an IP address); {example}"
            ));
        }
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let ok = [
            ("bmc.example", ("bmc.example", 623)),
            ("n1-ipmi.dc1.example:6230", ("n1-ipmi.dc1.example", 6230)),
            ("10.0.0.5", ("10.0.0.5", 623)),
            ("127.0.0.1:9623", ("127.0.0.1", 9623)),
            ("[fd00::5]:700", ("fd00::5", 700)),
            ("[fd00::5]", ("fd00::5", 623)),
            ("fd00::5", ("fd00::5", 623)),
            ("bmc.example.", ("bmc.example.", 623)),
        ];
        for (input, (host, port)) in ok {
            assert_eq!(
                parse_address(input),
                Ok((host.to_string(), port)),
                "{input}"
            );
        }
        let bad = [
            ("", "empty"),
            ("ipmi://bmc", "without a scheme"),
            ("https://bmc", "without a scheme"),
            ("bmc:0", "bad port"),
            ("bmc:70000", "bad port"),
            ("bmc:", "bad port"),
            ("bmc/x", "host or host:port"),
            ("bm c", "host or host:port"),
            ("a..b", "host or host:port"),
            ("[fd00::5", "unclosed"),
            ("[bmc]:1", "not an IPv6"),
            ("[fd00::5]x", "[IPv6]:port"),
        ];
        for (input, want) in bad {
            let e = parse_address(input).unwrap_err();
            assert!(e.contains(want), "{input}: {e}");
        }
        let e = parse_address("admin:hunter2@bmc").unwrap_err();
        assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn suites_and_privileges() {
        assert_eq!(check_cipher_suite(3), Ok(3));
        let e = check_cipher_suite(17).unwrap_err();
        assert!(
            e.starts_with("cipher suite 17 is not supported by this build"),
            "{e}"
        );
        assert!(check_cipher_suite(0).unwrap_err().contains("refused"));
        assert!(check_cipher_suite(2).unwrap_err().contains("encryption"));
        assert!(
            check_cipher_suite(20)
                .unwrap_err()
                .contains("not an IPMI cipher suite")
        );
        assert_eq!(
            check_privilege("administrator"),
            Ok(Privilege::Administrator)
        );
        let e = check_privilege("operator").unwrap_err();
        assert!(e.contains("not supported by this build"), "{e}");
        assert!(
            check_privilege("Admin")
                .unwrap_err()
                .contains("not a privilege")
        );
    }

    #[test]
    fn user_names_and_password_lengths() {
        assert!(check_username("admin").is_ok());
        assert!(check_username(&"a".repeat(16)).is_ok());
        assert!(check_username(&"a".repeat(17)).is_err());
        assert!(check_username("admïn").is_err());
        assert!(check_username("ad\0min").is_err());
        assert!(check_password(&Secret::new("x".repeat(20))).is_ok());
        let e = check_password(&Secret::new("y".repeat(21))).unwrap_err();
        assert!(e.contains("21 bytes") && !e.contains("yyy"), "{e}");
    }
}
