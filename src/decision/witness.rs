//! A second witness for Off. A BMC that rebooted while its host ran can report a stale "Off"
//! (reported on OpenBMC); a `[[bmc]]` entry with `corroborate = "power-draw"` has an Off read
//! count only when the same read also saw the system drawing at most `max_off_watts`.
//!
//! The source only reports what it saw ([`PowerDraw`], on the read); the entry's requirement
//! is a fact ([`OffWitness`]); whether the two agree is decided here, by [`check`], for the
//! core's `off-uncorroborated` rule.

use std::fmt;

use serde::Serialize;

/// A power figure, kept in milliwatts so that readings compare exactly (Redfish reports watts
/// as JSON numbers, with decimals on some services; DCMI as whole watts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Watts {
    milli: u64,
}

impl Watts {
    pub const fn whole(watts: u32) -> Watts {
        Watts {
            milli: watts as u64 * 1000,
        }
    }

    /// A non-negative, finite number of watts (to the milliwatt); `None` otherwise.
    pub fn from_f64(watts: f64) -> Option<Watts> {
        (watts.is_finite() && (0.0..=1e12).contains(&watts)).then(|| Watts {
            milli: (watts * 1000.0).round() as u64,
        })
    }

    pub fn as_f64(self) -> f64 {
        self.milli as f64 / 1000.0
    }
}

impl fmt::Display for Watts {
    /// `180 W`, `12.5 W`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (w, m) = (self.milli / 1000, self.milli % 1000);
        if m == 0 {
            write!(f, "{w} W")
        } else {
            let frac = format!("{m:03}");
            write!(f, "{w}.{} W", frac.trim_end_matches('0'))
        }
    }
}

impl Serialize for Watts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.as_f64())
    }
}

/// What an entry asks of an Off read besides the power state (`corroborate`): a fact the core
/// is given for each node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OffWitness {
    /// `corroborate = "power-draw"`: the system draws at most `max_off_watts` in the same read.
    PowerDraw { max_off_watts: Watts },
}

impl OffWitness {
    /// The config word for it.
    pub fn name(self) -> &'static str {
        match self {
            OffWitness::PowerDraw { .. } => "power-draw",
        }
    }
}

/// What a source saw of the system's power draw alongside its power state (only asked for
/// when the entry wants the witness and the state read Off).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum PowerDraw {
    /// A reading: how many watts, and where it was read ("PowerControl[0].PowerConsumedWatts
    /// of /redfish/v1/Chassis/1/Power", "DCMI Get Power Reading").
    Seen { watts: Watts, from: String },
    /// No usable reading, and why (no such resource, a refusal, no measurement active...).
    Unavailable { why: String },
}

impl fmt::Display for PowerDraw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PowerDraw::Seen { watts, from } => write!(f, "{watts} ({from})"),
            PowerDraw::Unavailable { why } => write!(f, "unavailable: {why}"),
        }
    }
}

/// Whether an Off read counts under `required`: `Ok` with what the witness said (for the
/// decision's reason), or `Err` with why it does not count. A missing or unreadable witness,
/// and a draw above the threshold, never count.
pub fn check(required: OffWitness, seen: Option<&PowerDraw>) -> Result<String, String> {
    match required {
        OffWitness::PowerDraw { max_off_watts } => match seen {
            None => Err(format!(
                "corroborate = \"power-draw\" is set but the read carries no power draw reading \
                 (max_off_watts {max_off_watts})"
            )),
            Some(PowerDraw::Unavailable { why }) => Err(format!(
                "the power draw witness is unavailable ({why}), so the Off is not corroborated"
            )),
            Some(PowerDraw::Seen { watts, from }) if *watts > max_off_watts => Err(format!(
                "the system draws {watts} ({from}), above max_off_watts {max_off_watts}: a stale \
                 Off from a BMC that restarted while its host ran looks like this"
            )),
            Some(PowerDraw::Seen { watts, from }) => Ok(format!(
                "drawing {watts} ({from}), at most max_off_watts {max_off_watts}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: OffWitness = OffWitness::PowerDraw {
        max_off_watts: Watts::whole(20),
    };

    fn seen(watts: f64) -> PowerDraw {
        PowerDraw::Seen {
            watts: Watts::from_f64(watts).unwrap(),
            from: "test".into(),
        }
    }

    #[test]
    fn only_a_reading_at_or_under_the_threshold_counts() {
        assert!(check(MAX, Some(&seen(0.0))).is_ok());
        assert!(check(MAX, Some(&seen(19.999))).is_ok());
        assert!(check(MAX, Some(&seen(20.0))).is_ok());
        let why = check(MAX, Some(&seen(20.001))).unwrap_err();
        assert!(
            why.contains("draws 20.001 W (test), above max_off_watts 20 W"),
            "{why}"
        );
        assert!(check(MAX, Some(&seen(350.0))).is_err());
        let why = check(MAX, None).unwrap_err();
        assert!(why.contains("no power draw reading"), "{why}");
        let why = check(
            MAX,
            Some(&PowerDraw::Unavailable {
                why: "no Power resource".into(),
            }),
        )
        .unwrap_err();
        assert!(why.contains("unavailable (no Power resource)"), "{why}");
    }

    #[test]
    fn watts_are_non_negative_finite_numbers() {
        for bad in [-0.5, f64::NAN, f64::INFINITY, -f64::INFINITY, 1e13] {
            assert_eq!(Watts::from_f64(bad), None, "{bad}");
        }
        assert_eq!(Watts::from_f64(12.5).unwrap().to_string(), "12.5 W");
        assert_eq!(Watts::from_f64(180.0).unwrap().to_string(), "180 W");
        assert_eq!(Watts::from_f64(0.0).unwrap().to_string(), "0 W");
        assert_eq!(Watts::from_f64(0.0125).unwrap().to_string(), "0.013 W");
        assert_eq!(Watts::whole(7), Watts::from_f64(7.0).unwrap());
    }

    proptest::proptest! {
        /// Whatever the threshold and the reading, the read counts exactly when a reading was
        /// seen and it is not above the threshold.
        #[test]
        fn counts_exactly_when_seen_and_not_above(max in 0u32..2000, milli in 0u64..3_000_000, kind in 0u8..3) {
            let required = OffWitness::PowerDraw { max_off_watts: Watts::whole(max) };
            let watts = Watts { milli };
            let draw = match kind {
                0 => None,
                1 => Some(PowerDraw::Unavailable { why: "x".into() }),
                _ => Some(PowerDraw::Seen { watts, from: "x".into() }),
            };
            let counted = check(required, draw.as_ref()).is_ok();
            proptest::prop_assert_eq!(counted, kind == 2 && milli <= u64::from(max) * 1000);
        }
    }
}
