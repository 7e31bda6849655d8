//! providerIDs (`aws:///ZONE/INSTANCE-ID`): the instance id, the zone, the zone's region, and
//! the refusal of a providerID whose zone is not in the configured region.

/// Extracts the instance id from a node's `spec.providerID`: `aws:///us-east-1a/i-0abc…` or
/// `aws:///i-0abc…`.
pub fn instance_id_from_provider_id(provider_id: &str) -> Result<String, String> {
    let rest = provider_id.strip_prefix("aws://").ok_or_else(|| {
        format!("providerID {provider_id:?} is not an AWS one (expected aws:///ZONE/i-...)")
    })?;
    let id = rest.rsplit('/').next().unwrap_or_default();
    let hex = id.strip_prefix("i-").unwrap_or_default();
    // EC2 instance ids are i- and 8 hex digits (before 2016) or 17; nothing in between.
    if !matches!(hex.len(), 8 | 17) || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "providerID {provider_id:?} does not end in an instance id (i- followed by 8 or 17 hex digits)"
        ));
    }
    Ok(id.to_string())
}

/// The availability zone a providerID names: `Some("us-east-1a")` for `aws:///us-east-1a/i-…`
/// (or `aws://us-east-1a/i-…`), `None` for the zone-less forms `aws:///i-…` and `aws://i-…`.
/// Err for a providerID [`instance_id_from_provider_id`] refuses, or one with more path parts
/// than a zone and an instance id.
pub fn zone_from_provider_id(provider_id: &str) -> Result<Option<&str>, String> {
    instance_id_from_provider_id(provider_id)?;
    let rest = provider_id.strip_prefix("aws://").unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        [_id] => Ok(None),
        [zone, _id] => Ok(Some(zone)),
        _ => Err(format!(
            "providerID {provider_id:?} has more parts than a zone and an instance id \
             (expected aws:///ZONE/i-...)"
        )),
    }
}

/// The region an availability zone name belongs to: `us-west-2a` → `us-west-2`; a Local Zone
/// (`us-west-2-lax-1a`) or a Wavelength Zone (`us-east-1-wl1-bos-wlz-1`) → its parent region
/// (`us-west-2`, `us-east-1`). `None` for anything that is not a zone name (a region, a zone id
/// such as `use1-az1`, an empty string).
pub fn region_of_zone(zone: &str) -> Option<&str> {
    // A region is two or more groups of letters and then a number (us-east-1, us-gov-west-1,
    // ap-southeast-3); a zone adds one letter to it, or a `-…` suffix for Local and Wavelength
    // Zones.
    let mut start = 0;
    let mut letter_groups = 0;
    for part in zone.split('-') {
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase()) {
            letter_groups += 1;
            start += part.len() + 1;
            continue;
        }
        let digits = part.bytes().take_while(u8::is_ascii_digit).count();
        if letter_groups < 2 || digits == 0 {
            return None;
        }
        let region = &zone[..start + digits];
        let letter = &part[digits..];
        let tail = &zone[start + part.len()..];
        let plain_zone =
            tail.is_empty() && letter.len() == 1 && letter.bytes().all(|b| b.is_ascii_lowercase());
        let local_zone = letter.is_empty()
            && tail.len() > 1
            && tail[1..].split('-').all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        return (plain_zone || local_zone).then_some(region);
    }
    None
}

/// Why a node with this providerID cannot be read through a reader of `region`; `None` only
/// when the providerID names an availability zone of `region`.
///
/// DescribeInstances answers for one region: an instance of another region is absent from the
/// answer, which reads as NotFound, and two of those would delete a Node whose instance runs.
/// A providerID without a zone, or with one that is not a zone name, cannot be checked, so it
/// gets a message too.
pub fn zone_region_mismatch(provider_id: &str, region: &str) -> Option<String> {
    let zone = match zone_from_provider_id(provider_id) {
        Ok(Some(zone)) => zone,
        Ok(None) => {
            return Some(format!(
                "providerID {provider_id:?} names no availability zone, so oobfence cannot \
                 check that the instance is in the [aws] region {region:?} (in another region \
                 it would look gone); only the aws:///ZONE/i-... form the AWS cloud provider \
                 sets can be fenced: leave this node out of [aws] nodes"
            ));
        }
        Err(e) => return Some(format!("{e}; its region cannot be checked")),
    };
    match region_of_zone(zone) {
        Some(r) if r == region => None,
        Some(r) => Some(format!(
            "providerID {provider_id:?} is in availability zone {zone} of region {r}, but the \
             [aws] region is {region:?}: DescribeInstances in {region} never lists the \
             instance, so it would look gone; run oobfence for region {r:?} for this node, \
             or leave it out of [aws] nodes"
        )),
        None => Some(format!(
            "providerID {provider_id:?} names {zone:?}, which is not an availability zone name \
             (REGION plus a letter, or a Local or Wavelength Zone REGION-...), so oobfence \
             cannot check that the instance is in the [aws] region {region:?}"
        )),
    }
}
