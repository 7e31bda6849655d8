//! A `[[bmc]]` entry of `protocol = "fence-agent"`: its keys checked, the agent found and
//! asked for its metadata, and the password every protocol reads the same way.

use std::path::Path;

use super::bmc::{BmcEntry, BmcTls, Protocol, RawBmc};
use super::fence_agent::{self, known};
use super::{ConfigError, IdentityCheck, Secrets};
use crate::secret::{self, Secret};

impl RawBmc {
    /// The password from `password_file` or `password_credential`, if the entry names one.
    pub(super) fn password(
        &self,
        secrets: Secrets,
        err: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<Option<Secret>, ConfigError> {
        Ok(Some(
            match (&self.password_file, &self.password_credential) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        "password_file",
                        "set either password_file or password_credential, not both".into(),
                    ));
                }
                (None, None) => return Ok(None),
                _ if secrets == Secrets::Skip => Secret::new(""),
                (Some(file), None) => {
                    secret::read_password_file(file).map_err(|e| err("password_file", e))?
                }
                (None, Some(name)) => {
                    let file =
                        secret::credential_path(name).map_err(|e| err("password_credential", e))?;
                    secret::read_password_file(&file).map_err(|e| err("password_credential", e))?
                }
            },
        ))
    }

    /// A `protocol = "fence-agent"` entry: the agent found and asked for its metadata, the
    /// options checked against it, and none of the BMC protocols' keys.
    pub(super) fn validate_fence_agent(
        self,
        index: usize,
        nodes: Vec<glob::Pattern>,
        path: &Path,
        secrets: Secrets,
    ) -> Result<BmcEntry, ConfigError> {
        let err = |key: &str, problem: String| ConfigError {
            file: path.to_owned(),
            line: None,
            key: format!("bmc[{index}].{key}"),
            problem,
        };
        for (key, set) in [
            ("address", self.address.is_some()),
            ("system", self.system.is_some()),
            ("outlet", self.outlet.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("tls_fingerprint", self.tls_fingerprint.is_some()),
            ("tls_insecure", self.tls_insecure),
            ("tls_pin_validity", self.tls_pin_validity.is_some()),
            ("auth", self.auth.is_some()),
            ("cipher_suite", self.cipher_suite.is_some()),
            ("privilege", self.privilege.is_some()),
            ("corroborate", self.corroborate.is_some()),
            ("max_off_watts", self.max_off_watts.is_some()),
        ] {
            if set {
                return Err(err(
                    key,
                    "does not apply to protocol = \"fence-agent\": the agent's own options (options = { ip = \"...\", ssl_insecure = \"1\" }) say where and how it connects".into(),
                ));
            }
        }
        if self.identity != IdentityCheck::Unchecked {
            return Err(err(
                "identity",
                "a fence agent reports no machine identity, so its Off reads cannot prove which machine answered: set identity = \"unchecked\" to trust this entry's mapping (check-config and why say so)".into(),
            ));
        }
        let name = self.agent.clone().ok_or_else(|| {
            err(
                "agent",
                "missing: the fence agent to run, such as \"fence_ipmilan\"".into(),
            )
        })?;
        let agent = fence_agent::resolve_agent(&name).map_err(|e| err("agent", e))?;
        let file_name = agent
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(name);
        // Refused by its name before it is even run.
        self.check_verdict(&[&file_name], &err)?;
        let options = fence_agent::check_options(&self.options.clone().unwrap_or_default())
            .map_err(|e| err("options", e))?;
        if let Some(plug) = &self.plug {
            fence_agent::one_line(plug).map_err(|e| err("plug", e))?;
        }
        if let Some(user) = &self.username {
            fence_agent::one_line(user).map_err(|e| err("username", e))?;
        }
        let password = self.password(secrets, &err)?;
        if let Some(pw) = &password
            && fence_agent::one_line(pw.expose()).is_err()
        {
            let key = match self.password_file {
                Some(_) => "password_file",
                None => "password_credential",
            };
            return Err(err(
                key,
                "the password has a line break (or NUL) inside: it goes to the agent's stdin as one password=VALUE line, where a second line would add an option of its own, such as action=off; only one trailing newline may end the file".into(),
            ));
        }
        let username = self.username.clone().filter(|u| !u.is_empty());
        let (metadata, version) =
            fence_agent::read_metadata(&agent).map_err(|e| err("agent", e))?;
        let vouched = self.check_verdict(&[&file_name, &metadata.name], &err)?;
        let mut given: Vec<&str> = options.iter().map(|(k, _)| k.as_str()).collect();
        given.extend(username.is_some().then_some("username"));
        given.extend(password.is_some().then_some("password"));
        given.extend(self.plug.is_some().then_some("plug"));
        metadata
            .check(&given)
            .map_err(|e| err("options", format!("{e} ({version})")))?;
        let secret_options = options
            .iter()
            .map(|(k, _)| k)
            .filter(|k| fence_agent::secret_options::secret_by_name(k) || metadata.says_secret(k))
            .cloned()
            .collect();
        let outlet_plugs = known::reads_outlets(&[&file_name, &metadata.name]);
        let fa = fence_agent::FenceAgentOptions {
            name: file_name,
            agent,
            options,
            plug: self.plug.clone(),
            version,
            actions: metadata.actions,
            secret_options,
            vouched,
            outlet_plugs,
        };
        // Above level 1 one plug may be an outlet that feeds several nodes.
        let covers_many = self.level.is_none_or(|l| l <= 1)
            && (self.nodes.len() > 1 || self.nodes.iter().any(|g| g.contains(['*', '?', '['])));
        if covers_many && !fa.per_node() {
            return Err(err(
                "plug",
                format!(
                    "this entry matches several nodes ({:?}) but neither plug nor any option contains {{node}}: every one of them would read the same machine's power; write one entry per node or use {{node}}",
                    self.nodes
                ),
            ));
        }
        super::bmc::check_timeout(self.timeout).map_err(|e| err("timeout", e))?;
        Ok(BmcEntry {
            index,
            line: None,
            nodes,
            inventory: None,
            protocol: Protocol::FenceAgent,
            address: String::new(),
            system: None,
            outlet: None,
            username: username.unwrap_or_default(),
            password: password.unwrap_or_else(|| Secret::new("")),
            password_file: self.password_file.clone(),
            tls: BmcTls::System,
            timeout: self.timeout,
            ipmi: None,
            redfish: None,
            fence_agent: Some(fa),
            identity: self.identity,
            actuate: self.actuate,
            corroborate: None,
            level: 1,
        })
    }
}

