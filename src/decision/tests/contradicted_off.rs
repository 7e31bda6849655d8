//! Off answers that other evidence contradicts: power drawn in the same read (with
//! `corroborate = "power-draw"`), or a kubelet that went on living after its source said Off.

use super::*;

/// An entry with `corroborate = "power-draw"`: Off counts only with the system drawing at most
/// 20 W in the same read.
fn witnessed() -> NodeFacts {
    NodeFacts {
        off_witness: Some(OffWitness::PowerDraw {
            max_off_watts: Watts::whole(20),
        }),
        ..dead()
    }
}

fn off_drawing(at: i64, draw: Option<PowerDraw>) -> PowerReading {
    PowerReading {
        power_draw: draw,
        ..off(at)
    }
}

fn drawing(watts: f64) -> Option<PowerDraw> {
    Some(PowerDraw::Seen {
        watts: Watts::from_f64(watts).unwrap(),
        from: "PowerControl[0].PowerConsumedWatts of /redfish/v1/Chassis/1/Power".into(),
    })
}

#[test]
fn an_off_drawing_power_is_not_counted() {
    // A BMC restarted while its host ran: Off, and 180 W drawn.
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(
        (d.state, d.step, d.rule),
        (NodeState::Blocked, Step::Idle, Rule::OffUncorroborated)
    );
    assert!(d.reason.contains("180 W"), "{}", d.reason);
    assert!(d.reason.contains("never fenced"), "{}", d.reason);
    // One stale Off among good ones is enough to refuse.
    let reads = [
        off_drawing(60, drawing(5.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::OffUncorroborated);
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(5.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::OffUncorroborated);
}

#[test]
fn an_off_without_its_witness_is_not_counted() {
    let unavailable = || {
        Some(PowerDraw::Unavailable {
            why: "the Chassis links neither Power nor EnvironmentMetrics".into(),
        })
    };
    for draw in [None, unavailable()] {
        let reads = [off_drawing(60, draw.clone()), off_drawing(65, draw.clone())];
        let d = decide(&witnessed(), &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::OffUncorroborated),
            "{draw:?}"
        );
    }
}

#[test]
fn an_off_under_the_threshold_fences() {
    let reads = [
        off_drawing(60, drawing(4.5)),
        off_drawing(65, drawing(20.0)),
    ];
    let d = decide(&witnessed(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::ConfirmedOff, "{}", d.reason);
    assert!(matches!(d.step, Step::Fence(_)));
    assert!(d.reason.contains("drawing 20 W"), "{}", d.reason);
    // Without corroborate, the power draw is evidence only: a high one does not block.
    let reads = [
        off_drawing(60, drawing(180.0)),
        off_drawing(65, drawing(180.0)),
    ];
    let d = decide(&dead(), &reads, &policy(), t(66));
    assert_eq!(d.rule, Rule::ConfirmedOff, "{}", d.reason);
}

/// A source that said Off while the kubelet went on living is refused: its Off reads never
/// fence, whatever they say later, until the tracker sees it read On (and drops the fact).
/// One sign of life after the Off is not enough: it may be a renewal delivered late.
#[test]
fn a_source_that_read_off_while_the_kubelet_lived_never_fences() {
    let reads = [off(60), off(65)];
    let watching = NodeFacts {
        off_while_alive: Some(OffWhileAlive {
            read_at: t(-300),
            signs_of_life_after: OFF_WHILE_ALIVE_PROOF - 1,
            gone: false,
        }),
        ..dead()
    };
    let d = decide(&watching, &reads, &policy(), t(66));
    assert_eq!(d.step, Step::Fence(FenceAction::Taint), "{d:?}");
    let proven = NodeFacts {
        off_while_alive: Some(OffWhileAlive {
            read_at: t(-300),
            signs_of_life_after: OFF_WHILE_ALIVE_PROOF,
            gone: false,
        }),
        ..dead()
    };
    for facts in [
        proven.clone(),
        NodeFacts {
            identity_check: IdentityCheck::Unchecked,
            ..proven.clone()
        },
    ] {
        let d = decide(&facts, &reads, &policy(), t(66));
        assert_eq!(
            (d.state, d.step, d.rule),
            (NodeState::Blocked, Step::Idle, Rule::OffWhileAlive),
            "{d:?}"
        );
        assert!(
            d.reason.contains("never fenced until it reads On"),
            "{}",
            d.reason
        );
        assert!(d.next_read_at.is_some(), "read again, to see it say On");
    }
    // Ready: healthy as ever (the problem shows in metrics, Events and `why`).
    let ready = NodeFacts {
        readiness: Readiness::Ready,
        lease_renewal_seen: Some(t(60)),
        lease_first_sight: false,
        ..proven
    };
    assert_eq!(decide(&ready, &[], &policy(), t(66)).rule, Rule::NodeReady);
}
