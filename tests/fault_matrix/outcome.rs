//! How the matrix judges its scenarios: the writes each expected against those seen, a failed
//! scenario's writes (none vouched for), and the summary line.

use super::Write;

/// What one scenario saw and expected.
pub(super) struct Outcome {
    pub(super) name: &'static str,
    pub(super) expected: Vec<Write>,
    pub(super) seen: Vec<Write>,
}

impl Outcome {
    /// Writes seen that the scenario did not expect (each expected write excuses one, and a
    /// taint the controller-manager dropped excuses the next taint of that node: the fence put
    /// back).
    pub(super) fn false_writes(&self) -> Vec<Write> {
        let mut left = self.expected.clone();
        let mut dropped = Vec::new();
        let mut extra = Vec::new();
        for w in &self.seen {
            if let Write::DroppedByController(node) = w {
                dropped.push(node.clone());
                continue;
            }
            if let Some(i) = left.iter().position(|e| e == w) {
                left.remove(i);
                continue;
            }
            match w {
                Write::Taint(node) if dropped.contains(node) => {
                    dropped.retain(|d| d != node);
                }
                _ => extra.push(w.clone()),
            }
        }
        extra
    }

    pub(super) fn missing_writes(&self) -> Vec<Write> {
        let mut left = self.expected.clone();
        for w in &self.seen {
            if let Some(i) = left.iter().position(|e| e == w) {
                left.remove(i);
            }
        }
        left
    }
}

/// A scenario that panicked before its end: every write its recorders saw, none vouched for.
pub(super) struct Failed {
    pub(super) name: &'static str,
    pub(super) why: String,
    pub(super) seen: Vec<Write>,
}

/// The suite's report lines, its last one the count of false fences, and that count: every
/// write a finished scenario did not expect, and every write of a failed scenario (it never
/// got to say which it expected, so none is vouched for).
pub(super) fn summary(outcomes: &[Outcome], failed: &[Failed]) -> (Vec<String>, usize) {
    let mut lines = Vec::new();
    let mut false_fences = 0;
    for o in outcomes {
        let extra = o.false_writes();
        let missing = o.missing_writes();
        false_fences += extra.len();
        lines.push(format!(
            "fault matrix: {:<65} writes {:?}{}{}",
            o.name,
            o.seen,
            if extra.is_empty() {
                String::new()
            } else {
                format!("  FALSE: {extra:?}")
            },
            if missing.is_empty() {
                String::new()
            } else {
                format!("  MISSING: {missing:?}")
            },
        ));
    }
    let mut unvouched = 0;
    for f in failed {
        let extra = Outcome {
            name: f.name,
            expected: Vec::new(),
            seen: f.seen.clone(),
        }
        .false_writes();
        unvouched += extra.len();
        lines.push(format!(
            "fault matrix: {:<65} FAILED, writes {:?}{}",
            f.name,
            f.seen,
            if extra.is_empty() {
                String::new()
            } else {
                format!("  UNVOUCHED: {extra:?}")
            },
        ));
    }
    false_fences += unvouched;
    let failed_note = match failed.len() {
        0 => String::new(),
        n => format!(
            " ({n} failed, whose {unvouched} writes count as false: a failed scenario vouches for none)"
        ),
    };
    lines.push(format!(
        "fault matrix: {} scenarios, {false_fences} false fences{failed_note}",
        outcomes.len() + failed.len()
    ));
    (lines, false_fences)
}

/// The summary counts a failed scenario and its writes: a run whose scenario panicked after a
/// node was wrongly tainted never says "0 false fences".
#[test]
fn the_summary_counts_the_writes_of_failed_scenarios() {
    let passed = Outcome {
        name: "passed",
        expected: vec![Write::Taint("a".into())],
        seen: vec![Write::Taint("a".into())],
    };
    let failed = Failed {
        name: "storm",
        why: "never reached rule storm".into(),
        seen: vec![Write::Taint("r1-a".into())],
    };
    let (lines, false_fences) = summary(&[passed], &[failed]);
    assert_eq!(false_fences, 1, "{lines:#?}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("fault matrix: 2 scenarios, 1 false fences"),
        "{last}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("storm") && l.contains("UNVOUCHED")),
        "{lines:#?}"
    );
    let quiet = Failed {
        name: "quiet",
        why: "timed out".into(),
        seen: vec![],
    };
    let (lines, false_fences) = summary(&[], &[quiet]);
    assert_eq!(false_fences, 0);
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("fault matrix: 1 scenarios, 0 false fences"),
        "{lines:#?}"
    );
}

/// The matrix's own bookkeeping: a taint the controller-manager dropped excuses exactly one
/// re-taint of that node, never an untaint, a delete or a second re-taint.
#[test]
fn a_dropped_taint_excuses_one_retaint_of_its_node() {
    let (t, d) = (
        |n: &str| Write::Taint(n.into()),
        |n: &str| Write::DroppedByController(n.into()),
    );
    let outcome = |seen: Vec<Write>| Outcome {
        name: "bookkeeping",
        expected: vec![t("a")],
        seen,
    };
    assert!(
        outcome(vec![t("a"), d("a"), t("a")])
            .false_writes()
            .is_empty()
    );
    assert_eq!(
        outcome(vec![t("a"), d("a"), t("a"), t("a")]).false_writes(),
        vec![t("a")]
    );
    assert_eq!(
        outcome(vec![t("a"), d("a"), t("b")]).false_writes(),
        vec![t("b")]
    );
    assert_eq!(
        outcome(vec![t("a"), Write::Untaint("a".into())]).false_writes(),
        vec![Write::Untaint("a".into())]
    );
    assert!(outcome(vec![d("a")]).missing_writes() == vec![t("a")]);
}