impl RawBmc {
    /// What [`known`]'s table says of the agent called `names` (its file name, and the name
    /// its metadata gives): refused for a known reason (no opt-in), accepted, or not listed
    /// and accepted only as the operator vouched. Whether it was vouched for.
    fn check_verdict(
        &self,
        names: &[&str],
        err: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<bool, ConfigError> {
        let vouch = self.unlisted_agent_off_means.as_deref();
        match known::lookup(names) {
            known::Lookup::Refused(name, row) => {
                let known::Verdict::Refused { why, instead } = row.verdict else {
                    unreachable!("a refused row");
                };
                Err(err(
                    "agent",
                    format!(
                        "{name} is refused as a power source: {why}; {instead} (an agent refused for a known reason cannot be vouched for)"
                    ),
                ))
            }
            known::Lookup::Accepted(_) if vouch.is_some() => Err(err(
                "unlisted_agent_off_means",
                format!(
                    "{} is accepted as a power source without it: remove unlisted_agent_off_means, which is only for agents oobfence does not list",
                    names[0]
                ),
            )),
            known::Lookup::Accepted(_) => Ok(false),
            known::Lookup::Unlisted => match vouch {
                Some(v) if v == fence_agent::VOUCH_VALUE => Ok(true),
                Some(v) => Err(err(
                    "unlisted_agent_off_means",
                    format!(
                        "{v:?} is not what it takes: set it to {:?} once you have read the agent's status code and its Off means exactly that",
                        fence_agent::VOUCH_VALUE
                    ),
                )),
                None => Err(err(
                    "agent",
                    format!(
                        "{} is not an agent oobfence has read, so whether its Off (exit status 2) means the machine has no power and no saved state is unknown (oobfence accepts {}). Read its get_power_status: if a suspended, saved, hibernated or unknown machine never reads off, set unlisted_agent_off_means = {:?} on this entry",
                        names[0],
                        known::accepted_names().join(", "),
                        fence_agent::VOUCH_VALUE
                    ),
                )),
            },
        }
    }
}
