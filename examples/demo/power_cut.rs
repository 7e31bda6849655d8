//! The demo's power cuts: one followed from the cut to the pod gone, as oobfence reports it
//! and as the cluster shows it, and printed as a timeline.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::Clock;
use super::support;
use support::k8s::{FakeNode, taints};
use support::sushy::SushyEmulator;

/// The pod of machine `i`'s node.
pub(super) fn db_pod(i: usize) -> String {
    format!("db-{i}")
}

/// One power cut, followed from the cut to the pod gone and printed as a timeline.
pub(super) struct PowerCut<'a> {
    pub(super) clock: &'a Clock,
    pub(super) http: &'a reqwest::Client,
    pub(super) listen: &'a str,
    pub(super) client: &'a kube::Client,
    pub(super) emu: &'a SushyEmulator,
    pub(super) alive: &'a Mutex<HashSet<usize>>,
}

impl PowerCut<'_> {
    /// Cuts machine `i`'s power and silences its kubelet; follows the node until it is fenced,
    /// then until it is NotReady and its pod gone (or 40 s more). Whether oobfence released
    /// the pod.
    pub(super) async fn run(&self, node: &FakeNode, i: usize, setting: &str) -> bool {
        self.clock.say(&format!(
            "=== {}: power cut (Redfish ForceOff); its kubelet goes silent ===",
            node.name
        ));
        let cut = Instant::now();
        let cut_wall = jiff::Timestamp::now();
        self.emu.set_power(i, false).await;
        self.alive.lock().await.remove(&i);
        let mut timeline = Timeline::default();
        let fenced = follow(
            self.clock,
            self.http,
            self.listen,
            self.client,
            &node.name,
            "fenced-awaiting-recovery",
            Duration::from_secs(150),
            Some((cut, &mut timeline)),
        )
        .await
        .expect("the node was not fenced within 150 s of the power cut: see the oobfence log");
        let t: Vec<String> = taints(&fenced)
            .iter()
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.clone().unwrap_or_default(),
                    t.effect
                )
            })
            .collect();
        self.clock.say(&format!(
            "{}: FENCED — taints now: {}",
            node.name,
            t.join(", ")
        ));
        // On to NotReady and the pod gone, whichever comes last.
        let pod = db_pod(i);
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), support::k8s::NAMESPACE);
        let until = Instant::now() + Duration::from_secs(40);
        while Instant::now() < until
            && (timeline.at(NOT_READY).is_none() || timeline.at(POD_GONE).is_none())
        {
            let at = cut.elapsed().as_secs_f64();
            if let Some(n) = node.try_get().await
                && support::k8s::ready_condition_of(&n).is_some_and(|c| c.status != "True")
            {
                timeline.note(at, NOT_READY);
            }
            if pods.get_opt(&pod).await.ok().flatten().is_none() {
                timeline.note(at, POD_GONE);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let renewed = node
            .lease_renew_time()
            .await
            .map(|t| t.duration_since(cut_wall).as_secs_f64());
        timeline.print(&node.name, setting, renewed);
        support::k8s::force_delete_pod(self.client, &pod).await;
        timeline.at(POD_GONE).is_some()
    }
}

/// The steps from a power cut to the pod gone, each when first seen.
#[derive(Default)]
pub(super) struct Timeline {
    steps: Vec<(f64, &'static str)>,
}

impl Timeline {
    fn note(&mut self, at: f64, step: &'static str) {
        if !self.steps.iter().any(|(_, s)| *s == step) {
            self.steps.push((at, step));
        }
    }

    fn at(&self, step: &str) -> Option<f64> {
        self.steps.iter().find(|(_, s)| *s == step).map(|(t, _)| *t)
    }

