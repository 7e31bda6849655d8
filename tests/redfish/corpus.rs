//! Captured replies of real BMCs (`tests/data/redfish`, see its SOURCES.md, and the ComputerSystem
//! samples of the `sushy` package), served over HTTPS by a test BMC and read through the real
//! reader with the test certificate pinned, On and Off: the state, and the identity (the
//! reported UUID first, with its other byte orders). Where a capture has a Systems collection
//! of one member the system is also found by discovery; one of several members is never
//! guessed.

use super::*;
use oobfence::identity::{NodeIdentity, uuid_forms_of_redfish_uuid, verify};
use support::corpus_bmc::CorpusBmc;

/// What a capture's Systems collection allows.
#[derive(Clone, Copy, Debug)]
enum Collection {
    /// None was captured: only `system` set to the path is read.
    NotCaptured,
    /// One member: discovery finds it.
    One,
    /// Several members: discovery refuses, naming them.
    Several(usize),
}

/// One captured BMC: its directory, its collection, and each system's path as an operator
/// would configure it with the UUID (as reported) and serial number it must read as.
struct Capture {
    dir: &'static str,
    collection: Collection,
    systems: &'static [(&'static str, Option<&'static str>, Option<&'static str>)],
}

const CAPTURES: &[Capture] = &[
    Capture {
        dir: "hpe-ilo4-bl460c-gen9",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/1/",
            Some("31333138-3839-5a43-3336-323946593842"),
            Some("CZ3629FY8B"),
        )],
    },
    Capture {
        dir: "dell-idrac8-m630",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/System.Embedded.1",
            Some("4c4c4544-0030-3510-8044-b9c04f434332"),
            Some("CN7016362D00JD"),
        )],
    },
    Capture {
        dir: "dell-idrac9-r6515",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/System.Embedded.1",
            Some("4c4c4544-0030-5210-8047-c6c04f5a4333"),
            Some("FOOBAR123"),
        )],
    },
    Capture {
        dir: "supermicro-x10dff-ctg",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/1",
            Some("00000000-0000-0000-0000-0cc47ab721c4"),
            None,
        )],
    },
    Capture {
        dir: "supermicro-x11-bigtwin",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/1",
            Some("00000000-0000-0000-0000-ac1f6bd39026"),
            Some("A328789X9101143"),
        )],
    },
    Capture {
        dir: "supermicro-x11-microcloud",
        collection: Collection::NotCaptured,
        systems: &[(
            "/redfish/v1/Systems/1",
            Some("48eb9200-be80-11e9-8000-3cecef22fc1a"),
            Some("E340538X1400702H"),
        )],
    },
    Capture {
        dir: "supermicro-h13-as1015cs",
        collection: Collection::One,
        systems: &[(
            "/redfish/v1/Systems/1",
            Some("ffd3b400-00de-11f1-8000-905a088166a9"),
            Some("E518845X6600399"),
        )],
    },
    Capture {
        dir: "lenovo-xcc-sr650",
        collection: Collection::One,
        systems: &[(
            "/redfish/v1/Systems/1",
            Some("92384634-2938-2342-8820-489239905423"),
            Some("J100ABCD"),
        )],
    },
    Capture {
        dir: "dmtf-public-bladed",
        collection: Collection::Several(4),
        systems: &[
            ("/redfish/v1/Systems/529QB9450R6", None, Some("529QB9450R6")),
            ("/redfish/v1/Systems/529QB9451R6", None, Some("529QB9451R6")),
        ],
    },
];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/redfish")
}

fn pinned_to(bmc: &CorpusBmc) -> String {
    format!("ca_file = \"{}\"", bmc.cert.display())
}

/// Reads `path` (or discovers it when `None`) On and then Off, and checks state and identity.
async fn read_both_ways(
    bmc: &mut CorpusBmc,
    path: Option<&str>,
    power_path: &str,
    uuid: Option<&str>,
    serial: Option<&str>,
    what: &str,
) {
    let extra = match path {
        Some(p) => format!("system = \"{p}\"\n{}", pinned_to(bmc)),
        None => pinned_to(bmc),
    };
    let entry = bmc_at(bmc.dir(), &bmc.base_url(), &extra);
    let src = source(&entry, "node-1");
    for (word, state) in [("On", PowerState::On), ("Off", PowerState::Off)] {
        bmc.set_power(power_path, word);
        let reply = src.read_reply().await;
        assert_eq!(reply.state, state, "{what}: {reply:?}");
        check_identity(&reply.identity, uuid, serial, what);
    }
    if path.is_none() {
        assert!(
            format!("{src:?}").contains(power_path.trim_end_matches('/')),
            "{what}: the discovered path is not kept: {src:?}"
        );
    }
}

