//! Power actions against sushy-tools' real `ComputerSystem.Reset`: ForceOff and On sent to the
//! target the system names, only after the caller's check passed on the reply read right
//! before; a refused check sends nothing.

use oobfence::power::{ActionOutcome, PowerAction, Reply, checked};

use super::*;

/// Reads until the source says `want` (the fake driver applies a change 1 to 11 s later).
async fn reads_until(src: &dyn PowerSource, want: PowerState) {
    let start = Instant::now();
    loop {
        let state = src.read().await;
        if state == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "still {state:?} 20 s after the action"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn force_off_and_on_go_to_the_systems_own_reset_after_the_check() {
    let emu = SushyEmulator::start(1).await;
    let system = format!("system = \"{}\"\n{}", emu.system_path(0), pinned(&emu));
    let entry = bmc(emu.dir(), &emu.base_url(), sushy::PASSWORD, &system);
    let src = source(&entry, "node000");

    let support = src.action_support().await;
    assert!(
        support.off.as_ref().is_ok_and(|s| s.contains("ForceOff")),
        "{support:?}"
    );
    assert!(
        support
            .on
            .as_ref()
            .is_ok_and(|s| s.contains("ResetType On")),
        "{support:?}"
    );

    // The check sees the reply read right before the command: the machine's UUID, On.
    let uuid = emu.uuid(0);
    let seen: std::sync::Mutex<Option<Reply>> = Default::default();
    let on_and_ours = |r: &Reply| {
        *seen.lock().unwrap() = Some(r.clone());
        if r.state == PowerState::On && r.identity.to_string().contains(&uuid) {
            Ok(())
        } else {
            Err(format!(
                "not this machine, or not On: {} {}",
                r.state, r.identity
            ))
        }
    };
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_and_ours(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { answer } if answer.contains("ResetType=ForceOff")),
        "{outcome:?}"
    );
    assert_eq!(
        seen.lock().unwrap().as_ref().map(|r| r.state.clone()),
        Some(PowerState::On)
    );
    reads_until(&src, PowerState::Off).await;

    // Off now: the same check refuses, and nothing is sent.
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(on_and_ours(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { why } if why.contains("not On")),
        "{outcome:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(src.read().await, PowerState::Off);

    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { answer } if answer.contains("ResetType=On")),
        "{outcome:?}"
    );
    reads_until(&src, PowerState::On).await;
}

/// Every captured vendor system names its own Reset: the target below it, and ForceOff and On
/// among the allowed values inline (Dell, HPE, Lenovo, Supermicro H13, the DMTF mockup) or in
/// an ActionInfo (Supermicro X11: read at action time).
#[test]
fn every_vendor_system_names_its_reset_and_allows_force_off() {
    use oobfence::power::redfish::actions::{reset_action, reset_type};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/redfish");
    let mut seen = 0;
    for vendor in std::fs::read_dir(&root).unwrap() {
        let systems = vendor.unwrap().path().join("redfish/v1/Systems");
        for system in std::fs::read_dir(&systems).into_iter().flatten() {
            let file = system.unwrap().path().join("index.json");
            let Ok(body) = std::fs::read(&file) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let path = v["@odata.id"].as_str().unwrap().to_string();
            let reset =
                reset_action(&body, &path).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            match &reset.allowed {
                Some(allowed) => {
                    assert_eq!(
                        reset_type(PowerAction::Off, allowed),
                        Ok("ForceOff"),
                        "{}",
                        file.display()
                    );
                    assert_eq!(
                        reset_type(PowerAction::On, allowed),
                        Ok("On"),
                        "{}",
                        file.display()
                    );
                }
                None => assert!(reset.action_info.is_some(), "{}", file.display()),
            }
            seen += 1;
        }
    }
    assert!(seen >= 10, "{seen} vendor systems");
}
