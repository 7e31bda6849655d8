//! IPMI over LAN (RMCP+, "lanplus") power source: Get Chassis Status, byte 1 bit 0.
//!
//! 1 is On, 0 is Off; an Off read with power fault bits set is still Off. The fault bits
//! (byte 1 bits 1-4) and the last power event (byte 2) go into the read's details. Every failure
//! — silence, refused credentials or cipher suite, a failed integrity check, a replayed or stray
//! answer, a short reply — is an error read, never Off.
//!
//! After the chassis status, in the same session, Get System GUID asks the machine what it is
//! (see [`crate::identity`]). That question comes second and can only cost the identity: a BMC
//! that refuses it, answers it oddly or not at all still has its power state read. An off
//! chassis is then asked Get ACPI Power State (a sleeping or hibernated machine is Suspended) and,
//! where the entry wants a second witness, DCMI Get Power Reading ([`off_checks`]).
//!
//! The RMCP+ session is oobfence's own ([`session`], on [`rakp`]'s RustCrypto primitives):
//! cipher suite 17 or 3 (or 17 then 3, when the entry asks for it), logged in as User, Operator
//! or Administrator, all async on tokio's `UdpSocket`. At most one session per BMC exists at a
//! time (BMCs have only a handful of slots); it is reused while fresh and closed with Close
//! Session when it is retired, idle, failed, or its last source goes away.
//!
//! This file holds the source; beside it, `slots` keeps one session per BMC (reused, retired,
//! closed when idle), and `read` is one read: the exchanges in a session, and every answer
//! and failure translated into a reply with a named error.

pub mod act;
pub mod commands;
mod off_checks;
pub mod rakp;
mod read;
pub mod session;
mod slots;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::BoxFuture;

use self::rakp::Suite;
use self::read::{failed, read_task, scrub_reply};
use self::session::Trouble;
use self::slots::{NEXT_SOURCE_ID, Slot, slot_for};
use super::{PowerSource, PowerState, ReadErrorKind, Reply};
use crate::config::BmcEntry;
use crate::secret::Secret;

/// A kept session is used again only if it was idle less than this. The IPMI default session
/// inactivity timeout is 60 s; a BMC that forgets sooner is noticed and remembered (see
/// `Slot::max_idle`).
const MAX_IDLE: Duration = Duration::from_secs(45);

/// A kept session that failed after less idle time than this says nothing about the BMC's
/// inactivity timeout (a BMC reset, a lost datagram), and never lowers `Slot::max_idle` below it.
const MIN_IDLE_EVIDENCE: Duration = Duration::from_secs(5);

/// A kept session is retired after this long or this many reads, whichever comes first.
const MAX_AGE: Duration = Duration::from_secs(600);
const MAX_READS: u32 = 10_000;

/// How often an exchange is sent again without an answer, at most (then it waits out the
/// deadline).
const RESENDS: u32 = 2;

// The rules of an IPMI `[[bmc]]` entry belong to the config, which checks them at load; the
// source checks the same ones again when it is built.
pub use crate::config::ipmi::{
    CipherSuites, DEFAULT_CIPHER_SUITE, DEFAULT_PORT, IpmiOptions, Privilege, check_password,
    check_privilege, check_username, parse_address,
};

/// Reads one machine's power state through its BMC over RMCP+.
pub struct IpmiSource {
    shared: Arc<Shared>,
}

struct Shared {
    /// Tells this source's sessions from those of another source for the same BMC.
    id: u64,
    node: String,
    host: String,
    port: u16,
    username: String,
    password: Secret,
    suites: Vec<Suite>,
    /// The configured suites as the config wrote them ("17, then 3").
    suites_text: String,
    privilege: Privilege,
    timeout: Duration,
    /// The entry asks for the power draw beside an Off (`corroborate = "power-draw"`).
    power_draw: bool,
    slot: Arc<tokio::sync::Mutex<Slot>>,
}

impl fmt::Debug for IpmiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("IpmiSource")
            .field("address", &self.address())
            .field("node", &s.node)
            .field("username", &s.username)
            .field("password", &s.password)
            .field("cipher_suite", &s.suites_text)
            .field("privilege", &s.privilege.as_str())
            .field("timeout", &s.timeout)
            .finish()
    }
}

