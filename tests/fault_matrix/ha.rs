//! The fault matrix's `[ha]` scenarios beyond the handover of `two_hosts_one_actor`.

use super::*;

/// Whether an instance reports another process renewing the Lease under its identity.
async fn reports_duplicate(instance: &HaInstance) -> bool {
    let Ok(r) = reqwest::get(format!("http://{}/metrics", instance.listen)).await else {
        return false;
    };
    let m = r.text().await.unwrap_or_default();
    sample(&m, "oobfence_ha_duplicate_identity{datacenter=\"test\"}") == Some(1.0)
}

/// Two hosts run with one `[ha] identity` (a config copied with its identity in it). Never
/// both write: the second follows the first, and reports it. A dead node is fenced once, by
/// the one that writes; when that one is SIGKILLed the other takes over after the lease and
/// fences the next.
pub(super) fn two_hosts_one_identity() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-dupid", 3).await;
        let namespaces = lease_namespace(&s).await;
        let mut nodes = Vec::new();
        let mut alive = Vec::new();
        for (i, suffix) in ["a", "b", "c"].into_iter().enumerate() {
            let n = s.node(suffix, i).await;
            alive.push(Some(FakeNode::keep_alive(&[&n], FIRST_BOOT)));
            nodes.push(n);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let mut first = HaInstance::named(&s, "first", "host-x", &s.group).await;
        let mut second = HaInstance::named(&s, "second", "host-x", &s.group).await;
        first.start().await;
        first.wait_leader(1.0, EVENT_BOUND).await;
        second.start().await;
        // Longer than the lease (9 s): one writer throughout, and the second says why.
        never_two_leaders(&first, &second, Duration::from_secs(12)).await;
        // The first writes: on a loaded machine it may have missed a renewal and stepped down
        // meanwhile (as a leader must), and then takes the Lease again, never the second.
        first.wait_leader(1.0, EVENT_BOUND).await;
        wait_for(
            "the second reports a duplicate identity",
            EVENT_BOUND,
            || async { reports_duplicate(&second).await.then_some(()) },
        )
        .await;
        assert!(!reports_duplicate(&first).await);

        // A node dies: fenced once, by whichever writes.
        alive[0] = None;
        power_cut(&s, &nodes[0], 0).await;
        wait_taint(&nodes[0], EVENT_BOUND).await;
        never_two_leaders(&first, &second, Duration::from_secs(3)).await;

        // The writer is SIGKILLed: the other takes over once the Lease has gone unrenewed for
        // the lease, and fences the next dead node.
        first.kill().await;
        second.wait_leader(1.0, EVENT_BOUND).await;
        alive[1] = None;
        power_cut(&s, &nodes[1], 1).await;
        wait_taint(&nodes[1], EVENT_BOUND).await;
        assert!(
            fenced_by(&nodes[1].get().await).starts_with("oobfence/test@ha/host-x#"),
            "{}",
            fenced_by(&nodes[1].get().await)
        );
        second.kill().await;
        drop(alive);
        let expected = vec![
            Write::Taint(nodes[0].name.clone()),
            Write::Taint(nodes[1].name.clone()),
        ];
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "[ha] two hosts under one identity: one writer, the other reports it",
            expected,
            seen,
        }
    })
}

