//! `protocol = "fence-agent"`: a ClusterLabs fence agent as a power source. The agent is found
//! at load (an absolute path, or a name on `PATH` and the directories agents are installed in),
//! and its own `metadata` says which options it takes: an option it does not declare, or a
//! required one missing, is a config error naming the agent and its version. Which agents'
//! Off counts at all is [`known`]'s table; which options are secrets, [`secret_options`].

pub mod known;
pub mod secret_options;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where Debian and RHEL install fence agents, searched after `PATH` (a service's `PATH` often
/// lacks the sbin directories).
const AGENT_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// How long an agent's `metadata` may take at load.
const METADATA_TIMEOUT: Duration = Duration::from_secs(20);

/// Options oobfence sets itself on every call; an entry may not set them in `options`.
const RESERVED: [&str; 7] = [
    "action", "plug", "port", "password", "passwd", "username", "login",
];

/// The value of `unlisted_agent_off_means`: what the operator vouches for, in full.
pub const VOUCH_VALUE: &str = "no power and no saved state";

/// A `[[bmc]]` entry's fence agent, checked against the agent's own metadata.
#[derive(Clone, PartialEq, Eq)]
pub struct FenceAgentOptions {
    /// The agent's executable, resolved at load.
    pub agent: PathBuf,
    /// Its file name (`fence_ipmilan`), for metrics and messages.
    pub name: String,
    /// `options`, as `name=value` lines for the agent's stdin; `{node}` filled in per node.
    pub options: Vec<(String, String)>,
    /// `plug`: the machine behind a multi-machine endpoint (a VM name, an outlet); `{node}`
    /// filled in per node.
    pub plug: Option<String>,
    /// What the agent said of itself (`fence_ipmilan 4.12.1`), for `check-config` and `probe`.
    pub version: String,
    /// The actions its metadata lists (`on`, `off`, `status`, `list-status`, ...).
    pub actions: Vec<String>,
    /// The options given that are secrets (by name or by the agent's metadata): redacted in
    /// `Debug` and scrubbed from all the agent prints.
    pub secret_options: Vec<String>,
    /// The agent is not in [`known`]'s table and the operator vouched that its Off means no
    /// power and no saved state (`unlisted_agent_off_means`).
    pub vouched: bool,
    /// One of [`known::OUTLET_AGENTS`]: an Off counts only for a plug its outlet list names once.
    pub outlet_plugs: bool,
}

impl std::fmt::Debug for FenceAgentOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceAgentOptions")
            .field("agent", &self.agent)
            .field("options", &self.public_options(&self.options))
            .field("plug", &self.plug)
            .field("version", &self.version)
            .field("secret_options", &self.secret_options)
            .field("vouched", &self.vouched)
            .field("outlet_plugs", &self.outlet_plugs)
            .finish()
    }
}

impl FenceAgentOptions {
    /// The options for one node, `{node}` filled in.
    pub fn options_for(&self, node: &str) -> Vec<(String, String)> {
        self.options
            .iter()
            .map(|(k, v)| (k.clone(), v.replace("{node}", node)))
            .collect()
    }

    /// `options` with each secret one's value replaced by `<redacted>`: for `Debug`, messages
    /// and the machine key (a secret names no machine).
    pub fn public_options(&self, options: &[(String, String)]) -> Vec<(String, String)> {
        options
            .iter()
            .map(|(k, v)| {
                let v = if self.secret_options.contains(k) {
                    "<redacted>".to_string()
                } else {
                    v.clone()
                };
                (k.clone(), v)
            })
            .collect()
    }

    pub fn plug_for(&self, node: &str) -> Option<String> {
        self.plug.as_ref().map(|p| p.replace("{node}", node))
    }

    /// The endpoint the agent talks to, as its options name it (`ip`, `ipaddr`, ...), for
    /// operators and the mapping's machine key.
    pub fn endpoint_for(&self, node: &str) -> String {
        ["ip", "ipaddr", "server", "api-url", "hostname"]
            .iter()
            .find_map(|k| {
                self.options
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.replace("{node}", node))
            })
            .unwrap_or_default()
    }

    /// Whether the options or the plug differ per node.
    pub fn per_node(&self) -> bool {
        self.plug.as_deref().is_some_and(|p| p.contains("{node}"))
            || self.options.iter().any(|(_, v)| v.contains("{node}"))
    }
}

