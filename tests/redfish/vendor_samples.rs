//! Real vendor payloads: every JSON sample that ships with the `sushy` client library, parsed
//! as the reply its BMC would serve.

use super::*;

/// Every JSON sample that ships with the `sushy` Redfish client, parsed as the reply to a GET
/// of the path it names itself by (its `@odata.id`), as the BMC it came from would serve it: a
/// ComputerSystem maps to exactly what its own `PowerState` says and to its `UUID`; anything
/// else (a Chassis, a Manager, a collection, a body without `@odata.id`) is an error. Asked for
/// any other path, every sample is an error.
#[test]
fn sushy_vendor_samples() {
    let root = sushy_package_dir().join("tests");
    let mut files = Vec::new();
    collect_json(&root, &mut files);
    assert!(
        files.len() > 100,
        "only {} JSON samples under {}",
        files.len(),
        root.display()
    );

    let mut systems = Vec::new();
    let mut with_power_state = 0;
    let mut with_identity = 0;
    for file in &files {
        let body = std::fs::read(file).unwrap();
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&body) else {
            let got = parse_reply(&body, "/redfish/v1/Systems/1");
            assert!(
                matches!(
                    got.state,
                    PowerState::Error {
                        kind: ReadErrorKind::BadReply,
                        ..
                    }
                ),
                "{}: not JSON, yet {got:?}",
                file.display()
            );
            continue;
        };
        let own_id = doc.get("@odata.id").and_then(|i| i.as_str());
        let asked = own_id.unwrap_or("/redfish/v1/Systems/1");
        let got = parse_reply(&body, asked);
        // Chassis and Managers carry a PowerState too, but only a ComputerSystem's counts.
        let is_system = own_id.is_some() && is_computer_system(&doc);
        let want = if is_system {
            expected(doc.get("PowerState"))
        } else {
            PowerState::error(ReadErrorKind::BadReply, "not the ComputerSystem asked for")
        };
        assert_eq!(
            label(&got.state),
            label(&want),
            "{}: {got:?}, expected {want:?}",
            file.display()
        );
        if doc.get("PowerState").is_some() {
            with_power_state += 1;
        }
        if !matches!(got.state, PowerState::Error { .. }) {
            check_sample_identity(file, &doc, &got.identity);
            with_identity += 1;
        } else {
            assert!(
                matches!(got.identity, MachineIdentity::Unreported { .. }),
                "{}: {got:?}",
                file.display()
            );
        }
        // The same body as the answer for another system: never read.
        let elsewhere = parse_reply(&body, "/redfish/v1/Systems/SomeOtherSystem");
        assert_eq!(
            label(&elsewhere.state),
            "error bad_reply",
            "{}: {elsewhere:?}",
            file.display()
        );
        if is_system {
            systems.push((file.clone(), doc));
        }
    }
    assert!(with_power_state > 0, "no sample carries a PowerState");
    assert!(with_identity > 0, "no sample was read with an identity");
    let dell = systems
        .iter()
        .find(|(f, _)| f.to_string_lossy().contains("oem/dell"))
        .expect("the Dell system sample was not found");
    let reply = parse_reply(
        &serde_json::to_vec(&dell.1).unwrap(),
        dell.1["@odata.id"].as_str().unwrap(),
    );
    assert_eq!(
        reply.identity,
        MachineIdentity::SystemUuid {
            forms: vec![
                "4c4c4544-0043-5910-8043-b8c04f5a3233".into(),
                // The same UUID SMBIOS byte-swapped and byte-reversed: forms some firmware
                // reports, accepted as for IPMI GUIDs.
                "44454c4c-4300-1059-8043-b8c04f5a3233".into(),
                "33325a4f-c0b8-4380-1059-430044454c4c".into(),
            ],
            serial: Some("CNIVC000180873".into()),
        }
    );

    // The same real payloads with every other PowerState value put in.
    let mut checked = 0;
    for (file, doc) in &systems {
        if doc.get("PowerState").is_none() {
            continue;
        }
        let asked = doc["@odata.id"].as_str().unwrap();
        for value in [
            serde_json::json!("Off"),
            serde_json::json!("On"),
            serde_json::json!("PoweringOn"),
            serde_json::json!("PoweringOff"),
            serde_json::json!("Paused"),
            serde_json::json!("off"),
            serde_json::json!(""),
            serde_json::Value::Null,
            serde_json::json!(0),
        ] {
            let mut doc = doc.clone();
            doc["PowerState"] = value.clone();
            let got = parse_reply(&serde_json::to_vec_pretty(&doc).unwrap(), asked);
            let want = expected(Some(&value));
            assert_eq!(
                label(&got.state),
                label(&want),
                "{} with {value}: {got:?}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no ComputerSystem sample with a PowerState");
}

/// `#ComputerSystem.ComputerSystem`, `#ComputerSystem.v<digits and _>.ComputerSystem`, or the
/// Redfish 1.0 `#ComputerSystem.<digits and .>.ComputerSystem` (HPE iLO 4).
pub(super) fn is_computer_system(doc: &serde_json::Value) -> bool {
    let Some(t) = doc.get("@odata.type").and_then(|t| t.as_str()) else {
        return false;
    };
    let Some(version) = t
        .strip_prefix("#ComputerSystem.")
        .and_then(|r| r.strip_suffix("ComputerSystem"))
    else {
        return false;
    };
    let digits = |v: &str, sep: char| v.split(sep).all(|n| n.parse::<u32>().is_ok());
    version.is_empty()
        || version
            .strip_suffix('.')
            .is_some_and(|v| match v.strip_prefix('v') {
                Some(v) => digits(v, '_'),
                None => digits(v, '.'),
            })
}

/// A sample read as a ComputerSystem reports its own `UUID` (lowercase) first, then its other
/// byte orders, and its `SerialNumber`.
fn check_sample_identity(file: &Path, doc: &serde_json::Value, identity: &MachineIdentity) {
    let uuid = doc.get("UUID").and_then(|u| u.as_str());
    match (uuid, identity) {
        (Some(uuid), MachineIdentity::SystemUuid { forms, serial }) => {
            assert_eq!(forms[0], uuid.to_lowercase(), "{}", file.display());
            assert_eq!(
                Some(forms),
                oobfence::identity::uuid_forms_of_redfish_uuid(uuid).as_ref(),
                "{}",
                file.display()
            );
            let want = doc
                .get("SerialNumber")
                .and_then(|s| s.as_str())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty());
            assert_eq!(serial, &want, "{}", file.display());
        }
        (None, MachineIdentity::Unreported { reason }) => {
            assert!(reason.contains("no UUID"), "{}: {reason}", file.display());
        }
        (_, other) => panic!("{}: UUID {uuid:?} read as {other:?}", file.display()),
    }
}

/// What a reply should map to, from its top-level `PowerState` value.
fn expected(value: Option<&serde_json::Value>) -> PowerState {
    match value.and_then(|v| v.as_str()) {
        Some("Off") => PowerState::Off,
        Some("On") => PowerState::On,
        Some(t @ ("PoweringOn" | "PoweringOff")) => PowerState::Transitional {
            detail: t.to_string(),
        },
        Some("Paused") => PowerState::Suspended {
            detail: "the ComputerSystem's PowerState is Paused".into(),
        },
        _ => PowerState::error(ReadErrorKind::BadReply, ""),
    }
}

fn label(state: &PowerState) -> String {
    match state {
        PowerState::Transitional { detail } => format!("transitional {detail}"),
        PowerState::Error { kind, .. } => format!("error {kind}"),
        other => other.label().to_string(),
    }
}

pub(super) fn sushy_package_dir() -> PathBuf {
    let python = support::venv_bin("python");
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import os, sushy; print(os.path.dirname(sushy.__file__))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "the `sushy` package is not installed in the test venv \
         (run scripts/install-deps): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

pub(super) fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_json(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}
