//! Redfish power actions: `ComputerSystem.Reset` with `ForceOff` or `On`, sent to the target
//! and checked against the allowed values the system's own resource names (inline
//! `ResetType@Redfish.AllowableValues`, or its `@Redfish.ActionInfo`), never a guessed URL.
//! The system is read right before, in the same call, and the caller's check sees that reply;
//! the check runs last, after the ActionInfo GET, immediately before the POST.

use serde_json::Value;

use super::{RedfishSource, parse_reply};
use crate::power::{ActionCheck, ActionOutcome, ActionSupport, PowerAction, PowerState, Reply};

/// The Reset action a ComputerSystem offers: where to POST it, and the `ResetType` values it
/// allows (`None`: the system does not say, and its ActionInfo is to be read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetAction {
    pub target: String,
    pub allowed: Option<Vec<String>>,
    /// `@Redfish.ActionInfo`, where the allowed values are listed instead.
    pub action_info: Option<String>,
}

/// The `#ComputerSystem.Reset` action of the system resource `body`, read from `system` (its
/// path). Its target must lie below that system's `Actions`: a Reset of anything else (a
/// Manager, a Chassis, another system) is never sent.
pub fn reset_action(body: &[u8], system: &str) -> Result<ResetAction, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the system resource is not JSON ({e})"))?;
    let reset = v
        .get("Actions")
        .and_then(|a| a.get("#ComputerSystem.Reset"))
        .ok_or("the system offers no #ComputerSystem.Reset action")?;
    let target = reset
        .get("target")
        .and_then(Value::as_str)
        .ok_or("its #ComputerSystem.Reset action has no target")?;
    let below = format!("{}/Actions/", system.trim_end_matches('/'));
    if !target.starts_with(&below) {
        return Err(format!(
            "its #ComputerSystem.Reset target {target:?} is not below {below}: only the system's own Reset is sent"
        ));
    }
    let allowed = match reset.get("ResetType@Redfish.AllowableValues") {
        Some(values) => Some(
            strings(values)
                .ok_or("its ResetType@Redfish.AllowableValues is not a list of strings")?,
        ),
        None => None,
    };
    let action_info = reset
        .get("@Redfish.ActionInfo")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(ResetAction {
        target: target.to_string(),
        allowed,
        action_info,
    })
}

/// The values an ActionInfo resource lists for its parameter `name` (`ResetType`, an outlet's
/// `PowerState`).
pub fn action_info_values(body: &[u8], name: &str) -> Result<Vec<String>, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the ActionInfo resource is not JSON ({e})"))?;
    v.get("Parameters")
        .and_then(Value::as_array)
        .and_then(|ps| {
            ps.iter()
                .find(|p| p.get("Name").and_then(Value::as_str) == Some(name))
        })
        .and_then(|p| p.get("AllowableValues"))
        .and_then(strings)
        .ok_or_else(|| format!("the ActionInfo lists no AllowableValues for {name}"))
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The `ResetType` sent for `action`, if the system allows it: `ForceOff` to power off (a hung
/// machine does not shut down gracefully; nothing else is taken in its place), `On` or else
/// `ForceOn` to power on.
pub fn reset_type(action: PowerAction, allowed: &[String]) -> Result<&'static str, String> {
    let wanted: &[&'static str] = match action {
        PowerAction::Off => &["ForceOff"],
        PowerAction::On => &["On", "ForceOn"],
    };
    wanted
        .iter()
        .find(|w| allowed.iter().any(|a| a == *w))
        .copied()
        .ok_or_else(|| {
            format!(
                "the system allows ResetType {} but not {} (needed to {action})",
                allowed.join(", "),
                wanted.join(" or ")
            )
        })
}

impl RedfishSource {
    /// The system's path: configured, found before, or found now.
    async fn system_path(&self) -> Result<String, PowerState> {
        match (&self.system, self.discovered.get()) {
            (Some(path), _) => Ok(path.clone()),
            (None, Some(path)) => Ok(path.clone()),
            (None, None) => self.discover().await,
        }
    }

    /// The Reset action of the system as `body` shows it, its allowed values read from its
    /// ActionInfo where the system lists none inline.
    async fn resolved_reset(
        &self,
        body: &[u8],
        system: &str,
    ) -> Result<(String, Vec<String>), ActionOutcome> {
        let refused = |why: String| ActionOutcome::Refused { why };
        let reset = reset_action(body, system).map_err(refused)?;
        // Neither is followed if it leaves the address's prefix; refused, as a wrong target is.
        for path in std::iter::once(&reset.target).chain(&reset.action_info) {
            super::url_of(&self.base, path).map_err(|e| match e {
                PowerState::Error { detail, .. } => refused(detail),
                other => refused(other.to_string()),
            })?;
        }
        let allowed = match (reset.allowed, reset.action_info) {
            (Some(values), _) => values,
            (None, Some(info)) => {
                let body = self
                    .get(&info)
                    .await
                    .map_err(|error| ActionOutcome::Failed {
                        error: self.scrub(error),
                    })?;
                action_info_values(&body, "ResetType").map_err(refused)?
            }
            (None, None) => {
                return Err(refused(
                    "its #ComputerSystem.Reset action lists no allowed ResetType values (no AllowableValues, no ActionInfo)".into(),
                ));
            }
        };
        Ok((reset.target, allowed))
    }

