//! Redfish sessions against a BMC that logs in as firmware does (`support::session_bmc`): a BMC
//! with HTTP Basic turned off is read through one kept session, renewed when the BMC forgets
//! it and deleted when oobfence lets it go; a BMC with a proxy's path prefix is read below it.

use std::sync::Arc;

use support::session_bmc::{self, Basic, SessionBmc};

use super::*;

fn entry_for(bmc: &SessionBmc, password: &str, extra: &str) -> (tempfile::TempDir, BmcEntry) {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "system = \"/redfish/v1/Systems/1\"\n{}\n{extra}",
        bmc.pinned()
    );
    let entry = support::scenario::parsed_bmc_entry(
        "redfish",
        dir.path(),
        &bmc.address(),
        session_bmc::USERNAME,
        password,
        &extra,
    );
    (dir, entry)
}

fn login_detail(reply: &oobfence::power::Reply) -> String {
    reply
        .details
        .iter()
        .find(|d| d.name == "session")
        .map(|d| d.value.clone())
        .unwrap_or_else(|| panic!("no session detail in {reply:?}"))
}

/// A BMC with Basic turned off answers every Basic request 401. The default (`auth = "auto"`)
/// sees that the refusal is of Basic itself and reads through a session: one login for many
/// reads, `why` saying so. `auth = "basic"` is refused with advice that names the way out.
#[tokio::test]
async fn a_bmc_with_basic_turned_off_is_read_through_one_session() {
    let bmc = SessionBmc::start(Basic::Refused);
    let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, "");
    let src = source(&entry, "n1");
    let first = src.read_reply().await;
    assert_eq!(first.state, PowerState::On, "{first:?}");
    match &first.identity {
        MachineIdentity::SystemUuid { forms, serial } => {
            assert_eq!(forms[0], session_bmc::UUID, "{forms:?}");
            assert_eq!(serial.as_deref(), Some("SESS-1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        login_detail(&first).contains("Redfish session, auth = auto"),
        "{first:?}"
    );
    bmc.set_power("Off").await;
    for _ in 0..20 {
        assert_eq!(src.read().await, PowerState::Off);
    }
    let stats = bmc.stats().await;
    assert_eq!(stats.logins, 1, "one session for 21 reads: {stats:?}");
    assert_eq!(stats.token_reads, 21, "{stats:?}");
    // Basic is tried once, seen refused, and not sent again.
    assert_eq!(stats.refused, 1, "{stats:?}");

    for auth in ["session", "auto"] {
        let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, &format!("auth = \"{auth}\""));
        let reply = source(&entry, "n1").read_reply().await;
        assert_eq!(reply.state, PowerState::Off, "{auth}: {reply:?}");
        assert!(
            login_detail(&reply).starts_with("Redfish session"),
            "{auth}: {reply:?}"
        );
    }

    let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, "auth = \"basic\"");
    let state = source(&entry, "n1").read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(
        detail.contains("401") && detail.contains("set auth = \"session\""),
        "{detail}"
    );
}

/// With a BMC that takes Basic, a wrong password is tried once per read, by Basic alone: no
/// session login doubles the failures a BMC counts towards locking the account. The password
/// is never shown; a wrong password with sessions is an Auth error naming the login.
#[tokio::test]
async fn a_wrong_password_is_tried_once_and_never_shown() {
    let wrong = "Wr0ng-S3ssion-Secret";
    let bmc = SessionBmc::start(Basic::AndSessions);
    let (_dir, entry) = entry_for(&bmc, wrong, "");
    let src = source(&entry, "n1");
    let reply = src.read_reply().await;
    let (kind, detail) = error_of(&reply.state);
    assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
    assert!(detail.contains("HTTP Basic"), "{detail}");
    assert!(!detail.contains("set auth"), "{detail}");
    assert_eq!(login_detail(&reply), "HTTP Basic, auth = auto");
    let stats = bmc.stats().await;
    assert_eq!((stats.logins, stats.login_failures), (0, 0), "{stats:?}");

    let bmc = SessionBmc::start(Basic::Refused);
    for extra in ["", "auth = \"session\""] {
        let (_dir, entry) = entry_for(&bmc, wrong, extra);
        let src = source(&entry, "n1");
        let state = src.read().await;
        let (kind, detail) = error_of(&state);
        assert_eq!(kind, ReadErrorKind::Auth, "{extra}: {detail}");
        assert!(
            detail.contains("session login of user \"admin\" refused"),
            "{extra}: {detail}"
        );
        for text in [state.to_string(), format!("{state:?}"), format!("{src:?}")] {
            assert!(!text.contains(wrong), "password leaked: {text}");
        }
    }
    assert_eq!(bmc.stats().await.login_failures, 2);
}

