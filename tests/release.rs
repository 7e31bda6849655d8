//! A release people can install: the version in one place (Cargo.toml) and everything that
//! names it agreeing with it, the LICENSE every package ships, CHANGELOG.md with upgrade notes
//! per release; the OCI image run once against the test control plane (`release/image.rs`);
//! deploy/management-cluster built by kubectl's kustomize and accepted by the API server in a
//! server-side dry run (`release/deploy.rs`); the Grafana dashboard through promtool
//! (`release/dashboard.rs`).

mod support;

#[path = "release/dashboard.rs"]
mod dashboard;
#[path = "release/deploy.rs"]
mod deploy;
#[path = "release/image.rs"]
mod image;

use std::path::PathBuf;
use std::process::Command;

/// The version every artefact must carry: Cargo.toml's.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The releases CHANGELOG.md lists, newest first: (version, date, the section's text).
fn changelog_releases(text: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    let mut current: Option<(String, String, String)> = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            out.extend(current.take());
            let Some(rest) = heading.strip_prefix('[') else {
                panic!("CHANGELOG.md: a release heading is `## [X.Y.Z] - YYYY-MM-DD`: {line}")
            };
            let (version, date) = rest.split_once(']').expect("`]` closes the version");
            if version == "Unreleased" {
                continue;
            }
            let date = date.trim_start_matches(" - ").to_string();
            current = Some((version.to_string(), date, String::new()));
        } else if let Some((_, _, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out.extend(current);
    out
}

fn semver(v: &str) -> (u64, u64, u64) {
    let parts: Vec<u64> = v
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("version {v} is not X.Y.Z"))
        })
        .collect();
    assert_eq!(parts.len(), 3, "version {v} is not X.Y.Z");
    (parts[0], parts[1], parts[2])
}

