//! The Grafana dashboard (deploy/grafana/oobfence-dashboard.json), by promtool: every query
//! parses once Grafana's variables are filled in, and the counts of the cluster's state are
//! not doubled by two `[ha]` instances of one datacenter (both serve them; only the leader's
//! count). Its variables pick a datacenter and that datacenter's daemons; it shows the leader,
//! the reload status, the token's and the certificates' expiry, and links to the runbook
//! (tests/doc_links.rs resolves those links).

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

use super::read;

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/oobfence-dashboard.json")).expect("dashboard JSON")
}

/// Every panel (rows' panels too), flattened.
fn panels(d: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    let mut todo: Vec<Value> = d["panels"].as_array().cloned().unwrap_or_default();
    while let Some(p) = todo.pop() {
        todo.extend(p["panels"].as_array().cloned().unwrap_or_default());
        out.push(p);
    }
    out
}

/// (panel title, query), annotations included.
fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((p["title"].as_str().unwrap_or("").to_string(), e.to_string()));
            }
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(e) = a["expr"].as_str() {
            out.push((format!("annotation {}", a["name"]), e.to_string()));
        }
    }
    out
}

/// A query as Prometheus receives it from Grafana: the two daemons `a` and `b` chosen.
fn filled(expr: &str) -> String {
    expr.replace("$job", "oobfence")
        .replace("$instance", "a:9464|b:9464")
        .replace("$datacenter", "dc1")
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "5m")
        .replace("$__range", "10m")
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool (Debian package prometheus; scripts/install-deps installs it)");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn two_ha_instances_of_a_datacenter_are_not_counted_twice() {
    let d = dashboard();
    let all = queries(&d);
    assert!(all.len() >= 20, "only {} queries", all.len());
    let by_title: BTreeMap<&str, &str> =
        all.iter().map(|(t, e)| (t.as_str(), e.as_str())).collect();

    let dir = tempfile::tempdir().unwrap();
    // Every query, as a recording rule: `promtool check rules` parses each one.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, e)) in all.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&filled(e)).unwrap()
        ));
    }
    let rules_file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&rules_file, &rules).unwrap();
    let (ok, out) = promtool(&["check", "rules", rules_file.to_str().unwrap()]);
    assert!(ok, "a dashboard query does not parse:\n{out}");

    // Two instances of dc1, `a` the leader, `b` the standby, both serving the same view of
    // the cluster: one fenced node, one blocked, two volumes held, one foreign taint, three
    // failing sources, five healthy nodes.
    let mut series = String::new();
    for (instance, leader) in [("a:9464", 1), ("b:9464", 0)] {
        let at = format!("job=\"oobfence\",instance=\"{instance}\"");
        for (name, labels, value) in [
            ("oobfence_leader", "datacenter=\"dc1\"", leader),
            ("oobfence_node_state", "node=\"n1\",state=\"fenced\"", 1),
            ("oobfence_blocked", "reason=\"power-on\"", 1),
            ("oobfence_fenced_volume_attachments", "node=\"n1\"", 2),
            (
                "oobfence_foreign_out_of_service_taints",
                "ready=\"true\"",
                1,
            ),
            (
                "oobfence_power_sources_failing",
                "backend=\"redfish\",error_kind=\"timeout\"",
                3,
            ),
            ("oobfence_nodes", "state=\"healthy\"", 5),
        ] {
            series.push_str(&format!(
                "      - series: {}\n        values: '{value}x20'\n",
                serde_json::to_string(&format!("{name}{{{at},{labels}}}")).unwrap()
            ));
        }
    }
    let mut expect = String::new();
    for (title, labels, value) in [
        ("Nodes fenced", "{}", 1),
        ("NotReady, not fenceable", "{}", 1),
        ("Volumes not released", "{}", 2),
        ("Foreign taints on Ready nodes", "{}", 1),
        ("BMCs failing", "{}", 3),
        ("Nodes by state", "{state=\"healthy\"}", 5),
        (
            "Writing instances per datacenter",
            "{datacenter=\"dc1\"}",
            1,
        ),
    ] {
        let expr = by_title
            .get(title)
            .unwrap_or_else(|| panic!("no panel {title:?}"));
        expect.push_str(&format!(
            "      - expr: {}\n        eval_time: 10m\n        exp_samples:\n          - labels: '{labels}'\n            value: {value}\n",
            serde_json::to_string(&filled(expr)).unwrap()
        ));
    }
    let test_file = dir.path().join("dashboard-test.yaml");
    std::fs::write(
        &test_file,
        format!(
            "rule_files:\n  - dashboard-rules.yaml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{series}    promql_expr_test:\n{expect}"
        ),
    )
    .unwrap();
    let (ok, out) = promtool(&["test", "rules", test_file.to_str().unwrap()]);
    assert!(
        ok,
        "with a leader and a standby of one datacenter, the dashboard counts differ from one instance's:\n{out}"
    );
}

#[test]
fn the_dashboard_picks_a_datacenter_and_shows_its_daemons_health() {
    let d = dashboard();
    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    let datacenter = vars.get("datacenter").expect("a datacenter variable");
    assert!(
        datacenter["definition"]
            .as_str()
            .unwrap()
            .contains("oobfence_config_info"),
        "the datacenters are those oobfence_config_info names"
    );
    let instance = vars.get("instance").expect("a daemon variable");
    assert!(
        instance["definition"]
            .as_str()
            .unwrap()
            .contains("datacenter=~\"$datacenter\""),
        "the daemons are those of the chosen datacenters"
    );
    assert!(
        instance.get("allValue").is_none(),
        "\"All\" daemons would be every daemon Prometheus scrapes with allValue {}",
        instance["allValue"]
    );

    let all = queries(&d);
    for (what, metric) in [
        ("the HA leader", "oobfence_leader"),
        ("reload status", "oobfence_config_last_reload_successful"),
        (
            "the kubeconfig token's expiry",
            "oobfence_kubeconfig_token_expiry_timestamp_seconds",
        ),
        (
            "the BMC certificates' expiry",
            "oobfence_bmc_certificate_expiry_timestamp_seconds",
        ),
        ("the config in force", "oobfence_config_info"),
    ] {
        assert!(
            all.iter().any(|(_, e)| e.contains(metric)),
            "no panel shows {what} ({metric})"
        );
    }

    // Runbook links: the dashboard's, and one per panel that has a runbook section.
    let mut links = Vec::new();
    for p in panels(&d).iter().chain(std::iter::once(&d)) {
        for l in p["links"].as_array().into_iter().flatten() {
            links.push(l["url"].as_str().unwrap_or_default().to_string());
        }
    }
    let runbook_links: Vec<&String> = links
        .iter()
        .filter(|u| u.starts_with("${runbook}/runbook.md"))
        .collect();
    assert!(
        runbook_links.len() >= 10,
        "runbook links: {runbook_links:?}"
    );
    for needed in [
        "#oobfencenoleader",
        "#oobfenceconfigreloadfailed",
        "#oobfencekubeconfigtokenexpiring",
        "#oobfencebmccertificateexpiring",
        "#stop-it-now-or-leave-one-node-alone",
    ] {
        assert!(
            runbook_links.iter().any(|u| u.ends_with(needed)),
            "no runbook link to {needed}"
        );
    }
}