/// Old firmware answers a wrong password 401 without a Basic challenge and has no session
/// service. `auto` tries a session, finds none, and says both, as a credentials error, without
/// sticking to sessions: the right password then reads through Basic.
#[tokio::test]
async fn a_basic_only_bmc_without_a_challenge_is_not_taken_for_a_session_one() {
    let wrong = "Wr0ng-Old-Firmware";
    let bmc = SessionBmc::start(Basic::OnlyNoChallenge);
    let (_dir, entry) = entry_for(&bmc, wrong, "");
    let src = source(&entry, "n1");
    for _ in 0..2 {
        let reply = src.read_reply().await;
        let (kind, detail) = error_of(&reply.state);
        assert_eq!(kind, ReadErrorKind::Auth, "{detail}");
        assert!(
            detail.contains("HTTP Basic was refused")
                && detail.contains("names no Sessions collection")
                && detail.contains("check the user and password"),
            "{detail}"
        );
        assert!(!detail.contains(wrong), "{detail}");
        // Back to Basic for the next read.
        assert_eq!(login_detail(&reply), "HTTP Basic, auth = auto");
    }
    let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, "");
    let reply = source(&entry, "n1").read_reply().await;
    assert_eq!(reply.state, PowerState::On, "{reply:?}");
    assert_eq!(login_detail(&reply), "HTTP Basic, auth = auto");
    let stats = bmc.stats().await;
    assert_eq!((stats.logins, stats.basic_reads), (0, 1), "{stats:?}");
}

/// The BMC forgets sessions after its own timeout: the next read is answered 401, logs in
/// once more and reads, without an error in between.
#[tokio::test]
async fn a_session_the_bmc_forgot_is_renewed_by_the_next_read() {
    let bmc = SessionBmc::start(Basic::Refused);
    let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, "auth = \"session\"");
    let src = source(&entry, "n1");
    assert_eq!(src.read().await, PowerState::On);
    bmc.expire_sessions().await;
    assert_eq!(src.read().await, PowerState::On);
    assert_eq!(src.read().await, PowerState::On);
    let stats = bmc.stats().await;
    assert_eq!(stats.logins, 2, "{stats:?}");
    assert_eq!(stats.open, 1, "{stats:?}");
}

/// Many nodes of one BMC (a chassis's blades) read at once share one login: one session,
/// however many reads wait for it.
#[tokio::test]
async fn concurrent_reads_of_one_bmc_share_one_login() {
    let bmc = SessionBmc::start(Basic::Refused);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "datacenter = \"dc\"\n[[bmc]]\nnodes = [\"n*\"]\nprotocol = \"redfish\"\n\
         address = \"{}\"\nsystem = \"/redfish/v1/Systems/{{node}}\"\nusername = \"{}\"\n\
         password_file = \"{}\"\nauth = \"session\"\n{}\n",
        bmc.address(),
        session_bmc::USERNAME,
        write_password(dir.path(), session_bmc::PASSWORD).display(),
        bmc.pinned()
    );
    let cfg = Arc::new(oobfence::config::Config::parse(&config, Path::new("dc.toml")).unwrap());
    let sources = oobfence::power::PowerSources::new(cfg, Default::default()).await;
    let reads: Vec<_> = (0..16)
        .map(|i| {
            let mapped = sources.for_node(&format!("n{}", i % 8), None).unwrap();
            tokio::spawn(async move { mapped.source.read().await })
        })
        .collect();
    for r in reads {
        assert_eq!(r.await.unwrap(), PowerState::On);
    }
    let stats = bmc.stats().await;
    assert_eq!((stats.logins, stats.max_open), (1, 1), "{stats:?}");
    assert_eq!(stats.token_reads, 16, "{stats:?}");
}

