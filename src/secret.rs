//! Secrets (BMC passwords) that can be used but never shown.

use std::fmt;
use std::path::{Path, PathBuf};

/// A password read from a file or a systemd credential.
///
/// `Debug` and `Display` print `<redacted>` so a secret cannot leak through logs, error
/// messages or `why` output by accident; [`Secret::expose`] is the one way to the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that sends it to a BMC.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Reads a password file: the whole file, minus one trailing newline (as `echo` writes it).
pub fn read_password_file(path: &Path) -> Result<Secret, String> {
    let raw = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read password file {}: {e}", path.display()))?;
    let value = raw
        .strip_suffix("\r\n")
        .or_else(|| raw.strip_suffix('\n'))
        .unwrap_or(&raw);
    if value.is_empty() {
        return Err(format!("password file {} is empty", path.display()));
    }
    Ok(Secret::new(value))
}

/// Where a systemd credential named `name` lives: `$CREDENTIALS_DIRECTORY/name`.
pub fn credential_path(name: &str) -> Result<PathBuf, String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("credential name {name:?} is not a plain file name"));
    }
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY").ok_or_else(|| {
        format!(
            "credential {name:?} requested but $CREDENTIALS_DIRECTORY is not set \
             (run under systemd with LoadCredential={name}:/path, or use password_file)"
        )
    })?;
    Ok(PathBuf::from(dir).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{s}"), "<redacted>");
        assert!(!format!("{:?}", Some(&s)).contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn password_file_loses_one_trailing_newline_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "pa ss\n").unwrap();
        assert_eq!(read_password_file(&p).unwrap().expose(), "pa ss");
        std::fs::write(&p, "\n").unwrap();
        assert!(read_password_file(&p).unwrap_err().contains("empty"));
        let missing = dir.path().join("nope");
        assert!(
            read_password_file(&missing)
                .unwrap_err()
                .contains("cannot read")
        );
    }

    #[test]
    fn credential_names_cannot_escape_the_directory() {
        assert!(credential_path("../etc/shadow").is_err());
        assert!(credential_path("").is_err());
    }
}
