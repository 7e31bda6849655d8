//! The `[ha]` handover: two hosts, one actor, the leader killed mid-storm and then
//! partitioned.

use super::*;

/// One `oobfence run` of an `[ha]` pair, as its own process (so that it can be SIGKILLed),
/// reaching the API server through its own [`Gate`] (so that it can be cut off).
pub(super) struct HaInstance {
    pub(super) identity: &'static str,
    pub(super) listen: String,
    pub(super) gate: Gate,
    pub(super) config: std::path::PathBuf,
    pub(super) child: Option<tokio::process::Child>,
    pub(super) log: std::path::PathBuf,
}

/// The namespace of a scenario's `[ha]` Lease (named after its group), created for it.
pub(super) async fn lease_namespace(s: &Scenario) -> Api<Namespace> {
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": s.group}})).unwrap(),
        )
        .await
        .expect("create the Lease's namespace");
    namespaces
}

/// A scenario's two `[ha]` hosts: host-a started and leading, then host-b started beside it.
pub(super) async fn leader_and_standby(s: &Scenario) -> (HaInstance, HaInstance) {
    let mut host_a = HaInstance::new(s, "host-a", &s.group).await;
    let mut host_b = HaInstance::new(s, "host-b", &s.group).await;
    host_a.start().await;
    host_a.wait_leader(1.0, EVENT_BOUND).await;
    host_b.start().await;
    (host_a, host_b)
}

impl HaInstance {
    pub(super) async fn new(s: &Scenario, identity: &'static str, namespace: &str) -> HaInstance {
        HaInstance::named(s, identity, identity, namespace).await
    }

    /// An instance whose files live in `dir` (two hosts may share one identity).
    pub(super) async fn named(
        s: &Scenario,
        dir: &str,
        identity: &'static str,
        namespace: &str,
    ) -> HaInstance {
        let dir = s.dir().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (gate, kubeconfig) = gated_kubeconfig(&dir).await;
        let listen = format!("127.0.0.1:{}", support::k8s::free_port());
        let ha = format!(
            "[ha]\nenabled = true\nnamespace = \"{namespace}\"\nidentity = \"{identity}\"\nlease_duration = \"9s\"\nrenew_interval = \"1s\"\n"
        );
        let config = dir.join("dc.toml");
        std::fs::write(&config, s.config_text(&kubeconfig, &listen, &ha)).unwrap();
        HaInstance {
            identity,
            listen,
            gate,
            config,
            child: None,
            log: dir.join("oobfence.log"),
        }
    }

