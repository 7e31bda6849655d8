//! A person's confirmation as `why` and `/nodes` show it: who, why, for which boot, and
//! whether it stands now, whether or not the decision consulted it (it stands in only where no
//! power source can answer, so a BMC answering On leaves it unconsulted, and shown here).

use std::fmt::Write as _;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::decision::NodeFacts;
use crate::decision::confirmation::{self, Confirmation, Standing};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConfirmationReport {
    /// As the person gave it (empty: not given; the API server's audit log names who).
    #[serde(default)]
    pub by: String,
    #[serde(default)]
    pub reason: String,
    /// The boot it confirms off.
    #[serde(default)]
    pub boot_id: String,
    /// When it was made, as far as oobfence can tell (none for a malformed annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// When this daemon first saw the annotation's value.
    pub seen: Timestamp,
    /// `stands`, `void` (another boot, the node not NotReady, a sign of life after it) or
    /// `invalid` (the annotation is no confirmation).
    pub standing: String,
    /// Why it is void or invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

impl ConfirmationReport {
    /// A confirmation, and whether it stands for the node as `facts` show it.
    pub fn of(c: &Confirmation, facts: &NodeFacts) -> ConfirmationReport {
        let (standing, problem) = match confirmation::standing(c, facts) {
            Standing::Stands => ("stands", None),
            Standing::Void(why) => ("void", Some(why)),
        };
        ConfirmationReport {
            by: c.note.by.clone(),
            reason: c.note.reason.clone(),
            boot_id: c.note.boot_id.clone(),
            at: Some(c.made_at()),
            seen: c.seen,
            standing: standing.into(),
            problem,
        }
    }

    /// An annotation that is no confirmation, and what is wrong with it.
    pub fn invalid(problem: &str, seen: Timestamp) -> ConfirmationReport {
        ConfirmationReport {
            by: String::new(),
            reason: String::new(),
            boot_id: String::new(),
            at: None,
            seen,
            standing: "invalid".into(),
            problem: Some(problem.to_string()),
        }
    }

    /// The `why` line.
    pub fn render(&self, s: &mut String) {
        if self.standing == "invalid" {
            let _ = writeln!(
                s,
                "  confirmed:    INVALID, never acted on: {}",
                self.problem.as_deref().unwrap_or_default()
            );
            return;
        }
        let by = if self.by.is_empty() {
            "a person (the API server's audit log names who)"
        } else {
            &self.by
        };
        let at = self
            .at
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        let standing = match (self.standing.as_str(), &self.problem) {
            ("stands", _) => {
                "STANDS (it decides only where no power source can answer; every hold still applies)"
                    .to_string()
            }
            (_, Some(why)) => format!("VOID, never counts: {why}"),
            (other, None) => other.to_uppercase(),
        };
        let _ = writeln!(
            s,
            "  confirmed:    off by {by} at {at} for boot {}: {:?}; {standing}",
            self.boot_id, self.reason
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::confirmation::ConfirmationNote;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn why_says_who_confirmed_which_boot_and_whether_it_stands() {
        let mut report = ConfirmationReport {
            by: "alice".into(),
            reason: "cord pulled".into(),
            boot_id: "boot-a".into(),
            at: Some(t(0)),
            seen: t(1),
            standing: "stands".into(),
            problem: None,
        };
        let mut s = String::new();
        report.render(&mut s);
        assert!(s.contains("off by alice at"), "{s}");
        assert!(
            s.contains("for boot boot-a: \"cord pulled\"; STANDS"),
            "{s}"
        );
        report.standing = "void".into();
        report.problem = Some("the node is not NotReady".into());
        report.by = String::new();
        let mut s = String::new();
        report.render(&mut s);
        assert!(s.contains("audit log names who"), "{s}");
        assert!(
            s.contains("VOID, never counts: the node is not NotReady"),
            "{s}"
        );
        let mut s = String::new();
        ConfirmationReport::invalid("no bootID", t(1)).render(&mut s);
        assert!(s.contains("INVALID, never acted on: no bootID"), "{s}");
    }

    #[test]
    fn made_at_is_never_after_oobfence_first_saw_it() {
        let note = ConfirmationNote {
            boot_id: "boot-a".into(),
            reason: "r".into(),
            by: String::new(),
            at: Some(t(50)),
        };
        let c = Confirmation { note, seen: t(10) };
        assert_eq!(c.made_at(), t(10));
        let earlier = Confirmation { seen: t(60), ..c };
        assert_eq!(earlier.made_at(), t(50));
    }
}
