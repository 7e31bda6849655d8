//! The rules of an IPMI `[[bmc]]` entry: its address, user name, password length, cipher
//! suite and privilege. Plain string checks, so that the config can refuse a bad entry at load
//! without knowing the IPMI source; the source builds on the same rules.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::secret::Secret;

/// The RMCP+ port (IANA "asf-rmcp").
pub const DEFAULT_PORT: u16 = 623;

/// The cipher suite used unless the entry says otherwise: 17 (RAKP-HMAC-SHA256,
/// HMAC-SHA256-128, AES-CBC-128), what OpenBMC enables by default and hardening guides require.
pub const DEFAULT_CIPHER_SUITE: u8 = 17;

/// The suites this build speaks.
const SPOKEN: [u8; 2] = [17, 3];

/// The most a user name may have: 16 bytes in RAKP message 1.
const MAX_USERNAME: usize = 16;

/// The most an IPMI 2.0 password may have.
const MAX_PASSWORD: usize = 20;

/// IPMI-only settings of a `[[bmc]]` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpmiOptions {
    pub cipher_suites: CipherSuites,
    pub privilege: Privilege,
}

impl Default for IpmiOptions {
    fn default() -> Self {
        IpmiOptions {
            cipher_suites: CipherSuites {
                first: DEFAULT_CIPHER_SUITE,
                then: None,
            },
            privilege: Privilege::User,
        }
    }
}

/// The cipher suite to log in with, or two in order (`cipher_suite = [17, 3]`): the second is
/// tried only when the BMC refuses the first suite itself, never silently otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CipherSuites {
    pub first: u8,
    pub then: Option<u8>,
}

impl CipherSuites {
    pub fn in_order(self) -> impl Iterator<Item = u8> {
        std::iter::once(self.first).chain(self.then)
    }
}

impl std::fmt::Display for CipherSuites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.then {
            None => write!(f, "{}", self.first),
            Some(then) => write!(f, "{}, then {then}", self.first),
        }
    }
}

/// The `cipher_suite` key: one suite, or a list of two tried in order.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(
    untagged,
    expecting = "must be a cipher suite number such as 17 or 3 (unquoted), or a list of two tried in order such as [17, 3]"
)]
pub enum CipherSuiteSetting {
    One(i64),
    InOrder(Vec<i64>),
}

/// The role an account logs in with (RAKP message 1's requested maximum privilege, then Set
/// Session Privilege Level).
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

    /// The IPMI privilege level number.
    pub fn level(self) -> u8 {
        match self {
            Privilege::User => 2,
            Privilege::Operator => 3,
            Privilege::Administrator => 4,
        }
    }
}

/// Validates one suite number.
fn check_one_suite(suite: i64) -> Result<u8, String> {
    match u8::try_from(suite) {
        Ok(s) if SPOKEN.contains(&s) => Ok(s),
        Ok(s @ 0..=2) => Err(format!(
            "cipher suite {s} has no {}: refused; use 17 (or 3)",
            if s == 2 {
                "encryption"
            } else {
                "integrity protection"
            }
        )),
        Ok(s @ 4..=19) => Err(format!(
            "cipher suite {s} is not spoken by oobfence: use 17 (RAKP-HMAC-SHA256, \
             HMAC-SHA256-128, AES-CBC-128) or 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"
        )),
        _ => Err(format!(
            "{suite} is not an IPMI cipher suite (0 to 19); use 17 (or 3)"
        )),
    }
}

/// Validates the `cipher_suite` key.
pub fn check_cipher_suites(setting: &CipherSuiteSetting) -> Result<CipherSuites, String> {
    match setting {
        CipherSuiteSetting::One(s) => Ok(CipherSuites {
            first: check_one_suite(*s)?,
            then: None,
        }),
        CipherSuiteSetting::InOrder(list) => match list.as_slice() {
            [only] => Ok(CipherSuites {
                first: check_one_suite(*only)?,
                then: None,
            }),
            [a, b] if a != b => Ok(CipherSuites {
                first: check_one_suite(*a)?,
                then: Some(check_one_suite(*b)?),
            }),
            _ => Err(format!(
                "{list:?} is not a list of suites to try in order: give one suite (17) or two \
                 different ones ([17, 3])"
            )),
        },
    }
}

/// Validates the `privilege` key.
pub fn check_privilege(s: &str) -> Result<Privilege, String> {
    match s {
        "user" => Ok(Privilege::User),
        "operator" => Ok(Privilege::Operator),
        "administrator" => Ok(Privilege::Administrator),
        other => Err(format!(
            "{other:?} is not a privilege: use \"user\" (enough to read the power state), \
             \"operator\" or \"administrator\""
        )),
    }
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
        use CipherSuiteSetting::{InOrder, One};
        let only = |s| CipherSuites {
            first: s,
            then: None,
        };
        assert_eq!(check_cipher_suites(&One(17)), Ok(only(17)));
        assert_eq!(check_cipher_suites(&One(3)), Ok(only(3)));
        assert_eq!(check_cipher_suites(&InOrder(vec![3])), Ok(only(3)));
        assert_eq!(
            check_cipher_suites(&InOrder(vec![17, 3])).map(|s| s.to_string()),
            Ok("17, then 3".to_string())
        );
        assert!(
            check_cipher_suites(&One(0))
                .unwrap_err()
                .contains("refused")
        );
        assert!(
            check_cipher_suites(&One(2))
                .unwrap_err()
                .contains("encryption")
        );
        assert!(
            check_cipher_suites(&One(8))
                .unwrap_err()
                .contains("not spoken")
        );
        assert!(
            check_cipher_suites(&One(20))
                .unwrap_err()
                .contains("not an IPMI cipher suite")
        );
        assert!(check_cipher_suites(&One(-1)).is_err());
        assert!(check_cipher_suites(&InOrder(vec![])).is_err());
        assert!(check_cipher_suites(&InOrder(vec![3, 3])).is_err());
        for (s, p) in [
            ("user", Privilege::User),
            ("operator", Privilege::Operator),
            ("administrator", Privilege::Administrator),
        ] {
            assert_eq!(check_privilege(s), Ok(p));
            assert_eq!(p.as_str(), s);
        }
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
