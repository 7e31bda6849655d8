//! Paths a BMC hands out, behind a path-prefix proxy (`support::proxy_bmc`): one that climbs
//! out of the entry's prefix (`..`, spelled out or percent-encoded) would send this BMC's
//! credentials, or a ForceOff, to the BMC beside it. Every such path is refused, naming it; the
//! session's DELETE goes below the prefix.

use oobfence::power::redfish::EntryShared;
use oobfence::power::{ActionOutcome, PowerAction, Reply, checked};
use support::proxy_bmc::{self, Lure, ProxyBmc};

use super::*;

/// `below` (a path on BMC 07, `/redfish/v1`) then enough `..` to leave `/bmc-07/`, then
/// `/bmc-08` and `tail`: spelled out, percent-encoded dots (which URL parsers resolve too), and
/// percent-encoded slashes (which only the proxy decodes).
fn escapes(below: &str, tail: &str) -> Vec<String> {
    let ups = below.split('/').filter(|s| !s.is_empty()).count() + 1;
    let join = |up: &str, sep: &str| vec![up; ups].join(sep);
    vec![
        format!("{below}/{}/bmc-08{tail}", join("..", "/")),
        format!("{below}/{}/bmc-08{tail}", join("%2e%2E", "/")),
        format!("{below}/{}%2fbmc-08{tail}", join("..", "%2f")),
    ]
}

fn entry(proxy: &ProxyBmc, dir: &Path, extra: &str) -> BmcEntry {
    parsed_bmc_entry(
        "redfish",
        dir,
        &proxy.address_07(),
        proxy_bmc::USERNAME,
        proxy_bmc::PASSWORD,
        &format!("{}\n{extra}", proxy.pinned()),
    )
}

/// Nothing reached BMC 08 or the proxy's own paths.
async fn stayed_on_07(proxy: &ProxyBmc, case: &str) {
    let s = proxy.stats().await;
    assert_eq!(s.bmc_08, Default::default(), "{case}: {s:?}");
    assert_eq!(s.elsewhere, Default::default(), "{case}: {s:?}");
}

fn names_the_path(state: &PowerState, lure: &str, case: &str) {
    let (_, detail) = error_of(state);
    assert!(
        detail.contains(lure) && detail.contains("/bmc-07/"),
        "{case}: {detail}"
    );
}

/// A read follows the service root's `Links.Sessions` (to log in) and the Systems collection's
/// member (to read it): neither may lead off the prefix.
#[tokio::test]
async fn a_read_never_follows_a_path_off_its_prefix() {
    let proxy = ProxyBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            Lure::SessionsLink,
            escapes("/redfish/v1", "/redfish/v1/SessionService/Sessions"),
            "auth = \"session\"\nsystem = \"/redfish/v1/Systems/1\"",
        ),
        (
            Lure::SystemsMember,
            escapes("/redfish", "/redfish/v1/Systems/1"),
            "",
        ),
    ];
    // The proxy itself: both BMCs answer below their prefixes.
    proxy.lure(None).await;
    for (_, _, extra) in &cases {
        let reply = source(&entry(&proxy, dir.path(), extra), "n1")
            .read_reply()
            .await;
        assert_eq!(reply.state, PowerState::On, "{extra}: {reply:?}");
        assert!(
            reply.identity.to_string().contains(proxy_bmc::UUID_07),
            "{reply:?}"
        );
    }
    for (lure, paths, extra) in cases {
        for path in paths {
            let case = format!("{lure:?} {path}");
            proxy.lure(Some((lure, &path))).await;
            let state = source(&entry(&proxy, dir.path(), extra), "n1").read().await;
            names_the_path(&state, &path, &case);
            stayed_on_07(&proxy, &case).await;
        }
    }
}

/// A session's `Location` that climbs out of the prefix is never sent a DELETE with the token;
/// one the BMC names without the proxy's prefix (an absolute URL on the proxy's origin) is
/// deleted below the prefix, on the BMC that made it.
#[tokio::test]
async fn a_session_is_deleted_below_the_prefix_only() {
    let proxy = ProxyBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let tail = "/redfish/v1/SessionService/Sessions/1";
    let mut locations = escapes("/redfish/v1/SessionService/Sessions", tail);
    let prefixless = format!("{}{tail}", proxy.origin());
    locations.push(prefixless.clone());
    for location in locations {
        let case = format!("Location {location}");
        proxy.lure(Some((Lure::SessionLocation, &location))).await;
        let entry = entry(
            &proxy,
            dir.path(),
            "auth = \"session\"\nsystem = \"/redfish/v1/Systems/1\"",
        );
        let shared = EntryShared::new(&entry).unwrap();
        let src = RedfishSource::with_shared(&entry, "n1", &shared).unwrap();
        assert_eq!(src.read().await, PowerState::On, "{case}");
        // Waits for the DELETE's answer (bounded by the entry's timeout).
        shared.logins.close_all().await;
        stayed_on_07(&proxy, &case).await;
        if location == prefixless {
            assert_eq!(proxy.stats().await.bmc_07.deletes, 1, "{case}");
        }
    }
}

/// A power action follows the system's Reset `@Redfish.ActionInfo` and POSTs to its `target`:
/// neither may lead off the prefix, whatever the caller's check says.
#[tokio::test]
async fn a_force_off_never_goes_off_the_prefix() {
    let proxy = ProxyBmc::start();
    let dir = tempfile::tempdir().unwrap();
    let entry = entry(&proxy, dir.path(), "system = \"/redfish/v1/Systems/1\"");
    let pass = |_: &Reply| checked(Ok(()));
    let cases = [
        (
            Lure::ActionInfo,
            escapes(
                "/redfish/v1/Systems/1",
                "/redfish/v1/Systems/1/ResetActionInfo",
            ),
        ),
        (
            Lure::ResetTarget,
            escapes(
                "/redfish/v1/Systems/1/Actions",
                "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            ),
        ),
    ];
    for (lure, paths) in cases {
        for path in paths {
            let case = format!("{lure:?} {path}");
            proxy.lure(Some((lure, &path))).await;
            let outcome = source(&entry, "n1").act(PowerAction::Off, &pass).await;
            let why = match &outcome {
                ActionOutcome::Refused { why } => why.clone(),
                ActionOutcome::Failed { error } => error_of(error).1.to_string(),
                sent => panic!("{case}: {sent:?}"),
            };
            assert!(
                why.contains(&path) && why.contains("/bmc-07/"),
                "{case}: {why}"
            );
            stayed_on_07(&proxy, &case).await;
        }
    }
    // Without a lure the ForceOff goes to BMC 07's own Reset.
    proxy.lure(None).await;
    let outcome = source(&entry, "n1").act(PowerAction::Off, &pass).await;
    assert!(matches!(outcome, ActionOutcome::Sent { .. }), "{outcome:?}");
    let s = proxy.stats().await;
    assert_eq!((s.bmc_07.resets, s.bmc_08.resets), (1, 0), "{s:?}");
}
