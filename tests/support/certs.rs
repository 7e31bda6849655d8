//! Certificates with the validity period a test names (`openssl ca`, which can set both
//! dates; `openssl req -x509` and `openssl x509` cannot set a notBefore): a BMC's self-signed
//! one (`CA:TRUE`, as `openssl req -x509` makes them) that expired on a known day or is not
//! valid yet, and a leaf signed by a CA of the test's own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::OutputAside;

/// `openssl ca`'s configuration: no policy beyond a CN, the extensions of each kind.
const CA_CONFIG: &str = "[ca]
default_ca = test
[test]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = anything
unique_subject = no
[anything]
commonName = supplied
[bmc_self_signed]
basicConstraints = critical, CA:TRUE
subjectKeyIdentifier = hash
[ca_cert]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
authorityKeyIdentifier = keyid
";

/// Runs `openssl` with `args` in `dir`; its standard output. Panics, with openssl's own
/// words, when it fails.
pub fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output_aside()
        .unwrap_or_else(|e| panic!("cannot run openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A certificate for `stem` valid from `not_before` to `not_after` (`YYYYMMDDHHMMSSZ`), with
/// the extensions of `kind` (`bmc_self_signed`, `ca_cert` or `leaf`), signed by `issuer` (its
/// certificate and key) or by itself. Returns the certificate's and the key's paths in `dir`.
pub fn dated(
    dir: &Path,
    stem: &str,
    not_before: &str,
    not_after: &str,
    kind: &str,
    issuer: Option<(&Path, &Path)>,
) -> (PathBuf, PathBuf) {
    let work = dir.join(format!("{stem}-ca-work"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("ca.cnf"), CA_CONFIG).unwrap();
    std::fs::write(work.join("index.txt"), "").unwrap();
    std::fs::write(work.join("serial"), "01\n").unwrap();
    let cert = dir.join(format!("{stem}-cert.pem"));
    let key = dir.join(format!("{stem}-key.pem"));
    let s = |p: &Path| p.to_str().expect("UTF-8 temporary path").to_string();
    let subject = format!("/CN={stem}.bmc.example");
    openssl(
        &work,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            &s(&key),
            "-out",
            "req.csr",
        ],
    );
    let mut args: Vec<String> = [
        "ca", "-batch", "-notext", "-config", "ca.cnf", "-in", "req.csr", "-out",
    ]
    .map(String::from)
    .to_vec();
    args.push(s(&cert));
    args.extend(
        [
            "-startdate",
            not_before,
            "-enddate",
            not_after,
            "-extensions",
            kind,
        ]
        .map(String::from),
    );
    match issuer {
        None => args.extend(["-selfsign".to_string(), "-keyfile".into(), s(&key)]),
        Some((c, k)) => args.extend(["-cert".to_string(), s(c), "-keyfile".into(), s(k)]),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    openssl(&work, &args);
    (cert, key)
}

/// A BMC's own certificate, made as most BMCs make theirs (self-signed, `CA:TRUE`), valid
/// from 2024-03-01 to 2025-03-01 00:00:00 UTC: expired.
pub fn expired_bmc_cert(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    dated(
        dir,
        stem,
        "20240301000000Z",
        "20250301000000Z",
        "bmc_self_signed",
        None,
    )
}

/// A BMC's own certificate valid only from 2098-01-01 00:00:00 UTC (to 2099-01-01): a BMC
/// whose clock ran ahead when it made it.
pub fn future_bmc_cert(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    dated(
        dir,
        stem,
        "20980101000000Z",
        "20990101000000Z",
        "bmc_self_signed",
        None,
    )
}

/// A CA valid from 2020 to 2090, and a leaf for 127.0.0.1 it signed, valid from `not_before`
/// to `not_after`. Returns (CA certificate, leaf certificate, leaf key).
pub fn ca_and_leaf(
    dir: &Path,
    stem: &str,
    not_before: &str,
    not_after: &str,
) -> (PathBuf, PathBuf, PathBuf) {
    let (ca, ca_key) = dated(
        dir,
        &format!("{stem}-ca"),
        "20200101000000Z",
        "20900101000000Z",
        "ca_cert",
        None,
    );
    let (leaf, key) = dated(
        dir,
        stem,
        not_before,
        not_after,
        "leaf",
        Some((&ca, &ca_key)),
    );
    (ca, leaf, key)
}
