//! Whether the cluster acts on the out-of-service taint, from the API server's version.
//!
//! The controller-manager acts on `node.kubernetes.io/out-of-service` (force-deletes the pods,
//! then detaches the volumes at once) behind the NodeOutOfServiceVolumeDetach feature gate:
//! alpha and off in 1.24 and 1.25, beta and on by default in 1.26, GA in 1.28. Before 1.26 the
//! taint is written and does nothing unless the gate was turned on by hand.

/// What the cluster makes of the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutOfService {
    /// 1.26 or later: acted on (the gate is on by default, locked on from 1.28).
    ActedOn,
    /// 1.24 or 1.25: only with the gate turned on by hand.
    GateOffByDefault,
    /// Before 1.24: never.
    NotKnown,
}

/// The API server's `major` and `minor` (as /version gives them: "1", "28+"), or `None` when
/// they are not numbers.
pub fn parse(major: &str, minor: &str) -> Option<(u32, u32)> {
    let digits = |s: &str| -> Option<u32> {
        s.trim()
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()
    };
    Some((digits(major)?, digits(minor)?))
}

pub fn out_of_service(version: (u32, u32)) -> OutOfService {
    match version {
        (1, m) if m >= 26 => OutOfService::ActedOn,
        (1, 24 | 25) => OutOfService::GateOffByDefault,
        (1, _) | (0, _) => OutOfService::NotKnown,
        _ => OutOfService::ActedOn,
    }
}

/// One line for `check-config --probe` and `drill`: whether the taint will do anything on
/// this cluster, and if not what to do. `Err` when it will not.
pub fn out_of_service_words(git_version: &str, version: (u32, u32)) -> Result<String, String> {
    const WHAT: &str = "the controller-manager force-deletes a tainted node's pods and \
                        detaches its volumes at once";
    match out_of_service(version) {
        OutOfService::ActedOn => Ok(format!(
            "Kubernetes {git_version}: the out-of-service taint is acted on ({WHAT})"
        )),
        OutOfService::GateOffByDefault => Err(format!(
            "Kubernetes {git_version}: the out-of-service taint is acted on only with the \
             NodeOutOfServiceVolumeDetach feature gate turned on (on by default from 1.26): \
             without it the taint is written and its volumes still wait for the 6-minute \
             force detach; turn the gate on, upgrade, or set action = \"delete-node\""
        )),
        OutOfService::NotKnown => Err(format!(
            "Kubernetes {git_version}: the out-of-service taint is not acted on before 1.26 \
             (1.24 behind a feature gate): oobfence can write it, and the volumes still wait \
             for the 6-minute force detach; upgrade to 1.26 or later, or set action = \
             \"delete-node\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_as_the_api_server_writes_them() {
        assert_eq!(parse("1", "28+"), Some((1, 28)));
        assert_eq!(parse("1", "20"), Some((1, 20)));
        assert_eq!(parse("", "x"), None);
        assert_eq!(out_of_service((1, 26)), OutOfService::ActedOn);
        assert_eq!(out_of_service((1, 31)), OutOfService::ActedOn);
        assert_eq!(out_of_service((1, 25)), OutOfService::GateOffByDefault);
        assert_eq!(out_of_service((1, 24)), OutOfService::GateOffByDefault);
        assert_eq!(out_of_service((1, 23)), OutOfService::NotKnown);
        assert!(out_of_service_words("v1.20.15", (1, 20)).is_err());
        assert!(out_of_service_words("v1.28.3", (1, 28)).is_ok());
    }
}
