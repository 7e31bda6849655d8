//! Certificate pinning for BMCs.
//!
//! Most BMCs serve a self-signed certificate, often marked `CA:TRUE` (what `openssl req -x509`
//! makes) and naming no address the BMC is reached by. Given as `ca_file`, the usual chain check
//! refuses it (`CaUsedAsEndEntity`, a name mismatch), which left `tls_insecure` as the only way
//! out. A certificate the operator pinned — one of `ca_file`'s certificates, byte for byte, or
//! one whose SHA-256 is in `tls_fingerprint` — is accepted as the BMC's own instead, with its
//! self-signature checked (it is verified as its own trust anchor), and the handshake proves
//! the BMC holds its key. What the pin replaces is only what a self-signed BMC certificate
//! cannot pass: being a CA, naming the address, and (unless `tls_pin_validity = "enforce"`)
//! being within its validity period: a pin is an identity, not a validity claim ([`validity`]).
//!
//! A certificate that is not pinned goes through the usual check against `ca_file`'s
//! certificates as roots (and no other roots: a BMC is trusted by the operator's CA alone).
//!
//! Each certificate verified here has its notAfter in the
//! `oobfence_bmc_certificate_expiry_timestamp_seconds` gauge.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, Error, RootCertStore};
use sha2::{Digest, Sha256};

mod validity;
pub use validity::{
    CERTIFICATE_EXPIRY, CERTIFICATE_EXPIRY_HELP, CertificateLabels, PinValidity, TLS_TOO_OLD,
    tls_error_text, utc,
};
use validity::{Period, Standing, WarnedOnce, record_expiry};

/// A SHA-256 certificate fingerprint.
pub type Fingerprint = [u8; 32];

/// The fingerprint of a certificate (its DER encoding), as `openssl x509 -fingerprint -sha256`
/// prints it.
pub fn fingerprint(cert: &[u8]) -> Fingerprint {
    Sha256::digest(cert).into()
}

