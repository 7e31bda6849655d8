//! The plug of an SNMP PDU agent (`fence_apc_snmp`, `fence_tripplite_snmp`,
//! `fence_eaton_snmp`), found in the agent's own outlet list: each takes a plug of digits as
//! the outlet's index without looking it up, and over SNMP v2c or v3 the PDU answers a GET of
//! an outlet it does not have with noSuchInstance, which `fence_apc_snmp` reads as off; a name
//! is taken as the last outlet that bears it. So an Off counts only for a plug the list names
//! once: a plug of digits (or `switch:outlet`) as an outlet's number, anything else as its name.

use super::listing::{Listed, list_lines};
use super::process::Agent;
use crate::power::{PowerState, ReadErrorKind};

/// The state `list_status` (the agent's `list-status` output) gives the outlet `plug`; why
/// not, when the list does not name it exactly once.
pub(super) fn find_outlet(list_status: &str, plug: &str) -> Result<Listed, String> {
    let by_number = is_outlet_number(plug);
    let matches: Vec<Listed> = list_lines(list_status)
        .filter(|(_, name, _)| !is_snmp_exception(name))
        .filter(|(number, name, _)| if by_number { *number } else { *name } == plug)
        .map(|(_, _, listed)| listed)
        .collect();
    let what = if by_number { "number" } else { "name" };
    match matches.as_slice() {
        [listed] => Ok(*listed),
        [] => Err(format!(
            "lists no outlet whose {what} is {plug:?}: the PDU does not have it (an outlet it does not have can read off)"
        )),
        _ => Err(format!(
            "lists {} outlets whose {what} is {plug:?}: which of them feeds this node is unknown (name each outlet once, or give its number)",
            matches.len()
        )),
    }
}

/// net-snmp's words for an SNMP exception where a value should be (`-Oq` output). The agents
/// keep every line of a walk that starts with an OID, so a device without the outlet table
/// answers their walk with one of these, listed as an outlet named so.
const SNMP_EXCEPTIONS: [&str; 3] = [
    "No Such Object available",
    "No Such Instance currently exists",
    "No more variables left",
];

fn is_snmp_exception(name: &str) -> bool {
    SNMP_EXCEPTIONS.iter().any(|e| name.starts_with(e))
}

/// The outlet state OIDs the SNMP PDU agents read (their `status_oid`s, the index after the
/// prefix), the PDU each belongs to, and its off value. `fence_apc_snmp` reads every value but
/// on as off, which on the Master Switch table (an unknown sysObjectID, a Master Switch on
/// firmware 6) includes outletUnknown (4), and on Tripplite's unknown (0).
const STATE_TABLES: [(&str, &str, i64); 7] = [
    (".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.", "APC rack PDU", 2),
    (".1.3.6.1.4.1.318.1.1.4.4.2.1.3.", "APC Master Switch", 2),
    (".1.3.6.1.4.1.318.1.1.6.7.1.1.5.", "APC Master Switch+", 2),
    (".1.3.6.1.4.1.850.10.2.3.5.1.2.1.", "Tripplite PDU", 1),
    (
        ".1.3.6.1.4.1.850.1.1.3.2.3.3.1.1.4.1.",
        "Tripplite LX PDU",
        1,
    ),
    (".1.3.6.1.4.1.534.6.6.6.1.2.2.1.3.", "Eaton Managed ePDU", 0),
    (".1.3.6.1.4.1.20677.2.6.3.", "Eaton Switched ePDU", 2),
];

/// Whether the agent's verbose log (`stderr` of a `status` run) shows the last outlet state it
/// read to be its table's off value; why not, else.
pub(super) fn off_as_read(stderr: &str) -> Result<(), String> {
    let read = stderr.lines().rev().find_map(|line| {
        let answer = line.split_once("DEBUG: ")?.1.trim();
        let (oid, value) = answer.split_once(' ')?;
        let (_, pdu, off) = STATE_TABLES.iter().find(|(p, ..)| oid.starts_with(p))?;
        Some((oid, value.trim(), *pdu, *off))
    });
    match read {
        Some((_, value, _, off)) if value.parse() == Ok(off) => Ok(()),
        Some((oid, value, pdu, off)) => Err(format!(
            "the PDU answered {value} at {oid}, not {pdu}'s off ({off}): a state the agent reads as off that is not off (unknown, a pending command)"
        )),
        None => Err(
            "its verbose log shows no outlet state it read (a PDU or an agent version oobfence does not know)"
                .into(),
        ),
    }
}

