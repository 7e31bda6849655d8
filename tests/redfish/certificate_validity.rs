//! Certificates as BMCs have them: a pinned certificate past its notAfter (or before its
//! notBefore) is still the BMC's identity and is read, with one warning and its notAfter in
//! `oobfence_bmc_certificate_expiry_timestamp_seconds`, unless `tls_pin_validity =
//! "enforce"`; a certificate trusted through a CA is refused once expired; every refusal for
//! validity prints dates, not Unix seconds. A BMC that offers only TLS 1.0/1.1 is named as such.

use std::sync::{Arc, Mutex};

use super::*;
use support::certs;

/// Log lines written while `f` runs on this thread (the runtime is the current thread's).
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || Captured(b.clone()))
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

/// The series of `oobfence_bmc_certificate_expiry_timestamp_seconds` in a fresh catalogue
/// (which serves the gauge with its HELP and type).
fn expiry_series() -> Vec<String> {
    let text = oobfence::metrics::Metrics::new().encode();
    for head in [
        "# HELP oobfence_bmc_certificate_expiry_timestamp_seconds notAfter of the TLS certificate",
        "# TYPE oobfence_bmc_certificate_expiry_timestamp_seconds gauge",
    ] {
        assert!(text.contains(head), "{head:?} not served");
    }
    text.lines()
        .filter(|l| l.starts_with("oobfence_bmc_certificate_expiry_timestamp_seconds{"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn an_expired_pinned_certificate_is_read_with_one_warning_unless_enforced() {
    let dir = tempfile::tempdir().unwrap();
    // Valid from 2024-03-01 to 2025-03-01 00:00:00 UTC; self-signed, CA:TRUE, as BMCs make them.
    let (cert, key) = certs::expired_bmc_cert(dir.path(), "rack2-01");
    let fingerprint = sushy::openssl_fingerprint(&cert);
    let config_dir = tempfile::tempdir().unwrap();
    let bmc = OddBmc::start_with_cert(dir, cert.clone(), key);
    let address = format!("https://127.0.0.1:{}", bmc.port);
    let entry = |extra: &str| {
        bmc_at(
            config_dir.path(),
            &address,
            &format!("system = \"/off\"\n{extra}"),
        )
    };

    let (logs, guard) = capture_logs();
    for pin in [
        format!("tls_fingerprint = \"{fingerprint}\""),
        format!("ca_file = \"{}\"", cert.display()),
        format!(
            "ca_file = \"{}\"\ntls_pin_validity = \"warn\"",
            cert.display()
        ),
    ] {
        let src = source(&entry(&pin), "rack2-01");
        // Three reads at once: three connections, three handshakes, one warning.
        let states = futures::future::join_all((0..3).map(|_| src.read())).await;
        for state in states {
            assert_eq!(state, PowerState::Off, "{pin}: {state:?}");
        }
    }
    drop(guard);
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("the pinned BMC certificate expired on"))
        .collect();
    // One per entry (each source above has its own client, as each entry has) and
    // certificate, not one per read or handshake.
    assert_eq!(warnings.len(), 3, "{logs}");
    for w in &warnings {
        assert!(w.contains("WARN"), "{w}");
        assert!(
            w.contains("expired on 2025-03-01 00:00:00 UTC (valid from 2024-03-01 00:00:00 UTC"),
            "{w}"
        );
        assert!(
            w.contains("entry=bmc[0]") && w.contains("host=127.0.0.1"),
            "{w}"
        );
    }
    let series = expiry_series();
    assert!(
        series.iter().any(|l| l.starts_with(
            "oobfence_bmc_certificate_expiry_timestamp_seconds{entry=\"bmc[0]\",host=\"127.0.0.1\",trust=\"pinned\"}"
        )),
        "{series:?}"
    );

    // Enforced: refused, with dates.
    for pin in [
        format!("tls_fingerprint = \"{fingerprint}\""),
        format!("ca_file = \"{}\"", cert.display()),
    ] {
        let state = source(
            &entry(&format!("{pin}\ntls_pin_validity = \"enforce\"")),
            "rack2-01",
        )
        .read()
        .await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
        for want in [
            "expired on 2025-03-01 00:00:00 UTC (valid from 2024-03-01 00:00:00 UTC; it is now ",
            "tls_pin_validity = \"enforce\" refuses it",
        ] {
            assert!(detail.contains(want), "{want:?} not in {detail}");
        }
        assert!(!detail.contains("1740787200"), "Unix seconds in {detail}");
    }
}

/// The certificate `OddBmc::start_expired` serves: "expired yesterday", made with `openssl
/// x509 -days -1`, so its notAfter lies a day before its notBefore. Pinned, it is read too.
#[tokio::test]
async fn a_pinned_certificate_whose_period_is_inverted_is_read() {
    let bmc = OddBmc::start_expired();
    let config_dir = tempfile::tempdir().unwrap();
    let entry = bmc_at(
        config_dir.path(),
        &format!("https://127.0.0.1:{}", bmc.port),
        &format!("system = \"/off\"\nca_file = \"{}\"", bmc.cert.display()),
    );
    assert_eq!(source(&entry, "n1").read().await, PowerState::Off);
}

/// A BMC whose clock ran ahead when it made its certificate: pinned, it is read (the same
/// decision as for an expired one: a pin is an identity); enforced, refused with the date.
#[tokio::test]
async fn a_pinned_certificate_not_yet_valid_is_read_unless_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certs::future_bmc_cert(dir.path(), "rack2-02");
    let config_dir = tempfile::tempdir().unwrap();
    let bmc = OddBmc::start_with_cert(dir, cert.clone(), key);
    let address = format!("https://127.0.0.1:{}", bmc.port);
    let read = |extra: &str| {
        let entry = bmc_at(
            config_dir.path(),
            &address,
            &format!(
                "system = \"/off\"\nca_file = \"{}\"\n{extra}",
                cert.display()
            ),
        );
        async move { source(&entry, "rack2-02").read().await }
    };
    assert_eq!(read("").await, PowerState::Off);
    let state = read("tls_pin_validity = \"enforce\"").await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(
        detail.contains("is not valid before 2098-01-01 00:00:00 UTC (it is now "),
        "{detail}"
    );
}

/// Trusted through a CA (not pinned): valid, it is read and its notAfter is in the gauge
/// with trust="ca"; expired, it is refused whatever tls_pin_validity says, with dates.
#[tokio::test]
async fn a_certificate_trusted_through_a_ca_is_refused_once_expired_with_dates() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let (ca, leaf, key) =
        certs::ca_and_leaf(dir.path(), "rack2-03", "20240301000000Z", "20250301000000Z");
    let expired = OddBmc::start_with_cert(dir, leaf, key);
    let entry = bmc_at(
        config_dir.path(),
        &format!("https://127.0.0.1:{}", expired.port),
        &format!("system = \"/off\"\nca_file = \"{}\"", ca.display()),
    );
    let state = source(&entry, "rack2-03").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(
        detail.contains("the BMC's certificate expired on 2025-03-01 00:00:00 UTC (it is now "),
        "{detail}"
    );
    assert!(
        !detail.contains("(UNIX)") && !detail.contains("1740787200"),
        "{detail}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (ca, leaf, key) =
        certs::ca_and_leaf(dir.path(), "rack2-04", "20240301000000Z", "20890301000000Z");
    let valid = OddBmc::start_with_cert(dir, leaf, key);
    let entry = bmc_at(
        config_dir.path(),
        &format!("https://127.0.0.1:{}", valid.port),
        &format!("system = \"/off\"\nca_file = \"{}\"", ca.display()),
    );
    assert_eq!(source(&entry, "rack2-04").read().await, PowerState::Off);
    let series = expiry_series();
    // 2089-03-01 00:00:00 UTC.
    assert!(
        series.contains(
            &"oobfence_bmc_certificate_expiry_timestamp_seconds{entry=\"bmc[0]\",host=\"127.0.0.1\",trust=\"ca\"} 3760473600.0".to_string()
        ),
        "{series:?}"
    );
}

#[tokio::test]
async fn a_bmc_offering_only_tls_1_1_is_named_as_such() {
    let bmc = OddBmc::start_tls_1_1_only();
    let config_dir = tempfile::tempdir().unwrap();
    let entry = bmc_at(
        config_dir.path(),
        &format!("https://127.0.0.1:{}", bmc.port),
        &format!("system = \"/off\"\nca_file = \"{}\"", bmc.cert.display()),
    );
    let state = source(&entry, "n1").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(
        detail.contains(
            "the BMC offers only TLS 1.0/1.1; oobfence requires TLS 1.2 or later: update the BMC firmware"
        ),
        "{detail}"
    );
    // The same server with TLS 1.2 is read (the mode is what differs).
    let modern = OddBmc::start();
    let entry = bmc_at(
        config_dir.path(),
        &format!("https://127.0.0.1:{}", modern.port),
        &format!("system = \"/off\"\nca_file = \"{}\"", modern.cert.display()),
    );
    assert_eq!(source(&entry, "n1").read().await, PowerState::Off);
}