/// Finds `agent`: an absolute path as given, or a bare name on `PATH` and then in
/// [`AGENT_DIRS`]. Refused unless it is an executable file.
pub fn resolve_agent(agent: &str) -> Result<PathBuf, String> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if agent.is_empty() {
        return Err("must name a fence agent, such as \"fence_ipmilan\"".into());
    }
    let path = Path::new(agent);
    if path.is_absolute() {
        return if executable(path) {
            Ok(path.to_path_buf())
        } else {
            Err(format!("{agent} is not an executable file"))
        };
    }
    if agent.contains('/') {
        return Err(format!(
            "{agent:?} is a relative path: give the agent's name (found on PATH) or an absolute path"
        ));
    }
    let path_dirs = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path_dirs)
        .chain(AGENT_DIRS.iter().map(PathBuf::from))
        .collect();
    dirs.iter()
        .map(|d| d.join(agent))
        .find(|p| executable(p))
        .ok_or_else(|| {
            format!(
                "{agent} was not found on PATH nor in {}: install it (Debian: apt install fence-agents) or give its absolute path",
                AGENT_DIRS.join(", ")
            )
        })
}

/// Refuses a line break (or NUL) in `value`, which goes to the agent's stdin as one
/// `name=value` line: a second line would be an option of its own, such as `action=off`.
pub fn one_line(value: &str) -> Result<(), String> {
    if value.contains(['\n', '\r', '\0']) {
        return Err("must be one line: it goes to the agent's stdin as one name=value line, where a line break (or NUL) would add an option of its own, such as action=off; remove it".into());
    }
    Ok(())
}

/// Checks the entry's `options` table: names as agents spell them, no option oobfence sets
/// itself, no `missing_as_off`, values on one line (they go to the agent's stdin, one
/// `name=value` a line).
pub fn check_options(options: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (name, value) in options {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(format!(
                "{name:?} is not a fence agent option name (letters, digits, _ and -, as its metadata spells them)"
            ));
        }
        if RESERVED.contains(&name.as_str()) {
            return Err(format!(
                "{name:?} is set by oobfence itself (action, plug, username, password): use the entry's plug, username and password_file keys"
            ));
        }
        if name
            .replace('-', "_")
            .eq_ignore_ascii_case("missing_as_off")
        {
            return Err(format!(
                "{name:?} makes the agent read a plug the device does not know (a VM deleted or renamed, a wrong plug) as Off, which proves nothing of the machine's power: remove it"
            ));
        }
        one_line(value).map_err(|e| format!("the value of {name:?} {e}"))?;
        out.push((name.clone(), value.clone()));
    }
    Ok(out)
}

/// One parameter an agent's metadata declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentParameter {
    pub name: String,
    pub required: bool,
    /// The older name this one replaces (`password` obsoletes `passwd`).
    pub obsoletes: Option<String>,
    /// The agent's own default: a required parameter with one need not be given.
    pub has_default: bool,
    /// Its description says it is a secret ("Login password", "Kg key"): fence-agents'
    /// metadata has no attribute that marks one.
    pub secret: bool,
}

/// What an agent's `metadata` action says of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentMetadata {
    pub name: String,
    pub parameters: Vec<AgentParameter>,
    pub actions: Vec<String>,
}