/// A plug the agents take as an outlet's index: digits, or `switch:outlet` digits.
fn is_outlet_number(plug: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match plug.split_once(':') {
        Some((switch, outlet)) => digits(switch) && digits(outlet),
        None => digits(plug),
    }
}

/// An Off from `status` of `plug`, kept only when the agent's `list-status` names the outlet
/// once; else the error that says why.
pub(super) async fn confirm_off(agent: &Agent, plug: &str) -> PowerState {
    match agent.run("list-status", None).await {
        Err((kind, detail)) => PowerState::error(
            kind,
            format!("{detail} (its outlet list, asked to confirm an Off)"),
        ),
        Ok(run) if run.code == Some(0) => match find_outlet(&run.stdout, plug) {
            Ok(_) => PowerState::Off,
            Err(why) => PowerState::error(
                ReadErrorKind::BadReply,
                format!(
                    "{} read plug {plug:?} off, but its list-status {why}",
                    agent.name
                ),
            ),
        },
        Ok(run) => {
            let (kind, detail) = agent.failure("list-status", &run).await;
            PowerState::error(kind, format!("{detail} (asked to confirm an Off)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_off_counts_only_as_the_off_value_of_the_table_read() {
        let log = |oid_value: &str| {
            format!(
                "2026-11-28 01:02:05,885 DEBUG: /usr/bin/snmpwalk -m '' -Oeqn -v '2C' -c '<community>' '127.0.0.1:161' '.1.3.6.1.2.1.1.2.0'\n\n\
                 2026-11-28 01:02:06,005 DEBUG: .1.3.6.1.2.1.1.2.0 .1.3.6.1.4.1.318.1.3.4.6\n\
                 2026-11-28 01:02:06,126 DEBUG: {oid_value}\n\n"
            )
        };
        assert_eq!(
            off_as_read(&log(".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1 2")),
            Ok(())
        );
        assert_eq!(
            off_as_read(&log(".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.7 2")),
            Ok(())
        );
        assert_eq!(
            off_as_read(&log(".1.3.6.1.4.1.850.10.2.3.5.1.2.1.3 1")),
            Ok(())
        );
        let e = off_as_read(&log(".1.3.6.1.4.1.318.1.1.4.4.2.1.3.1 4")).unwrap_err();
        assert!(
            e.contains("answered 4") && e.contains("Master Switch's off (2)"),
            "{e}"
        );
        let e = off_as_read(&log(".1.3.6.1.4.1.850.10.2.3.5.1.2.1.3 0")).unwrap_err();
        assert!(e.contains("answered 0"), "{e}");
        let e = off_as_read(&log(
            ".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4.9 No Such Instance currently exists at this OID",
        ))
        .unwrap_err();
        assert!(e.contains("No Such Instance"), "{e}");
        assert!(
            off_as_read("Status: OFF\n")
                .unwrap_err()
                .contains("no outlet state")
        );
    }

    #[test]
    fn a_plug_is_an_outlet_number_or_a_name_listed_once() {
        let list = "1,db-1,UNKNOWN\n2,dual,UNKNOWN\n3,dual,UNKNOWN\n4,5,OFF\n";
        assert_eq!(find_outlet(list, "1"), Ok(Listed::Unknown));
        assert_eq!(find_outlet(list, "db-1"), Ok(Listed::Unknown));
        // Digits are a number, never the name of another outlet.
        assert_eq!(find_outlet(list, "4"), Ok(Listed::Off));
        assert!(
            find_outlet(list, "5")
                .unwrap_err()
                .contains("number is \"5\"")
        );
        assert!(find_outlet(list, "7").unwrap_err().contains("no outlet"));
        assert!(
            find_outlet(list, "dual")
                .unwrap_err()
                .contains("lists 2 outlets")
        );
        assert!(find_outlet("1:3,web,ON\n", "1:3").is_ok());
        assert!(find_outlet("", "1").is_err());
        // A device without the outlet table: the agent lists net-snmp's end-of-MIB line.
        let none = "4,No more variables left in this MIB View (It is past the end of the MIB tree),UNKNOWN\n";
        assert!(find_outlet(none, "4").unwrap_err().contains("no outlet"));
    }
}
