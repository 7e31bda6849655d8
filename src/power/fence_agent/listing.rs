//! What an agent's `list-status` prints: one `plug,alias,status` line per plug (fencing.py's
//! format, `,` its default separator), read into each plug's state.

use std::collections::BTreeMap;

use super::process::last_lines;

/// A plug's state as an agent's list gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listed {
    On,
    Off,
    Unknown,
    /// Named on two lines or more: which machine is the plug's is unknown.
    Twice,
}

/// Parses `list-status` output: one `plug,alias,status` line per plug (fencing.py's format, `,`
/// its default separator). Lines that are not such a line (a notice, `N/A`) are skipped; output
/// with no such line at all is an error: the agent cannot list. A plug named twice is
/// [`Listed::Twice`], whatever each line says.
pub fn parse_list_status(text: &str) -> Result<BTreeMap<String, Listed>, String> {
    let mut plugs = BTreeMap::new();
    for (plug, _alias, listed) in list_lines(text) {
        plugs
            .entry(plug.to_string())
            .and_modify(|seen| *seen = Listed::Twice)
            .or_insert(listed);
    }
    if plugs.is_empty() {
        return Err(format!(
            "the list-status output has no plug,alias,status line: {}",
            last_lines(text)
        ));
    }
    Ok(plugs)
}

/// The `plug,alias,status` lines of `list-status` output, trimmed; other lines skipped.
pub(super) fn list_lines(text: &str) -> impl Iterator<Item = (&str, &str, Listed)> {
    text.lines().filter_map(|line| {
        let (front, status) = line.trim().rsplit_once(',')?;
        let (plug, alias) = front.split_once(',')?;
        let listed = match status.trim().to_ascii_lowercase().as_str() {
            "on" => Listed::On,
            "off" => Listed::Off,
            "unknown" => Listed::Unknown,
            _ => return None,
        };
        Some((plug.trim(), alias.trim(), listed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_status_lines_are_plug_alias_and_state() {
        let out = "NOTICE: something\nvm-1,db one,ON\nvm-2,,off\n7,Outlet 7,UNKNOWN\nN/A\n";
        let plugs = parse_list_status(out).unwrap();
        assert_eq!(plugs.get("vm-1"), Some(&Listed::On));
        assert_eq!(plugs.get("vm-2"), Some(&Listed::Off));
        assert_eq!(plugs.get("7"), Some(&Listed::Unknown));
        assert_eq!(plugs.len(), 3);
        // An alias with a comma in it keeps plug and state apart.
        let plugs = parse_list_status("vm-3,web, front,on\n").unwrap();
        assert_eq!(plugs.get("vm-3"), Some(&Listed::On));
    }

    #[test]
    fn output_without_a_list_is_an_error_and_a_plug_named_twice_is_neither_state() {
        let e = parse_list_status("N/A\n").unwrap_err();
        assert!(e.contains("no plug,alias,status line"), "{e}");
        let plugs = parse_list_status("vm-1,,on\nvm-2,,on\nvm-1,,off\nvm-1,,on\n").unwrap();
        assert_eq!(plugs.get("vm-1"), Some(&Listed::Twice));
        assert_eq!(plugs.get("vm-2"), Some(&Listed::On));
    }
}