/// `sha256:AB:CD:…`, `AB:CD:…` or `abcd…` (64 hex digits): the forms operators copy from
/// `openssl x509 -fingerprint -sha256` and browser dialogs.
pub fn parse_fingerprint(text: &str) -> Result<Fingerprint, String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("sha256:")
        .or_else(|| t.strip_prefix("SHA256:"))
        .or_else(|| t.strip_prefix("sha256 Fingerprint="))
        .or_else(|| t.strip_prefix("SHA256 Fingerprint="))
        .unwrap_or(t);
    let digits: String = hex.chars().filter(|c| *c != ':').collect();
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not a SHA-256 fingerprint: expected 64 hex digits, colons allowed, as `openssl x509 -noout -fingerprint -sha256 -in CERT` prints them (\"sha256:AB:CD:…\")"
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

/// The certificates of a PEM bundle.
pub fn certificates_of_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

/// The handshake-signature half of a rustls `ServerCertVerifier`, checked with the algorithms
/// of the `CryptoProvider` in the field `$provider`: every verifier here checks signatures the
/// same way, whatever it decides about the certificate.
macro_rules! signatures_checked_by_provider {
    ($provider:tt) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &rustls::pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.$provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}
pub(crate) use signatures_checked_by_provider;

/// What to trust for one `[[bmc]]` entry.
#[derive(Debug)]
pub struct PinningVerifier {
    /// Chains to `ca_file`'s certificates; `None` without a `ca_file`.
    chain: Option<Arc<WebPkiServerVerifier>>,
    /// `ca_file`'s certificates, each also accepted as the BMC's own.
    pinned: Vec<CertificateDer<'static>>,
    fingerprints: Vec<Fingerprint>,
    /// What a pinned certificate outside its validity period gets.
    validity: PinValidity,
    /// The entry, as config errors name it (`bmc[0]`): for warnings and the expiry gauge.
    entry: String,
    warned: WarnedOnce,
    provider: Arc<CryptoProvider>,
}

impl PinningVerifier {
    /// The verifier of entry `entry` (`bmc[0]`).
    pub fn new(
        ca_certs: &[CertificateDer<'static>],
        fingerprints: &[Fingerprint],
        validity: PinValidity,
        entry: &str,
    ) -> Result<PinningVerifier, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain = if ca_certs.is_empty() {
            None
        } else {
            let mut roots = RootCertStore::empty();
            // A certificate that cannot be a trust anchor can still be pinned.
            let (_added, _ignored) = roots.add_parsable_certificates(ca_certs.iter().cloned());
            (!roots.is_empty())
                .then(|| {
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| format!("cannot use ca_file's certificates: {e}"))
                })
                .transpose()?
        };
        Ok(PinningVerifier {
            chain,
            pinned: ca_certs.to_vec(),
            fingerprints: fingerprints.to_vec(),
            validity,
            entry: entry.to_string(),
            warned: WarnedOnce::default(),
            provider,
        })
    }

    fn is_pinned(&self, cert: &CertificateDer<'_>) -> bool {
        self.pinned.iter().any(|p| p.as_ref() == cert.as_ref())
            || self.fingerprints.contains(&fingerprint(cert))
    }

    /// A pinned certificate, verified as its own trust anchor: its signature counts; being a
    /// CA and the names it carries do not, nor (with `tls_pin_validity = "warn"`) its validity
    /// period: outside it, the certificate is checked as at the nearest time within it, and a
    /// warning is logged once.
    fn verify_pinned(
        &self,
        cert: &CertificateDer<'_>,
        server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let host = server_name.to_str();
        // A certificate webpki reads but x509-cert cannot (DER quirks of some firmware) is
        // checked as before this existed: at `now`, its validity period included.
        let period = Period::of(cert)
            .inspect_err(|e| {
                tracing::debug!(entry = %self.entry, host = %host, "pinned certificate: {e}");
            })
            .ok();
        record_expiry(&self.entry, &host, "pinned", period);
        let mut at = now;
        if let Some((period, problem)) = period.and_then(|p| Some((p, p.problem(now)?))) {
            let fp = fingerprint(cert);
            match self.validity {
                PinValidity::Enforce => {
                    return Err(Error::General(format!(
                        "the pinned certificate sha256:{} {problem}, and tls_pin_validity = \
                         \"enforce\" refuses it: renew the BMC's certificate and pin the new \
                         one, or set tls_pin_validity = \"warn\" to read the BMC regardless",
                        colon_hex(&fp)
                    )));
                }
                PinValidity::Warn => {
                    if self.warned.first(&host, fp) {
                        tracing::warn!(
                            entry = %self.entry,
                            host = %host,
                            fingerprint = %format!("sha256:{}", colon_hex(&fp)),
                            "the pinned BMC certificate {problem}; read regardless, as it is \
                             pinned (tls_pin_validity = \"warn\"): renew it on the BMC and pin \
                             the new one"
                        );
                    }
                    at = period.nearest_time_within(now);
                }
            }
        }
        let mut roots = RootCertStore::empty();
        roots
            .add(cert.clone().into_owned())
            .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
        let own =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| Error::General(format!("pinned certificate: {e}")))?;
        match own.verify_server_cert(cert, &[], server_name, &[], at) {
            Ok(v) => Ok(v),
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. }
                | CertificateError::Other(_),
            )) => Ok(ServerCertVerified::assertion()),
            // A period with no time in it (notAfter before notBefore), judged above.
            Err(Error::InvalidCertificate(
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. },
            )) if self.validity == PinValidity::Warn
                && period.is_some_and(|p| p.standing(now) != Standing::Within) =>
            {
                Ok(ServerCertVerified::assertion())
            }
            Err(e) => Err(e),
        }
    }
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let chained = match &self.chain {
            Some(v) => {
                v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(Error::InvalidCertificate(CertificateError::UnknownIssuer)),
        };
        match chained {
            Ok(v) => {
                let host = server_name.to_str();
                let trust = if self.is_pinned(end_entity) {
                    "pinned"
                } else {
                    "ca"
                };
                record_expiry(&self.entry, &host, trust, Period::of(end_entity).ok());
                Ok(v)
            }
            Err(_) if self.is_pinned(end_entity) => {
                self.verify_pinned(end_entity, server_name, now)
            }
            Err(Error::InvalidCertificate(CertificateError::UnknownIssuer))
                if self.chain.is_none() =>
            {
                Err(Error::General(format!(
                    "certificate sha256:{} is not the one tls_fingerprint pins",
                    colon_hex(&fingerprint(end_entity))
                )))
            }
            Err(e) => Err(e),
        }
    }

    signatures_checked_by_provider!(provider);
}