    pub(super) async fn act_once(
        &self,
        action: PowerAction,
        check: ActionCheck<'_>,
    ) -> ActionOutcome {
        if let Some(outlet) = &self.outlet {
            return self.act_on_outlet(outlet, action, check).await;
        }
        let system = match self.system_path().await {
            Ok(path) => path,
            Err(error) => {
                return ActionOutcome::Failed {
                    error: self.scrub(error),
                };
            }
        };
        let body = match self.get(&system).await {
            Ok(body) => body,
            Err(error) => {
                return ActionOutcome::Failed {
                    error: self.scrub(error),
                };
            }
        };
        let reply: Reply = self.scrub_reply(parse_reply(&body, &system));
        let (target, allowed) = match self.resolved_reset(&body, &system).await {
            Ok(found) => found,
            Err(outcome) => return outcome,
        };
        let value = match reset_type(action, &allowed) {
            Ok(v) => v,
            Err(why) => return ActionOutcome::Refused { why },
        };
        // Last, right before the POST: a slow ActionInfo GET must not stand between the check
        // (the pause read afresh, the holds, leadership) and the command.
        if let Err(why) = check(&reply).await {
            return ActionOutcome::Refused { why };
        }
        let command = serde_json::json!({ "ResetType": value });
        match self
            .send(reqwest::Method::POST, &target, Some(&command))
            .await
        {
            Ok(_) => ActionOutcome::Sent {
                answer: format!("POST {target} ResetType={value}: accepted"),
            },
            Err(error) => ActionOutcome::Failed {
                error: self.scrub(error),
            },
        }
    }

    pub(super) async fn support(&self) -> ActionSupport {
        if let Some(outlet) = &self.outlet {
            return self.outlet_support(outlet).await;
        }
        let failed = |e: PowerState| {
            ActionSupport::unsupported(&format!("the system could not be read: {e}"))
        };
        let system = match self.system_path().await {
            Ok(path) => path,
            Err(e) => return failed(self.scrub(e)),
        };
        let body = match self.get(&system).await {
            Ok(body) => body,
            Err(e) => return failed(self.scrub(e)),
        };
        match self.resolved_reset(&body, &system).await {
            Ok((target, allowed)) => {
                let says = |action| {
                    reset_type(action, &allowed).map(|v| format!("ResetType {v} at {target}"))
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

    const SYSTEM: &str = "/redfish/v1/Systems/1";

    fn body(actions: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "Actions": actions })).unwrap()
    }

    #[test]
    fn the_reset_target_and_its_allowed_values_come_from_the_system() {
        let b = body(serde_json::json!({ "#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown"]
        }}));
        let r = reset_action(&b, SYSTEM).unwrap();
        assert_eq!(
            r.target,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
        );
        let allowed = r.allowed.unwrap();
        assert_eq!(reset_type(PowerAction::Off, &allowed), Ok("ForceOff"));
        assert_eq!(reset_type(PowerAction::On, &allowed), Ok("On"));
    }

    #[test]
    fn a_reset_without_force_off_or_of_another_resource_is_refused() {
        let graceful = vec!["On".to_string(), "GracefulShutdown".to_string()];
        let e = reset_type(PowerAction::Off, &graceful).unwrap_err();
        assert!(e.contains("not ForceOff"), "{e}");
        assert_eq!(
            reset_type(PowerAction::On, &["ForceOn".to_string()]),
            Ok("ForceOn")
        );
        let manager = body(serde_json::json!({ "#ComputerSystem.Reset": {
            "target": "/redfish/v1/Managers/1/Actions/Manager.Reset",
            "ResetType@Redfish.AllowableValues": ["ForceOff"]
        }}));
        let e = reset_action(&manager, SYSTEM).unwrap_err();
        assert!(
            e.contains("not below /redfish/v1/Systems/1/Actions/"),
            "{e}"
        );
        let other_system = body(serde_json::json!({ "#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/10/Actions/ComputerSystem.Reset"
        }}));
        assert!(reset_action(&other_system, SYSTEM).is_err());
        assert!(reset_action(&body(serde_json::json!({})), SYSTEM).is_err());
    }

    #[test]
    fn allowed_values_may_live_in_the_action_info() {
        let b = body(serde_json::json!({ "#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "@Redfish.ActionInfo": "/redfish/v1/Systems/1/ResetActionInfo"
        }}));
        let r = reset_action(&b, SYSTEM).unwrap();
        assert_eq!(r.allowed, None);
        assert_eq!(
            r.action_info.as_deref(),
            Some("/redfish/v1/Systems/1/ResetActionInfo")
        );
        let info = serde_json::to_vec(&serde_json::json!({ "Parameters": [
            { "Name": "ResetType", "AllowableValues": ["On", "ForceOff"] }
        ]}))
        .unwrap();
        assert_eq!(
            action_info_values(&info, "ResetType").unwrap(),
            vec!["On", "ForceOff"]
        );
        assert!(action_info_values(b"{}", "ResetType").is_err());
    }
}