#[test]
fn every_artefact_carries_cargo_tomls_version() {
    let mut wrong = Vec::new();

    let out = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .arg("--version")
        .output()
        .expect("run oobfence --version");
    let said = String::from_utf8_lossy(&out.stdout);
    if !said.starts_with(&format!("oobfence {VERSION} (")) {
        wrong.push(format!("oobfence --version says {said:?}"));
    }

    let deb = read("packaging/changelog");
    let top = deb.lines().next().unwrap_or_default();
    if !top.starts_with(&format!("oobfence ({VERSION}-1) ")) {
        wrong.push(format!("packaging/changelog's top entry is {top:?}"));
    }

    let spec = read("packaging/rpm/oobfence.spec");
    let rpm_top = spec
        .lines()
        .skip_while(|l| l.trim() != "%changelog")
        .nth(1)
        .unwrap_or_default();
    if !rpm_top.ends_with(&format!(" - {VERSION}-1")) {
        wrong.push(format!("the RPM's %changelog begins {rpm_top:?}"));
    }

    let releases = changelog_releases(&read("CHANGELOG.md"));
    match releases.first() {
        Some((v, _, _)) if v == VERSION => {}
        other => wrong.push(format!(
            "CHANGELOG.md's newest release is {:?}",
            other.map(|r| &r.0)
        )),
    }

    let kustomization = read("deploy/management-cluster/kustomization.yaml");
    if !kustomization
        .lines()
        .any(|l| l.trim() == format!("newTag: {VERSION}"))
    {
        wrong.push("deploy/management-cluster/kustomization.yaml's image tag".to_string());
    }

    // The package names the install page shows.
    let install = read("docs/install.md");
    for name in install.split(|c: char| c.is_whitespace() || c == '`' || c == '/') {
        let Some(rest) = name
            .strip_prefix("oobfence_")
            .or_else(|| name.strip_prefix("oobfence-"))
        else {
            continue;
        };
        let Some(version) = rest.split(['-', '_']).next() else {
            continue;
        };
        if version.starts_with(|c: char| c.is_ascii_digit()) && version != VERSION {
            wrong.push(format!("docs/install.md names {name}"));
        }
    }

    assert!(
        wrong.is_empty(),
        "Cargo.toml says {VERSION}; these disagree (bump them with it):\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_changelog_keeps_every_release_with_its_upgrade_notes() {
    let releases = changelog_releases(&read("CHANGELOG.md"));
    assert!(releases.len() >= 2, "CHANGELOG.md lists {releases:?}");
    for pair in releases.windows(2) {
        assert!(
            semver(&pair[0].0) > semver(&pair[1].0) && pair[0].1 >= pair[1].1,
            "CHANGELOG.md: newest first, {} ({}) before {} ({})",
            pair[0].0,
            pair[0].1,
            pair[1].0,
            pair[1].1
        );
    }
    for (version, date, body) in &releases {
        assert!(
            date.parse::<jiff::civil::Date>().is_ok(),
            "CHANGELOG.md: release {version}'s date {date:?} is not YYYY-MM-DD"
        );
        assert!(
            body.contains("### Added")
                || body.contains("### Changed")
                || body.contains("### Fixed"),
            "CHANGELOG.md: release {version} says nothing of what changed"
        );
    }
    // Every release after the first tells an upgrading operator what changed meaning.
    for (version, _, body) in &releases[..releases.len() - 1] {
        assert!(
            body.contains("### Upgrade notes\n\n- "),
            "CHANGELOG.md: release {version} has no `### Upgrade notes` list"
        );
    }
    // The notes this release owes: keys whose meaning or default changed.
    let notes = &releases[0].2;
    for key in [
        "release_at_attestation",
        "level",
        "fence-agent",
        "deploy/rbac.yaml",
    ] {
        assert!(
            notes.contains(key),
            "CHANGELOG.md {VERSION}: no upgrade note on {key}"
        );
    }
}

#[test]
fn the_license_is_the_whole_apache_2_text() {
    let cargo: toml::Table = read("Cargo.toml").parse().expect("Cargo.toml");
    assert_eq!(cargo["package"]["license"].as_str(), Some("Apache-2.0"));
    let license = read("LICENSE");
    assert!(
        license.trim_start().starts_with("Apache License")
            && license.contains("Version 2.0, January 2004"),
        "LICENSE does not open as the Apache License 2.0"
    );
    for section in [
        "1. Definitions.",
        "2. Grant of Copyright License.",
        "3. Grant of Patent License.",
        "4. Redistribution.",
        "5. Submission of Contributions.",
        "6. Trademarks.",
        "7. Disclaimer of Warranty.",
        "8. Limitation of Liability.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ] {
        assert!(license.contains(section), "LICENSE lacks {section:?}");
    }
    // The .deb's copyright file (Debian's machine-readable format) names the common licence,
    // as Debian asks, and that is LICENSE's text.
    let deb = &cargo["package"]["metadata"]["deb"];
    assert_eq!(
        deb["license-file"].as_array().and_then(|a| a[0].as_str()),
        Some("packaging/debian/copyright"),
        "[package.metadata.deb] license-file"
    );
    let copyright = read("packaging/debian/copyright");
    assert!(
        copyright.contains("License: Apache-2.0\n")
            && copyright.contains("/usr/share/common-licenses/Apache-2.0"),
        "packaging/debian/copyright names Apache-2.0 and Debian's copy of it"
    );
    let common = std::path::Path::new("/usr/share/common-licenses/Apache-2.0");
    if common.exists() {
        assert_eq!(
            std::fs::read_to_string(common).unwrap().trim_end(),
            license.trim_end(),
            "LICENSE is the text Debian's copyright file refers to"
        );
    }
}

#[test]
fn the_man_page_names_the_changelog_and_its_upgrade_notes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oobfence"))
        .args(["man", "--output"])
        .arg(dir.path())
        .output()
        .expect("run oobfence man");
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(dir.path().join("oobfence.1")).unwrap();
    assert!(
        page.contains("CHANGELOG.md (every release, with its upgrade notes)"),
        "oobfence(1) FILES names /usr/share/doc/oobfence/CHANGELOG.md"
    );
}
