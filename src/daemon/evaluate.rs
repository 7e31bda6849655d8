//! One node decided, in three steps: its facts gathered ([`super::facts`]), the decision core
//! asked ([`decision::levels::decide_levels`], [`decision::decide`]: pure, the one place a
//! node's fate is decided), and the decision carried out ([`super::carry_out`]).

use std::sync::Arc;

use jiff::Timestamp;

use super::facts::Gathered;
use super::state::Daemon;
use crate::cluster::NodeView;
use crate::decision::levels::{Member, Outcome};
use crate::decision::{self, Decision};

impl Daemon {
    pub(super) fn evaluate(&mut self, node: &Arc<NodeView>, now: Timestamp) -> Decision {
        let mut gathered = self.gather_facts(node, now);
        let mut outcome = self.decide(node, &gathered, now);
        // Outside a pass the guards are the last pass's count, and the cache may have moved
        // since: the rack's other node NotReady a moment ago makes this one's fence a storm's.
        // A write is decided on a count of the cache as it is now (a count per write, not per
        // event: writes are few).
        if !self.census_current && outcome.decision.step.writes() && self.write_may_start(node) {
            let nodes = self.nodes.all();
            self.update_guards(&nodes, now);
            let holds = self.holds_of(node, now);
            for m in &mut gathered.members {
                m.holds = holds.clone();
            }
            gathered.facts.holds = holds;
            outcome = self.decide(node, &gathered, now);
        }
        let decision = outcome.decision.clone();
        self.carry_out(node, gathered, outcome, now);
        decision
    }

    /// The core's outcome for the node, from its facts and each source's reads.
    pub(super) fn decide(&self, node: &NodeView, gathered: &Gathered, now: Timestamp) -> Outcome {
        let Some(t) = self.trackers.get(&node.name) else {
            return decision::levels::decide_levels(&gathered.facts, &[], &self.cfg.policy, now);
        };
        let members: Vec<Member<'_>> = t
            .sources
            .iter()
            .zip(&gathered.members)
            .map(|(s, facts)| Member {
                level: s.level,
                label: s.label.clone(),
                attested: facts.identity_check == crate::identity::IdentityCheck::Checked,
                facts: facts.clone(),
                reads: &s.reads,
            })
            .collect();
        decision::levels::decide_levels(&gathered.facts, &members, &self.cfg.policy, now)
    }
}
