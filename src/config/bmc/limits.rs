//! A `[[bmc]]` entry's bounded settings: its read deadline and its second witness for Off.

use std::time::Duration;

/// `max_off_watts` unless set: a powered-off server's BMC reports its standby draw (often
/// 0 W, some 5-15 W); a running one draws far more.
pub const DEFAULT_MAX_OFF_WATTS: u32 = 20;

/// The highest `max_off_watts` accepted: above it, many running machines would count as off.
pub const MAX_MAX_OFF_WATTS: u32 = 500;

/// `corroborate` and `max_off_watts`, checked.
pub(super) fn off_witness(
    corroborate: Option<&str>,
    max_off_watts: Option<f64>,
) -> Result<Option<crate::decision::OffWitness>, (&'static str, String)> {
    use crate::decision::{OffWitness, Watts};
    match (corroborate, max_off_watts) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err((
            "max_off_watts",
            "applies with corroborate = \"power-draw\" only".into(),
        )),
        (Some("power-draw"), max) => {
            let max_off_watts = match max {
                None => Watts::whole(DEFAULT_MAX_OFF_WATTS),
                Some(w) if w.is_finite() && (0.0..=f64::from(MAX_MAX_OFF_WATTS)).contains(&w) => {
                    Watts::from_f64(w).expect("finite and in range")
                }
                Some(w) => {
                    return Err((
                        "max_off_watts",
                        format!(
                            "{w} is out of range: use a number of watts from 0 to {MAX_MAX_OFF_WATTS}, below the machine's lowest draw while running"
                        ),
                    ));
                }
            };
            Ok(Some(OffWitness::PowerDraw { max_off_watts }))
        }
        (Some(other), _) => Err((
            "corroborate",
            format!(
                "{other:?} is not a witness oobfence knows: use \"power-draw\" (the system's power draw, read beside an Off)"
            ),
        )),
    }
}

/// An entry's `timeout`: from 1 ms to 120 s, whatever the protocol.
pub(in crate::config) fn check_timeout(timeout: Duration) -> Result<(), String> {
    if timeout.is_zero() || timeout > Duration::from_secs(120) {
        return Err(format!(
            "{} is out of range: use between 1ms and 120s",
            humantime::format_duration(timeout)
        ));
    }
    Ok(())
}