    pub(super) async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_oobfence"))
                .args(["run", "--config"])
                .arg(&self.config)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .expect("start oobfence run"),
        );
        let url = format!("http://{}/readyz", self.listen);
        // Liveness only: ready once its first lists are in, which a loaded test API server
        // (the whole matrix at once) can take tens of seconds to answer.
        wait_for(&format!("{} ready", self.identity), EVENT_BOUND, || async {
            reqwest::get(&url)
                .await
                .ok()?
                .status()
                .is_success()
                .then_some(())
        })
        .await;
    }

    /// SIGKILL: no shutdown, no Lease released.
    pub(super) async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    pub(super) async fn leader(&self) -> Option<f64> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let m = match client
            .get(format!("http://{}/metrics", self.listen))
            .send()
            .await
        {
            Ok(r) => r.text().await.ok()?,
            Err(e) => {
                report(&format!(
                    "fault matrix: [ha] {} /metrics: {e}",
                    self.identity
                ));
                return None;
            }
        };
        sample(&m, "oobfence_leader{datacenter=\"test\"}")
    }

    pub(super) async fn report(&self, node: &str) -> Option<serde_json::Value> {
        reqwest::get(format!("http://{}/nodes/{node}", self.listen))
            .await
            .ok()?
            .json()
            .await
            .ok()
    }

    pub(super) async fn wait_leader(&self, want: f64, limit: Duration) -> Instant {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.leader().await == Some(want) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "{} never reached leader = {want} within {limit:?}; its log ends:\n{}",
            self.identity,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// Samples both instances for `during`: never both writing at once.
pub(super) async fn never_two_leaders(a: &HaInstance, b: &HaInstance, during: Duration) {
    let start = Instant::now();
    while start.elapsed() < during {
        let (la, lb) = (a.leader().await, b.leader().await);
        assert!(!(la == Some(1.0) && lb == Some(1.0)), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn fenced_by(n: &Node) -> String {
    n.annotations()
        .get("oobfence.io/fenced-by")
        .cloned()
        .unwrap_or_default()
}

/// Two management hosts, one actor. Host a leads; a storm of three dead nodes begins and a
/// is SIGKILLed after its first fence: b takes over within the lease and the margin, fences
/// the rest, and no node is written twice. Then a comes back (standby, and `why` answers
/// there); b is cut off from the API server: b stops writing by its own clock before a can
/// take the Lease, a takes over and fences the next dead node, and lifts b's and its own
/// earlier fence when that node comes back: no fence is orphaned.
pub(super) fn two_hosts_one_actor() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-ha", 5).await;
        let namespaces = lease_namespace(&s).await;
        let mut nodes = Vec::new();
        let mut alive = Vec::new();
        for (i, suffix) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let n = s.node(suffix, i).await;
            alive.push(Some(FakeNode::keep_alive(&[&n], FIRST_BOOT)));
            nodes.push(n);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let (mut host_a, mut host_b) = leader_and_standby(&s).await;
        never_two_leaders(&host_a, &host_b, Duration::from_secs(3)).await;
        // The standby answers `why`: the node, and that it does not write.
        let r = host_b.report(&nodes[4].name).await.unwrap();
        assert!(
            r["holds"]
                .to_string()
                .contains("standby: host-a holds the Lease"),
            "{r}"
        );

        // The storm: machines 0-2 lose power; a is killed after its first fence.
        let emu = s.redfish_emulator();
        for i in 0..3 {
            emu.set_power(i, false).await;
        }
        for i in 0..3 {
            emu.wait_power(i, "Off", EVENT_BOUND).await;
        }
        for i in 0..3 {
            alive[i] = None;
            nodes[i].die(FIRST_BOOT).await;
        }
        let first = wait_for("a first fence", EVENT_BOUND, || async {
            for n in &nodes[..3] {
                let node = n.get().await;
                if FakeNode::has_oos_taint(&node) {
                    return Some(node);
                }
            }
            None
        })
        .await;
        assert!(
            fenced_by(&first).starts_with("oobfence/test@ha/host-a#"),
            "{}",
            fenced_by(&first)
        );
        let killed = Instant::now();
        host_a.kill().await;
        // Lease duration (9 s) plus the time to observe it: ~10 s on an idle machine; the
        // bound leaves room for a loaded one.
        let took_over = host_b.wait_leader(1.0, EVENT_BOUND).await;
        let takeover = took_over - killed;
        for n in &nodes[..3] {
            wait_taint(n, EVENT_BOUND).await;
        }
        // The new leader's fence budget counts its predecessor's fences too.
        wait_for(
            "b's budget counts all three fences",
            EVENT_BOUND,
            || async {
                let m = reqwest::get(format!("http://{}/metrics", host_b.listen))
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                (sample(&m, "oobfence_fence_budget_used") == Some(3.0)).then_some(())
            },
        )
        .await;

        // a comes back as standby; b is cut off from the API server.
        host_a.start().await;
        never_two_leaders(&host_a, &host_b, Duration::from_secs(3)).await;
        // Under load the leader may miss a renewal and stand by for a moment: it is the
        // leader again once it renews. (A loaded test API server has been seen to answer
        // nothing for 20 s: the bound is for liveness, the safety is asserted below.)
        host_b.wait_leader(1.0, EVENT_BOUND).await;
        let cut = Instant::now();
        host_b.gate.cut();
        let b_stopped = host_b.wait_leader(0.0, EVENT_BOUND).await;
        let a_took_over = host_a.wait_leader(1.0, EVENT_BOUND).await;
        assert!(
            b_stopped < a_took_over,
            "b still believed it could write when a took the Lease"
        );
        emu.set_power(3, false).await;
        emu.wait_power(3, "Off", EVENT_BOUND).await;
        alive[3] = None;
        nodes[3].die(FIRST_BOOT).await;
        wait_taint(&nodes[3], EVENT_BOUND).await;
        let by = fenced_by(&nodes[3].get().await);
        assert!(by.starts_with("oobfence/test@ha/host-a#"), "{by}");
        // Node b (fenced by host-a or host-b in the first term) comes back: host-a lifts it.
        emu.set_power(1, true).await;
        emu.wait_power(1, "On", EVENT_BOUND).await;
        nodes[1].come_back("boot-2").await;
        alive[1] = Some(FakeNode::keep_alive(&[&nodes[1]], "boot-2"));
        wait_for("node b unfenced", EVENT_BOUND, || async {
            (!FakeNode::has_oos_taint(&nodes[1].get().await)).then_some(())
        })
        .await;
        report(&format!(
            "fault matrix: [ha] takeover after SIGKILL {:.1}s; after a partition the cut-off leader stopped {:.1}s after the cut and {:.1}s before the other took over",
            takeover.as_secs_f64(),
            (b_stopped - cut).as_secs_f64(),
            (a_took_over - b_stopped).as_secs_f64()
        ));
        host_b.gate.restore();
        host_a.kill().await;
        host_b.kill().await;
        // The journal (both hosts' here, one file) tells each change of hands, in order.
        let t = journal::timeline(&s.journal(), &journal::Filter::default()).unwrap();
        let hands: Vec<(String, String)> = t
            .events
            .iter()
            .filter(|e| e.rule == "leadership")
            .map(|e| {
                let who = e.change.as_ref().and_then(|c| c.identity.clone());
                (who.unwrap_or_default(), e.what.clone())
            })
            .collect();
        let story = [
            ("host-a", "leadership leader"),
            ("host-b", "leadership leader"),
            ("host-b", "leadership standby"),
            ("host-a", "leadership leader"),
        ];
        let mut told = hands.iter();
        for (who, what) in story {
            assert!(
                told.any(|(w, x)| w == who && x == what),
                "{who} {what} missing or out of order in {hands:?}"
            );
        }
        drop(alive);
        let expected: Vec<Write> = [0, 1, 2, 3]
            .iter()
            .map(|i| Write::Taint(nodes[*i].name.clone()))
            .chain([Write::Untaint(nodes[1].name.clone())])
            .collect();
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "[ha] two hosts: leader SIGKILLed mid-storm, then partitioned",
            expected,
            seen,
        }
    })
}
