//! A PDU outlet read through the PDU's Redfish service (`outlet = ...`, DMTF's `Outlet` of
//! `PowerEquipment/RackPDUs/{id}/Outlets/{id}`), and its `Outlet.PowerControl`.
//!
//! The outlet's `PowerState` is read as strictly as a ComputerSystem's (the answer must name
//! itself the Outlet asked for), and its `PowerWatts` is the second witness: an outlet drawing
//! current is not off, whatever its state says. An Off with a reading above the entry's
//! threshold is an error naming the draw; an Off with no reading at all stands on the state
//! alone, and says so (`corroborate = "power-draw"` then refuses it). An outlet cannot tell
//! whose machine it feeds, so no read carries an identity: the mapping is the operator's.
//! An outlet switched On that draws at most the threshold reads Off too: nothing it feeds runs
//! (a pulled cord, a dead PSU, a tripped breaker ahead of it), which only its meter can tell.

use serde_json::Value;

use super::errors::quote;
use super::reply::{bad, is_resource_type, names_path, one_string, parse_resource};
use super::{RedfishSource, failed};
use crate::identity::MachineIdentity;
use crate::power::{
    ActionCheck, ActionOutcome, ActionSupport, PowerAction, PowerDraw, PowerState, ReadDetail,
    Reply, Watts,
};

/// Maps the answer to a GET of the Outlet at `asked` to a power state, with its power draw
/// beside an Off; `max_off` is the most an Off outlet may draw.
pub fn parse_outlet(body: &[u8], asked: &str, max_off: Watts) -> Reply {
    let resource = match parse_resource(body) {
        Ok(r) => r,
        Err(state) => return failed(state),
    };
    let checked = check_is_asked_outlet(&resource.odata_ids, &resource.odata_types, asked)
        .and_then(|()| power_state_of(&resource.power_states))
        .and_then(|state| Ok((state, reading_of(&resource.power_watts)?)));
    let (state, reading) = match checked {
        Ok(found) => found,
        Err(state) => return failed(state),
    };
    let from = format!("PowerWatts.Reading of {asked}");
    let draw = match (&state, reading) {
        (PowerState::Off, Some(watts)) if watts > max_off => {
            return failed(bad(format!(
                "the outlet reads Off but draws {watts} ({from}), above {max_off}: a load on it \
                 is still fed (its relay did not open, or its state is stale), so it is not \
                 taken as off"
            )));
        }
        (PowerState::Off, Some(watts)) => Some(PowerDraw::Seen { watts, from }),
        // Switched on, and nothing draws through it: the machine it feeds has no power from
        // it. This is the commonest loss: a pulled cord, a dead PSU, a tripped breaker ahead of
        // the outlet; the relay stays closed and only the meter can tell. An unmetered outlet
        // that is switched on proves nothing.
        (PowerState::On, Some(watts)) if watts <= max_off => {
            let mut reply = parse_outlet_off(asked, watts, from);
            reply.details.push(ReadDetail::new(
                "switched",
                format!(
                    "On, but drawing only {watts} (at most {max_off}): nothing it feeds is running"
                ),
            ));
            return reply;
        }
        (PowerState::Off, None) => Some(PowerDraw::Unavailable {
            why: "the outlet reports no PowerWatts reading, so no draw was reported beside its \
                  Off"
            .into(),
        }),
        _ => None,
    };
    let mut details = vec![ReadDetail::new("outlet", asked)];
    if let Some(draw) = &draw {
        details.push(ReadDetail::new("power draw", draw.to_string()));
    }
    Reply {
        state,
        details,
        identity: outlet_identity(),
        reader: None,
        power_draw: draw,
    }
}

/// An outlet switched on through which nothing runs reads as an Off, with its draw as the
/// witness.
fn parse_outlet_off(asked: &str, watts: Watts, from: String) -> Reply {
    let draw = PowerDraw::Seen { watts, from };
    Reply {
        state: PowerState::Off,
        details: vec![
            ReadDetail::new("outlet", asked),
            ReadDetail::new("power draw", draw.to_string()),
        ],
        identity: outlet_identity(),
        reader: None,
        power_draw: Some(draw),
    }
}

fn outlet_identity() -> MachineIdentity {
    MachineIdentity::unreported(
        "a PDU outlet cannot tell whose machine it feeds: the node's outlet is the entry's \
         mapping (identity = \"unchecked\")",
    )
}

