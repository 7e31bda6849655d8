use super::*;
use crate::decision::Rule;

fn counts() -> Family<JournalLabels, Counter> {
    Family::default()
}

fn count(f: &Family<JournalLabels, Counter>, result: &'static str) -> u64 {
    f.get_or_create(&JournalLabels { result }).get()
}

fn sample(j: &Journal, node: &str, rule: &str) -> Record {
    let mut r = j.record(
        node,
        "uid-1",
        RecordKind::Action,
        rule,
        Inputs {
            ready: "NotReady".into(),
            reads: vec![ReadInput {
                at: Timestamp::now(),
                value: "off".into(),
                raw: "Off".into(),
                latency_seconds: 0.1,
                details: vec![],
                identity: "system UUID 4c4c4544-0038-4b10-8052-b4c04f4a4e32".into(),
                reader: "redfish https://bmc-07.mgmt".into(),
                power_draw: None,
            }],
            ..Default::default()
        },
    );
    r.action = "taint".into();
    r.result = "success".into();
    r.message = "fenced".into();
    r
}

#[tokio::test]
async fn appends_across_restarts_and_never_truncates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/dc.journal.jsonl");
    for round in 0..2 {
        let c = counts();
        let (j, w) = Journal::start(path.clone(), "dc", "digest", c.clone());
        j.submit_wait(&sample(&j, "n1", &format!("round-{round}")))
            .await;
        j.submit(&sample(&j, "n2", "other"));
        drop(j);
        w.finish(Duration::from_secs(5)).await;
        assert_eq!(count(&c, "written"), 2);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 4, "{text}");
    let t = tail(&path, "n1", 10).unwrap();
    let rules: Vec<_> = t.records.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(rules, ["round-0", "round-1"]);
    assert_eq!(t.records[0].inputs.reads[0].raw, "Off");
    // Who answered each read is kept: "gone" counts only through the reader that knew it.
    assert_eq!(
        t.records[0].inputs.reads[0].reader,
        "redfish https://bmc-07.mgmt"
    );
    assert_eq!(t.records[0].config_digest, "digest");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
}

#[tokio::test]
async fn a_torn_last_line_is_skipped_and_the_next_record_starts_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    std::fs::write(
        &path,
        "{\"ts\":\"2026-01-01T00:00:00Z\",\"node\":\"n1\",\"ki",
    )
    .unwrap();
    let (j, w) = Journal::start(path.clone(), "dc", "d", counts());
    j.submit_wait(&sample(&j, "n1", "after-tear")).await;
    drop(j);
    w.finish(Duration::from_secs(5)).await;
    let t = tail(&path, "n1", 5).unwrap();
    assert_eq!(t.unreadable, 1);
    assert_eq!(t.records.len(), 1);
    assert_eq!(t.records[0].rule, "after-tear");
}

#[tokio::test]
async fn a_rotated_file_is_replaced_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (j, w) = Journal::start(path.clone(), "dc", "d", counts());
    j.submit_wait(&sample(&j, "n1", "before")).await;
    // Wait until the first record is on disk, then rotate by rename.
    for _ in 0..100 {
        if std::fs::metadata(&path)
            .map(|m| m.len() > 0)
            .unwrap_or(false)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::rename(&path, dir.path().join("j.jsonl.1")).unwrap();
    j.submit_wait(&sample(&j, "n1", "after")).await;
    drop(j);
    w.finish(Duration::from_secs(5)).await;
    let old = tail(&dir.path().join("j.jsonl.1"), "n1", 5).unwrap();
    let new = tail(&path, "n1", 5).unwrap();
    assert_eq!(old.records.len(), 1);
    assert_eq!(old.records[0].rule, "before");
    // The file named in the config tells its own records, then the rotated one's.
    let rules: Vec<_> = new.records.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(rules, ["before", "after"]);
    assert_eq!(tail(&path, "n1", 1).unwrap().records[0].rule, "after");
}

#[tokio::test]
async fn an_unwritable_journal_is_counted_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: opening it for writing fails, even as root.
    let path = dir.path().join("is-a-dir");
    std::fs::create_dir(&path).unwrap();
    let c = counts();
    let (j, w) = Journal::start(path, "dc", "d", c.clone());
    j.submit_wait(&sample(&j, "n1", "x")).await;
    j.submit(&sample(&j, "n1", "y"));
    drop(j);
    w.finish(Duration::from_secs(5)).await;
    assert_eq!(count(&c, "failed"), 2);
    assert_eq!(count(&c, "written"), 0);
}

#[test]
fn a_refusal_holds_between_reads_and_ends_with_progress() {
    use Rule as R;
    let mut state = None;
    let mut starts = 0;
    for rule in [
        R::NotReadyGrace,
        R::AwaitingPowerRead,
        R::PowerUnknown,
        R::StalePowerRead,
        R::PowerUnknown,
        R::StalePowerRead,
        R::PowerUnknown,
    ] {
        let next = refusal(rule, state);
        if next.is_some() && next != state {
            starts += 1;
        }
        state = next;
    }
    assert_eq!(state, Some(R::PowerUnknown));
    assert_eq!(starts, 1, "one unreachable episode is one refusal");
    assert_eq!(refusal(R::PowerOn, state), Some(R::PowerOn));
    assert_eq!(refusal(R::ConfirmingOff, Some(R::PowerOn)), None);
    assert_eq!(refusal(R::NodeReady, Some(R::PowerOn)), None);
    assert_eq!(refusal(R::StalePowerRead, None), None);
}

#[test]
fn tail_keeps_only_the_newest_for_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (tx, _rx) = mpsc::channel(1);
    let j = Journal {
        tx,
        counts: counts(),
        datacenter: "dc".into(),
        config_digest: "d".into(),
    };
    let mut text = String::new();
    for i in 0..20 {
        let node = if i % 2 == 0 { "a" } else { "b" };
        text.push_str(&serde_json::to_string(&sample(&j, node, &format!("r{i}"))).unwrap());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    let t = tail(&path, "a", 3).unwrap();
    let rules: Vec<_> = t.records.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(rules, ["r14", "r16", "r18"]);
    assert!(!t.truncated_scan);
    let shown = render(&t.records);
    assert!(shown.contains("taint success"), "{shown}");
    assert!(shown.contains("rule r18"), "{shown}");
    assert!(shown.contains("Off (0.10s)"), "{shown}");
}

/// One journal line as the daemon writes it, for the fuzz test to mutate.
const FUZZ_LINE: &str = r#"{"ts":"2026-11-23T12:08:39Z","datacenter":"dc1","node":"rack1-02","uid":"u-1","kind":"action","event":"OobfenceFenced","rule":"confirmed-off","action":"taint","result":"success","message":"fenced","inputs":{"ready":"NotReady","not_ready_since":"2026-11-23T12:08:23Z","lease_renewed":"2026-11-23T12:08:01Z","boot_id":"boot-1","reads":[{"at":"2026-11-23T12:08:33Z","value":"off","raw":"Off","latency_seconds":0.02,"identity":"system UUID 0"}]},"config_digest":"ab","version":"0.1.0"}"#;

proptest::proptest! {
    #![proptest_config(crate::fuzz::config())]

    /// A torn, foreign or corrupted journal line: never a panic, neither parsing it nor
    /// rendering it for `why`.
    #[test]
    fn fuzz_journal_lines(line in crate::fuzz::text_like(FUZZ_LINE)) {
        if let Ok(r) = serde_json::from_str::<Record>(&line) {
            let _ = render(&[r]);
        }
    }
}

mod timeline;
