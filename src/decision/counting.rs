//! Whether a read may count: its machine against the node's (identity), and the streak of reads
//! that confirms the newest one.

use super::*;

/// How a read's machine compares with the node's.
pub(super) fn identity_of(facts: &NodeFacts, r: &PowerReading) -> Verdict {
    identity::verify(&facts.identity, &r.identity)
}

/// Why a read may not count, and the rule that says so.
pub(super) struct NotCounted {
    pub(super) rule: Rule,
    pub(super) why: String,
}

impl NotCounted {
    fn new(rule: Rule, why: impl Into<String>) -> Self {
        NotCounted {
            rule,
            why: why.into(),
        }
    }
}

/// Whether a read may count towards a fence (or an unfence): its machine proved it is the
/// node's; or, for "gone" (an instance that no longer exists reports no addresses), the same
/// reader (credentials, endpoint) proved earlier that it knew this node's machine; or, for an
/// Off read, the entry says `identity = "unchecked"`. A mismatch never counts, checked or not;
/// and `unchecked` never turns "this reader cannot see the instance" into "gone".
pub(super) fn identity_counts(facts: &NodeFacts, r: &PowerReading) -> Result<(), NotCounted> {
    let d = match identity_of(facts, r) {
        Verdict::Match(_) => return Ok(()),
        Verdict::Mismatch(d) => return Err(NotCounted::new(Rule::IdentityMismatch, d)),
        Verdict::Unverifiable(d) => d,
    };
    if !r.state.is_gone() {
        if facts.identity_check == IdentityCheck::Unchecked {
            return Ok(());
        }
        if !facts.identity.uuid_shared_with.is_empty()
            && matches!(r.identity, identity::MachineIdentity::SystemUuid { .. })
        {
            return Err(NotCounted::new(Rule::DuplicateSystemUuid, d));
        }
        return Err(NotCounted::new(Rule::IdentityUnverified, d));
    }
    match &facts.identity_binding {
        // Equal words from two readers that each could not tell their key prove nothing.
        _ if !reading::reader_is_known(&r.reader) => Err(NotCounted::new(
            Rule::IdentityUnverified,
            format!(
                "{d}; this answer came through {}: a reader whose key is unknown names no account, so its \"gone\" proves nothing",
                r.reader
            ),
        )),
        Some(b) if b.verdict.is_match() && b.reader == r.reader => Ok(()),
        Some(b) if b.verdict.is_match() => Err(NotCounted::new(
            Rule::ReaderChanged,
            format!(
                "{d}; the instance was known as this node's machine through {} ({}), but this answer came through {}: new credentials, a new endpoint or another account prove nothing until they find the instance themselves",
                b.reader,
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                r.reader
            ),
        )),
        _ => Err(NotCounted::new(
            Rule::IdentityUnverified,
            format!(
                "{d}, and {} never answered for the node's machine, so \"gone\" may only mean \"not ours\"{}",
                r.reader,
                if facts.identity_check == IdentityCheck::Unchecked {
                    " (identity = \"unchecked\" relaxes which machine answers an Off read, never this)"
                } else {
                    ""
                }
            ),
        )),
    }
}

pub(super) fn identity_summary(facts: &NodeFacts, r: &PowerReading) -> String {
    match identity_of(facts, r) {
        Verdict::Match(d) => d,
        _ if r.state.is_gone() => match &facts.identity_binding {
            Some(b) if b.verdict.is_match() => format!(
                "{}, verified {} through {}",
                b.verdict.detail(),
                b.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                b.reader
            ),
            _ => "identity unverified".into(),
        },
        _ if facts.identity_check == IdentityCheck::Unchecked => {
            "identity unchecked by configuration".into()
        }
        _ => "identity unverified".into(),
    }
}

/// The reads that confirm the newest one: walking back from the newest, reads of the same kind
/// (Off, or gone: terminated / not found), each at least `interval` older than the previous
/// counted one; a read of that kind closer than that is skipped, and any other read ends the
/// streak.
pub(super) fn confirming_streak(
    reads: &[PowerReading],
    gone: bool,
    interval: Duration,
) -> Vec<&PowerReading> {
    let mut streak: Vec<&PowerReading> = Vec::new();
    for r in reads.iter().rev() {
        let same_kind = if gone {
            r.state.is_gone()
        } else {
            r.state == PowerState::Off
        };
        if !same_kind {
            break;
        }
        match streak.last() {
            Some(prev) if elapsed(r.at, prev.at) < interval => continue,
            _ => streak.push(r),
        }
    }
    streak
}
