//! Which of a fence agent's options are secrets: by name (fence-agents spells its credentials
//! `password`, `community`, `snmp_priv_passwd`, `secret_key`, `access_key`, `apikey`,
//! `token`, ...) or by the description its metadata gives (`hexadecimal_kg`: "Kg key").
//! An agent that echoes what it was given must never carry one into `why`, the journal,
//! Events or `/nodes`.

/// Words of an option name that make it a secret.
const SECRET_NAME_WORDS: [&str; 9] = [
    "password",
    "passwd",
    "passphrase",
    "community",
    "secret",
    "key",
    "token",
    "credential",
    "auth_pass",
];

/// Words of an option's description that make it a secret.
const SECRET_DESCRIPTION_WORDS: [&str; 7] = [
    "password",
    "passphrase",
    "secret",
    "community",
    "token",
    " key",
    "credential",
];

/// Whether an option named `name` is a secret by its name.
pub fn secret_by_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_NAME_WORDS.iter().any(|w| name.contains(w))
}

/// Whether an option's metadata description says it is a secret.
pub fn describes_secret(shortdesc: &str) -> bool {
    let text = shortdesc.to_ascii_lowercase();
    SECRET_DESCRIPTION_WORDS.iter().any(|w| text.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_agents_credentials_are_secret_by_name() {
        for name in [
            "password",
            "community",
            "snmp_priv_passwd",
            "snmp_auth_pass",
            "secret_key",
            "access_key",
            "apikey",
            "token",
            "ssh_credential",
        ] {
            assert!(secret_by_name(name), "{name}");
        }
        for name in [
            "ip",
            "ipport",
            "plug",
            "ssl_insecure",
            "region",
            "namespace",
        ] {
            assert!(!secret_by_name(name), "{name}");
        }
    }

    #[test]
    fn a_description_of_a_password_or_key_is_secret() {
        assert!(describes_secret(
            "Hexadecimal-encoded Kg key for IPMIv2 authentication"
        ));
        assert!(describes_secret("Login password or passphrase"));
        assert!(!describes_secret(
            "IP address or hostname of fencing device"
        ));
    }
}