/// The reply must name itself the resource asked for, and be an Outlet.
fn check_is_asked_outlet(ids: &[Value], types: &[Value], asked: &str) -> Result<(), PowerState> {
    let id = one_string(ids, "@odata.id").map_err(|why| {
        bad(format!(
            "reply {why}, so it is not known to be the Outlet at {} that was asked for",
            quote(asked)
        ))
    })?;
    if !names_path(id, asked) {
        return Err(bad(format!(
            "reply is the resource {} (its @odata.id), not the Outlet at {} that was asked for",
            quote(id),
            quote(asked)
        )));
    }
    let odata_type = one_string(types, "@odata.type")
        .map_err(|why| bad(format!("reply {why}, so it is not known to be an Outlet")))?;
    if !is_resource_type(odata_type, "Outlet") {
        return Err(bad(format!(
            "reply is a {}, not an Outlet (expected #Outlet.v1_4_4.Outlet, any version); set \
             `outlet` to a member of the PDU's Outlets collection",
            quote(odata_type)
        )));
    }
    Ok(())
}

/// `PowerState` (Resource.PowerState): On, Off, and the transitions; `PowerCycle` (the
/// action's value, which a service may show while it cycles) is one too. `Paused` is no
/// outlet's state; anything else is refused.
fn power_state_of(values: &[Value]) -> Result<PowerState, PowerState> {
    let value = match values {
        [] => return Err(bad("the Outlet has no PowerState".into())),
        [one] => one,
        many => {
            return Err(bad(format!(
                "reply has PowerState {} times; refusing an ambiguous answer",
                many.len()
            )));
        }
    };
    match value.as_str() {
        Some("On") => Ok(PowerState::On),
        Some("Off") => Ok(PowerState::Off),
        Some(s @ ("PoweringOn" | "PoweringOff" | "PowerCycle")) => Ok(PowerState::Transitional {
            detail: format!("the outlet's PowerState is {s}"),
        }),
        Some(other) => Err(bad(format!(
            "unknown PowerState {} for an outlet",
            quote(other)
        ))),
        None => Err(bad(format!(
            "PowerState is not a string: {}",
            quote(&value.to_string())
        ))),
    }
}

/// `PowerWatts.Reading`: `None` when the outlet has no PowerWatts or no reading in it (null is
/// Redfish's "unavailable"); an error for a duplicated or malformed one.
fn reading_of(values: &[Value]) -> Result<Option<Watts>, PowerState> {
    let excerpt = match values {
        [] | [Value::Null] => return Ok(None),
        [one] => one,
        many => {
            return Err(bad(format!(
                "reply has PowerWatts {} times; refusing an ambiguous answer",
                many.len()
            )));
        }
    };
    let Some(excerpt) = excerpt.as_object() else {
        return Err(bad(format!(
            "PowerWatts is not an object: {}",
            quote(&excerpt.to_string())
        )));
    };
    match excerpt.get("Reading") {
        None | Some(Value::Null) => Ok(None),
        Some(reading) => reading
            .as_f64()
            .and_then(Watts::from_f64)
            .map(Some)
            .ok_or_else(|| {
                bad(format!(
                    "PowerWatts.Reading is not a number of watts: {}",
                    quote(&reading.to_string())
                ))
            }),
    }
}

/// The `#Outlet.PowerControl` action an outlet offers.
#[derive(Debug, PartialEq, Eq)]
struct PowerControl {
    /// Where to POST it: below the outlet (DMTF's example names it
    /// `.../Outlets/A1/Outlet.PowerControl`, with no `Actions/`).
    target: String,
    /// The `PowerState` values the outlet lists inline, if it does.
    allowed: Option<Vec<String>>,
    /// `@Redfish.ActionInfo`, where the allowed values are listed instead.
    action_info: Option<String>,
}

/// The `#Outlet.PowerControl` action of the outlet resource `body` read from `outlet`; its
/// target must lie below the outlet.
fn power_control(body: &[u8], outlet: &str) -> Result<PowerControl, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the outlet resource is not JSON ({e})"))?;
    let action = v
        .get("Actions")
        .and_then(|a| a.get("#Outlet.PowerControl"))
        .ok_or("the outlet offers no #Outlet.PowerControl action")?;
    let target = action
        .get("target")
        .and_then(Value::as_str)
        .ok_or("its #Outlet.PowerControl action has no target")?;
    let below = format!("{}/", outlet.trim_end_matches('/'));
    if !target.starts_with(&below) || super::http::climbs(target) {
        return Err(format!(
            "its #Outlet.PowerControl target {} is not below {below}: only the outlet's own PowerControl is sent",
            quote(target)
        ));
    }
    let allowed = match action.get("PowerState@Redfish.AllowableValues") {
        None => None,
        Some(values) => Some(
            strings(values)
                .ok_or("its PowerState@Redfish.AllowableValues is not a list of strings")?,
        ),
    };
    let action_info = action
        .get("@Redfish.ActionInfo")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(PowerControl {
        target: target.to_string(),
        allowed,
        action_info,
    })
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The `PowerState` sent for `action`. An outlet has no graceful Off: `Off` opens its relay.
fn wanted(action: PowerAction) -> &'static str {
    match action {
        PowerAction::Off => "Off",
        PowerAction::On => "On",
    }
}