    fn print(&self, node: &str, setting: &str, last_renewal: Option<f64>) {
        println!(
            "\ntimeline of {node}, seconds from the power cut (example config defaults, {setting}; this control plane's node-monitor grace is 20 s, its kubelets' Leases 20 s):"
        );
        let mut steps = self.steps.clone();
        if let Some(r) = last_renewal {
            steps.push((r, "last Lease renewal by the kubelet"));
        }
        steps.push((0.0, "power cut"));
        steps.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (t, step) in &steps {
            println!("  {t:+6.1}s  {step}");
        }
        let Some(taint) = self.at(TAINTED) else {
            return;
        };
        let after_not_ready = self.at(NOT_READY).map(|n| taint - n);
        println!(
            "power cut -> taint {taint:.1} s{}",
            after_not_ready
                .map(|d| format!(" (NotReady -> taint {d:+.1} s)"))
                .unwrap_or_default()
        );
        if after_not_ready.is_some_and(|d| d < 0.0) {
            println!(
                "the fence came before NotReady: the power was proven off while the node still showed Ready"
            );
        } else if self.at(ATTESTED).is_some() || after_not_ready.is_some_and(|d| d < 60.0) {
            println!(
                "not_ready_grace (60 s) was not waited: the power was attested while the Lease went stale"
            );
        }
        match self.at(POD_GONE) {
            Some(gone) => println!(
                "taint -> pod gone {:.1} s (force-deleted by oobfence): on a control plane >= 1.26 the attach/detach controller detaches its volume about a tenth of a second later",
                gone - taint
            ),
            None => println!(
                "pod not gone: this demo's 1.20 control plane deletes nothing for an out-of-service node; >= 1.26 force-deletes it at the pod garbage collector's next 20 s tick after NotReady, then detaches the volume"
            ),
        }
        println!();
    }
}

const AHEAD: &str = "Lease stale: oobfence reads power ahead of NotReady";
const ATTESTED: &str = "power attested Off, node still Ready";
const NOT_READY: &str = "NotReady (kube-controller-manager)";
const TAINTED: &str = "out-of-service taint written";
const POD_GONE: &str = "the node's pod gone";

/// Prints each change in oobfence's view of `name` (rule, or a new power read) until its
/// rule is `until`; returns the Node as it is then. With a timeline, notes each step of the
/// way from the power cut at `cut`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn follow(
    clock: &Clock,
    http: &reqwest::Client,
    listen: &str,
    client: &kube::Client,
    name: &str,
    until: &str,
    limit: Duration,
    mut timeline: Option<(Instant, &mut Timeline)>,
) -> Option<k8s_openapi::api::core::v1::Node> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        let report = async {
            let r = http
                .get(format!("http://{listen}/nodes/{name}"))
                .send()
                .await
                .ok()?;
            r.json::<serde_json::Value>().await.ok()
        };
        if let Some(v) = report.await {
            let reads = v["reads"].as_array().cloned().unwrap_or_default();
            let key = format!("{}/{}/{}", v["rule"], v["ready"], reads.len());
            let rule = v["rule"].as_str().unwrap_or("?");
            if let Some((cut, t)) = &mut timeline {
                let at = cut.elapsed().as_secs_f64();
                let ready = v["ready"].as_str();
                if ready == Some("NotReady") {
                    t.note(at, NOT_READY);
                }
                match (ready, rule) {
                    (Some("Ready"), "node-ready") => {}
                    (Some("Ready"), "pre-attested" | "confirmed-off") => {
                        t.note(at, AHEAD);
                        t.note(at, ATTESTED);
                    }
                    (_, "fenced-awaiting-recovery") => {
                        // Released at attestation: proven off at the latest when fenced.
                        if ready == Some("Ready") {
                            t.note(at, ATTESTED);
                        }
                        t.note(at, TAINTED);
                    }
                    (Some("Ready"), _) => t.note(at, AHEAD),
                    _ => {}
                }
            }
            if key != last {
                last = key;
                clock.say(&format!(
                    "{name}: Ready={} state={} rule={}: {}",
                    v["ready"].as_str().unwrap_or("?"),
                    v["state"].as_str().unwrap_or("?"),
                    rule,
                    v["reason"].as_str().unwrap_or("")
                ));
                if let Some(r) = reads.last() {
                    println!(
                        "           {name}:   newest power read: {} ({:.3}s)",
                        r["value"].as_str().unwrap_or("?"),
                        r["latency_seconds"].as_f64().unwrap_or(0.0)
                    );
                }
            }
            if rule == until {
                let api: kube::Api<k8s_openapi::api::core::v1::Node> =
                    kube::Api::all(client.clone());
                return api.get(name).await.ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}