fn write_password(dir: &Path, password: &str) -> PathBuf {
    let path = dir.join(format!("pw-{}", rand_suffix()));
    std::fs::write(&path, format!("{password}\n")).unwrap();
    path
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The sessions a config's sources hold are deleted when oobfence lets them go: at once by
/// `close_sessions` (what shutdown and a reload call), and when the sources and what they
/// share are dropped (a reload replaced them). A source dropped alone (the daemon makes one
/// for each read of a healthy node) leaves the session for the next read.
#[tokio::test]
async fn sessions_are_deleted_when_let_go() {
    let bmc = SessionBmc::start(Basic::Refused);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "datacenter = \"dc\"\n[[bmc]]\nnodes = [\"n1\"]\nprotocol = \"redfish\"\n\
         address = \"{}\"\nsystem = \"/redfish/v1/Systems/1\"\nusername = \"{}\"\n\
         password_file = \"{}\"\n{}\n",
        bmc.address(),
        session_bmc::USERNAME,
        write_password(dir.path(), session_bmc::PASSWORD).display(),
        bmc.pinned()
    );
    let cfg = Arc::new(oobfence::config::Config::parse(&config, Path::new("dc.toml")).unwrap());
    let sources = oobfence::power::PowerSources::new(cfg.clone(), Default::default()).await;
    let mapped = sources.for_node("n1", None).unwrap();
    assert_eq!(mapped.source.read().await, PowerState::On);
    // A second source for the same node and BMC shares the session.
    let again = sources.for_node("n1", None).unwrap();
    assert_eq!(again.source.read().await, PowerState::On);
    drop(again);
    let again = sources.for_node("n1", None).unwrap();
    assert_eq!(again.source.read().await, PowerState::On);
    let stats = bmc.stats().await;
    assert_eq!((stats.logins, stats.deletes), (1, 0), "{stats:?}");
    sources.close_sessions().await;
    let stats = bmc.stats().await;
    assert_eq!((stats.deletes, stats.open), (1, 0), "{stats:?}");

    // A read still under way through them (made before a reload) logs in, and its session is
    // deleted as soon as it is done.
    assert_eq!(mapped.source.read().await, PowerState::On);
    let stats = bmc.stats().await;
    assert_eq!(
        (stats.logins, stats.deletes, stats.open),
        (2, 2, 0),
        "{stats:?}"
    );
    drop((mapped, again, sources));

    // Sources of a config in force: dropping all of them and what they share (a reload
    // replaced them) deletes the session.
    let sources = oobfence::power::PowerSources::new(cfg, Default::default()).await;
    let mapped = sources.for_node("n1", None).unwrap();
    assert_eq!(mapped.source.read().await, PowerState::On);
    assert_eq!(bmc.stats().await.open, 1);
    drop((mapped, sources));
    let stats = bmc
        .stats_until(Duration::from_secs(5), |s| s.open == 0)
        .await;
    assert_eq!(
        (stats.logins, stats.deletes, stats.open),
        (3, 3, 0),
        "{stats:?}"
    );
}

/// A BMC has few session slots. When other clients hold them all, the login is refused with a
/// message that says so; once one is free, the next read logs in.
#[tokio::test]
async fn a_bmc_without_a_free_session_slot_is_named() {
    let bmc = SessionBmc::start_with(Basic::Refused, "", 1);
    let other = bmc.take_a_slot().await.expect("the other client's login");
    let (_dir, entry) = entry_for(&bmc, session_bmc::PASSWORD, "");
    let src = source(&entry, "n1");
    let state = src.read().await;
    let (kind, detail) = error_of(&state);
    assert_eq!(kind, ReadErrorKind::Protocol, "{detail}");
    assert!(detail.contains("no free session slot"), "{detail}");
    drop(other);
    bmc.expire_sessions().await;
    assert_eq!(src.read().await, PowerState::On);
}

/// An address with a path (a BMC proxy's prefix) is read below that prefix, sessions and all;
/// the same BMC without the prefix is not there.
#[tokio::test]
async fn an_address_path_is_a_prefix_for_every_request() {
    for mode in [Basic::AndSessions, Basic::Refused] {
        let bmc = SessionBmc::start_with(mode, "/bmc1", 4);
        for address in [bmc.address(), format!("{}/", bmc.address())] {
            let dir = tempfile::tempdir().unwrap();
            for system in ["system = \"/redfish/v1/Systems/1\"\n", ""] {
                let entry = support::scenario::parsed_bmc_entry(
                    "redfish",
                    dir.path(),
                    &address,
                    session_bmc::USERNAME,
                    session_bmc::PASSWORD,
                    &format!("{system}{}", bmc.pinned()),
                );
                let src = source(&entry, "n1");
                assert_eq!(src.address(), format!("{}/", bmc.address()));
                let reply = src.read_reply().await;
                assert_eq!(
                    reply.state,
                    PowerState::On,
                    "{mode:?} {address} {system}: {reply:?}"
                );
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let entry = support::scenario::parsed_bmc_entry(
            "redfish",
            dir.path(),
            &format!("https://127.0.0.1:{}", bmc.port),
            session_bmc::USERNAME,
            session_bmc::PASSWORD,
            &format!("system = \"/redfish/v1/Systems/1\"\n{}", bmc.pinned()),
        );
        let state = source(&entry, "n1").read().await;
        assert!(
            matches!(state, PowerState::Error { .. }),
            "{mode:?}: read without the prefix: {state:?}"
        );
    }
}
