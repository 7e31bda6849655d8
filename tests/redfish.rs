//! The Redfish power source against a real Redfish service (sushy-tools' emulator), against
//! peers that misbehave at the TCP level, and against real vendor payloads (the samples that
//! ship with the `sushy` client library, and the captured replies of real BMCs in
//! `tests/data/redfish`, served over HTTPS).
//!
//! This file holds the helpers the tests share (entries built through the config parser, a
//! source, its errors); the tests live by family in `tests/redfish/`: reads (against
//! sushy-tools), auth_and_tls, certificate_validity, odd_peers, sessions (logins as firmware
//! does them, proxy prefixes), vendor_samples, corpus (captured replies of real BMCs served over
//! HTTPS), pdu_outlets (a rack PDU's outlets, from DMTF's example).

mod support;

#[path = "redfish/actions.rs"]
mod actions;
#[path = "redfish/auth_and_tls.rs"]
mod auth_and_tls;
#[path = "redfish/certificate_validity.rs"]
mod certificate_validity;
#[path = "redfish/corpus.rs"]
mod corpus;
#[path = "redfish/odd_peers.rs"]
mod odd_peers;
#[path = "redfish/pdu_outlets.rs"]
mod pdu_outlets;
#[path = "redfish/proxy_paths.rs"]
mod proxy_paths;
#[path = "redfish/reads.rs"]
mod reads;
#[path = "redfish/sessions.rs"]
mod sessions;
#[path = "redfish/vendor_samples.rs"]
mod vendor_samples;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oobfence::config::BmcEntry;
use oobfence::identity::MachineIdentity;
use oobfence::power::redfish::{RedfishSource, parse_reply};
use oobfence::power::{PowerSource, PowerState, ReadErrorKind};
use support::odd_bmc::OddBmc;
use support::scenario::parsed_bmc_entry;
use support::sushy::{self, SushyEmulator};

/// A `[[bmc]]` entry built through the real config parser. `extra` adds TOML keys.
fn bmc(dir: &Path, address: &str, password: &str, extra: &str) -> BmcEntry {
    parsed_bmc_entry("redfish", dir, address, sushy::USERNAME, password, extra)
}

/// An entry for a BMC of the odd server (any password: it asks for none).
fn bmc_at(dir: &Path, address: &str, extra: &str) -> BmcEntry {
    bmc(dir, address, "any-Passw0rd", extra)
}

fn pinned(emu: &SushyEmulator) -> String {
    format!("ca_file = \"{}\"", emu.cert_pem_path().display())
}

fn source(entry: &BmcEntry, node: &str) -> RedfishSource {
    RedfishSource::new(entry, node).unwrap_or_else(|e| panic!("RedfishSource::new: {e}"))
}

fn error_of(state: &PowerState) -> (ReadErrorKind, &str) {
    match state {
        PowerState::Error { kind, detail } => (*kind, detail.as_str()),
        other => panic!("expected an error, got {other:?}"),
    }
}