impl AgentMetadata {
    /// Parses the XML an agent prints for `-o metadata` (the FenceAgentAPI's
    /// `<resource-agent>` document).
    pub fn parse(xml: &str) -> Result<AgentMetadata, String> {
        let doc = roxmltree::Document::parse(xml)
            .map_err(|e| format!("its metadata is not XML ({e})"))?;
        let root = doc.root_element();
        if root.tag_name().name() != "resource-agent" {
            return Err(format!(
                "its metadata is a <{}>, not a <resource-agent>",
                root.tag_name().name()
            ));
        }
        let element = |n: &roxmltree::Node, name: &str| n.is_element() && n.has_tag_name(name);
        let parameters = root
            .descendants()
            .filter(|n| element(n, "parameter"))
            .filter_map(|n| {
                Some(AgentParameter {
                    name: n.attribute("name")?.to_string(),
                    required: n.attribute("required") == Some("1"),
                    obsoletes: n.attribute("obsoletes").map(str::to_string),
                    has_default: n
                        .children()
                        .any(|c| element(&c, "content") && c.attribute("default").is_some()),
                    secret: n
                        .children()
                        .filter(|c| element(c, "shortdesc"))
                        .filter_map(|c| c.text())
                        .any(secret_options::describes_secret),
                })
            })
            .collect::<Vec<_>>();
        let actions = root
            .descendants()
            .filter(|n| element(n, "action"))
            .filter_map(|n| n.attribute("name").map(str::to_string))
            .collect::<Vec<_>>();
        if !actions.iter().any(|a| a == "status") {
            return Err("its metadata lists no status action: it cannot read a power state".into());
        }
        Ok(AgentMetadata {
            name: root.attribute("name").unwrap_or_default().to_string(),
            parameters,
            actions,
        })
    }

    /// Whether the agent's metadata describes `name` as a secret.
    pub fn says_secret(&self, name: &str) -> bool {
        self.parameters.iter().any(|p| p.name == name && p.secret)
    }

    fn declares(&self, name: &str) -> bool {
        self.parameters.iter().any(|p| p.name == name)
    }

    /// Checks the options an entry gives (with `username` and `password` when set, the plug
    /// when there is one) against the parameters the agent declares: none it does not know,
    /// and every required one given (under its name or the one it replaced).
    pub fn check(&self, given: &[&str]) -> Result<(), String> {
        if let Some(unknown) = given.iter().find(|g| !self.declares(g)) {
            let mut known: Vec<&str> = self
                .parameters
                .iter()
                .map(|p| p.name.as_str())
                .filter(|n| !RESERVED.contains(n))
                .collect();
            known.sort_unstable();
            return Err(format!(
                "{} declares no option {unknown:?}; it takes: {}",
                self.name,
                known.join(", ")
            ));
        }
        let is_given = |name: &str| given.contains(&name);
        for p in self.parameters.iter().filter(|p| p.required) {
            // `action` is oobfence's; a required old name is met by its replacement.
            if p.name == "action" || p.has_default || is_given(&p.name) {
                continue;
            }
            let replaced = self
                .parameters
                .iter()
                .any(|q| q.obsoletes.as_deref() == Some(p.name.as_str()) && is_given(&q.name));
            let replaces = p.obsoletes.as_deref().is_some_and(is_given);
            if !replaced && !replaces {
                return Err(format!(
                    "{} requires the option {:?}, which the entry does not give",
                    self.name, p.name
                ));
            }
        }
        Ok(())
    }
}

/// Runs `agent -o metadata` (bounded) and parses what it prints; the version comes from
/// `agent -V` where the agent answers it.
pub fn read_metadata(agent: &Path) -> Result<(AgentMetadata, String), String> {
    let xml = run_bounded(agent, &["-o", "metadata"])?;
    let metadata = AgentMetadata::parse(&xml)?;
    let version = run_bounded(agent, &["-V"])
        .ok()
        .and_then(|v| v.lines().next().map(|l| l.trim().to_string()))
        .filter(|v| !v.is_empty())
        .map(|v| format!("{} {v}", metadata.name))
        .unwrap_or_else(|| format!("{} (version unknown)", metadata.name));
    Ok((metadata, version))
}

