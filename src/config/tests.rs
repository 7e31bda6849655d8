//! The config file's tests: the fixtures they share (a minimal config, its password file, a
//! parse) here, the tests by family in the children.

use std::path::{Path, PathBuf};

use super::*;
use crate::config::redfish::RedfishAuth;
use crate::decision::FenceAction;
use crate::decision::holds::Limit;

mod actuation;
mod bmc_entries;
mod corroborate;
mod ha;
mod levels;
mod outlet;
mod parsing;
mod policy_and_guards;

fn write_pw(dir: &Path) -> PathBuf {
    let p = dir.join("pw");
    std::fs::write(&p, "s3cret-value\n").unwrap();
    p
}

fn minimal(pw: &Path) -> String {
    format!(
        r#"
datacenter = "dc1"
[[bmc]]
nodes = ["rack1-*", "db-[0-9]"]
protocol = "redfish"
address = "https://{{node}}-bmc.dc1.example"
username = "fence"
password_file = "{}"
"#,
        pw.display()
    )
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("dc1.toml"))
}