fn check_identity(
    identity: &MachineIdentity,
    uuid: Option<&str>,
    serial: Option<&str>,
    what: &str,
) {
    match (uuid, identity) {
        (Some(uuid), MachineIdentity::SystemUuid { forms, serial: got }) => {
            assert_eq!(forms[0], uuid, "{what}: the reported form comes first");
            assert_eq!(
                Some(forms),
                uuid_forms_of_redfish_uuid(uuid).as_ref(),
                "{what}"
            );
            assert_eq!(got.as_deref(), serial, "{what}");
            // The Node that reports this UUID is matched, as reported; a Node that reports it
            // in another byte order is matched too, and the verdict says which. (A UUID whose
            // first three fields are zero, as Supermicro's MAC-based ones, is its own swapped
            // form: then the second form is the byte-reversed one.)
            let node = |u: &str| NodeIdentity {
                system_uuid: u.into(),
                ..NodeIdentity::default()
            };
            let v = verify(&node(uuid), identity);
            assert_eq!(
                v.detail(),
                format!("system UUID {uuid} (as reported)"),
                "{what}"
            );
            if forms.len() > 1 {
                let v = verify(&node(&forms[1]), identity);
                assert!(
                    v.is_match() && v.detail().contains(&format!("form of the reported {uuid}")),
                    "{what}: {v}"
                );
            }
        }
        (None, MachineIdentity::Unreported { reason }) => {
            assert!(reason.contains("no UUID"), "{what}: {reason}");
        }
        (_, other) => panic!("{what}: expected UUID {uuid:?}, read {other:?}"),
    }
}

/// HPE iLO 4 (ProLiant Gen9) names its system `#ComputerSystem.1.0.1.ComputerSystem`, the
/// Redfish 1.0 form, and writes `@odata.id` with a trailing slash. Before the 1.0 form was
/// accepted it was refused ("not a ComputerSystem"), so such a machine could never be fenced.
#[tokio::test]
async fn hpe_ilo4_gen9_reads_on_and_off() {
    let mut bmc = CorpusBmc::start();
    bmc.serve_tree(&corpus_dir().join("hpe-ilo4-bl460c-gen9"));
    read_both_ways(
        &mut bmc,
        Some("/redfish/v1/Systems/1/"),
        "/redfish/v1/Systems/1",
        Some("31333138-3839-5a43-3336-323946593842"),
        Some("CZ3629FY8B"),
        "iLO 4",
    )
    .await;
}

/// Every capture, each system by its path, On and Off; by discovery where the collection lists
/// one system; never by discovery where it lists several.
#[tokio::test]
async fn every_captured_reply_reads_right() {
    let mut bmc = CorpusBmc::start();
    let mut dirs: Vec<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    let mut listed: Vec<&str> = CAPTURES.iter().map(|c| c.dir).collect();
    listed.sort();
    assert_eq!(
        dirs, listed,
        "every capture directory is checked, and only those"
    );

    for capture in CAPTURES {
        let served = bmc.serve_tree(&corpus_dir().join(capture.dir));
        for (path, uuid, serial) in capture.systems {
            let what = format!("{} {path}", capture.dir);
            let bare = path.trim_end_matches('/');
            assert!(
                served.iter().any(|s| s == bare),
                "{what}: not in {served:?}"
            );
            read_both_ways(&mut bmc, Some(path), bare, *uuid, *serial, &what).await;
        }
        let has_collection = served.iter().any(|s| s == "/redfish/v1/Systems");
        match capture.collection {
            Collection::NotCaptured => assert!(!has_collection, "{}", capture.dir),
            Collection::One => {
                let (path, uuid, serial) = capture.systems[0];
                let what = format!("{} by discovery", capture.dir);
                read_both_ways(&mut bmc, None, path, uuid, serial, &what).await;
            }
            Collection::Several(n) => {
                let entry = bmc_at(bmc.dir(), &bmc.base_url(), &pinned_to(&bmc));
                let reply = source(&entry, "node-1").read_reply().await;
                let (kind, detail) = error_of(&reply.state);
                assert_eq!(kind, ReadErrorKind::BadReply, "{detail}");
                assert!(detail.contains(&format!("lists {n} systems")), "{detail}");
                assert!(detail.contains("set `system`"), "{detail}");
                for (path, _, _) in capture.systems {
                    assert!(detail.contains(path), "{path} not named in {detail}");
                }
                assert!(
                    matches!(reply.identity, MachineIdentity::Unreported { .. }),
                    "{:?}",
                    reply.identity
                );
            }
        }
    }
}