/// A TCP relay on 127.0.0.1 that holds what the client sends for a while (when told to)
/// before passing it on: a slow way to the API server, on which a GET reads what was written
/// while it was held.
struct SlowPath {
    port: u16,
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowPath {
    async fn start(upstream: u16) -> SlowPath {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let delay = delay.clone();
                tokio::spawn(async move {
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let to_server = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = dr.read(&mut buf).await
                            && n > 0
                        {
                            let d = delay.load(std::sync::atomic::Ordering::SeqCst);
                            if d > 0 {
                                tokio::time::sleep(Duration::from_millis(d)).await;
                            }
                            if uw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = uw.shutdown().await;
                    };
                    let to_client = async move {
                        let _ = tokio::io::copy(&mut ur, &mut dw).await;
                        let _ = dw.shutdown().await;
                    };
                    // Bounded: a relayed connection lives at most 10 minutes.
                    let _ = tokio::time::timeout(Duration::from_secs(600), async {
                        tokio::join!(to_server, to_client)
                    })
                    .await;
                });
            }
        });
        SlowPath {
            port,
            delay_ms,
            task,
        }
    }

    /// From now on, what the client sends waits `d` before it goes on.
    fn hold(&self, d: Duration) {
        self.delay_ms
            .store(d.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for SlowPath {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The standby's requests to the API server are held up on their way (its Lease GETs read
/// late) while the leader fences and then is cut off from the API server. The standby takes
/// over only after the cut-off leader has stopped writing, then fences the next dead node.
pub(super) fn a_standby_with_slow_lease_gets() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-slowget", 3).await;
        let namespaces = lease_namespace(&s).await;
        let mut nodes = Vec::new();
        let mut alive = Vec::new();
        for (i, suffix) in ["a", "b", "c"].into_iter().enumerate() {
            let n = s.node(suffix, i).await;
            alive.push(Some(FakeNode::keep_alive(&[&n], FIRST_BOOT)));
            nodes.push(n);
        }
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let mut host_a = HaInstance::new(&s, "host-a", &s.group).await;
        let mut host_b = HaInstance::new(&s, "host-b", &s.group).await;
        // host-b reaches its gate through the slow path.
        let slow = SlowPath::start(host_b.gate.port).await;
        let kubeconfig = s.dir().join("host-b").join("gated.kubeconfig");
        let text = std::fs::read_to_string(&kubeconfig).unwrap();
        let gate_at = format!("127.0.0.1:{}", host_b.gate.port);
        assert!(text.contains(&gate_at), "{text}");
        std::fs::write(
            &kubeconfig,
            text.replace(&gate_at, &format!("127.0.0.1:{}", slow.port)),
        )
        .unwrap();
        host_a.start().await;
        host_a.wait_leader(1.0, EVENT_BOUND).await;
        host_b.start().await;
        // Each of b's requests now waits 1.2 s on its way (the lease is 9 s, a round's bound
        // 2.25 s).
        slow.hold(Duration::from_millis(1200));
        never_two_leaders(&host_a, &host_b, Duration::from_secs(5)).await;
        alive[0] = None;
        power_cut(&s, &nodes[0], 0).await;
        wait_taint(&nodes[0], EVENT_BOUND).await;
        never_two_leaders(&host_a, &host_b, Duration::from_secs(2)).await;

        // a is cut off; b's GETs stay slow for a few seconds more, then are fast again.
        host_a.gate.cut();
        let a_stopped = host_a.wait_leader(0.0, EVENT_BOUND).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        slow.hold(Duration::ZERO);
        let b_took_over = host_b.wait_leader(1.0, EVENT_BOUND).await;
        assert!(
            a_stopped < b_took_over,
            "b took the Lease while a still believed it could write"
        );
        report(&format!(
            "fault matrix: [ha] slow Lease GETs: the cut-off leader stopped {:.1}s before the standby took over",
            (b_took_over - a_stopped).as_secs_f64()
        ));
        alive[1] = None;
        power_cut(&s, &nodes[1], 1).await;
        wait_taint(&nodes[1], EVENT_BOUND).await;
        let by = fenced_by(&nodes[1].get().await);
        assert!(by.starts_with("oobfence/test@ha/host-b#"), "{by}");
        host_a.gate.restore();
        host_a.kill().await;
        host_b.kill().await;
        drop(alive);
        let expected = vec![
            Write::Taint(nodes[0].name.clone()),
            Write::Taint(nodes[1].name.clone()),
        ];
        let seen = rec.writes_once_seen(&expected).await;
        for n in &nodes {
            n.delete().await;
        }
        let _ = namespaces.delete(&s.group, &DeleteParams::default()).await;
        Outcome {
            name: "[ha] a standby's Lease GETs held up while the leader is cut off",
            expected,
            seen,
        }
    })
}
