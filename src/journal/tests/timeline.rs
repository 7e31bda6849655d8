//! The daemon's change records as JSON, and the timeline: files across a rotation (plain and
//! gzip), the merge into time order, the node and time filters.

use std::io::Write as _;

use super::*;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn journal() -> Journal {
    let (tx, _rx) = mpsc::channel(1);
    Journal {
        tx,
        counts: counts(),
        datacenter: "dc1".into(),
        config_digest: "d1".into(),
    }
}

/// A record of `kind` about `node` at `ts`, with the reads it rests on.
fn rec(ts: &str, node: &str, kind: RecordKind, rule: &str, reads: &[(&str, &str)]) -> Record {
    let mut r = journal().record(
        node,
        "uid",
        kind,
        rule,
        Inputs {
            reads: reads
                .iter()
                .map(|(t, v)| ReadInput {
                    at: at(t),
                    value: v.to_string(),
                    raw: v.to_string(),
                    latency_seconds: 0.25,
                    details: vec![],
                    identity: String::new(),
                    reader: "redfish https://bmc-1".into(),
                    power_draw: None,
                })
                .collect(),
            ..Default::default()
        },
    );
    r.ts = at(ts);
    r.message = format!("{rule} said");
    if kind == RecordKind::Action {
        r.action = "taint".into();
        r.result = "success".into();
    }
    r
}

fn daemon(ts: &str, topic: Topic, result: &str) -> Record {
    let mut r = journal().daemon_record(
        topic,
        "",
        result,
        format!("{} {result}", topic.name()),
        Change::default(),
    );
    r.ts = at(ts);
    r
}

fn lines(records: &[Record]) -> String {
    records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect()
}

#[test]
fn a_daemon_record_round_trips_with_its_change() {
    let j = journal();
    let change = Change {
        by: vec!["file /etc/oobfence/dc1.paused: rewiring (paused by ana at 03:10)".into()],
        switch: pause_switch(&["file /etc/oobfence/dc1.paused: rewiring".into()]),
        ..Default::default()
    };
    let r = j.daemon_record(Topic::Pause, "", "began", "writes PAUSED".into(), change);
    let line = serde_json::to_string(&r).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["kind"], "daemon", "{line}");
    assert_eq!(v["rule"], "pause", "{line}");
    assert_eq!(v["result"], "began", "{line}");
    assert_eq!(v["change"]["switch"], "file", "{line}");
    // Fields a topic does not use are left out, not written as null.
    assert!(v["change"].get("digest_before").is_none(), "{line}");
    assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    assert!(RecordKind::Daemon.synced() && RecordKind::Action.synced());
    assert!(!RecordKind::Refusal.synced());

    let budget = Change {
        used: Some(2),
        limit: Some(3),
        ..Default::default()
    };
    assert_eq!(budget.left(), Some(1));
    assert_eq!(Change::default().left(), None);
    let both = [
        "file /x: a".to_string(),
        "ConfigMap oobfence/p annotation oobfence.io/paused=\"b\"".to_string(),
    ];
    assert_eq!(pause_switch(&both).as_deref(), Some("file+configmap"));
    assert_eq!(pause_switch(&both[1..]).as_deref(), Some("configmap"));
}

#[test]
fn a_record_of_an_older_version_still_reads() {
    // Written before daemon records existed: no `change`, and a reader must not need one.
    let old = r#"{"ts":"2026-11-01T03:00:00Z","datacenter":"dc1","node":"n1","kind":"action","rule":"confirmed-off","action":"taint","result":"success","message":"fenced","inputs":{"ready":"NotReady"},"config_digest":"d","version":"0.1.0"}"#;
    let r: Record = serde_json::from_str(old).unwrap();
    assert_eq!((r.kind, r.change), (RecordKind::Action, None));
}

