//! Which TLS version a BMC picks with oobfence's TLS settings, for `probe` and
//! `check-config --probe`: one handshake of its own, nothing sent over it.
//!
//! The reads' HTTP client does not say which version each connection took, so this asks the
//! BMC again with the same protocol versions (TLS 1.2 and 1.3, rustls' safe defaults). Whether
//! the certificate is trusted is the reads' own check (and `probe` reads too); here every
//! certificate is let through, because only the version is learnt and no byte of a request,
//! credential or token goes over this connection: it is closed after the handshake.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{Error, ProtocolVersion};

/// The TLS version the service at `base` negotiates, as "TLS 1.3"; the reason when the
/// handshake fails (a BMC offering TLS 1.0 or 1.1 only is named as such).
pub async fn negotiated(base: &Url, timeout: Duration) -> Result<String, String> {
    let host = base
        .host_str()
        .ok_or("the address has no host")?
        .trim_matches(['[', ']'])
        .to_string();
    let port = base.port_or_known_default().unwrap_or(443);
    let name = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.clone()).map_err(|e| format!("host {host:?}: {e}"))?,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(VersionOnly(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let tls = connector.connect(name, tcp).await.map_err(|e| {
            // The same words as a read's TLS error (a BMC offering only TLS 1.0/1.1 named).
            let text = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .and_then(crate::pinning::tls_error_text)
                .unwrap_or_else(|| e.to_string());
            format!("TLS handshake failed: {text}")
        })?;
        let version = tls.get_ref().1.protocol_version();
        Ok::<_, String>(match version {
            Some(ProtocolVersion::TLSv1_3) => "TLS 1.3".to_string(),
            Some(ProtocolVersion::TLSv1_2) => "TLS 1.2".to_string(),
            Some(other) => format!("{other:?}"),
            None => "TLS (version not reported)".to_string(),
        })
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| {
            format!(
                "no TLS handshake within {}",
                humantime::format_duration(timeout)
            )
        })?
}

/// Lets every certificate through: see the module's comment for why that is safe here.
#[derive(Debug)]
struct VersionOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for VersionOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    crate::pinning::signatures_checked_by_provider!(0);
}
