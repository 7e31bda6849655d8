//! `[pause]`: the pause file and the pause ConfigMap, their defaults, and their checks (with
//! `[ha]` a pause is the group's, so only the ConfigMap).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, ConfigMapRef};

/// `[pause]`: the two switches that stop every write without stopping the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseConfig {
    /// While this file exists, nothing is written (its text is the reason shown). Default
    /// `/etc/oobfence/<datacenter>.paused`; `oobfence pause` and `oobfence resume` manage it.
    pub file: Option<PathBuf>,
    /// While this ConfigMap carries the annotation `oobfence.io/paused` (any value but
    /// "false"), nothing is written. Default `oobfence/oobfence-pause`.
    pub configmap: Option<ConfigMapRef>,
}

/// The default pause file of a datacenter.
pub fn default_pause_file(datacenter: &str) -> PathBuf {
    Path::new("/etc/oobfence").join(format!("{datacenter}.paused"))
}

pub const DEFAULT_PAUSE_CONFIGMAP: &str = "oobfence/oobfence-pause";

/// The annotation that pauses every datacenter whose `[pause]` reads its ConfigMap.
pub const ANNOTATION_PAUSED: &str = "oobfence.io/paused";

/// The annotation that pauses one datacenter, every instance of it (`[ha]`: the group):
/// `oobfence.io/paused-<datacenter>`, the name lowercased with '_' and '.' as '-'. What
/// `oobfence pause` writes under `[ha]`.
pub fn datacenter_annotation(datacenter: &str) -> String {
    format!(
        "{ANNOTATION_PAUSED}-{}",
        datacenter.to_ascii_lowercase().replace(['_', '.'], "-")
    )
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPause {
    file: Option<PathBuf>,
    configmap: Option<String>,
}

impl RawPause {
    pub(super) fn validate(
        self,
        path: &Path,
        dc: &str,
        ha: bool,
    ) -> Result<PauseConfig, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("pause.{key}"),
            problem,
        };
        let file = match self.file {
            // With [ha] a pause is the group's: the ConfigMap, which every instance reads.
            None if ha => None,
            None => Some(default_pause_file(dc)),
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) if ha => {
                return Err(err(
                    "file",
                    format!(
                        "{:?}: with [ha] a pause file is read only by the instance on its own host, so a failover would resume every write on the other; remove it: under [ha] `oobfence pause` writes the pause ConfigMap, which every instance reads",
                        p.display().to_string()
                    ),
                ));
            }
            Some(p) if !p.is_absolute() => {
                return Err(err(
                    "file",
                    format!(
                        "{:?} must be an absolute path, or \"\" for none",
                        p.display().to_string()
                    ),
                ));
            }
            Some(p) => Some(p),
        };
        let configmap = match self.configmap.as_deref().map(str::trim) {
            None => Some(DEFAULT_PAUSE_CONFIGMAP),
            Some("") => None,
            Some(c) => Some(c),
        }
        .map(|c| {
            let dns = |s: &str| {
                !s.is_empty()
                    && s.len() <= 253
                    && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
            };
            match c.split_once('/') {
                Some((ns, name)) if dns(ns) && dns(name) => Ok(ConfigMapRef {
                    namespace: ns.into(),
                    name: name.into(),
                }),
                _ => Err(err(
                    "configmap",
                    format!("{c:?} must be NAMESPACE/NAME (example: \"{DEFAULT_PAUSE_CONFIGMAP}\"), or \"\" for none"),
                )),
            }
        })
        .transpose()?;
        if ha {
            // An annotation's name is at most 63 characters.
            let key = datacenter_annotation(dc);
            let name = key.split_once('/').map_or(key.as_str(), |(_, n)| n);
            if name.len() > 63 || name.ends_with('-') {
                return Err(ConfigError {
                    file: path.to_owned(),
                    line: None,
                    key: "datacenter".into(),
                    problem: format!(
                        "{dc:?}: with [ha] the group's pause annotation {key} must be a valid annotation name (at most 63 characters after the '/', ending in a letter or digit): use a shorter datacenter name"
                    ),
                });
            }
        }
        Ok(PauseConfig { file, configmap })
    }
}
