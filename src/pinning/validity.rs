//! A BMC certificate's validity period: read from the certificate (RustCrypto's `x509-cert`),
//! judged against the clock for a pinned certificate as `tls_pin_validity` says, written as
//! dates in errors and warnings (never Unix seconds), and served as the
//! `oobfence_bmc_certificate_expiry_timestamp_seconds` gauge.
//!
//! A pin is an identity, not a validity claim: the operator named these exact certificate
//! bytes, and the handshake proves the BMC holds their key. A BMC certificate expires unnoticed
//! for years (firmware makes one at the factory or first boot, for one to ten years), and its
//! expiry says nothing about whether the machine is off. So by default (`"warn"`) a pinned
//! certificate outside its validity period is still accepted, with a warning logged once per
//! entry and certificate, and the gauge and its alert tell the operator to renew it.
//! `"enforce"` refuses it instead. A certificate that is not pinned, trusted through a CA, is
//! always refused outside its validity period.

use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rustls::pki_types::UnixTime;
use rustls::{AlertDescription, CertificateError, Error, PeerIncompatible};
use serde::Deserialize;

/// What a pinned certificate outside its validity period gets: `tls_pin_validity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinValidity {
    /// Accepted (the pin is the identity), with a warning and the expiry gauge.
    #[default]
    Warn,
    /// Refused, as an unpinned certificate would be.
    Enforce,
}

/// The labels of the expiry gauge: one series per BMC (not per node).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// The `[[bmc]]` entry, as config errors name it (`bmc[0]`).
    pub entry: String,
    /// The BMC's host, as the TLS handshake named it.
    pub host: String,
    /// `pinned` (tls_fingerprint, or ca_file's certificate itself) or `ca` (chained to a
    /// ca_file certificate).
    pub trust: &'static str,
}

/// `oobfence_bmc_certificate_expiry_timestamp_seconds`: each verified BMC certificate's
/// notAfter, set at each TLS handshake with an entry that has `ca_file` or `tls_fingerprint`.
/// Registered by the metrics catalogue.
pub static CERTIFICATE_EXPIRY: LazyLock<Family<CertificateLabels, Gauge<f64, AtomicU64>>> =
    LazyLock::new(Default::default);

/// The expiry gauge's HELP text.
pub const CERTIFICATE_EXPIRY_HELP: &str = "notAfter of the TLS certificate each BMC served at its last handshake, Unix seconds, for entries with ca_file or tls_fingerprint; by entry, host and trust (pinned: the certificate itself is pinned, and is still read after this time unless tls_pin_validity = \"enforce\"; ca: chained to a ca_file certificate, refused after this time, so that the BMC cannot be read and its node cannot be fenced)";

/// A certificate's validity period, Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    pub not_before: u64,
    pub not_after: u64,
}

/// Where `now` stands against a period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Within,
    Expired,
    NotYetValid,
}

impl Period {
    /// The validity period of a DER certificate.
    pub fn of(der: &[u8]) -> Result<Period, String> {
        use x509_cert::der::Decode;
        let cert = x509_cert::Certificate::from_der(der)
            .map_err(|e| format!("the certificate cannot be parsed as X.509: {e}"))?;
        let v = &cert.tbs_certificate.validity;
        Ok(Period {
            not_before: v.not_before.to_unix_duration().as_secs(),
            not_after: v.not_after.to_unix_duration().as_secs(),
        })
    }

    pub fn standing(&self, now: UnixTime) -> Standing {
        let now = now.as_secs();
        if now > self.not_after {
            Standing::Expired
        } else if now < self.not_before {
            Standing::NotYetValid
        } else {
            Standing::Within
        }
    }

    /// A time within the period, as near `now` as there is one (`now` itself when it is
    /// within): a certificate outside its period is checked as it was (or will be) there.
    pub fn nearest_time_within(&self, now: UnixTime) -> UnixTime {
        let secs = now
            .as_secs()
            .min(self.not_after)
            .max(self.not_before.min(self.not_after));
        UnixTime::since_unix_epoch(Duration::from_secs(secs))
    }

