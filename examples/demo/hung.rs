//! The demo's hung node (opt-in actuation): its kubelet goes silent while the machine stays
//! On. oobfence waits `[actuation] after`, powers the machine off through its BMC, fences it
//! on its Off reads, powers it on again, and lifts the fence when it boots. Followed as
//! oobfence reports it and as the cluster and the BMC show it, and printed as a timeline.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::Clock;
use super::support;
use support::k8s::FakeNode;
use support::sushy::SushyEmulator;

/// One hung node, followed from the kubelet's silence to the fence lifted.
pub(super) struct Hang<'a> {
    pub(super) clock: &'a Clock,
    pub(super) http: &'a reqwest::Client,
    pub(super) listen: &'a str,
    pub(super) emu: &'a SushyEmulator,
    pub(super) alive: &'a Mutex<HashSet<usize>>,
    pub(super) boots: &'a Mutex<Vec<String>>,
}

const NOT_READY: &str = "NotReady (kube-controller-manager)";
const WAITING: &str = "oobfence: machine On, kubelet silent: waiting [actuation] after";
const POWER_OFF: &str = "power-off recorded and sent (Redfish ForceOff)";
const READS_OFF: &str = "the BMC reads Off";
const TAINTED: &str = "out-of-service taint written";
const POWER_ON: &str = "power-on recorded and sent (Redfish On)";
const READS_ON: &str = "the BMC reads On: the machine boots (bootID boot-2)";
const READY: &str = "Ready again, new bootID";
const UNFENCED: &str = "fence lifted (taint and records removed)";

impl Hang<'_> {
    /// Silences machine `i`'s kubelet (the machine stays On) and follows its node until the
    /// fence is lifted, or `limit`. Whether every step was seen.
    pub(super) async fn run(&self, node: &FakeNode, i: usize, after: Duration) -> bool {
        self.clock.say(&format!(
            "=== {}: kernel hang: its kubelet goes silent, the machine stays On ===",
            node.name
        ));
        let silent = Instant::now();
        self.alive.lock().await.remove(&i);
        let mut steps: Vec<(f64, &'static str)> = Vec::new();
        // Notes a step the first time it is seen; whether it is new.
        fn note(steps: &mut Vec<(f64, &'static str)>, at: f64, step: &'static str) -> bool {
            let new = !steps.iter().any(|(_, s)| *s == step);
            if new {
                steps.push((at, step));
            }
            new
        }
        let limit = after + Duration::from_secs(180);
        let mut last = String::new();
        let mut booted = false;
        while silent.elapsed() < limit {
            let at = silent.elapsed().as_secs_f64();
            let report = async {
                let r = self
                    .http
                    .get(format!("http://{}/nodes/{}", self.listen, node.name))
                    .send()
                    .await
                    .ok()?;
                r.json::<serde_json::Value>().await.ok()
            };
            let Some(v) = report.await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let rule = v["rule"].as_str().unwrap_or("?").to_string();
            let ready = v["ready"].as_str().unwrap_or("?").to_string();
            if rule != last {
                last = rule.clone();
                self.clock.say(&format!(
                    "{}: Ready={ready} state={} rule={rule}: {}",
                    node.name,
                    v["state"].as_str().unwrap_or("?"),
                    v["reason"].as_str().unwrap_or("")
                ));
            }
            if ready == "NotReady" {
                note(&mut steps, at, NOT_READY);
            }
            if rule == "waiting-to-actuate" {
                note(&mut steps, at, WAITING);
            }
            let n = node.try_get().await;
            let annotation = |key: &str| {
                n.as_ref()
                    .and_then(|n| support::k8s::annotation(n, key))
                    .is_some()
            };
            if annotation(oobfence::cluster::ANNOTATION_POWERED_OFF_AT) {
                note(&mut steps, at, POWER_OFF);
            }
            if annotation(oobfence::cluster::ANNOTATION_POWERED_ON_AT) {
                note(&mut steps, at, POWER_ON);
            }
            let tainted = n.as_ref().is_some_and(FakeNode::has_oos_taint);
            if tainted && note(&mut steps, at, TAINTED) {
                self.clock
                    .say(&format!("{}: FENCED (out-of-service taint)", node.name));
            }
            let power = self.emu.power(i).await;
            if power == "Off" && note(&mut steps, at, READS_OFF) {
                self.clock.say(&format!(
                    "{}: the BMC reads Off: powered off by oobfence",
                    node.name
                ));
            }
            let was_off = steps.iter().any(|(_, s)| *s == READS_OFF);
            if power == "On" && was_off && !booted {
                note(&mut steps, at, READS_ON);
                booted = true;
                // The machine boots: its kubelet comes back with a new bootID.
                self.boots.lock().await[i] = "boot-2".into();
                self.alive.lock().await.insert(i);
            }
            if booted && ready == "Ready" {
                note(&mut steps, at, READY);
            }
            if booted && !tainted && steps.iter().any(|(_, s)| *s == TAINTED) {
                note(&mut steps, at, UNFENCED);
                self.clock.say(&format!("{}: UNFENCED", node.name));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        steps.sort_by(|a, b| a.0.total_cmp(&b.0));
        println!(
            "\ntimeline of {}, seconds from its kubelet's silence ([actuation] after = {}s; this control plane's node-monitor grace is 20 s):",
            node.name,
            after.as_secs()
        );
        println!(
            "  {:+6.1}s  kubelet silent, machine On (a hung kernel)",
            0.0
        );
        for (t, step) in &steps {
            println!("  {t:+6.1}s  {step}");
        }
        let at = |step: &str| steps.iter().find(|(_, s)| *s == step).map(|(t, _)| *t);
        if let (Some(nr), Some(off)) = (at(NOT_READY), at(POWER_OFF)) {
            println!("NotReady -> power-off {:.1} s", off - nr);
        }
        if let (Some(off), Some(taint)) = (at(POWER_OFF), at(TAINTED)) {
            println!(
                "power-off -> taint {:.1} s (the machine read Off on two fresh reads 5 s apart)",
                taint - off
            );
        }
        if let (Some(taint), Some(back)) = (at(TAINTED), at(UNFENCED)) {
            println!(
                "taint -> fence lifted {:.1} s (power-on, boot, Ready on a new bootID)",
                back - taint
            );
        }
        println!();
        [
            NOT_READY, WAITING, POWER_OFF, READS_OFF, TAINTED, POWER_ON, UNFENCED,
        ]
        .iter()
        .all(|s| at(s).is_some())
    }
}
