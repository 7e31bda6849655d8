//! One node decided, in three steps: its facts gathered ([`super::facts`]), the decision core
//! asked ([`decision::decide`]: pure, the one place a node's fate is decided), and the decision
//! carried out ([`super::carry_out`]).

use std::sync::Arc;

use jiff::Timestamp;

use super::facts::Gathered;
use super::state::Daemon;
use crate::cluster::NodeView;
use crate::decision::{self, Decision};

impl Daemon {
    pub(super) fn evaluate(&mut self, node: &Arc<NodeView>, now: Timestamp) -> Decision {
        let Gathered { facts, source } = self.gather_facts(node, now);
        let name = node.name.clone();
        let reads = self.trackers.get(&name).map_or(&[][..], |t| &t.reads[..]);
        let decision = decision::decide(&facts, reads, &self.cfg.policy, now);
        self.carry_out(node, facts, source, &decision, now);
        decision
    }
}
