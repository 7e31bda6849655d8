//! What the daemon remembers about each of a node's power sources: one per `[[bmc]]` entry (or
//! `[aws]`) that maps the node ([`crate::config::Config::mappings_for`]), indexed like the
//! members the decision core is given ([`crate::decision::levels::Member`]). Each keeps its own
//! reads, identity verdict, Off-while-alive watch and generation: a BMC gone dark says nothing
//! about the PDU outlet that feeds the same machine.

use std::time::Instant;

use jiff::Timestamp;

use crate::config::{Config, IdentityCheck};
use crate::decision::{self, IdentityBinding, OffWitness, PowerReading, ReadErrorKind};
use crate::power::{MappedSource, PowerSources};

/// One power source of a node, and what its reads said.
#[derive(Default)]
pub(super) struct SourceTrack {
    /// The fencing level its reads prove at.
    pub(super) level: u32,
    /// How `why` and the journal name it: the entry, its backend and target.
    pub(super) label: String,
    /// Its backend and target: what a reload compares (an entry moved in the file is the
    /// same source).
    pub(super) target: String,
    pub(super) source: Option<MappedSource>,
    /// The mapping's identity check (`unchecked`: the mapping the operator wrote is the proof).
    pub(super) identity: IdentityCheck,
    /// The second witness the mapping asks of an Off read.
    pub(super) witness: Option<OffWitness>,
    /// Why the mapping refuses power actions (`None`: `actuate = true`).
    pub(super) actuation_refused: Option<String>,
    /// The machine it reads, where it may feed several nodes (a level ≥ 2 entry: an outlet).
    pub(super) shared_key: Option<String>,
    pub(super) reads: Vec<PowerReading>,
    pub(super) read_in_flight: bool,
    /// The last identity verdict a read through it gave.
    pub(super) binding: Option<IdentityBinding>,
    /// When a healthy node's next read of it is due.
    pub(super) identity_due: Option<Instant>,
    /// The last read, for any purpose: when, and how it failed if it did.
    pub(super) last_read: Option<(Timestamp, Option<ReadErrorKind>)>,
    /// The last read that was answered (not an error).
    pub(super) last_answer: Option<Timestamp>,
    /// It said Off while the node was Ready (since its last On), and the signs of life since.
    pub(super) off_while_alive: Option<OffSeen>,
    /// Unique within the node's tracker: every read is tagged with it when sent, and an
    /// answer whose source a reload has replaced since finds none.
    pub(super) generation: u64,
}

/// An Off read of a Ready node's machine, and the kubelet's signs of life seen after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct OffSeen {
    pub(super) read_at: Timestamp,
    /// When the read's answer arrived (oobfence's clock): only later signs count.
    pub(super) answered_at: Timestamp,
    pub(super) signs: u32,
    pub(super) last_sign: Option<Timestamp>,
    /// Whether the proof was reported (log, Event, journal).
    pub(super) reported: bool,
    /// The read said gone (terminated, not found) rather than Off.
    pub(super) gone: bool,
    /// The bootID then: signs of life from another boot prove nothing (the machine may well
    /// have been off, then started again).
    pub(super) boot_id: Option<String>,
}

impl SourceTrack {
    /// The same source as `other`: the same level, backend and target (a reload that leaves
    /// it so keeps what it read).
    fn same_as(&self, other: &SourceTrack) -> bool {
        self.level == other.level && self.target == other.target
    }

    /// Its last read within `window` of `now`, if any: whether it failed.
    fn failed_within(&self, now: Timestamp, window: std::time::Duration) -> Option<bool> {
        self.last_read
            .filter(|(at, _)| {
                std::time::Duration::try_from(now.duration_since(*at))
                    .unwrap_or(std::time::Duration::ZERO)
                    <= window
            })
            .map(|(_, failure)| failure.is_some())
    }
}

/// The sources `cfg` maps `node` to, built from `sources`, fresh (no reads).
pub(super) fn build(
    cfg: &Config,
    sources: &PowerSources,
    node: &str,
    provider_id: Option<&str>,
) -> Vec<SourceTrack> {
    cfg.mappings_for(node)
        .into_iter()
        .filter_map(|m| {
            let source = sources.for_mapping(m, node, provider_id)?;
            let shared_key = match m {
                crate::config::Mapping::Bmc(b) if b.level > 1 => Some(b.machine_key(node)),
                _ => None,
            };
            Some(SourceTrack {
                level: m.level(),
                label: format!(
                    "{} ({} {})",
                    m.label(),
                    source.source.backend(),
                    source.source.address()
                ),
                target: format!("{} {}", source.source.backend(), source.source.address()),
                identity: m.identity(),
                witness: m.off_witness(),
                actuation_refused: m.actuation_refused(),
                shared_key,
                source: Some(source),
                ..Default::default()
            })
        })
        .collect()
}

