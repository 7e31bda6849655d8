//! The elector's rules against a simulated API server: two instances (two identities, or one
//! identity on two hosts), arbitrary GET and PUT latencies, clocks that run apart by up to
//! 1 %, crashes at arbitrary times. The property: the spans during which each instance's
//! writes may land on the API server (from its first renewal's answer until its deadline
//! plus the time a write takes to be applied or given up by both sides) never overlap.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use proptest::prelude::*;
use tokio::time::Instant;

use super::{Core, Record, Step};
use crate::config::HaConfig;

/// Latencies of one round, as fractions of the round's bound.
#[derive(Clone, Debug)]
struct Lat {
    get_req: f64,
    get_resp: f64,
    put_req: f64,
    put_resp: f64,
}

/// A share of the round's bound: mostly small, often anything.
fn share() -> impl Strategy<Value = f64> {
    prop_oneof![3 => 0.0..0.05f64, 2 => 0.0..1.0f64]
}

fn lat() -> impl Strategy<Value = Lat> {
    // Mostly fast, sometimes slow, now and then past the bound (the round gives up; a PUT
    // may still land later).
    let part = prop_oneof![
        6 => 0.0..0.05f64,
        3 => 0.0..0.6f64,
        1 => 0.0..2.0f64,
    ];
    (part.clone(), part.clone(), part.clone(), part).prop_map(
        |(get_req, get_resp, put_req, put_resp)| Lat {
            get_req,
            get_resp,
            put_req,
            put_resp,
        },
    )
}

enum Ev {
    Start,
    /// The round's bound: a round not over by then gives up.
    Deadline(usize),
    /// The GET reaches the API server.
    Read(usize),
    /// The GET's answer arrives, with the resourceVersion it read.
    Answer(usize, Option<Record>, u64),
    /// The PUT (or create) reaches the API server: applied if nobody wrote since the read,
    /// whether or not the writer still waits for it.
    Apply(usize, u64, Record),
    /// The PUT's answer arrives (None: 409, someone wrote since our read).
    PutAnswer(usize, Option<Record>),
}

struct Proc {
    me: String,
    core: Core,
    /// This instance's clock runs at `rate` times real time.
    rate: f64,
    lats: Vec<Lat>,
    round: usize,
    /// The current round is over (answered, or given up).
    over: bool,
    /// Real time the current round started.
    started: f64,
    /// The resourceVersion the current round's GET read.
    read_rv: u64,
    crash_at: f64,
    /// From then on this instance is cut off from the API server: no round is answered.
    cut_at: f64,
    /// The write span open now: (since, may start writes until), real time.
    open: Option<(f64, f64)>,
    /// Closed spans: (since, last write landed or given up by).
    spans: Vec<(f64, f64)>,
    wrote_any: bool,
}

struct Sim {
    ha: HaConfig,
    base: Instant,
    record: Option<Record>,
    rv: u64,
    stamp: u64,
    procs: Vec<Proc>,
    /// (real time in µs, sequence) -> (instance, event).
    events: BTreeMap<(u64, u64), (usize, Ev)>,
    seq: u64,
}

impl Sim {
    fn local(&self, p: usize, real: f64) -> Instant {
        self.base + Duration::from_secs_f64(real * self.procs[p].rate)
    }

    fn real(&self, p: usize, at: Instant) -> f64 {
        at.duration_since(self.base).as_secs_f64() / self.procs[p].rate
    }

    /// A duration on instance `p`'s clock, in real seconds.
    fn span(&self, p: usize, d: Duration) -> f64 {
        d.as_secs_f64() / self.procs[p].rate
    }

    fn at(&mut self, real: f64, p: usize, ev: Ev) {
        self.seq += 1;
        self.events.insert(((real * 1e6) as u64, self.seq), (p, ev));
    }

    /// The elector's bound on one round, as in `Elector::attempt`.
    fn bound(&self, p: usize) -> f64 {
        self.span(p, self.ha.write_timeout().max(Duration::from_secs(1)))
    }

    /// Writes stop starting at `t` (or earlier if the deadline is earlier).
    fn stop_writing(&mut self, p: usize, t: f64) {
        if let Some((_, until)) = &mut self.procs[p].open {
            *until = until.min(t);
        }
    }

