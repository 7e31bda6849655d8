//! The property of opt-in actuation: over every way a silence can begin and every short
//! sequence of reads, a power action only where every rule of [`super::actuation`] allows it.

use super::actuation::{actuating, hung, powered_off_at};
use super::holds_and_guards::hold;
use super::*;

/// How the node's silence began, as oobfence saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watch {
    /// Seen Ready, then its kubelet's last renewal watched: the silence began under watch.
    Watched,
    /// The Lease is as oobfence first found it (a restart): the silence began out of sight.
    FirstSight,
    /// Seen Ready moments (within a Lease duration) before the last sign of life, which a
    /// pass saw only with the node NotReady: still a silence that began under watch.
    ReadyMomentsBefore,
    /// Seen Ready only more than a Lease duration before the last sign of life: the silence
    /// began NotReady.
    ReadyBefore,
}

/// Every combination of how the silence began, maintenance and an opt-out.
fn node_sides() -> Vec<(Watch, bool, bool)> {
    let mut v = Vec::new();
    for w in [
        Watch::Watched,
        Watch::FirstSight,
        Watch::ReadyMomentsBefore,
        Watch::ReadyBefore,
    ] {
        for m in [false, true] {
            for o in [false, true] {
                v.push((w, m, o));
            }
        }
    }
    v
}

/// Over readiness, signs of life, how the silence began, maintenance, opt-outs, records, holds
/// and every short sequence of reads: a
/// power-off only with both opt-ins, on a NotReady node silent for `after` but not past
/// `max_silence`, a silence oobfence watched begin while the node was Ready, no maintenance, no
/// opt-out, its newest read a fresh On from its own machine, no hold, and no power-off of this
/// boot before; a power-on only of a fence of a boot oobfence powered off, with the source
/// still allowed to act and neither maintenance nor an opt-out.
#[test]
fn property_no_power_action_without_the_opt_ins_the_silence_a_fresh_own_on_read_and_no_hold() {
    let states = [
        PowerState::On,
        PowerState::Off,
        PowerState::error(ReadErrorKind::Timeout, "t"),
    ];
    let readiness = [Readiness::Ready, Readiness::NotReady { since: t(0) }];
    let records = [
        None,
        Some(powered_off_at(100, "boot-a")),
        Some(powered_off_at(100, "boot-z")),
    ];
    let (mut checked, mut offs, mut ons) = (0, 0, 0);
    for enabled in [false, true] {
        let p = if enabled { actuating() } else { policy() };
        for r in &readiness {
            for alive in [-4000i64, -10, 200] {
                for record in &records {
                    for refuses in [false, true] {
                        for held in [false, true] {
                            for fenced_node in [false, true] {
                                let mut f = if fenced_node {
                                    fenced(r.clone(), "boot-a")
                                } else {
                                    NodeFacts {
                                        readiness: r.clone(),
                                        ..hung()
                                    }
                                };
                                f.lease_renewal_seen = Some(t(alive));
                                f.actuation = record.clone().unwrap_or_default();
                                if refuses {
                                    f.actuation.source_refuses = Some("no".into());
                                }
                                if held {
                                    f.holds.power = Some(hold(HoldKind::PowerBudget));
                                }
                                for (watch, maintenance, opted) in node_sides() {
                                    let mut f = f.clone();
                                    match watch {
                                        Watch::Watched => f.ready_seen = Some(t(alive)),
                                        Watch::FirstSight => f.lease_first_sight = true,
                                        Watch::ReadyMomentsBefore => {
                                            f.ready_seen = Some(t(alive - 30))
                                        }
                                        Watch::ReadyBefore => f.ready_seen = Some(t(alive - 41)),
                                    }
                                    if maintenance {
                                        f.maintenance = Some("cordoned".into());
                                    }
                                    if opted {
                                        f.opted_out = Some("annotation".into());
                                    }
                                    for reads in sequences(&states, 2, 280, 10) {
                                        for now in [291i64, 310] {
                                            let d = decide(&f, &reads, &p, t(now));
                                            checked += 1;
                                            match d.step {
                                                Step::PowerOff | Step::WouldPowerOff => {
                                                    offs += 1;
                                                    assert!(enabled && !refuses && !held, "{d:?}");
                                                    assert!(!fenced_node, "{d:?}");
                                                    assert_ne!(
                                                        f.readiness,
                                                        Readiness::Ready,
                                                        "{d:?}"
                                                    );
                                                    assert!(now - alive >= 300, "{d:?}");
                                                    assert!(now - alive <= 3600, "{d:?}");
                                                    assert!(
                                                        matches!(
                                                            watch,
                                                            Watch::Watched
                                                                | Watch::ReadyMomentsBefore
                                                        ),
                                                        "{d:?}"
                                                    );
                                                    assert!(!maintenance && !opted, "{d:?}");
                                                    let last = reads.last().unwrap();
                                                    assert_eq!(last.state, PowerState::On);
                                                    assert!(identity_of(&f, last).is_match());
                                                    assert!(
                                                        elapsed(last.at, t(now)) <= p.read_max_age
                                                    );
                                                    assert!(
                                                        f.actuation
                                                            .powered_off(&f.boot_id)
                                                            .is_none(),
                                                        "{d:?}"
                                                    );
                                                }
                                                Step::PowerOn | Step::WouldPowerOn => {
                                                    ons += 1;
                                                    assert!(
                                                        enabled && !held && fenced_node,
                                                        "{d:?}"
                                                    );
                                                    assert!(
                                                        !refuses && !maintenance && !opted,
                                                        "{d:?}"
                                                    );
                                                    let fence = f.fence.as_ref().unwrap();
                                                    assert!(
                                                        f.actuation
                                                            .powered_off(&fence.boot_id)
                                                            .is_some(),
                                                        "{d:?}"
                                                    );
                                                    assert_ne!(f.readiness, Readiness::Ready);
                                                }
                                                _ => {}
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 40_000, "{checked}");
    assert!(
        offs > 0 && ons > 0,
        "the generator never reached a power action: {offs} {ons}"
    );
}