/// Runs `agent ARGS` with a scrubbed environment, at most [`METADATA_TIMEOUT`], and returns
/// its stdout (capped at 1 MiB).
fn run_bounded(agent: &Path, args: &[&str]) -> Result<String, String> {
    use std::io::Read;
    let mut child = std::process::Command::new(agent)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{} could not be run: {e}", agent.display()))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(1 << 20).read_to_end(&mut out);
        out
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < METADATA_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} {} did not finish within {}s",
                    agent.display(),
                    args.join(" "),
                    METADATA_TIMEOUT.as_secs()
                ));
            }
        }
    };
    let out = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!(
            "{} {} failed ({status})",
            agent.display(),
            args.join(" ")
        ));
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METADATA: &str = r#"<?xml version="1.0" ?>
<resource-agent name="fence_test" shortdesc="test">
<parameters>
	<parameter name="action" unique="0" required="1"><content type="string" default="reboot"/></parameter>
	<parameter name="ip" unique="0" required="1" obsoletes="ipaddr"><content type="string"/></parameter>
	<parameter name="ipaddr" unique="0" required="1" deprecated="1"><content type="string"/></parameter>
	<parameter name="login" unique="0" required="1" deprecated="1"><content type="string"/></parameter>
	<parameter name="username" unique="0" required="1" obsoletes="login"><content type="string"/></parameter>
	<parameter name="password" unique="0" required="0" obsoletes="passwd"><content type="string"/></parameter>
	<parameter name="ssl_insecure" unique="0" required="0"><content type="boolean"/></parameter>
	<parameter name="vmtype" unique="0" required="1"><content type="string" default="qemu"/></parameter>
	<parameter name="plug" unique="0" required="0" obsoletes="port"><content type="string"/></parameter>
</parameters>
<actions>
	<action name="on" automatic="0"/>
	<action name="off" />
	<action name="status" />
	<action name="metadata" />
</actions>
</resource-agent>"#;

    #[test]
    fn metadata_names_the_parameters_the_required_ones_and_the_actions() {
        let m = AgentMetadata::parse(METADATA).unwrap();
        assert_eq!(m.name, "fence_test");
        assert_eq!(m.actions, ["on", "off", "status", "metadata"]);
        assert!(
            m.check(&["ip", "username", "password", "ssl_insecure"])
                .is_ok()
        );
        // The old names meet a requirement too, each way.
        assert!(m.check(&["ipaddr", "login"]).is_ok());
        let e = m.check(&["ip", "username", "verbose_level"]).unwrap_err();
        assert!(e.contains("declares no option \"verbose_level\""), "{e}");
        assert!(e.contains("ip, ipaddr, ssl_insecure, vmtype"), "{e}");
        let e = m.check(&["username"]).unwrap_err();
        assert!(e.contains("requires the option \"ip\""), "{e}");
    }

    #[test]
    fn metadata_that_is_not_an_agents_is_refused() {
        for (xml, says) in [
            ("not xml", "not XML"),
            ("<html/>", "not a <resource-agent>"),
            (
                "<resource-agent name=\"x\"><actions><action name=\"off\"/></actions></resource-agent>",
                "no status action",
            ),
        ] {
            let e = AgentMetadata::parse(xml).unwrap_err();
            assert!(e.contains(says), "{xml}: {e}");
        }
    }

    #[test]
    fn options_are_agent_names_on_one_line_and_never_oobfences_own() {
        let ok: BTreeMap<String, String> = [("ip".to_string(), "{node}-vc".to_string())].into();
        assert_eq!(
            check_options(&ok).unwrap(),
            [("ip".into(), "{node}-vc".into())]
        );
        for (name, value, says) in [
            ("action", "off", "set by oobfence"),
            ("password", "x", "set by oobfence"),
            ("ip addr", "x", "not a fence agent option name"),
            ("ip=", "x", "not a fence agent option name"),
            ("ip", "a\nplug=other", "line break"),
            ("missing_as_off", "1", "does not know"),
            ("missing-as-off", "1", "does not know"),
            ("Missing_As_Off", "1", "does not know"),
        ] {
            let o: BTreeMap<String, String> = [(name.to_string(), value.to_string())].into();
            let e = check_options(&o).unwrap_err();
            assert!(e.contains(says), "{name}: {e}");
        }
    }

    #[test]
    fn an_agent_is_an_executable_found_by_name_or_path() {
        let e = resolve_agent("fence_does_not_exist").unwrap_err();
        assert!(e.contains("apt install fence-agents"), "{e}");
        assert!(
            resolve_agent("bin/fence_x")
                .unwrap_err()
                .contains("relative path")
        );
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("fence_plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            resolve_agent(plain.to_str().unwrap())
                .unwrap_err()
                .contains("not an executable")
        );
        assert_eq!(resolve_agent("/bin/sh").unwrap(), Path::new("/bin/sh"));
        assert!(resolve_agent("sh").is_ok());
    }
}
