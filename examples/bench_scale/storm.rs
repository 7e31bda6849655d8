//! The storm phase of the scale benchmark: many machines lose power at once, with decoys
//! that go NotReady while their machines stay On.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;

use super::support;
use super::support::bench::figure;
use super::support::bench::note;
use super::support::k8s::{FakeNode, KubeletIdentity};
use super::support::redfish_farm::{RedfishFarm, uuid_of};
use super::{
    API_CONCURRENCY, CONFIRM_INTERVAL, NOT_READY_GRACE, metric_sum, percentile, signed_secs, usage,
};

/// `max_concurrent_reads`, the default the benchmark's config keeps.
const READ_CAP: usize = 16;

/// The storm phase: what the daemon does when many machines lose power at once.
pub(crate) struct Storm<'a> {
    pub(crate) client: &'a kube::Client,
    pub(crate) group: &'a str,
    pub(crate) names: &'a [String],
    pub(crate) storm_nodes: usize,
    pub(crate) decoys: usize,
    pub(crate) listen: &'a str,
    pub(crate) pid: u32,
    pub(crate) journal: std::path::PathBuf,
}

impl Storm<'_> {
    /// Runs the storm; returns what went wrong (a decoy tainted, a storm node never tainted).
    pub(crate) async fn run(&self, farm: &mut RedfishFarm, silenced: &AtomicUsize) -> Vec<String> {
        let (storm, decoys) = (self.storm_nodes, self.decoys);
        let down = storm + decoys;
        note(&format!(
            "storm: {storm} machines lose power, {decoys} more nodes go NotReady with their machines On"
        ));
        // Taints as the API server shows them, from a watch of our own.
        let tainted: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> =
            Arc::default();
        let watch = {
            let tainted = tainted.clone();
            let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
            let cfg = kube::runtime::watcher::Config::default().labels(&format!(
                "{}={}",
                support::k8s::TEST_LABEL,
                self.group
            ));
            tokio::spawn(async move {
                let stream = kube::runtime::watcher(api, cfg);
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    if let Ok(
                        kube::runtime::watcher::Event::Apply(n)
                        | kube::runtime::watcher::Event::InitApply(n),
                    ) = ev
                        && FakeNode::has_oos_taint(&n)
                    {
                        tainted
                            .lock()
                            .unwrap()
                            .entry(kube::ResourceExt::name_any(&n))
                            .or_insert_with(Instant::now);
                    }
                }
            })
        };
        // The API server's own latency through the storm, as a client beside oobfence sees it:
        // one GET of a healthy Node every 100 ms.
        let api_gets: Arc<std::sync::Mutex<Vec<f64>>> = Arc::default();
        let probe = {
            let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
            let name = self.names[self.names.len() - 1].clone();
            let took = api_gets.clone();
            tokio::spawn(async move {
                for _ in 0..3000 {
                    let t = Instant::now();
                    if api.get(&name).await.is_ok() {
                        took.lock().unwrap().push(t.elapsed().as_secs_f64());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let before = support::k8s::scrape(self.listen).await;
        let requests_before = metric_sum(&before, "oobfence_kubernetes_requests_total");
        let reads_before = farm.requests().await;

        // The power cut: machines Off, kubelets silent, then the status the controller-manager
        // would post (NotReady), as fast as the API server takes it.
        farm.power(true, 0, storm);
        silenced.store(down, Ordering::Relaxed);
        let cut = Instant::now();
        let not_ready: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> =
            Arc::default();
        futures::stream::iter(self.names[..down].iter().enumerate())
            .for_each_concurrent(API_CONCURRENCY, |(i, name)| {
                let not_ready = not_ready.clone();
                let node = FakeNode {
                    client: self.client.clone(),
                    name: name.clone(),
                    identity: KubeletIdentity::uuid(&uuid_of(i)),
                };
                async move {
                    // The Ready condition's lastTransitionTime has whole seconds: the daemon's
                    // grace runs from `since` cut to its second, and so does eligibility here.
                    let (since, at) = (jiff::Timestamp::now(), Instant::now());
                    let fraction = Duration::from_nanos(since.subsec_nanosecond().max(0) as u64);
                    node.set_status("False", since, "boot-1").await;
                    not_ready.lock().unwrap().insert(node.name, at - fraction);
                }
            })
            .await;
        let marked = cut.elapsed();
        let not_ready = not_ready.lock().unwrap().clone();
        // Eligible: NotReady (by its lastTransitionTime), the grace elapsed, then the second
        // read a confirmation interval after the first; the last marked is the last eligible.
        let eligible_at = |name: &str| not_ready[name] + NOT_READY_GRACE + CONFIRM_INTERVAL;
        let eligible =
            not_ready.values().max().copied().unwrap_or(cut) + NOT_READY_GRACE + CONFIRM_INTERVAL;

        let deadline = eligible + Duration::from_secs(120);
        let (mut in_flight_max, mut rss_max) = (0.0f64, 0u64);
        // How long the reads in flight sat at the cap (max_concurrent_reads), sampled.
        let (mut at_cap, mut last_sample) = (Duration::ZERO, Instant::now());
        loop {
            let done = {
                let t = tainted.lock().unwrap();
                (0..storm).all(|i| t.contains_key(&self.names[i]))
            };
            if done || Instant::now() >= deadline {
                break;
            }
            let m = support::k8s::scrape(self.listen).await;
            let in_flight = metric_sum(&m, "oobfence_power_reads_in_flight");
            in_flight_max = in_flight_max.max(in_flight);
            if in_flight >= READ_CAP as f64 {
                at_cap += last_sample.elapsed();
            }
            last_sample = Instant::now();
            rss_max = rss_max.max(usage(self.pid).0);
            // Once a second: a scrape of /metrics at 20,000 nodes is megabytes to encode, and
            // more often it would be the benchmark's own load on what it measures.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // A decoy wrongly fenced would be by now: the storm nodes' reads and writes are done.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = support::k8s::scrape(self.listen).await;
        let read_seconds = metric_sum(&after, "oobfence_power_read_duration_seconds_sum")
            - metric_sum(&before, "oobfence_power_read_duration_seconds_sum");
        let read_count = metric_sum(&after, "oobfence_power_read_duration_seconds_count")
            - metric_sum(&before, "oobfence_power_read_duration_seconds_count");
        let requests: f64 =
            metric_sum(&after, "oobfence_kubernetes_requests_total") - requests_before;
        let reads = farm.requests().await - reads_before;
        watch.abort();
        probe.abort();
        let mut api_gets = api_gets.lock().unwrap().clone();
        api_gets.sort_by(f64::total_cmp);

        let tainted = tainted.lock().unwrap().clone();
        let storm_tainted: Vec<Instant> = (0..storm)
            .filter_map(|i| tainted.get(&self.names[i]).copied())
            .collect();
        // Each node's taint after its own eligibility.
        let mut after_eligible: Vec<f64> = (0..storm)
            .filter_map(|i| {
                let name = &self.names[i];
                let t = *tainted.get(name)?;
                Some(signed_secs(t, eligible_at(name)))
            })
            .collect();
        after_eligible.sort_by(f64::total_cmp);
        let false_fences = (storm..down)
            .filter(|&i| tainted.contains_key(&self.names[i]))
            .count();
        let last = storm_tainted.iter().max().copied();
        let secs = |d: Duration| format!("{:.1}", d.as_secs_f64());
        figure("storm: machines Off at once", storm, "");
        figure("storm: decoys NotReady but On", decoys, "");
        figure(
            "storm: guards",
            format!("max_unhealthy 50%, fence_budget {down}/1h, max_concurrent_reads {READ_CAP}"),
            "",
        );
        figure(
            "storm: policy",
            format!(
                "not_ready_grace {}s, 2 Off reads {}s apart, pre_attest off",
                NOT_READY_GRACE.as_secs(),
                CONFIRM_INTERVAL.as_secs()
            ),
            "",
        );
        figure("storm: nodes marked NotReady in", secs(marked), "s");
        figure("storm: nodes tainted", storm_tainted.len(), "");
        figure(
            "storm: last taint after the last node became eligible",
            last.map_or("never".into(), |l| {
                format!("{:+.1}", signed_secs(l, eligible))
            }),
            "s",
        );
        figure(
            "storm: each node's taint after its eligibility, p50 / p99",
            format!(
                "{:+.1} / {:+.1}",
                percentile(&after_eligible, 50.0),
                percentile(&after_eligible, 99.0)
            ),
            "s",
        );
        figure("storm: false fences (decoys tainted)", false_fences, "");
        figure("storm: Kubernetes API requests by oobfence", requests, "");
        figure("storm: power reads", reads, "");
        figure(
            "storm: power reads in flight, highest seen",
            in_flight_max,
            "",
        );
        figure(
            "storm: time the reads in flight sat at the cap",
            secs(at_cap),
            "s",
        );
        // What bounds the storm: every node needs its reads, and no more than the cap are in
        // flight; at the mean read's latency, that many reads take this long at the least.
        let mean_read = read_seconds / read_count.max(1.0);
        figure(
            "storm: power read latency, mean",
            format!("{:.0}", mean_read * 1000.0),
            "ms",
        );
        figure(
            "storm: reads ÷ (cap ÷ mean latency): the least time the reads take",
            format!("{:.1}", read_count * mean_read / READ_CAP as f64),
            "s",
        );
        figure("storm: RSS, highest seen", rss_max / 1024, "MiB");

        // Decision latency, from the journal: the confirming read's answer → the taint written,
        // and its two parts: answer → write started (the decision loop) and write started →
        // written (the API server: a fresh read of the Node and its Lease, the write).
        let records: Vec<oobfence::journal::Record> = std::fs::read_to_string(&self.journal)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<oobfence::journal::Record>(l).ok())
            .filter(|r| r.action == "taint" && r.result == "success")
            .collect();
        let seconds = |t: jiff::Timestamp| t.as_millisecond() as f64 / 1000.0;
        let answered = |r: &oobfence::journal::Record| {
            let read = r.inputs.reads.last()?;
            Some(seconds(read.at) + read.latency_seconds)
        };
        let sorted = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v
        };
        let latency = sorted(
            records
                .iter()
                .filter_map(|r| Some(seconds(r.ts) - answered(r)?))
                .collect(),
        );
        let in_loop = sorted(
            records
                .iter()
                .filter_map(|r| Some(seconds(r.inputs.decided_at?) - answered(r)?))
                .collect(),
        );
        let in_api = sorted(
            records
                .iter()
                .filter_map(|r| Some(seconds(r.ts) - seconds(r.inputs.decided_at?)))
                .collect(),
        );
        let ms = |v: &[f64], p: f64| format!("{:.0}", percentile(v, p) * 1000.0);
        figure(
            "storm: decision latency (confirming answer → taint written), p50",
            ms(&latency, 50.0),
            "ms",
        );
        figure("storm: decision latency, p99", ms(&latency, 99.0), "ms");
        figure(
            "storm: decision latency, max",
            format!(
                "{:.0}",
                latency.last().copied().unwrap_or(f64::NAN) * 1000.0
            ),
            "ms",
        );
        figure(
            "storm: of which answer → write started (the decision loop), p50 / p99",
            format!("{} / {}", ms(&in_loop, 50.0), ms(&in_loop, 99.0)),
            "ms",
        );
        figure(
            "storm: of which write started → written (the API server), p50 / p99",
            format!("{} / {}", ms(&in_api, 50.0), ms(&in_api, 99.0)),
            "ms",
        );
        figure(
            "storm: one GET of a Node by another client meanwhile, p50 / p99",
            format!("{} / {}", ms(&api_gets, 50.0), ms(&api_gets, 99.0)),
            "ms",
        );

        let mut broken = Vec::new();
        if false_fences > 0 {
            broken.push(format!("{false_fences} decoys (machines On) were tainted"));
        }
        if storm_tainted.len() < storm {
            broken.push(format!(
                "{} of {storm} storm nodes were never tainted",
                storm - storm_tainted.len()
            ));
        }
        broken
    }
}