/// `fresh` takes what `old` remembers of each source it keeps (the same level, backend and
/// target); every other one starts afresh under a new generation. Whether any source changed.
pub(super) fn carry_over(
    old: &mut Vec<SourceTrack>,
    fresh: &mut [SourceTrack],
    next_generation: &mut u64,
) -> bool {
    let mut changed = old.len() != fresh.len();
    for f in fresh.iter_mut() {
        match old.iter().position(|o| o.same_as(f)) {
            Some(i) => {
                let o = old.swap_remove(i);
                f.reads = o.reads;
                f.read_in_flight = o.read_in_flight;
                f.binding = o.binding;
                f.identity_due = o.identity_due;
                f.last_read = o.last_read;
                f.last_answer = o.last_answer;
                f.off_while_alive = o.off_while_alive;
                f.generation = o.generation;
            }
            None => {
                changed = true;
                *next_generation += 1;
                f.generation = *next_generation;
            }
        }
    }
    changed
}

/// Whether a node counts as failing in the read census: only when none of its sources
/// answered within the window and one failed (a rack whose BMCs went dark while the PDU
/// outlets answer is not a management network gone). `None`: no source read in the window.
pub(super) fn census_failing(
    sources: &[SourceTrack],
    now: Timestamp,
    window: std::time::Duration,
) -> Option<bool> {
    let reads: Vec<bool> = sources
        .iter()
        .filter_map(|s| s.failed_within(now, window))
        .collect();
    if reads.is_empty() {
        return None;
    }
    Some(reads.iter().all(|failed| *failed))
}

/// Why an outlet that feeds `node` and the other nodes of `fed` may not be switched: one of
/// them is not NotReady and silent (its machine may well run on it).
pub(super) fn feeds_a_live_node(
    fed: &[String],
    node: &str,
    label: &str,
    down_and_silent: impl Fn(&str) -> bool,
) -> Option<String> {
    let alive = fed
        .iter()
        .find(|other| *other != node && !down_and_silent(other))?;
    Some(format!(
        "outlet {label} also feeds node {alive}, which is alive (not NotReady and silent): switching it would cut a running machine's power"
    ))
}

/// The node's facts with source `s`'s own: what it proves of identity, its witness, its
/// verdict, its Off-while-alive watch, and whether it may act.
pub(super) fn member_facts(
    base: &decision::NodeFacts,
    s: &SourceTrack,
    actuation: bool,
) -> decision::NodeFacts {
    let mut facts = base.clone();
    facts.has_power_source = true;
    facts.identity_check = s.identity;
    facts.off_witness = s.witness;
    facts.identity_binding = s.binding.clone();
    facts.off_while_alive = s.off_while_alive.as_ref().map(|o| decision::OffWhileAlive {
        read_at: o.read_at,
        signs_of_life_after: o.signs,
        gone: o.gone,
    });
    if actuation && facts.readiness != decision::Readiness::Ready {
        facts.actuation.source_refuses = s.actuation_refused.clone();
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn read(at: i64, failed: bool) -> SourceTrack {
        SourceTrack {
            last_read: Some((t(at), failed.then_some(ReadErrorKind::Unreachable))),
            ..Default::default()
        }
    }

    /// A shared outlet is never switched for one of its nodes while another lives.
    #[test]
    fn an_outlet_feeding_a_live_node_refuses_to_act() {
        let fed = ["twin-a".to_string(), "twin-b".to_string()];
        let label = "[[bmc]] #2 (fence-agent fence_apc_snmp pdu-7)";
        let why = feeds_a_live_node(&fed, "twin-a", label, |n| n != "twin-b");
        assert_eq!(
            why.as_deref(),
            Some(
                "outlet [[bmc]] #2 (fence-agent fence_apc_snmp pdu-7) also feeds node twin-b, which is alive (not NotReady and silent): switching it would cut a running machine's power"
            )
        );
        assert_eq!(feeds_a_live_node(&fed, "twin-a", label, |_| true), None);
    }

    /// The freeze's census: a node whose BMC went dark while its PDU outlet answers is not a
    /// failing source (a rack's BMCs dark with their machines is not a management network
    /// gone); it is only when none of its levels answers.
    #[test]
    fn a_node_fails_the_census_only_when_none_of_its_sources_answers() {
        let window = std::time::Duration::from_secs(300);
        let now = t(100);
        assert_eq!(census_failing(&[], now, window), None, "no source");
        assert_eq!(
            census_failing(&[read(90, true)], now, window),
            Some(true),
            "one source, dark"
        );
        assert_eq!(
            census_failing(&[read(90, true), read(95, false)], now, window),
            Some(false),
            "the BMC dark, the outlet answers"
        );
        assert_eq!(
            census_failing(&[read(95, true), read(90, false)], now, window),
            Some(false),
            "the BMC failed after the outlet answered: still one level answers"
        );
        assert_eq!(
            census_failing(&[read(90, true), read(95, true)], now, window),
            Some(true),
            "every level dark"
        );
        assert_eq!(
            census_failing(&[read(90, true), read(-1000, false)], now, window),
            Some(true),
            "an answer older than the window does not count"
        );
        assert_eq!(
            census_failing(&[read(-1000, true)], now, window),
            None,
            "a failure older than the window neither"
        );
    }
}