/// `AB:CD:…`, as openssl prints a fingerprint.
pub fn colon_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A rustls client config that trusts what `verifier` trusts.
pub fn client_config(verifier: PinningVerifier) -> rustls::ClientConfig {
    let provider = verifier.provider.clone();
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the default provider supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BMC's own certificate as `openssl ca -selfsign` made it: CA:TRUE, CN
    /// rack1-10.bmc.example, valid from 2024-03-01 to 2025-03-01 00:00:00 UTC.
    const EXPIRED_BMC_CERT: &[u8] = include_bytes!("pinning/expired-bmc-cert.pem");

    #[test]
    fn an_expired_pin_is_accepted_with_its_expiry_in_the_gauge_unless_enforced() {
        let cert = certificates_of_pem(EXPIRED_BMC_CERT).unwrap().remove(0);
        let pin = fingerprint(&cert);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let now = UnixTime::now();
        let by_fingerprint =
            PinningVerifier::new(&[], &[pin], PinValidity::Warn, "bmc[unit-1]").unwrap();
        assert!(
            by_fingerprint
                .verify_server_cert(&cert, &[], &name, &[], now)
                .is_ok()
        );
        let by_file = PinningVerifier::new(
            std::slice::from_ref(&cert),
            &[],
            PinValidity::Warn,
            "bmc[unit-2]",
        )
        .unwrap();
        assert!(
            by_file
                .verify_server_cert(&cert, &[], &name, &[], now)
                .is_ok()
        );
        let value = |entry: &str| {
            CERTIFICATE_EXPIRY
                .get_or_create(&CertificateLabels {
                    entry: entry.into(),
                    host: "127.0.0.1".into(),
                    trust: "pinned",
                })
                .get()
        };
        // 2025-03-01 00:00:00 UTC.
        assert_eq!(value("bmc[unit-1]"), 1_740_787_200.0);
        assert_eq!(value("bmc[unit-2]"), 1_740_787_200.0);

        for enforcing in [
            PinningVerifier::new(&[], &[pin], PinValidity::Enforce, "bmc[unit-3]").unwrap(),
            PinningVerifier::new(
                std::slice::from_ref(&cert),
                &[],
                PinValidity::Enforce,
                "bmc[unit-3]",
            )
            .unwrap(),
        ] {
            let e = enforcing
                .verify_server_cert(&cert, &[], &name, &[], now)
                .unwrap_err();
            let text = tls_error_text(&e).unwrap();
            assert!(
                text.contains("expired on 2025-03-01 00:00:00 UTC (valid from 2024-03-01 00:00:00 UTC; it is now "),
                "{text}"
            );
            assert!(text.contains("tls_pin_validity = \"enforce\""), "{text}");
        }
        // Within its period (checked at a time then), it is accepted under either setting.
        let then = UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_720_000_000));
        let enforcing =
            PinningVerifier::new(&[], &[pin], PinValidity::Enforce, "bmc[unit-4]").unwrap();
        assert!(
            enforcing
                .verify_server_cert(&cert, &[], &name, &[], then)
                .is_ok()
        );
        // Not pinned: refused, expired or not.
        let other =
            PinningVerifier::new(&[], &[[0; 32]], PinValidity::Warn, "bmc[unit-5]").unwrap();
        let e = other
            .verify_server_cert(&cert, &[], &name, &[], then)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is not the one tls_fingerprint pins"),
            "{e}"
        );
    }

    #[test]
    fn fingerprints_parse_in_the_forms_operators_copy() {
        let hex = "AB".repeat(32);
        let colons = vec!["ab"; 32].join(":");
        for text in [
            format!("sha256:{colons}"),
            format!("SHA256 Fingerprint={}", colons.to_uppercase()),
            colons.clone(),
            hex.clone(),
        ] {
            assert_eq!(parse_fingerprint(&text), Ok([0xab; 32]), "{text}");
        }
        for bad in ["sha256:AB", "sha1:AB", &"zz".repeat(32), ""] {
            let e = parse_fingerprint(bad).unwrap_err();
            assert!(e.contains("64 hex digits"), "{bad}: {e}");
        }
        assert_eq!(colon_hex(&[0xab, 0x01]), "AB:01");
    }
}
