//! Which machine (or PDU outlet) a `[[bmc]]` entry reads for a node, as one comparable key.

use super::{BmcEntry, Protocol};
use crate::config::ipmi;

impl BmcEntry {
    /// The machine this entry reads for `node`, normalised so that two spellings of one
    /// target compare equal: scheme and host in lower case, the default port written out
    /// (`https://h/` = `https://H:443`), no trailing slash on the system path. A Redfish
    /// outlet entry's key names the outlet (`redfish outlet https://pdu:443/.../Outlets/A1`):
    /// every node it feeds reads that one source.
    pub fn machine_key(&self, node: &str) -> String {
        let address = self.address_for(node);
        let system = self.system_for(node).unwrap_or_default();
        let system = system.trim_end_matches('/');
        match self.protocol {
            Protocol::Redfish => {
                let target = match reqwest::Url::parse(address.trim()) {
                    // A proxy's path prefix is part of the target: two prefixes, two BMCs.
                    Ok(u) => format!(
                        "{}://{}:{}{}",
                        u.scheme(),
                        u.host_str().unwrap_or_default().to_ascii_lowercase(),
                        u.port_or_known_default().unwrap_or(0),
                        u.path().trim_end_matches('/')
                    ),
                    Err(_) => address.trim().trim_end_matches('/').to_ascii_lowercase(),
                };
                match self.outlet_for(node) {
                    Some(outlet) => {
                        format!("redfish outlet {target}{}", outlet.trim_end_matches('/'))
                    }
                    None => format!("redfish {target}{system}"),
                }
            }
            Protocol::Ipmi => match ipmi::parse_address(&address) {
                Ok((host, port)) => format!("ipmi {}:{port}", host.to_ascii_lowercase()),
                Err(_) => format!("ipmi {}", address.trim().to_ascii_lowercase()),
            },
            // Every option takes part: the same endpoint on another port, or another systems
            // URI, is another machine.
            Protocol::FenceAgent => match &self.fence_agent {
                Some(fa) => format!(
                    "fence-agent {} {} plug {}",
                    fa.name,
                    fa.public_options(&fa.options_for(node))
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.to_ascii_lowercase()))
                        .collect::<Vec<_>>()
                        .join(" "),
                    fa.plug_for(node).unwrap_or_default()
                ),
                None => "fence-agent".into(),
            },
        }
    }

    /// The machine key when this entry names one fixed machine whatever the node (no `{node}`
    /// in address, system or outlet).
    pub(in crate::config) fn fixed_target(&self) -> Option<String> {
        let per_node = self.inventory.is_some()
            || self.address.contains("{node}")
            || self.system.as_deref().is_some_and(|s| s.contains("{node}"))
            || self.outlet.as_deref().is_some_and(|s| s.contains("{node}"))
            || self.fence_agent.as_ref().is_some_and(|fa| fa.per_node());
        (!per_node).then(|| self.machine_key(""))
    }
}