fn suite_of(id: u8) -> Result<Suite, String> {
    match id {
        17 => Ok(Suite::Seventeen),
        3 => Ok(Suite::Three),
        other => Err(format!(
            "cipher suite {other} is not spoken by oobfence: use 17 or 3"
        )),
    }
}

impl IpmiSource {
    /// Builds the source for `node` from its `[[bmc]]` entry. Fails on settings this build
    /// cannot honour; opens nothing yet.
    pub fn new(entry: &BmcEntry, node: &str) -> Result<IpmiSource, String> {
        let options = entry.ipmi.unwrap_or_default();
        let suites = options
            .cipher_suites
            .in_order()
            .map(suite_of)
            .collect::<Result<Vec<_>, _>>()?;
        check_privilege(options.privilege.as_str())?;
        let address = entry.address_for(node);
        let (host, port) = parse_address(&address).map_err(|e| format!("address {e}"))?;
        check_username(&entry.username).map_err(|e| format!("username {e}"))?;
        check_password(&entry.password)?;
        let key = format!("{}:{port}", host.to_ascii_lowercase());
        Ok(IpmiSource {
            shared: Arc::new(Shared {
                id: NEXT_SOURCE_ID.fetch_add(1, Ordering::Relaxed),
                node: node.to_string(),
                host,
                port,
                username: entry.username.clone(),
                password: entry.password.clone(),
                suites,
                suites_text: options.cipher_suites.to_string(),
                privilege: options.privilege,
                timeout: entry.timeout,
                power_draw: entry.corroborate.is_some(),
                slot: slot_for(&key),
            }),
        })
    }
}

impl PowerSource for IpmiSource {
    fn backend(&self) -> &'static str {
        "ipmi"
    }

    fn address(&self) -> String {
        let s = &self.shared;
        if s.host.contains(':') {
            format!("[{}]:{}", s.host, s.port)
        } else {
            format!("{}:{}", s.host, s.port)
        }
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { self.read_reply().await.state })
    }

    /// The chassis status and the System GUID, both from one exchange in one session.
    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        let shared = self.shared.clone();
        Box::pin(async move {
            // Detached: if the caller gives up, the read still ends by its own deadline and
            // leaves the session slot in order.
            let task = tokio::spawn(read_task(shared.clone()));
            let reply = match task.await {
                Ok(done) => done,
                Err(e) => failed(Trouble::new(
                    ReadErrorKind::BadReply,
                    format!("the IPMI read failed internally: {e}"),
                )),
            };
            scrub_reply(&shared.password, reply)
        })
    }

    fn act<'a>(
        &'a self,
        action: super::PowerAction,
        check: super::ActionCheck<'a>,
    ) -> BoxFuture<'a, super::ActionOutcome> {
        // Not detached, unlike a read: the check borrows from the caller. The task ends by its
        // own deadline all the same.
        Box::pin(act::act_task(self.shared.clone(), action, check))
    }

    fn action_support(&self) -> BoxFuture<'_, super::ActionSupport> {
        let privilege = self.shared.privilege;
        Box::pin(async move {
            let says = |action: super::PowerAction| match act::privilege_refusal(privilege) {
                Some(why) => Err(why),
                None => Ok(format!(
                    "Chassis Control {:#04x} as {}",
                    act::chassis_control(action),
                    privilege.as_str()
                )),
            };
            super::ActionSupport {
                off: says(super::PowerAction::Off),
                on: says(super::PowerAction::On),
            }
        })
    }
}

/// The name of a generic completion code (IPMI 2.0 table 5-2), for an error message.
fn completion_name(code: u8) -> &'static str {
    match code {
        0xC0 => " (node busy)",
        0xC1 => " (invalid command)",
        0xC3 => " (timeout)",
        0xC7 | 0xC8 => " (request data length invalid)",
        0xCC => " (invalid data field)",
        0xCE => " (response could not be provided)",
        0xD4 => " (insufficient privilege level)",
        0xD5 => " (not supported in present state)",
        0xFF => " (unspecified error)",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