    /// What is wrong with the period at `now`, with dates: "expired on 2025-03-01 00:00:00
    /// UTC (it is now …)", or "not valid before …". `None` within it.
    pub fn problem(&self, now: UnixTime) -> Option<String> {
        let at = utc(now.as_secs());
        match self.standing(now) {
            Standing::Within => None,
            Standing::Expired => Some(format!(
                "expired on {} (valid from {}; it is now {at})",
                utc(self.not_after),
                utc(self.not_before)
            )),
            Standing::NotYetValid => Some(format!(
                "is not valid before {} (it is now {at}: is the BMC's clock or this host's \
                 wrong?)",
                utc(self.not_before)
            )),
        }
    }
}

/// Unix seconds as a date: `2025-03-01 00:00:00 UTC`.
pub fn utc(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{secs} seconds after 1970 (beyond the calendar)"))
}

/// Records `cert`'s notAfter in the gauge (a certificate that cannot be parsed is not).
pub fn record_expiry(entry: &str, host: &str, trust: &'static str, period: Option<Period>) {
    if let Some(p) = period {
        CERTIFICATE_EXPIRY
            .get_or_create(&CertificateLabels {
                entry: entry.to_string(),
                host: host.to_string(),
                trust,
            })
            .set(p.not_after as f64);
    }
}

/// Remembers what was warned about, so that each warning is logged once: per verifier (one per
/// entry) and certificate. Bounded: when full, it starts over (a warning may then repeat).
#[derive(Debug, Default)]
pub struct WarnedOnce {
    seen: Mutex<std::collections::HashSet<(String, super::Fingerprint)>>,
}

/// Distinct (host, certificate) pairs one entry remembers having warned about.
const MAX_WARNED: usize = 4096;

impl WarnedOnce {
    /// True the first time for (host, fingerprint).
    pub fn first(&self, host: &str, fingerprint: super::Fingerprint) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_WARNED {
            seen.clear();
        }
        seen.insert((host.to_string(), fingerprint))
    }
}

/// What a TLS failure means for the operator, in words and dates, where rustls' own text
/// would print Unix seconds or an enum name: an expired or not yet valid certificate, a BMC
/// offering only TLS 1.0/1.1, and the verifier's own refusals (without rustls' "unexpected
/// error" prefix). `None`: rustls' text says it well enough.
pub fn tls_error_text(e: &Error) -> Option<String> {
    match e {
        Error::InvalidCertificate(CertificateError::ExpiredContext { time, not_after }) => {
            Some(format!(
                "the BMC's certificate expired on {} (it is now {}): renew it on the BMC (a \
                 pinned certificate — tls_fingerprint, or the BMC's self-signed one as \
                 ca_file — is read past its expiry)",
                utc(not_after.as_secs()),
                utc(time.as_secs())
            ))
        }
        Error::InvalidCertificate(CertificateError::NotValidYetContext { time, not_before }) => {
            Some(format!(
                "the BMC's certificate is not valid before {} (it is now {}): check the clocks \
                 of the BMC and of this host",
                utc(not_before.as_secs()),
                utc(time.as_secs())
            ))
        }
        Error::InvalidCertificate(CertificateError::Expired) => Some(
            "the BMC's certificate has expired: renew it on the BMC (a pinned certificate is \
             read past its expiry)"
                .into(),
        ),
        Error::InvalidCertificate(CertificateError::NotValidYet) => Some(
            "the BMC's certificate is not valid yet: check the clocks of the BMC and of this host"
                .into(),
        ),
        Error::PeerIncompatible(PeerIncompatible::ServerDoesNotSupportTls12Or13)
        | Error::AlertReceived(AlertDescription::ProtocolVersion) => Some(TLS_TOO_OLD.into()),
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => Some(UNKNOWN_ISSUER.into()),
        Error::General(text) => Some(text.clone()),
        _ => None,
    }
}

/// The error for a BMC certificate no trusted CA signed (most BMCs' are self-signed).
pub const UNKNOWN_ISSUER: &str = "the BMC's certificate is not signed by a CA this entry \
     trusts (this host's CAs, or ca_file's where set; most BMCs' certificates are self-signed): \
     pin it with tls_fingerprint = \"sha256:...\" (the fingerprint `openssl s_client -connect \
     HOST:443 </dev/null | openssl x509 -noout -fingerprint -sha256` prints, after checking it \
     on the BMC's console), or set ca_file to the CA that signed it or to the BMC's own \
     certificate";