impl RedfishSource {
    /// The most an Off outlet may draw for this source.
    fn outlet_max_off(&self) -> Watts {
        self.outlet_max_off
    }

    /// One read of the outlet at `path`.
    pub(super) async fn read_outlet(&self, path: &str) -> Reply {
        match self.get(path).await {
            Ok(body) => parse_outlet(&body, path, self.outlet_max_off()),
            Err(state) => failed(state),
        }
    }

    /// The outlet's PowerControl target and the `PowerState` values it allows (inline, from
    /// its ActionInfo, or, where it lists none, the schema's On, Off and PowerCycle).
    async fn resolved_power_control(
        &self,
        body: &[u8],
        outlet: &str,
    ) -> Result<(String, Vec<String>), ActionOutcome> {
        let refused = |why: String| ActionOutcome::Refused { why };
        let PowerControl {
            target,
            allowed,
            action_info: info,
        } = power_control(body, outlet).map_err(refused)?;
        for path in std::iter::once(&target).chain(&info) {
            super::url_of(&self.base, path).map_err(|e| refused(e.to_string()))?;
        }
        let allowed = match (allowed, info) {
            (Some(values), _) => values,
            (None, Some(info)) => {
                let body = self
                    .get(&info)
                    .await
                    .map_err(|error| ActionOutcome::Failed {
                        error: self.scrub(error),
                    })?;
                super::actions::action_info_values(&body, "PowerState").map_err(refused)?
            }
            // DSP0268's Outlet.PowerControl takes On, Off or PowerCycle; DMTF's own example
            // lists no allowed values.
            (None, None) => ["On", "Off", "PowerCycle"].map(String::from).to_vec(),
        };
        Ok((target, allowed))
    }

    pub(super) async fn act_on_outlet(
        &self,
        outlet: &str,
        action: PowerAction,
        check: ActionCheck<'_>,
    ) -> ActionOutcome {
        let body = match self.get(outlet).await {
            Ok(body) => body,
            Err(error) => {
                return ActionOutcome::Failed {
                    error: self.scrub(error),
                };
            }
        };
        let reply = self.scrub_reply(parse_outlet(&body, outlet, self.outlet_max_off()));
        let (target, allowed) = match self.resolved_power_control(&body, outlet).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
        let value = wanted(action);
        if !allowed.iter().any(|a| a == value) {
            return ActionOutcome::Refused {
                why: format!(
                    "the outlet allows PowerState {} but not {value} (needed to {action})",
                    allowed.join(", ")
                ),
            };
        }
        // Last, right before the POST, as for a ComputerSystem's Reset.
        if let Err(why) = check(&reply).await {
            return ActionOutcome::Refused { why };
        }
        let command = serde_json::json!({ "PowerState": value });
        match self
            .send(reqwest::Method::POST, &target, Some(&command))
            .await
        {
            Ok(_) => ActionOutcome::Sent {
                answer: format!("POST {target} PowerState={value}: accepted"),
            },
            Err(error) => ActionOutcome::Failed {
                error: self.scrub(error),
            },
        }
    }