/// Every ComputerSystem sample of the `sushy` package, served at the path it names itself by,
/// read On and Off with `system` set to that path.
#[tokio::test]
async fn sushy_computer_systems_over_https() {
    let mut bmc = CorpusBmc::start();
    let root = super::vendor_samples::sushy_package_dir().join("tests");
    let mut files = Vec::new();
    super::vendor_samples::collect_json(&root, &mut files);
    files.sort();
    let mut read = 0;
    for file in &files {
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(file).unwrap())
        else {
            continue;
        };
        let Some(path) = doc.get("@odata.id").and_then(|i| i.as_str()) else {
            continue;
        };
        let powered = doc.get("PowerState").and_then(|p| p.as_str()).is_some();
        if !super::vendor_samples::is_computer_system(&doc) || !powered || path.contains(' ') {
            continue;
        }
        let uuid = doc
            .get("UUID")
            .and_then(|u| u.as_str())
            .map(str::to_lowercase);
        let serial = doc
            .get("SerialNumber")
            .and_then(|s| s.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty());
        bmc.serve(path, file);
        let what = file.display().to_string();
        read_both_ways(&mut bmc, Some(path), path, uuid.as_deref(), serial, &what).await;
        read += 1;
    }
    assert!(
        read >= 3,
        "only {read} sushy ComputerSystem samples were read"
    );
}

/// The test BMC itself: a capture is served byte for byte, and asking for a power state
/// changes that one value of the top-level `PowerState` and nothing else (iLO 4's compact reply
/// has a `"Power":"On"` beside it; the Dell reply has UUIDs and states nested in `Oem`).
#[tokio::test]
async fn the_test_bmc_changes_only_the_power_state() {
    let mut bmc = CorpusBmc::start();
    let entry = bmc_at(bmc.dir(), &bmc.base_url(), &pinned_to(&bmc));
    let client = oobfence::power::redfish::client_for(&entry).unwrap();
    let base = bmc.base_url();
    for (dir, path) in [
        ("hpe-ilo4-bl460c-gen9", "/redfish/v1/Systems/1"),
        ("dell-idrac9-r6515", "/redfish/v1/Systems/System.Embedded.1"),
        ("lenovo-xcc-sr650", "/redfish/v1/Systems/1"),
    ] {
        bmc.serve_tree(&corpus_dir().join(dir));
        let file = corpus_dir().join(dir).join(&path[1..]).join("index.json");
        let captured = std::fs::read(&file).unwrap();
        let get = |p: String| {
            let request = client.get(format!("{base}{p}"));
            async move {
                let response = request.send().await.unwrap();
                (response.status().as_u16(), response.bytes().await.unwrap())
            }
        };
        let (status, body) = get(path.to_string()).await;
        assert_eq!(status, 200, "{dir}");
        assert_eq!(&body[..], &captured[..], "{dir}: not served as captured");
        assert_eq!(
            get(format!("{path}/")).await.1,
            body,
            "{dir}: trailing slash"
        );

        bmc.set_power(path, "Off");
        let (_, off) = get(path.to_string()).await;
        assert_eq!(
            off.len(),
            captured.len() + 1,
            "{dir}: \"On\" became \"Off\""
        );
        let mut want: serde_json::Value = serde_json::from_slice(&captured).unwrap();
        want["PowerState"] = "Off".into();
        let got: serde_json::Value = serde_json::from_slice(&off).unwrap();
        assert_eq!(got, want, "{dir}");

        assert_eq!(get(format!("{path}/Nope")).await.0, 404, "{dir}");
        assert_eq!(get(format!("{path}?$expand=*")).await.0, 404, "{dir}");
    }
}