/// The error for a BMC that offers only TLS 1.0/1.1.
pub const TLS_TOO_OLD: &str = "the BMC offers only TLS 1.0/1.1; oobfence requires TLS 1.2 or \
     later: update the BMC firmware or enable TLS 1.2 in the BMC's network/web server \
     settings (there is no setting in oobfence to allow TLS 1.0/1.1)";

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs))
    }

    #[test]
    fn periods_are_judged_and_written_as_dates() {
        // 2024-03-01 00:00:00 UTC to 2025-03-01 00:00:00 UTC.
        let p = Period {
            not_before: 1_709_251_200,
            not_after: 1_740_787_200,
        };
        assert_eq!(utc(p.not_after), "2025-03-01 00:00:00 UTC");
        assert_eq!(p.standing(at(1_720_000_000)), Standing::Within);
        assert_eq!(p.problem(at(1_720_000_000)), None);
        let later = at(1_764_158_400); // 2025-11-26 12:00:00 UTC
        assert_eq!(p.standing(later), Standing::Expired);
        assert_eq!(
            p.problem(later).unwrap(),
            "expired on 2025-03-01 00:00:00 UTC (valid from 2024-03-01 00:00:00 UTC; it is now \
             2025-11-26 12:00:00 UTC)"
        );
        assert_eq!(p.nearest_time_within(later).as_secs(), p.not_after);
        let earlier = at(1_000_000_000);
        assert_eq!(p.standing(earlier), Standing::NotYetValid);
        assert!(
            p.problem(earlier)
                .unwrap()
                .starts_with("is not valid before 2024-03-01 00:00:00 UTC"),
            "{:?}",
            p.problem(earlier)
        );
        assert_eq!(p.nearest_time_within(earlier).as_secs(), p.not_before);
        // An inverted period (notAfter before notBefore): expired at any time after notAfter.
        let inverted = Period {
            not_before: 2_000,
            not_after: 1_000,
        };
        assert_eq!(inverted.standing(at(1_500)), Standing::Expired);
        assert_eq!(inverted.nearest_time_within(at(1_500)).as_secs(), 1_000);
    }

    #[test]
    fn rustls_validity_errors_are_reworded_with_dates_not_unix_seconds() {
        let expired = Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: at(1_764_158_400),
            not_after: at(1_740_787_200),
        });
        // What rustls says on its own: Unix seconds.
        assert!(expired.to_string().contains("1740787200"), "{expired}");
        let text = tls_error_text(&expired).unwrap();
        assert!(
            text.contains("expired on 2025-03-01 00:00:00 UTC (it is now 2025-11-26 12:00:00 UTC)"),
            "{text}"
        );
        assert!(!text.contains("1740787200"), "{text}");
        let early = Error::InvalidCertificate(CertificateError::NotValidYetContext {
            time: at(1_709_251_199),
            not_before: at(1_709_251_200),
        });
        let text = tls_error_text(&early).unwrap();
        assert!(
            text.contains(
                "not valid before 2024-03-01 00:00:00 UTC (it is now 2024-02-29 23:59:59 UTC)"
            ),
            "{text}"
        );
        for old in [
            Error::PeerIncompatible(PeerIncompatible::ServerDoesNotSupportTls12Or13),
            Error::AlertReceived(AlertDescription::ProtocolVersion),
        ] {
            assert_eq!(tls_error_text(&old).as_deref(), Some(TLS_TOO_OLD));
        }
        let unknown = tls_error_text(&Error::InvalidCertificate(CertificateError::UnknownIssuer))
            .unwrap_or_default();
        assert!(
            unknown.contains("tls_fingerprint") && unknown.contains("ca_file"),
            "{unknown}"
        );
    }

    #[test]
    fn warnings_are_once_per_host_and_certificate() {
        let w = WarnedOnce::default();
        assert!(w.first("bmc1", [1; 32]));
        assert!(!w.first("bmc1", [1; 32]));
        assert!(w.first("bmc1", [2; 32]));
        assert!(w.first("bmc2", [1; 32]));
    }
}