    pub(super) async fn outlet_support(&self, outlet: &str) -> ActionSupport {
        let body = match self.get(outlet).await {
            Ok(body) => body,
            Err(e) => {
                return ActionSupport::unsupported(&format!(
                    "the outlet could not be read: {}",
                    self.scrub(e)
                ));
            }
        };
        match self.resolved_power_control(&body, outlet).await {
            Ok((target, allowed)) => {
                let says = |action| {
                    let value = wanted(action);
                    if allowed.iter().any(|a| a == value) {
                        Ok(format!("PowerState {value} at {target}"))
                    } else {
                        Err(format!(
                            "the outlet allows PowerState {} but not {value}",
                            allowed.join(", ")
                        ))
                    }
                };
                ActionSupport {
                    off: says(PowerAction::Off),
                    on: says(PowerAction::On),
                }
            }
            Err(outcome) => ActionSupport::unsupported(&outcome.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A1: &str = "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1";

    /// DMTF's example outlet, with `edit` applied.
    fn example(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut v: Value = serde_json::from_str(include_str!(
            "../../../tests/data/redfish-pdu/Outlet-v1-example.json"
        ))
        .unwrap();
        edit(&mut v);
        serde_json::to_vec(&v).unwrap()
    }

    fn read(edit: impl FnOnce(&mut Value)) -> Reply {
        parse_outlet(&example(edit), A1, Watts::whole(20))
    }

    #[test]
    fn dmtfs_example_reads_on_and_each_state_maps() {
        assert_eq!(read(|_| {}).state, PowerState::On);
        assert_eq!(read(|_| {}).power_draw, None);
        for (value, transitional) in [
            ("PoweringOn", true),
            ("PoweringOff", true),
            ("PowerCycle", true),
            ("Paused", false),
            ("off", false),
            ("", false),
        ] {
            let state = read(|v| v["PowerState"] = value.into()).state;
            assert_eq!(
                matches!(state, PowerState::Transitional { .. }),
                transitional,
                "{value}: {state:?}"
            );
            if !transitional {
                assert!(
                    matches!(state, PowerState::Error { .. }),
                    "{value}: {state:?}"
                );
            }
        }
    }

    /// A pulled cord, a dead PSU, a tripped breaker ahead of the outlet: switched On, drawing
    /// nothing. Only the meter tells, and without one an On is an On.
    #[test]
    fn an_outlet_switched_on_that_draws_nothing_reads_off_on_its_meter() {
        let on = |watts: Value| {
            read(|v| {
                v["PowerState"] = "On".into();
                v["PowerWatts"]["Reading"] = watts;
            })
        };
        let cord_pulled = on(0.into());
        assert_eq!(cord_pulled.state, PowerState::Off, "{cord_pulled:?}");
        assert!(matches!(
            cord_pulled.power_draw,
            Some(PowerDraw::Seen { .. })
        ));
        assert!(
            cord_pulled
                .details
                .iter()
                .any(|d| d.value.contains("nothing it feeds is running")),
            "{:?}",
            cord_pulled.details
        );
        assert_eq!(on(20.into()).state, PowerState::Off);
        assert_eq!(on(21.into()).state, PowerState::On);
        let unmetered = read(|v| {
            v["PowerState"] = "On".into();
            v.as_object_mut().unwrap().remove("PowerWatts");
        });
        assert_eq!(unmetered.state, PowerState::On);
    }

    /// Off counts only when the outlet draws at most the threshold, or reports no reading.
    #[test]
    fn off_stands_only_without_a_draw_above_the_threshold() {
        let off = |watts: Value| {
            read(|v| {
                v["PowerState"] = "Off".into();
                v["PowerWatts"]["Reading"] = watts;
            })
        };
        assert_eq!(off(0.into()).state, PowerState::Off);
        assert_eq!(off(20.into()).state, PowerState::Off);
        assert!(matches!(off(20.001.into()).state, PowerState::Error { .. }));
        let drawing = off(197.4.into());
        assert!(
            drawing
                .state
                .to_string()
                .contains("reads Off but draws 197.4 W"),
            "{drawing:?}"
        );
        let no_reading = off(Value::Null);
        assert_eq!(no_reading.state, PowerState::Off);
        assert!(matches!(
            no_reading.power_draw,
            Some(PowerDraw::Unavailable { .. })
        ));
        for malformed in [Value::from("0"), Value::from(-1)] {
            assert!(
                matches!(off(malformed.clone()).state, PowerState::Error { .. }),
                "{malformed}"
            );
        }
        let duplicated = String::from_utf8(example(|v| v["PowerState"] = "Off".into()))
            .unwrap()
            .replacen(
                "\"PowerWatts\"",
                "\"PowerWatts\":{\"Reading\":0},\"PowerWatts\"",
                1,
            );
        let state = parse_outlet(duplicated.as_bytes(), A1, Watts::whole(20)).state;
        assert!(
            state.to_string().contains("PowerWatts 2 times"),
            "{state:?}"
        );
    }

    #[test]
    fn another_resource_or_another_outlet_is_refused() {
        let other =
            read(|v| v["@odata.id"] = "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A2".into());
        assert!(
            other.state.to_string().contains("not the Outlet at"),
            "{other:?}"
        );
        for odata_type in [
            "#OutletGroup.v1_0_0.OutletGroup",
            "#Circuit.v1_5_0.Circuit",
            "#OutletCollection.OutletCollection",
        ] {
            let state = read(|v| v["@odata.type"] = odata_type.into()).state;
            assert!(state.to_string().contains("not an Outlet"), "{state:?}");
        }
    }

    #[test]
    fn the_power_control_target_must_be_below_the_outlet() {
        assert_eq!(
            power_control(&example(|_| {}), A1),
            Ok(PowerControl {
                target: format!("{A1}/Outlet.PowerControl"),
                allowed: None,
                action_info: None,
            })
        );
        for bad_target in [
            "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A2/Outlet.PowerControl",
            "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A1/../A2/Outlet.PowerControl",
            "/redfish/v1/PowerEquipment/RackPDUs/1/Outlets/A10/Outlet.PowerControl",
        ] {
            let body = example(|v| {
                v["Actions"]["#Outlet.PowerControl"]["target"] = bad_target.into();
            });
            let e = power_control(&body, A1).unwrap_err();
            assert!(e.contains("is not below"), "{bad_target}: {e}");
        }
    }
}
