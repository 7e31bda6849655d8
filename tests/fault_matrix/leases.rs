//! Scenarios of Leases and pre-attestation: the power-cut timeline with the example defaults
//! (release at attestation on and off), a kubelet stall with a lying BMC (discarded by its
//! renewal before NotReady, or before the proof with the release on), most Leases stale at
//! once.

use super::*;
use support::k8s::{bound_pod, force_delete_pod, pods_on, with_claim};

pub(super) fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The whole chain with the example config's defaults (not_ready_grace 60 s, two Off reads
/// 5 s apart, the default guards), with `release_at_attestation` as the example has it (on)
/// or off: a machine loses power and its kubelet goes silent; its Lease goes stale and
/// oobfence reads power ahead of NotReady. With the release on, the fence follows the proof
/// at once and the node's pod goes right after it; with it off, the fence waits for the
/// controller-manager's NotReady, and the pod for the pod garbage collector (on 1.26 and
/// later; this 1.20 control plane has none that acts on the taint). The timeline is printed
/// with each step's time from the power cut; what is asserted is the logic, not the clock.
pub(super) fn power_cut_timeline(release: bool) -> ScenarioFuture {
    Box::pin(async move {
        let s = Scenario::redfish(
            if release {
                "fm-timeline"
            } else {
                "fm-timeline-off"
            },
            3,
        )
        .await;
        s.set_policy(if release {
            ""
        } else {
            "release_at_attestation = false\n"
        });
        s.set_guards("");
        let mut nodes = Vec::new();
        for i in 0..3 {
            nodes.push(s.node(&format!("n{i}"), i).await);
        }
        let victim = &nodes[0];
        let others = FakeNode::keep_alive(&[&nodes[1], &nodes[2]], FIRST_BOOT);
        let kubelet = FakeNode::keep_alive(&[victim], FIRST_BOOT);
        let pod = format!("{}-db", victim.name);
        bound_pod(&s.client, &victim.name, &pod, with_claim).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        daemon
            .wait_identity(&victim.name, "match", EVENT_BOUND)
            .await;
        // Let the kubelet settle into its rhythm, then cut the power.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let cut_wall = jiff::Timestamp::now();
        let cut = Instant::now();
        drop(kubelet);
        s.redfish_emulator().set_power(0, false).await;
        let since_cut = |t: Instant| t.duration_since(cut).as_secs_f64();
        let (mut ahead, mut attested, mut pod_gone) = (None, None, None);
        let deadline = cut + Duration::from_secs(120);
        let pod_gone_at = async |client: &Client| {
            (!pods_on(client, &victim.name).await.contains(&pod)).then(Instant::now)
        };
        while rec.when(&Write::Taint(victim.name.clone())).is_none() {
            assert!(
                Instant::now() < deadline,
                "no fence within 120 s of the cut"
            );
            let now = Instant::now();
            if let Some(r) = daemon.report(&victim.name).await
                && r["ready"] == "Ready"
            {
                let rule = r["rule"].as_str().unwrap_or_default();
                if ahead.is_none() && rule != "node-ready" {
                    ahead = Some(now);
                }
                if attested.is_none() && matches!(rule, "pre-attested" | "confirmed-off") {
                    attested = Some(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let tainted = rec.when(&Write::Taint(victim.name.clone())).unwrap();
        // The pod: gone at once with the release; without it, watched for 10 s more.
        let watch_until = Instant::now() + Duration::from_secs(if release { 30 } else { 10 });
        while pod_gone.is_none() && Instant::now() < watch_until {
            pod_gone = pod_gone_at(&s.client).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // NotReady may come after the fence now: wait for it, for the timeline.
        let until = Instant::now() + Duration::from_secs(30);
        while rec.not_ready_at(&victim.name).is_none() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let not_ready = rec.not_ready_at(&victim.name);
        // Released at attestation, the proof and the write are one step: the fence decision
        // (the journal's decided_at) is when the power was proven off.
        if attested.is_none()
            && let Some(decided) = journal::tail(&s.journal(), &victim.name, 100)
                .unwrap()
                .records
                .iter()
                .find(|r| r.action == "taint")
                .and_then(|r| r.inputs.decided_at)
        {
            let after = decided.duration_since(cut_wall).as_secs_f64();
            attested = Some(cut + Duration::from_secs_f64(after.max(0.0)));
        }
        let renewed = victim
            .lease_renew_time()
            .await
            .map(|t| t.duration_since(cut_wall).as_secs_f64());
        let fmt = |t: Option<f64>| t.map_or("     -".to_string(), |t| format!("{t:+6.1}"));
        let setting = if release { "on" } else { "off" };
        let mut lines = vec![
            format!("  {}s  last Lease renewal by the kubelet", fmt(renewed)),
            format!(
                "  {}s  power cut (Redfish ForceOff), kubelet silent",
                fmt(Some(0.0))
            ),
            format!(
                "  {}s  Lease stale: oobfence reads power ahead of NotReady",
                fmt(ahead.map(since_cut))
            ),
            format!(
                "  {}s  power attested Off{}",
                fmt(attested.map(since_cut)),
                match (attested, not_ready) {
                    (Some(a), Some(n)) if a < n => ", node still Ready",
                    _ => "",
                }
            ),
            format!(
                "  {}s  NotReady (kube-controller-manager)",
                fmt(not_ready.map(since_cut))
            ),
            format!(
                "  {}s  out-of-service taint written",
                fmt(Some(since_cut(tainted)))
            ),
            format!(
                "  {}s  the node's pod gone{}",
                fmt(pod_gone.map(since_cut)),
                match (release, pod_gone) {
                    (true, _) => " (force-deleted by oobfence)",
                    (false, None) =>
                        " (not within 10 s: left to the pod garbage collector, which on 1.26+ deletes it at its next 20 s tick after NotReady)",
                    (false, Some(_)) => "",
                }
            ),
        ];
        // In time order, the steps never reached last.
        lines.sort_by(|a, b| {
            let at = |l: &str| {
                l.split('s')
                    .next()
                    .and_then(|t| t.trim().parse::<f64>().ok())
            };
            at(a)
                .unwrap_or(f64::MAX)
                .total_cmp(&at(b).unwrap_or(f64::MAX))
        });
        lines.insert(
            0,
            format!(
                "fault matrix: power-cut timeline, example config defaults, release_at_attestation = {setting} (node-monitor grace 20 s, Lease 20 s):"
            ),
        );
        lines.push(format!(
            "  power cut -> taint {:.1} s; NotReady -> taint {}; taint -> pod gone {}",
            since_cut(tainted),
            not_ready.map_or("-".into(), |n| format!(
                "{:+.1} s",
                since_cut(tainted) - since_cut(n)
            )),
            pod_gone.map_or("-".into(), |p| format!(
                "{:.2} s",
                p.saturating_duration_since(tainted).as_secs_f64()
            ))
        ));
        report(&lines.join("\n"));
        // The metric is observed once the daemon hears its write landed.
        wait_for("the power-cut metric", Duration::from_secs(15), || async {
            (sample(
                &daemon.metrics().await,
                "oobfence_power_cut_to_fence_seconds_count",
            ) == Some(1.0))
            .then_some(())
        })
        .await;
        daemon.stop().await;
        let records = journal::tail(&s.journal(), &victim.name, 100)
            .unwrap()
            .records;
        let fence = records
            .iter()
            .find(|r| r.action == "taint" && r.result == "success")
            .expect("a fence record");
        assert_eq!(fence.rule, "confirmed-off");
        let releases: Vec<_> = records
            .iter()
            .filter(|r| r.action == "release_pods")
            .collect();
        if release {
            // Proven off while Ready (the usual case), or, on a slow pass, at NotReady: the
            // pod goes with the fence either way.
            assert!(
                fence.message.contains("release_at_attestation"),
                "{}",
                fence.message
            );
            assert_eq!(releases.len(), 1, "{releases:?}");
            assert_eq!(releases[0].result, "success", "{:?}", releases[0]);
            assert!(pod_gone.is_some(), "the pod was not released");
        } else {
            assert!(
                fence.message.contains("pre-attested") && fence.message.contains("not_ready_grace"),
                "the fence did not come from a pre-attestation: {}",
                fence.message
            );
            assert!(releases.is_empty(), "{releases:?}");
            assert!(
                pod_gone.is_none(),
                "oobfence deleted the pod with the release off"
            );
        }
        drop(others);
        force_delete_pod(&s.client, &pod).await;
        Outcome {
            name: if release {
                "power cut, example defaults: proven off, fenced and released at once"
            } else {
                "power cut, example defaults, release off: attested ahead, fenced at NotReady"
            },
            expected: vec![Write::Taint(victim.name.clone())],
            seen: {
                let seen = rec
                    .writes_once_seen(&[Write::Taint(victim.name.clone())])
                    .await;
                for n in &nodes {
                    n.delete().await;
                }
                seen
            },
        }
    })
}

/// Machine 0 runs `node`, whose kubelet is alive until its BMC wrongly says Off; then it renews
/// once more and stalls. The write recorder and the daemon, from the moment of the stall.
async fn a_stall_with_a_lying_bmc(s: &Scenario, node: &FakeNode) -> (WriteRecorder, RunningDaemon) {
    let kubelet = FakeNode::keep_alive(&[node], FIRST_BOOT);
    let rec = WriteRecorder::start(&s.client, &s.group).await;
    let daemon = s.daemon().await;
    daemon.wait_identity(&node.name, "match", EVENT_BOUND).await;
    let emu = s.redfish_emulator();
    emu.set_power(0, false).await;
    emu.wait_power(0, "Off", EVENT_BOUND).await;
    drop(kubelet);
    node.renew_lease().await;
    (rec, daemon)
}

/// A kubelet stalls for a while (a long GC pause, a saturated link to the API server) while
/// its BMC wrongly says Off: oobfence reads ahead and attests Off, then the kubelet renews its
/// Lease before the controller-manager's grace runs out. The renewal discards the reads:
/// nothing is written, and the node is healthy again.
pub(super) fn a_kubelet_stall_with_a_lying_bmc_is_discarded_by_its_renewal() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-stall", 1).await;
        // Stale after 1.5 renewals of 5 s: 7.5 s, well inside the 20 s node-monitor grace.
        // Pre-attestation alone: the fence waits for NotReady (the release's own stall is
        // the next scenario).
        s.set_policy(&format!(
            "lease_stale_after = 1.5\nrelease_at_attestation = false\n{}",
            s.policy_lines()
        ));
        let node = s.node("a", 0).await;
        let (rec, daemon) = a_stall_with_a_lying_bmc(&s, &node).await;
        let stalled = Instant::now();
        let r = daemon
            .wait_rule(&node.name, "pre-attested", Duration::from_secs(17))
            .await;
        assert_eq!(r["ready"], "Ready", "{r}");
        assert!(
            stalled.elapsed() < Duration::from_secs(17),
            "the stall ran too long to stay inside the grace"
        );
        // Alive again: a renewal, as the kubelet catches up.
        let renewed = jiff::Timestamp::now();
        node.renew_lease().await;
        let _alive = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        let r = daemon
            .wait_rule(&node.name, "node-ready", Duration::from_secs(10))
            .await;
        // The reads ahead are gone; one that was in flight at the renewal may still be listed,
        // but none was started after it.
        let reads = r["reads"].as_array().cloned().unwrap_or_default();
        assert!(reads.len() <= 1, "{r}");
        for read in &reads {
            let at: jiff::Timestamp = read["at"].as_str().unwrap().parse().unwrap();
            assert!(at < renewed, "a read after the renewal: {r}");
        }
        stays_unfenced(&node, Duration::from_secs(5)).await;
        conclude(
            "kubelet stall, lying BMC: the renewal discards the reads ahead",
            vec![],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// The same stall with the release at attestation on: the kubelet stalls while its BMC wrongly
/// says Off, oobfence reads ahead and counts the first Off read, and the kubelet renews its
/// Lease before the proof is complete. The renewal discards the reads: nothing is written and
/// no pod is deleted, though the node was never going to turn NotReady first.
pub(super) fn a_stall_that_renews_before_the_proof_is_never_released() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-stall-release", 1).await;
        // Stale after 7.5 s; the proof takes three Off reads 3 s apart, 6 s more.
        s.set_policy(
            "lease_stale_after = 1.5\nconfirm_reads = 3\nconfirm_interval = \"3s\"\nread_max_age = \"20s\"\nnot_ready_grace = \"2s\"\nrecheck_interval = \"2s\"\n",
        );
        let node = s.node("a", 0).await;
        let pod = format!("{}-db", node.name);
        bound_pod(&s.client, &node.name, &pod, with_claim).await;
        let (rec, daemon) = a_stall_with_a_lying_bmc(&s, &node).await;
        // Read ahead, one Off counted: the kubelet comes back before the second.
        let r = daemon
            .wait_rule(&node.name, "confirming-off", Duration::from_secs(17))
            .await;
        assert_eq!(r["ready"], "Ready", "{r}");
        node.renew_lease().await;
        let _alive = FakeNode::keep_alive(&[&node], FIRST_BOOT);
        daemon
            .wait_rule(&node.name, "node-ready", Duration::from_secs(10))
            .await;
        stays_unfenced(&node, Duration::from_secs(8)).await;
        assert!(
            pods_on(&s.client, &node.name).await.contains(&pod),
            "the pod was deleted"
        );
        let records = journal::tail(&s.journal(), &node.name, 100)
            .unwrap()
            .records;
        assert!(
            records
                .iter()
                .all(|r| r.action != "taint" && r.action != "release_pods"),
            "{records:?}"
        );
        force_delete_pod(&s.client, &pod).await;
        conclude(
            "kubelet stall, lying BMC, release on: renewed before the proof, nothing released",
            vec![],
            daemon,
            &rec,
            &[&node],
        )
        .await
    })
}

/// Every kubelet of the datacenter goes silent at once (the control plane, or the path to
/// it, is what broke): a lease storm. The kubelets last renewed at phases spread over half a
/// renewal interval, as real ones do, so their Leases go stale one after another; the storm
/// is counted on late Leases, before the first is stale, and oobfence reads no BMC ahead of
/// NotReady and says why.
pub(super) fn most_leases_stale_at_once_reads_nothing_ahead() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-leasestorm", 4).await;
        // The example's lease_stale_after (2.5 renewals: late after 7.5 s, stale after 12.5 s
        // of a 20 s Lease), and a grace long enough that no read at NotReady (20 s and more
        // after the silence) falls in the window watched.
        let policy = s
            .policy_lines()
            .replace("not_ready_grace = \"2s\"", "not_ready_grace = \"30s\"");
        assert!(policy.contains("30s"), "{policy}");
        s.set_policy(&format!("lease_stale_after = 2.5\n{policy}"));
        let mut nodes = Vec::new();
        for i in 0..4 {
            nodes.push(s.node(&format!("n{i}"), i).await);
        }
        let kubelets = FakeNode::keep_alive(&nodes_of(&nodes), FIRST_BOOT);
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let daemon = s.daemon().await;
        for n in &nodes {
            daemon.wait_identity(&n.name, "match", EVENT_BOUND).await;
        }
        drop(kubelets);
        let reads_total = |m: &str| support::k8s::sum_of(m, "oobfence_power_reads_total{");
        let silent = Instant::now();
        let before = reads_total(&daemon.metrics().await);
        // The last renewals, 0.8 s apart.
        for (i, n) in nodes.iter().enumerate() {
            tokio::time::sleep_until((silent + Duration::from_millis(800) * i as u32).into()).await;
            n.renew_lease().await;
        }
        wait_for("the lease storm", Duration::from_secs(20), || async {
            (sample(&daemon.metrics().await, "oobfence_lease_storm") == Some(1.0)).then_some(())
        })
        .await;
        // Past the moment the last Lease went stale (2.4 + 12.5 s, and a pass), before any
        // NotReady node's grace has run: not one read.
        wait_for("every Lease stale", Duration::from_secs(30), || async {
            let m = daemon.metrics().await;
            (sample(&m, "oobfence_leases_stale") == Some(4.0)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = reads_total(&daemon.metrics().await);
        assert!(
            silent.elapsed() < Duration::from_secs(45),
            "the check ran too late: reads at NotReady may have begun"
        );
        assert_eq!(after, before, "BMCs were read during a lease storm");
        // A stale node says why it is not read.
        let r = daemon.report(&nodes[0].name).await.unwrap();
        // Still Ready, or (on a loaded machine, the controller-manager's 20 s grace run out)
        // NotReady within not_ready_grace: either way unread, and saying why.
        assert!(
            r["rule"] == "node-ready" || r["rule"] == "not-ready-grace",
            "{r}"
        );
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("Leases went unrenewed at once") && reason.contains("control plane"),
            "{reason}"
        );
        let _alive = FakeNode::keep_alive(&nodes_of(&nodes), FIRST_BOOT);
        wait_for("the lease storm over", Duration::from_secs(15), || async {
            (sample(&daemon.metrics().await, "oobfence_lease_storm") == Some(0.0)).then_some(())
        })
        .await;
        wait_journal_tells(&s, &["lease-storm began", "lease-storm ended"]).await;
        conclude(
            "most Leases stale at once: nothing read ahead",
            vec![],
            daemon,
            &rec,
            &nodes_of(&nodes),
        )
        .await
    })
}
