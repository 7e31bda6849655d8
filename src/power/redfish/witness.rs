//! The second witness for an Off read over Redfish (`corroborate = "power-draw"`): the power the
//! system's chassis draws, right after the ComputerSystem said Off.
//!
//! Only links the service gives are followed, never guessed paths: the ComputerSystem's
//! `Links.Chassis`, then each Chassis' `EnvironmentMetrics` (`PowerWatts.Reading`, the current
//! model) or, where it has none, its `Power` resource (`PowerControl[].PowerConsumedWatts`,
//! deprecated but the most widely served). The highest figure of every chassis and every power
//! control counts: a part of the machine drawing power is enough to doubt the Off. Anything
//! missing, refused or malformed makes the witness unavailable, which the core never counts.

use reqwest::Url;
use serde_json::Value;

use super::{RedfishSource, quote};
use crate::power::{PowerDraw, Watts};

/// At most this many chassis are read for one system.
const MAX_CHASSIS: usize = 4;

/// The power draw of the chassis the ComputerSystem `system` (its answer's body) links to.
pub(super) async fn power_draw(source: &RedfishSource, system: &[u8]) -> PowerDraw {
    match draw(source, system).await {
        Ok((watts, from)) => PowerDraw::Seen { watts, from },
        Err(why) => PowerDraw::Unavailable { why },
    }
}

async fn draw(source: &RedfishSource, system: &[u8]) -> Result<(Watts, String), String> {
    let doc: Value = serde_json::from_slice(system)
        .map_err(|e| format!("the ComputerSystem is not JSON: {e}"))?;
    let chassis = doc
        .get("Links")
        .and_then(|l| l.get("Chassis"))
        .and_then(Value::as_array)
        .ok_or("the ComputerSystem has no Links.Chassis to read its power draw from")?;
    if chassis.is_empty() {
        return Err("the ComputerSystem's Links.Chassis is empty".into());
    }
    if chassis.len() > MAX_CHASSIS {
        return Err(format!(
            "the ComputerSystem links {} chassis; at most {MAX_CHASSIS} are read",
            chassis.len()
        ));
    }
    let mut highest: Option<(Watts, String)> = None;
    for link in chassis {
        let path = link_path(link).ok_or_else(|| {
            format!(
                "a Links.Chassis member without a usable @odata.id: {}",
                quote(&link.to_string())
            )
        })?;
        let seen = chassis_draw(source, &path).await?;
        if highest.as_ref().is_none_or(|(w, _)| seen.0 > *w) {
            highest = Some(seen);
        }
    }
    Ok(highest.expect("at least one chassis"))
}

/// The power draw one Chassis reports, through the first of its links that it has.
async fn chassis_draw(source: &RedfishSource, path: &str) -> Result<(Watts, String), String> {
    let chassis = get_typed(source, path, "Chassis").await?;
    if let Some(metrics) = chassis.get("EnvironmentMetrics").and_then(link_path) {
        let doc = get_typed(source, &metrics, "EnvironmentMetrics").await?;
        let reading = doc.get("PowerWatts").and_then(|p| p.get("Reading"));
        let watts = watts_of(reading).ok_or_else(|| {
            format!(
                "{} has no usable PowerWatts.Reading ({})",
                quote(&metrics),
                shown(reading)
            )
        })?;
        return Ok((watts, format!("PowerWatts.Reading of {metrics}")));
    }
    let Some(power) = chassis.get("Power").and_then(link_path) else {
        return Err(format!(
            "the Chassis {} links neither EnvironmentMetrics nor Power",
            quote(path)
        ));
    };
    let doc = get_typed(source, &power, "Power").await?;
    let controls = doc
        .get("PowerControl")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("{} has no PowerControl entries", quote(&power)))?;
    let mut highest: Option<(Watts, usize)> = None;
    for (i, control) in controls.iter().enumerate() {
        let reading = control.get("PowerConsumedWatts");
        let watts = watts_of(reading).ok_or_else(|| {
            format!(
                "PowerControl[{i}].PowerConsumedWatts of {} is not a reading ({})",
                quote(&power),
                shown(reading)
            )
        })?;
        if highest.is_none_or(|(w, _)| watts > w) {
            highest = Some((watts, i));
        }
    }
    let (watts, i) = highest.expect("at least one control");
    Ok((
        watts,
        format!("PowerControl[{i}].PowerConsumedWatts of {power}"),
    ))
}

/// GETs `path` and checks that the answer is that resource, of type `#<kind>.`.
async fn get_typed(source: &RedfishSource, path: &str, kind: &str) -> Result<Value, String> {
    let body = source.get(path).await.map_err(|state| state.to_string())?;
    let doc: Value =
        serde_json::from_slice(&body).map_err(|e| format!("{} is not JSON: {e}", quote(path)))?;
    let id = doc.get("@odata.id").and_then(Value::as_str).unwrap_or("");
    if !super::reply::names_path(id, path) {
        return Err(format!(
            "the answer for {} names itself {} (its @odata.id)",
            quote(path),
            quote(id)
        ));
    }
    let odata_type = doc.get("@odata.type").and_then(Value::as_str).unwrap_or("");
    if !odata_type.starts_with(&format!("#{kind}.")) {
        return Err(format!(
            "{} is a {}, not a {kind}",
            quote(path),
            quote(odata_type)
        ));
    }
    Ok(doc)
}

/// The path of a `{"@odata.id": ...}` link: a path on the BMC, or the path of an http(s) URL.
fn link_path(link: &Value) -> Option<String> {
    let id = link.get("@odata.id")?.as_str()?;
    let path = if id.starts_with('/') {
        id.to_string()
    } else {
        let url = Url::parse(id).ok()?;
        if !matches!(url.scheme(), "https" | "http") || url.query().is_some() {
            return None;
        }
        url.path().to_string()
    };
    super::check_path(&path).ok()?;
    Some(path)
}

/// A number of watts from a JSON number; `None` for null, a string, a negative number.
fn watts_of(v: Option<&Value>) -> Option<Watts> {
    Watts::from_f64(v?.as_f64()?)
}

fn shown(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(v) => quote(&v.to_string()),
    }
}
