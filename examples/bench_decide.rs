//! Benchmark: how long the decision core takes per node, which bounds how large a cluster one
//! decision pass (every second) can cover, and what the guards add to a pass (counting the
//! datacenter, and each node's holds). Prints figures; asserts nothing about speed.
//!
//!     cargo run --release --example bench_decide [NODES]

use std::time::{Duration, Instant};

use jiff::Timestamp;
use oobfence::decision::holds::{Calm, Census, CensusNode, GuardPolicy, Pause, View};
use oobfence::decision::{FenceRecord, LeaseState, NodeFacts, Policy, Readiness, decide};
use oobfence::identity::{IdentityCheck, MachineIdentity, NodeIdentity};
use oobfence::power::{PowerReading, PowerState, ReadErrorKind};

fn main() {
    let nodes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let now = Timestamp::now();
    let ago = |s: i64| now - jiff::SignedDuration::from_secs(s);
    let policy = Policy::default();

    // A mix like a bad day in a large datacenter: mostly healthy, some NotReady in every
    // stage, with a few reads each.
    let mut cases = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let readiness = if i % 50 == 0 {
            Readiness::NotReady { since: ago(120) }
        } else if i % 97 == 0 {
            Readiness::NotReady { since: ago(10) }
        } else {
            Readiness::Ready
        };
        let fence = (i % 211 == 0).then(|| FenceRecord {
            at: ago(60),
            boot_id: "a".into(),
            taint_present: true,
            ours: true,
        });
        let uuid = format!("4c4c4544-0000-4000-8000-{i:012}");
        let facts = NodeFacts {
            uid: format!("uid-{i}"),
            readiness,
            lease_renewal_seen: Some(ago(300)),
            lease_first_sight: false,
            lease_renew_time: Some(ago(300)),
            lease_version: Some(1),
            lease_duration: None,
            ready_heartbeat: None,
            heartbeat_seen: None,
            ready_seen: None,
            boot_id: "b".into(),
            being_deleted: false,
            fence,
            foreign_out_of_service: false,
            opted_out: None,
            maintenance: None,
            not_ready_seen: vec![ago(120)],
            other_remediator: None,
            has_power_source: true,
            mapping_conflict: None,
            off_while_alive: None,
            identity: NodeIdentity {
                system_uuid: uuid.clone(),
                addresses: vec![format!("10.0.{}.{}", i / 250, i % 250)],
                uuid_shared_with: Vec::new(),
            },
            identity_check: IdentityCheck::Checked,
            off_witness: None,
            confirmation: None,
            identity_binding: None,
            holds: Default::default(),
            actuation: Default::default(),
        };
        let state = match i % 4 {
            0 => PowerState::Off,
            1 => PowerState::On,
            2 => PowerState::error(ReadErrorKind::Timeout, "no answer"),
            _ => PowerState::Off,
        };
        let reads: Vec<PowerReading> = (0..4)
            .map(|k| PowerReading {
                at: ago(20 - 5 * k),
                latency: Duration::from_millis(100),
                state: state.clone(),
                details: Vec::new(),
                identity: MachineIdentity::system_uuid(&uuid, None).expect("a UUID"),
                reader: "redfish https://bmc.example".into(),
                power_draw: None,
            })
            .collect();
        cases.push((facts, reads));
    }

    // Warm up, then time whole passes.
    let mut fences = 0usize;
    for (f, r) in &cases {
        fences += usize::from(matches!(
            decide(f, r, &policy, now).step,
            oobfence::decision::Step::Fence(_)
        ));
    }
    let passes = 20;
    let start = Instant::now();
    for _ in 0..passes {
        for (f, r) in &cases {
            std::hint::black_box(decide(f, r, &policy, now));
        }
    }
    let elapsed = start.elapsed();
    let per = elapsed / (passes * nodes) as u32;
    println!(
        "decide(): {nodes} nodes x {passes} passes in {:.3}s: {:?} per node, {:.2} ms per pass ({fences} would fence)",
        elapsed.as_secs_f64(),
        per,
        elapsed.as_secs_f64() * 1000.0 / passes as f64
    );

    // The guards: count the datacenter (50 racks), update, then every node's holds.
    let guards = GuardPolicy {
        failure_domain_label: Some("rack".into()),
        ..GuardPolicy::default()
    };
    let census_nodes: Vec<CensusNode> = (0..nodes)
        .map(|i| CensusNode {
            uid: format!("uid-{i}").into(),
            domain: Some(format!("rack{}", i % 50).into()),
            unhealthy: i % 50 == 0 || i % 97 == 0,
            source_failing: (i % 7 == 0).then_some(i % 91 == 0),
            lease: Some(match i % 50 {
                0 => LeaseState::Stale,
                1 => LeaseState::Late,
                _ => LeaseState::Renewing,
            }),
        })
        .collect();
    let view = View {
        broken_watches: Vec::new(),
        last_round_trip: Some(now),
    };
    let mut calm = Calm::default();
    let start = Instant::now();
    let mut held = 0usize;
    for _ in 0..passes {
        let census = Census::count(&census_nodes, true);
        calm.update(&census, &view, Pause::default(), &guards, now);
        for (i, n) in census_nodes.iter().enumerate() {
            let h = calm.holds(n.domain.as_deref(), &format!("uid-{i}"), &guards, now);
            held += usize::from(h.fence.is_some());
        }
    }
    let elapsed = start.elapsed();
    println!(
        "guards: {nodes} nodes in 50 domains x {passes} passes in {:.3}s: {:.2} ms per pass ({:?} per node; {} held)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / passes as f64,
        elapsed / (passes * nodes) as u32,
        held / passes
    );
}
