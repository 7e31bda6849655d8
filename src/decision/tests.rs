//! One test per rule, found by its name, and property tests over every short sequence of
//! reads: every rule that can refuse or allow a write is pinned. This file holds the fixtures
//! they share (a dead node, reads of its machine, the default policy); the tests sit in a
//! child per family of rules.

use super::reading::ReadErrorKind;
use super::*;
use crate::identity::{MachineIdentity, NodeIdentity};

mod actuation;
mod actuation_property;
mod confirmation;
mod contradicted_off;
mod grace_and_leases;
mod holds_and_guards;
mod left_alone;
mod levels;
mod person;
mod pre_attestation;
mod release;
mod storm_census;
mod trust;
mod unfence;
mod wrong_machine;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

const UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e32";
const OTHER_UUID: &str = "4c4c4544-0038-4b10-8052-b4c04f4a4e33";
/// Who answers the reads of these tests, unless a test says otherwise.
const READER: &str = "ec2 us-east-1 at the region's endpoint, key AKIA…TEST";

/// A read from the node's own machine.
fn read(at: i64, state: PowerState) -> PowerReading {
    read_from(at, state, MachineIdentity::system_uuid(UUID, None).unwrap())
}

fn read_from(at: i64, state: PowerState, identity: MachineIdentity) -> PowerReading {
    PowerReading {
        at: t(at),
        latency: Duration::from_millis(120),
        state,
        details: Vec::new(),
        identity,
        reader: READER.into(),
        power_draw: None,
    }
}

/// A "gone" answer: an instance that no longer exists reports no addresses.
fn gone(at: i64, state: PowerState) -> PowerReading {
    read_from(at, state, no_identity())
}

/// A dead node whose power source proved, while it was healthy, that it knows its machine.
fn bound() -> NodeFacts {
    NodeFacts {
        identity_binding: Some(IdentityBinding {
            at: t(-600),
            verdict: Verdict::Match("instance i-1 has the Node's address 10.0.0.5".into()),
            reader: READER.into(),
        }),
        ..dead()
    }
}

fn other_machine() -> MachineIdentity {
    MachineIdentity::system_uuid(OTHER_UUID, None).unwrap()
}

fn no_identity() -> MachineIdentity {
    MachineIdentity::unreported("test")
}

fn off(at: i64) -> PowerReading {
    read(at, PowerState::Off)
}

/// NotReady since t(0), lease renewal last seen at t(-10): a dead node.
fn dead() -> NodeFacts {
    NodeFacts {
        uid: "uid-1".into(),
        readiness: Readiness::NotReady { since: t(0) },
        lease_renewal_seen: Some(t(-10)),
        lease_first_sight: false,
        lease_renew_time: Some(t(-12)),
        lease_version: Some(1),
        lease_duration: Some(Duration::from_secs(40)),
        ready_heartbeat: None,
        heartbeat_seen: None,
        ready_seen: Some(t(-1)),
        boot_id: "boot-a".into(),
        being_deleted: false,
        fence: None,
        foreign_out_of_service: false,
        opted_out: None,
        maintenance: None,
        not_ready_seen: vec![t(0)],
        other_remediator: None,
        has_power_source: true,
        mapping_conflict: None,
        off_while_alive: None,
        identity: NodeIdentity {
            system_uuid: UUID.to_uppercase(),
            addresses: vec!["10.0.0.5".into()],
            uuid_shared_with: Vec::new(),
        },
        identity_check: IdentityCheck::Checked,
        off_witness: None,
        identity_binding: None,
        holds: Holds::default(),
        confirmation: None,
        actuation: Default::default(),
    }
}

/// A dead node without a Lease (very old clusters, or one deleted): nothing to go stale, so
/// nothing is read ahead and `not_ready_grace` always applies.
fn unleased() -> NodeFacts {
    NodeFacts {
        lease_renewal_seen: None,
        lease_first_sight: false,
        lease_renew_time: None,
        lease_duration: None,
        ..dead()
    }
}

/// Fenced at t(100); its kubelet last seen alive at t(140), after the fence.
fn fenced(readiness: Readiness, boot_id: &str) -> NodeFacts {
    NodeFacts {
        readiness,
        boot_id: boot_id.into(),
        lease_renewal_seen: Some(t(140)),
        lease_first_sight: false,
        fence: Some(FenceRecord {
            at: t(100),
            boot_id: "boot-a".into(),
            taint_present: true,
            ours: true,
        }),
        ..dead()
    }
}

/// Every sequence of up to `max_len` reads of the node's machine drawn from `states`, the
/// first at `t(start)` and each `gap` seconds after the previous.
fn sequences(
    states: &[PowerState],
    max_len: usize,
    start: i64,
    gap: i64,
) -> Vec<Vec<PowerReading>> {
    let mut all = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for i in 0..max_len as i64 {
        last = last
            .iter()
            .flat_map(|prefix: &Vec<PowerReading>| {
                states.iter().map(move |st| {
                    let mut r = prefix.clone();
                    r.push(read(start + i * gap, st.clone()));
                    r
                })
            })
            .collect();
        all.extend(last.iter().cloned());
    }
    all
}

fn policy() -> Policy {
    Policy::default() // grace 60s, 2 reads, 5s apart, max age 30s
}
