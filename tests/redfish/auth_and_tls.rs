//! What the Redfish source refuses to trust: a wrong password (never shown), a redirect, a
//! certificate that does not verify; and a BMC's own self-signed CA, which can be pinned.

use super::*;

#[tokio::test]
async fn wrong_password_is_auth_and_never_shown() {
    let emu = SushyEmulator::start(1).await;
    let wrong = "Wr0ng-but-still-S3cret";
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), wrong, &system);
    let src = source(&entry, "node000");
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(detail.contains("401"), "{detail}");
    for text in [
        state.to_string(),
        format!("{state:?}"),
        format!("{src:?}"),
        src.address(),
    ] {
        assert!(!text.contains(wrong), "password leaked: {text}");
    }
    // Discovery hits the same wall.
    let entry = bmc(emu.dir(), &emu.base_url(), wrong, &pinned(&emu));
    let state = source(&entry, "node000").read().await;
    assert_eq!(error_of(&state).0, ReadErrorKind::Auth, "{state:?}");
    assert!(!state.to_string().contains(wrong));
}

#[tokio::test]
async fn redirect_is_a_protocol_error_without_the_location() {
    // The emulator answers /Systems/<name> with a 307 whose Location embeds the credentials.
    let emu = SushyEmulator::start(1).await;
    let system = format!("system = \"/redfish/v1/Systems/node000\"\n{}", pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let state = source(&entry, "node000").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(detail.contains("307"), "{detail}");
    assert!(!detail.contains(sushy::PASSWORD), "{detail}");
    assert!(!detail.contains("@127.0.0.1"), "{detail}");
    assert!(!detail.contains(&emu.uuid(0)), "{detail}");
}

#[tokio::test]
async fn certificate_verification() {
    let emu = SushyEmulator::start(1).await;
    let path = format!("system = \"{}\"", emu.system_path(0));

    // System roots only: the self-signed certificate is refused, with what to do.
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &path);
    let state = source(&entry, "node000").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{state:?}");
    assert!(
        detail.contains("not signed by a CA this entry trusts")
            && detail.contains("tls_fingerprint = \"sha256:")
            && detail.contains("set ca_file"),
        "{detail}"
    );

    // Pinned to an unrelated certificate: refused.
    let other = tempfile::tempdir().unwrap();
    let (other_cert, _) = sushy::self_signed_cert(other.path(), "unrelated");
    let extra = format!("{path}\nca_file = \"{}\"", other_cert.display());
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    let state = source(&entry, "node000").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(detail.to_lowercase().contains("certificate"), "{detail}");

    // Pinned to its own certificate: works.
    let extra = format!("{path}\n{}", pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    assert_eq!(source(&entry, "node000").read().await, PowerState::On);

    // Verification off: works.
    let extra = format!("{path}\ntls_insecure = true");
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &extra);
    assert_eq!(source(&entry, "node000").read().await, PowerState::On);
}

/// Most BMCs serve a self-signed certificate made as `openssl req -x509` makes it: CA:TRUE, no
/// name the BMC is reached by. Given as `ca_file`, or pinned by its SHA-256 (`tls_fingerprint`,
/// pasted as openssl prints it), it is accepted as the BMC's own, not refused as a CA used as
/// an end entity, and even once expired (unless `tls_pin_validity = "enforce"`); another
/// certificate is still refused.
#[tokio::test]
async fn a_bmcs_own_self_signed_ca_certificate_can_be_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = sushy::bmc_style_cert(dir.path(), "rack1-07", 30);
    let config_dir = tempfile::tempdir().unwrap();
    let bmc = OddBmc::start_with_cert(dir, cert.clone(), key);
    let address = format!("https://127.0.0.1:{}", bmc.port);
    let read = |extra: String| {
        let entry = bmc_at(
            config_dir.path(),
            &address,
            &format!("system = \"/off\"\n{extra}"),
        );
        async move { source(&entry, "rack1-07").read().await }
    };

    let by_file = read(format!("ca_file = \"{}\"", cert.display())).await;
    assert_eq!(by_file, PowerState::Off, "{by_file:?}");
    let fingerprint = sushy::openssl_fingerprint(&cert);
    assert!(
        fingerprint.starts_with("sha256 Fingerprint="),
        "{fingerprint}"
    );
    let by_fingerprint = read(format!("tls_fingerprint = \"{fingerprint}\"")).await;
    assert_eq!(by_fingerprint, PowerState::Off, "{by_fingerprint:?}");
    let among_others = read(format!(
        "tls_fingerprint = [\"sha256:{}\", \"{fingerprint}\"]",
        "00".repeat(32)
    ))
    .await;
    assert_eq!(among_others, PowerState::Off, "{among_others:?}");

    // Another certificate pinned: refused, saying which certificate the BMC served.
    let wrong = read(format!("tls_fingerprint = \"sha256:{}\"", "ab".repeat(32))).await;
    let (kind, detail) = error_of(&wrong);
    assert_eq!(kind, ReadErrorKind::Tls, "{detail}");
    assert!(
        detail.contains("is not the one tls_fingerprint pins"),
        "{detail}"
    );
    let other_dir = tempfile::tempdir().unwrap();
    let (other, _) = sushy::bmc_style_cert(other_dir.path(), "rack1-08", 30);
    let other_file = read(format!("ca_file = \"{}\"", other.display())).await;
    assert_eq!(
        error_of(&other_file).0,
        ReadErrorKind::Tls,
        "{other_file:?}"
    );

    // A pin is an identity, not a validity claim: expired, the pinned certificate is still
    // read (with a warning: tests/redfish/certificate_validity.rs), unless the entry enforces
    // the validity period, and then the refusal says when it ended.
    let expired_dir = tempfile::tempdir().unwrap();
    let (expired, expired_key) = sushy::bmc_style_cert(expired_dir.path(), "rack1-09", -1);
    let expired_bmc = OddBmc::start_with_cert(expired_dir, expired.clone(), expired_key);
    let address = format!("https://127.0.0.1:{}", expired_bmc.port);
    for extra in [
        format!("ca_file = \"{}\"", expired.display()),
        format!(
            "tls_fingerprint = \"{}\"",
            sushy::openssl_fingerprint(&expired)
        ),
    ] {
        let read = |validity: &str| {
            let entry = bmc_at(
                config_dir.path(),
                &address,
                &format!("system = \"/off\"\n{extra}\n{validity}"),
            );
            async move { source(&entry, "rack1-09").read().await }
        };
        assert_eq!(read("").await, PowerState::Off, "{extra}");
        let state = read("tls_pin_validity = \"enforce\"").await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, ReadErrorKind::Tls, "{extra}: {detail}");
        assert!(detail.contains(" expired on "), "{extra}: {detail}");
        assert!(detail.contains(" UTC"), "{extra}: {detail}");
    }
}