    fn close(&mut self, p: usize) {
        let settle = self.span(p, self.ha.write_settled_within());
        if let Some((since, until)) = self.procs[p].open.take()
            && until > since
        {
            self.procs[p].spans.push((since, until + settle));
        }
    }

    /// The round is over at `t`: the next starts `renew_interval` later.
    fn end_round(&mut self, p: usize, t: f64) {
        self.procs[p].over = true;
        let next = t + self.span(p, self.ha.renew_interval);
        self.at(next, p, Ev::Start);
    }

    fn lat(&self, p: usize) -> Lat {
        let l = &self.procs[p].lats;
        let mut lat = l[self.procs[p].round % l.len()].clone();
        if self.procs[p].started >= self.procs[p].cut_at {
            lat.get_req = 2.0;
        }
        lat
    }

    fn step(&mut self, t: f64, p: usize, ev: Ev) {
        let crashed = t >= self.procs[p].crash_at;
        if crashed {
            let crash_at = self.procs[p].crash_at;
            self.stop_writing(p, crash_at);
        }
        let bound = self.bound(p);
        let lat = self.lat(p);
        // Whether an answer to round `r` still finds the round waiting for it.
        let waiting = |s: &Sim, r: usize| !crashed && s.procs[p].round == r && !s.procs[p].over;
        match ev {
            Ev::Start => {
                if crashed {
                    return;
                }
                let r = self.procs[p].round + 1;
                self.procs[p].round = r;
                self.procs[p].over = false;
                self.procs[p].started = t;
                let lat = self.lat(p);
                self.at(t + lat.get_req * bound, p, Ev::Read(r));
                self.at(t + bound, p, Ev::Deadline(r));
            }
            Ev::Deadline(r) => {
                if waiting(self, r) {
                    self.end_round(p, t);
                }
            }
            Ev::Read(r) => {
                let snapshot = self.record.clone();
                self.at(
                    t + lat.get_resp * bound,
                    p,
                    Ev::Answer(r, snapshot, self.rv),
                );
            }
            Ev::Answer(r, record, rv) => {
                if !waiting(self, r) {
                    return;
                }
                self.procs[p].read_rv = rv;
                let answered = self.local(p, t);
                match self.procs[p].core.read(record.as_ref(), answered) {
                    Step::Follow => {
                        self.stop_writing(p, t);
                        self.end_round(p, t);
                    }
                    step => {
                        self.stamp += 1;
                        let renew = Timestamp::from_second(1_700_000_000).unwrap()
                            + Duration::from_micros(self.stamp);
                        let term = record.as_ref().map(|r| r.term).unwrap_or(0);
                        let term = if step == Step::TakeOver {
                            term + 1
                        } else {
                            term
                        };
                        self.procs[p].core.sending(renew);
                        let written = Record {
                            holder: Some(self.procs[p].me.clone()),
                            renew: Some(renew),
                            term,
                        };
                        let read_rv = self.procs[p].read_rv;
                        self.at(t + lat.put_req * bound, p, Ev::Apply(r, read_rv, written));
                    }
                }
            }
            Ev::Apply(r, read_rv, record) => {
                let ok = self.rv == read_rv;
                if ok {
                    self.record = Some(record.clone());
                    self.rv += 1;
                }
                self.at(
                    t + lat.put_resp * bound,
                    p,
                    Ev::PutAnswer(r, ok.then_some(record)),
                );
            }
            Ev::PutAnswer(r, written) => {
                if !waiting(self, r) {
                    return;
                }
                match written {
                    Some(record) => {
                        let answered = self.local(p, t);
                        self.procs[p].core.wrote(record, answered);
                        let started = self.local(p, self.procs[p].started);
                        let until = self.real(p, self.procs[p].core.writable_until(started));
                        match &mut self.procs[p].open {
                            Some((_, u)) if t < *u => *u = u.max(until),
                            _ => {
                                self.close(p);
                                self.procs[p].open = Some((t, until));
                            }
                        }
                        self.procs[p].wrote_any |= until > t;
                    }
                    None => self.stop_writing(p, t),
                }
                self.end_round(p, t);
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Case {
    /// (lease_duration, renew_interval) in seconds: valid `[ha]` settings.
    lease: (u64, u64),
    same_identity: bool,
    /// Per instance: clock rate, first round (s), crash (s), cut off (s), latencies.
    procs: Vec<(f64, f64, f64, f64, Vec<Lat>)>,
}

fn case() -> impl Strategy<Value = Case> {
    let lease = prop_oneof![Just((9, 1)), Just((15, 2)), Just((30, 5))];
    let proc = (
        0.995..1.005f64,
        0.0..20.0f64,
        prop_oneof![0.0..90.0f64, Just(f64::INFINITY)],
        prop_oneof![0.0..90.0f64, Just(f64::INFINITY)],
        prop::collection::vec(lat(), 1..40),
    );
    (lease, any::<bool>(), prop::collection::vec(proc, 2)).prop_map(
        |(lease, same_identity, procs)| Case {
            lease,
            same_identity,
            procs,
        },
    )
}

struct Outcome {
    /// Per instance, the spans during which its writes may land.
    spans: Vec<Vec<(f64, f64)>>,
    wrote_any: bool,
    duplicate_seen: bool,
}

fn run(case: &Case) -> Outcome {
    let ha = HaConfig {
        namespace: "oobfence".into(),
        identity: "a".into(),
        lease_duration: Duration::from_secs(case.lease.0),
        renew_interval: Duration::from_secs(case.lease.1),
    };
    let mut sim = Sim {
        ha: ha.clone(),
        base: Instant::now(),
        record: None,
        rv: 0,
        stamp: 0,
        procs: Vec::new(),
        events: BTreeMap::new(),
        seq: 0,
    };
    for (i, (rate, first, crash_at, cut_at, lats)) in case.procs.iter().enumerate() {
        let me = if case.same_identity || i == 0 {
            "a"
        } else {
            "b"
        };
        sim.procs.push(Proc {
            me: me.to_string(),
            over: true,
            core: Core::new(me, ha.lease_duration, ha.safety_margin()),
            rate: *rate,
            lats: lats.clone(),
            round: 0,
            started: 0.0,
            read_rv: 0,
            crash_at: *crash_at,
            cut_at: *cut_at,
            open: None,
            spans: Vec::new(),
            wrote_any: false,
        });
        sim.at(*first, i, Ev::Start);
    }
    let mut duplicate_seen = false;
    for _ in 0..20_000 {
        let Some(((t, _), (p, ev))) = sim.events.pop_first() else {
            break;
        };
        let t = t as f64 / 1e6;
        if t > 200.0 {
            break;
        }
        sim.step(t, p, ev);
        let now = sim.local(p, t);
        duplicate_seen |= sim.procs[p].core.duplicate(now);
    }
    for p in 0..sim.procs.len() {
        sim.close(p);
    }
    Outcome {
        spans: sim.procs.iter().map(|p| p.spans.clone()).collect(),
        wrote_any: sim.procs.iter().any(|p| p.wrote_any),
        duplicate_seen,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Whatever the latencies, clocks and crashes: the leader's last write has landed (or
    /// been given up by both sides) before the other instance may write its first.
    #[test]
    fn never_two_writers(case in case()) {
        let out = run(&case);
        for a in &out.spans[0] {
            for b in &out.spans[1] {
                prop_assert!(
                    a.1 <= b.0 || b.1 <= a.0,
                    "write spans overlap: {a:?} and {b:?} (all: {:?})",
                    out.spans
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// One handover, closely: the leader's last renewing round starts at 0 and its renewal
    /// lands at any time within the round's bound; the standby's GETs, sent at any phase,
    /// each take any time within the bound on the way there and back. Whenever the standby
    /// decides to take over, the leader's writes have settled.
    #[test]
    fn a_takeover_waits_for_the_leaders_writes(
        lease in prop_oneof![Just((9u64, 1u64)), Just((15, 2)), Just((30, 5))],
        landed in 0.0..1.0f64,
        phase in 0.0..1.0f64,
        rates in (0.995..1.005f64, 0.995..1.005f64),
        gets in prop::collection::vec((share(), share()), 1..100),
    ) {
        let ha = HaConfig {
            namespace: "oobfence".into(),
            identity: "b".into(),
            lease_duration: Duration::from_secs(lease.0),
            renew_interval: Duration::from_secs(lease.1),
        };
        let base = Instant::now() + Duration::from_secs(100);
        let (leader_rate, standby_rate) = rates;
        let on = |rate: f64, real: f64| {
            if real >= 0.0 {
                base + Duration::from_secs_f64(real * rate)
            } else {
                base - Duration::from_secs_f64(-real * rate)
            }
        };
        let bound = ha.write_timeout().max(Duration::from_secs(1)).as_secs_f64();
        // The leader (its own clock): writes start until its deadline, and settle after.
        let leader = Core::new("a", ha.lease_duration, ha.safety_margin());
        let until = leader.writable_until(on(leader_rate, 0.0));
        let settled = (until - base).as_secs_f64() / leader_rate
            + ha.write_settled_within().as_secs_f64() / leader_rate;
        let landed = landed * bound / leader_rate;
        let record = |renew: i64| Record {
            holder: Some("a".into()),
            renew: Some(Timestamp::from_second(1_700_000_000 + renew).unwrap()),
            term: 1,
        };
        let mut standby = Core::new("b", ha.lease_duration, ha.safety_margin());
        let renew = ha.renew_interval.as_secs_f64() / standby_rate;
        let bound_real = bound / standby_rate;
        // The standby's first GET goes out up to a round before the renewal lands.
        let mut sent = landed - phase * (bound_real + renew);
        for (there, back) in gets.iter().cycle().take(400) {
            let read = sent + there * bound_real;
            let answered = read + back * bound_real;
            if answered - sent <= bound_real {
                let seen = if read >= landed { record(2) } else { record(1) };
                if standby.read(Some(&seen), on(standby_rate, answered)) == Step::TakeOver {
                    prop_assert!(
                        answered >= settled,
                        "took over at {answered:.3} s; the leader's writes settle by {settled:.3} s"
                    );
                    break;
                }
            }
            sent = answered.min(sent + bound_real) + renew;
        }
    }
}

fn fast(n: usize) -> Vec<Lat> {
    vec![
        Lat {
            get_req: 0.01,
            get_resp: 0.01,
            put_req: 0.01,
            put_resp: 0.01,
        };
        n
    ]
}

/// The simulation is not vacuous: with a fast API server the first instance leads, and the
/// other takes over after it crashes, not before a lease duration has passed.
#[test]
fn takeover_after_a_crash() {
    for same_identity in [false, true] {
        let case = Case {
            lease: (9, 1),
            same_identity,
            procs: vec![
                (1.0, 0.0, 20.0, f64::INFINITY, fast(1)),
                (1.0, 0.5, f64::INFINITY, f64::INFINITY, fast(1)),
            ],
        };
        let out = run(&case);
        assert!(out.wrote_any);
        assert_eq!(out.spans[0].len(), 1, "{:?}", out.spans);
        assert_eq!(out.spans[1].len(), 1, "{:?}", out.spans);
        let (a, b) = (out.spans[0][0], out.spans[1][0]);
        assert!(a.0 < 1.0, "{a:?}");
        assert!(b.0 >= 20.0 + 9.0 - 1.0 && b.0 < 20.0 + 9.0 + 3.0, "{b:?}");
        // The second instance under the same name saw the first renew as it.
        assert_eq!(out.duplicate_seen, same_identity);
    }
}

/// A standby whose GET was slow: the leader's renewal landed while the GET was on its way.
/// Counting from the GET's send would take over before the leader's writes have settled.
#[test]
fn a_slow_get_does_not_date_the_renewal_back() {
    let slow_then_fast = {
        let mut l = fast(8);
        // The standby's first round: the request waits 95 % of the bound on its way.
        l[1].get_req = 0.95;
        l
    };
    let case = Case {
        lease: (9, 1),
        same_identity: false,
        // The leader's rounds start at 0, ~1.09 and ~2.18 s; the last renewal lands at
        // ~2.25 s, while the standby's GET sent at 0.2 s is on its way (it reads at ~2.34 s).
        // Then the leader is cut off from the API server: it writes until its deadline.
        procs: vec![
            (1.0, 0.0, f64::INFINITY, 2.5, fast(1)),
            (1.0, 0.2, f64::INFINITY, f64::INFINITY, slow_then_fast),
        ],
    };
    let out = run(&case);
    assert_eq!(out.spans[0].len(), 1, "{:?}", out.spans);
    assert_eq!(
        out.spans[1].len(),
        1,
        "the standby never took over: {:?}",
        out.spans
    );
    let (a, b) = (out.spans[0][0], out.spans[1][0]);
    assert!(
        a.1 <= b.0,
        "the standby wrote from {:.2} s, the leader's writes settle by {:.2} s",
        b.0,
        a.1
    );
}
