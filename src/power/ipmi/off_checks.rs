//! What an IPMI read asks besides the chassis status when the chassis reads off, in the same
//! session: Get ACPI Power State (a machine asleep or hibernated may read off: it is
//! [`PowerState::Suspended`], never Off), and, when the entry asks for the second witness
//! (`corroborate = "power-draw"`), DCMI Get Power Reading.
//!
//! Neither question can fail the read. A BMC that does not implement Get ACPI Power State
//! (completion code C1h), refuses it or does not answer leaves the Off as read, and the read
//! says that the sleep state could not be told; a power draw that cannot be read is reported
//! as unavailable, which the core never counts as a witness.

use tokio::time::Instant;

use super::commands::acpi::{AcpiState, AcpiTrouble, DcmiReading, power_reading};
use super::completion_name;
use super::session::Session;
use crate::power::{PowerDraw, PowerState, ReadDetail};

/// What the questions asked beside an off chassis learnt.
pub(super) struct OffChecks {
    /// The ACPI system power state, or why it is not known.
    pub acpi: Result<AcpiState, String>,
    /// The power draw, when the entry asks for it.
    pub power_draw: Option<PowerDraw>,
    /// Every question got an answer (a session that went unanswered is not kept).
    pub answered: bool,
}

/// Asks Get ACPI Power State and, if `want_power_draw`, Get Power Reading through `session`,
/// each only if `deadline` leaves time for it.
pub(super) async fn ask(
    session: &mut Session,
    deadline: Instant,
    want_power_draw: bool,
) -> OffChecks {
    let mut answered = true;
    let acpi = if Instant::now() >= deadline {
        Err("no time was left within the read's deadline to ask Get ACPI Power State".into())
    } else {
        match session.acpi_power_state().await {
            Ok(a) => AcpiState::parse(a.completion, &a.data).map_err(|t| match t {
                AcpiTrouble::Refused(code) => format!(
                    "the BMC refused Get ACPI Power State with completion code {code:#04x}{}",
                    completion_name(code)
                ),
                AcpiTrouble::WrongLength(n) => {
                    format!("the Get ACPI Power State answer has {n} data bytes; 2 expected")
                }
            }),
            Err(t) => {
                answered = false;
                Err(format!("Get ACPI Power State failed: {}", t.detail))
            }
        }
    };
    let suspended = acpi.as_ref().is_ok_and(|s| s.memory_kept());
    let power_draw = if !want_power_draw || suspended {
        None
    } else if Instant::now() >= deadline {
        Some(PowerDraw::Unavailable {
            why: "no time was left within the read's deadline to ask DCMI Get Power Reading".into(),
        })
    } else {
        Some(match session.dcmi_power_reading().await {
            Ok(a) => draw_of(power_reading(a.completion, &a.data)),
            Err(t) => {
                answered = false;
                PowerDraw::Unavailable {
                    why: format!("DCMI Get Power Reading failed: {}", t.detail),
                }
            }
        })
    };
    OffChecks {
        acpi,
        power_draw,
        answered,
    }
}

fn draw_of(reading: Result<DcmiReading, AcpiTrouble>) -> PowerDraw {
    let why = match reading {
        Ok(DcmiReading::Current(watts)) => {
            return PowerDraw::Seen {
                watts,
                from: "DCMI Get Power Reading, current power".into(),
            };
        }
        Ok(DcmiReading::Inactive) => {
            "the DCMI Get Power Reading answer says no power measurement is active".to_string()
        }
        Ok(DcmiReading::NotDcmi(group)) => {
            format!("the DCMI Get Power Reading answer names group {group:#04x}, not DCMI's 0xdc")
        }
        Err(AcpiTrouble::Refused(code)) => format!(
            "the BMC refused DCMI Get Power Reading with completion code {code:#04x}{}",
            completion_name(code)
        ),
        Err(AcpiTrouble::WrongLength(n)) => {
            format!("the DCMI Get Power Reading answer has {n} data bytes; 18 expected")
        }
    };
    PowerDraw::Unavailable { why }
}

/// The state of a read whose chassis said off, in the light of `checks`, and the details to
/// show beside it.
pub(super) fn apply(checks: &OffChecks) -> (PowerState, Vec<ReadDetail>) {
    let mut details = Vec::new();
    let state = match &checks.acpi {
        Ok(s) if s.memory_kept() => PowerState::Suspended {
            detail: format!(
                "chassis power off, but Get ACPI Power State says {s}: the machine may resume with its memory"
            ),
        },
        Ok(s) => {
            details.push(ReadDetail::new("ACPI power state", s.to_string()));
            PowerState::Off
        }
        Err(why) => {
            details.push(ReadDetail::new(
                "ACPI power state",
                format!("cannot tell whether the machine sleeps or hibernates: {why}"),
            ));
            PowerState::Off
        }
    };
    if let Some(draw) = &checks.power_draw {
        details.push(ReadDetail::new("power draw", draw.to_string()));
    }
    (state, details)
}