#[test]
fn events_are_merged_in_time_order_with_each_read_once() {
    // As three files give them: each file in order, the files oldest first, but a record
    // made later may name a read from before an earlier record.
    let records = vec![
        rec(
            "2026-11-28T03:00:10Z",
            "n1",
            RecordKind::Refusal,
            "storm",
            &[("2026-11-28T03:00:05Z", "off")],
        ),
        daemon("2026-11-28T03:00:08Z", Topic::Storm, "began"),
        daemon("2026-11-28T03:01:00Z", Topic::Pause, "began"),
        rec(
            "2026-11-28T03:05:00Z",
            "n1",
            RecordKind::Action,
            "confirmed-off",
            &[
                ("2026-11-28T03:00:05Z", "off"),
                ("2026-11-28T03:04:58Z", "off"),
            ],
        ),
        rec(
            "2026-11-28T03:02:00Z",
            "n2",
            RecordKind::Refusal,
            "power-on",
            &[],
        ),
    ];
    let all = events(&records, &Filter::default());
    let story: Vec<String> = all
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e.ts.strftime("%M:%S"),
                e.node.as_deref().unwrap_or("-"),
                e.what
            )
        })
        .collect();
    assert_eq!(
        story,
        [
            "00:05 n1 power read off",
            "00:08 - storm began",
            "00:10 n1 refused",
            "01:00 - pause began",
            "02:00 n2 refused",
            "04:58 n1 power read off",
            "05:00 n1 taint success",
        ]
    );
    // A node's story keeps the datacenter's events, which explain it, and no other node's.
    let n1 = events(
        &records,
        &Filter {
            node: Some("n1".into()),
            ..Default::default()
        },
    );
    assert!(n1.iter().all(|e| e.node.as_deref() != Some("n2")));
    assert_eq!(n1.len(), 6);
    let late = events(
        &records,
        &Filter {
            since: Some(at("2026-11-28T03:01:30Z")),
            ..Default::default()
        },
    );
    assert_eq!(late.len(), 3, "{late:?}");
    assert!(late.iter().all(|e| e.ts >= at("2026-11-28T03:01:30Z")));

    // The node column as wide as the longest name, at least 8.
    assert_eq!(node_width(&all), 8);
    let text = render_line(&all[6], node_width(&all));
    assert!(
        text.starts_with("2026-11-28T03:05:00Z  n1       taint success ")
            && text.contains("taint success")
            && text.contains("[confirmed-off] confirmed-off said"),
        "{text}"
    );
    let datacenter = render_line(&all[1], 8);
    assert!(
        datacenter.contains("Z  -        storm began "),
        "{datacenter}"
    );
    let mut long = all[6].clone();
    long.node = Some("rack12-node-with-a-long-name-0042".into());
    let wide = node_width(&[long.clone(), all[1].clone()]);
    assert_eq!(wide, 33);
    assert!(render_line(&long, wide).contains("0042 taint success"));
    let json: serde_json::Value = serde_json::to_value(&all[0]).unwrap();
    assert_eq!(json["kind"], "read");
    assert_eq!(json["node"], "n1");
    assert!(
        json["reason"]
            .as_str()
            .unwrap()
            .contains("redfish https://bmc-1"),
        "{json}"
    );
}

#[test]
fn the_timeline_reads_across_rotated_files_plain_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dc1.journal.jsonl");
    let name = |suffix: &str| dir.path().join(format!("dc1.journal.jsonl{suffix}"));
    let oldest = [daemon("2026-11-28T01:00:00Z", Topic::Storm, "began")];
    let middle = [daemon("2026-11-28T02:00:00Z", Topic::Pause, "began")];
    let newest = [daemon("2026-11-28T03:00:00Z", Topic::Pause, "ended")];
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(name(".2.gz")).unwrap(),
        flate2::Compression::default(),
    );
    gz.write_all(lines(&oldest).as_bytes()).unwrap();
    gz.finish().unwrap();
    std::fs::write(name(".1"), lines(&middle)).unwrap();
    std::fs::write(&path, lines(&newest)).unwrap();
    // Not this journal's: another datacenter's, an editor's backup.
    std::fs::write(dir.path().join("dc10.journal.jsonl"), lines(&middle)).unwrap();
    std::fs::write(name(".bak"), lines(&middle)).unwrap();
    // Their times as logrotate leaves them: each last written before the next.
    let written = |suffix: &str, secs: u64| {
        let f = std::fs::File::options()
            .append(true)
            .open(name(suffix))
            .unwrap();
        f.set_modified(
            std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs),
        )
        .unwrap();
    };
    for (suffix, secs) in [(".2.gz", 100), (".1", 200), ("", 300)] {
        written(suffix, secs);
    }
    let t = timeline(&path, &Filter::default()).unwrap();
    let what: Vec<&str> = t.events.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(what, ["storm began", "pause began", "pause ended"]);
    assert_eq!(t.files.len(), 3, "{:?}", t.files);
    assert_eq!(t.unreadable, 0);

    // `why --records` goes on into the rotated files once the current one is exhausted.
    let mut older = rec(
        "2026-11-28T01:30:00Z",
        "n1",
        RecordKind::Refusal,
        "storm",
        &[],
    );
    std::fs::write(name(".1"), lines(&[older.clone()])).unwrap();
    older.ts = at("2026-11-28T03:30:00Z");
    older.rule = "power-on".into();
    std::fs::write(&path, lines(&[older])).unwrap();
    written(".1", 200);
    written("", 300);
    let tail2 = tail(&path, "n1", 2).unwrap();
    let rules: Vec<&str> = tail2.records.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(rules, ["storm", "power-on"]);
    assert_eq!(tail(&path, "n1", 1).unwrap().records.len(), 1);

    // The current file moved away and not written since: the rotated ones still tell.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(timeline(&path, &Filter::default()).unwrap().events.len(), 2);
    for f in ["dc1.journal.jsonl.1", "dc1.journal.jsonl.2.gz"] {
        std::fs::remove_file(dir.path().join(f)).unwrap();
    }
    let e = timeline(&path, &Filter::default()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
}

#[test]
fn since_takes_a_duration_back_or_a_time_and_names_what_it_wants() {
    let now = at("2026-11-28T05:00:00Z");
    assert_eq!(since("2h", now).unwrap(), at("2026-11-28T03:00:00Z"));
    assert_eq!(since("1d 30m", now).unwrap(), at("2026-11-27T04:30:00Z"));
    assert_eq!(
        since("2026-11-28T03:12:00Z", now).unwrap(),
        at("2026-11-28T03:12:00Z")
    );
    let e = since("yesterday", now).unwrap_err();
    assert!(
        e.contains("--since \"yesterday\"") && e.contains("2h"),
        "{e}"
    );
}
