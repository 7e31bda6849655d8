//! `outlet`: a Redfish `[[bmc]]` entry that reads the PDU outlet feeding each node
//! (`/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/{node}`) instead of the node's
//! ComputerSystem. An outlet proves only the mapping the operator wrote: it cannot say whose
//! machine it feeds, so such an entry must say `identity = "unchecked"` knowingly.

use super::limits::DEFAULT_MAX_OFF_WATTS;
use super::{BmcEntry, Protocol, RawBmc};
use crate::config::IdentityCheck;
use crate::decision::{OffWitness, Watts};

/// What the examples name: an outlet of DMTF's rack PDU schema.
const EXAMPLE: &str = "\"/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/{node}\"";

impl RawBmc {
    /// The problems of `outlet` and the keys that go with it, as (key, problem).
    pub(super) fn outlet_problems(&self) -> Vec<(&'static str, String)> {
        let Some(outlet) = &self.outlet else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        if self.protocol != Protocol::Redfish {
            problems.push((
                "outlet",
                "applies to protocol = \"redfish\" only (a PDU outlet read through its Redfish service)".into(),
            ));
            return problems;
        }
        if self.system.is_some() {
            problems.push((
                "outlet",
                "set system (the machine's ComputerSystem, read through its BMC) or outlet (the PDU outlet that feeds it), not both: write one entry for each".into(),
            ));
        }
        if !outlet.starts_with('/') || outlet.starts_with("//") {
            problems.push((
                "outlet",
                format!("{outlet:?} must be a path on the PDU's Redfish service such as {EXAMPLE}"),
            ));
        } else if !outlet
            .trim_end_matches('/')
            .rsplit_once('/')
            .is_some_and(|(collection, id)| collection.ends_with("/Outlets") && !id.is_empty())
        {
            problems.push((
                "outlet",
                format!(
                    "{outlet:?} does not name a member of an Outlets collection: use the path of the outlet itself, such as {EXAMPLE}"
                ),
            ));
        }
        if self.identity != IdentityCheck::Unchecked {
            problems.push((
                "identity",
                "a PDU outlet reports no machine identity (it cannot tell whose machine it feeds), so its Off reads prove only this entry's mapping of nodes to outlets: set identity = \"unchecked\" to trust it knowingly (check-config and why say so)".into(),
            ));
        }
        problems
    }
}

impl BmcEntry {
    /// The most an outlet that reads Off may draw and still count as off: the entry's
    /// `max_off_watts` where `corroborate = "power-draw"` sets one, the same default otherwise.
    /// An open relay passes no current; a reading above this is a load still fed.
    pub fn outlet_max_off_watts(&self) -> Watts {
        match self.corroborate {
            Some(OffWitness::PowerDraw { max_off_watts }) => max_off_watts,
            None => Watts::whole(DEFAULT_MAX_OFF_WATTS),
        }
    }
}
