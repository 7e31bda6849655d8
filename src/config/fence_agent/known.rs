//! The fence agents oobfence has read, one row each: what the agent's "off" means (from its own
//! `get_power_status` in Debian's fence-agents 4.12 and fencing.py), how it reads a machine
//! suspended, saved or unknown to the device, and oobfence's verdict. Every fence-agent entry is
//! `identity = "unchecked"`, so the agent's word is all there is: only an agent whose Off means
//! the machine has no power and no saved state is a power source. One refused for a known
//! reason has no opt-in; one not listed here needs the operator's `unlisted_agent_off_means`.

/// oobfence's verdict on an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its Off means the machine has no power and no saved state.
    Accepted,
    /// Refused at load: why its Off proves no power-off, and what to use instead.
    Refused {
        why: &'static str,
        instead: &'static str,
    },
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct KnownAgent {
    /// The agent and the names it is also installed under (same code, same reading).
    pub names: &'static [&'static str],
    /// What its `status` answering off (exit 2) means.
    pub off_means: &'static str,
    /// How it reads a machine suspended, saved to disk, or unknown to the device.
    pub suspend_save_missing: &'static str,
    pub verdict: Verdict,
}

/// What to use instead of an agent whose Off is a fabric or storage cut, not power.
const READ_THE_POWER: &str = "read the machine's own power instead: protocol = \"redfish\" or \"ipmi\" on its BMC, or an agent oobfence accepts (fence_ipmilan, fence_redfish, a PDU outlet agent)";

/// The table. Kept in the order of the fence-agent table in docs/power-sources.md.
pub const KNOWN: &[KnownAgent] = &[
    KnownAgent {
        names: &[
            "fence_ipmilan",
            "fence_ipmilanplus",
            "fence_idrac",
            "fence_ilo3",
            "fence_ilo4",
            "fence_ilo5",
            "fence_imm",
        ],
        off_means: "ipmitool's chassis power status is off (IPMI Get Chassis Status)",
        suspend_save_missing: "reads no sleep state: a machine hibernated (ACPI S4) may read off, as the chassis has no main power (the native protocol = \"ipmi\" reader also asks Get ACPI Power State); a BMC that does not answer fails",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_redfish"],
        off_means: "the system's PowerState is \"Off\"; any other state reads on",
        suspend_save_missing: "Redfish has no hibernate state: a host in S4 reads Off, as with the native protocol = \"redfish\" reader; a system URI without a PowerState fails",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_kubevirt"],
        off_means: "the VirtualMachine exists and has no VirtualMachineInstance: KubeVirt has stopped it",
        suspend_save_missing: "a paused VMI is still phase Running (on); any other phase, and a VirtualMachine that does not exist, fail; KubeVirt has no save to disk",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_apc_snmp", "fence_tripplite_snmp"],
        off_means: "the PDU outlet's state OID is anything but the on value (APC rack PDU: state 1 on, 2 off; Tripplite: 2 on, 1 off). It proves the machine off only if that outlet is its only power feed; a machine with two power supplies is off only when every outlet feeding it reads off in the same level. A PDU whose sysObjectID it does not know, and an APC Master Switch on firmware 6, are read through the Master Switch's sPDUOutletCtl, where an outlet whose state the PDU cannot determine (4, outletUnknown) reads off, as would any value but 1; Tripplite's unknown (0) reads off. oobfence runs it verbose and counts its Off only when the PDU answered its table's off value",
        suspend_save_missing: "an outlet has no sleep state. It takes a plug of digits as the outlet's index unchecked: over SNMP v2c or v3 an outlet the PDU does not have answers noSuchInstance and reads off (v1: an error), and a name two outlets share reads the last of them; a device without the outlet table (another make, a switch at a wrong address with the same community) is listed with net-snmp's end-of-MIB line as an outlet. oobfence believes its Off only for a plug its list-status names once (by number, else by name), such lines left out. A PDU that does not answer, or a wrong v1/v2c community (dropped without a word), is a timeout; a wrong SNMPv3 key or user an auth error. No power draw: no second witness",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_eaton_snmp"],
        off_means: "the ePDU outlet's state is off (Managed ePDU: 0, Switched ePDU: 2); on is 1, and any other value (Managed: 2, cycling) fails. The machine is off only if that outlet is its only power feed, or every outlet feeding it reads off in the same level",
        suspend_save_missing: "an outlet has no sleep state; an outlet it cannot read, a PDU whose sysObjectID it does not know, and a name it does not find fail; a plug of digits is the outlet's number (its index plus one), found in its list-status before an Off counts. No power draw: no second witness",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_raritan"],
        off_means: "over telnet (the PDU's CLI, not SNMP), `show -d properties=powerState PLUG` answers powerState 2: the machine is off only if that outlet is its only power feed, or every outlet feeding it reads off in the same level",
        suspend_save_missing: "an outlet has no sleep state; an answer other than powerState 1 or 2 is never matched and fails at the shell timeout. No power draw: no second witness",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_gce"],
        off_means: "the instance is TERMINATED (stopped, its memory discarded)",
        suspend_save_missing: "SUSPENDED (memory saved) reads unknown and fails; an instance the project does not have fails",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_openstack"],
        off_means: "the Nova server is SHUTOFF",
        suspend_save_missing: "SUSPENDED, PAUSED and SHELVED read unknown and fail; a server Nova does not find fails",
        verdict: Verdict::Accepted,
    },
    KnownAgent {
        names: &["fence_vmware_rest"],
        off_means: "the VM's power_state is POWERED_OFF or SUSPENDED",
        suspend_save_missing: "SUSPENDED reads off; its status takes the first VM of a name filter, so two VMs with one name give one's state to the other",
        verdict: Verdict::Refused {
            why: "its off includes SUSPENDED (a suspended VM resumes with its memory and writes to volumes now attached elsewhere), and a VM name shared by two VMs reads the first one's state",
            instead: "oobfence has no reader for vCenter yet: fence these VMs another way",
        },
    },
    KnownAgent {
        names: &["fence_vmware_soap"],
        off_means: "the VM is anything but poweredOn",
        suspend_save_missing: "suspended reads off; a name shared by two VMs reads one of them",
        verdict: Verdict::Refused {
            why: "every state but poweredOn reads off, suspended included (a suspended VM resumes with its memory)",
            instead: "oobfence has no reader for vCenter yet: fence these VMs another way",
        },
    },
    KnownAgent {
        names: &["fence_virsh"],
        off_means: "the domain is in any state but running, blocked, idle, no state or paused",
        suspend_save_missing: "pmsuspended and a managed save (\"shut off\" with its memory saved, libvirt-guests' default on a host shutdown) read off; it takes missing_as_off",
        verdict: Verdict::Refused {
            why: "its off includes pmsuspended and a managed save, both of which resume with the VM's memory",
            instead: "put sushy-tools or VirtualBMC in front of libvirt and use protocol = \"redfish\" or \"ipmi\", with libvirt-guests ON_SHUTDOWN=shutdown",
        },
    },
    KnownAgent {
        names: &["fence_vbox"],
        off_means: "the VM is not among VirtualBox's running VMs",
        suspend_save_missing: "a saved state reads off; it takes missing_as_off",
        verdict: Verdict::Refused {
            why: "its off includes a VM in a saved state, which resumes with its memory",
            instead: "fence these VMs another way",
        },
    },
    KnownAgent {
        names: &["fence_aws"],
        off_means: "the EC2 instance is stopped",
        suspend_save_missing: "a hibernated instance is stopped with its memory saved to its root volume, and reads off",
        verdict: Verdict::Refused {
            why: "its off includes a hibernated instance, which resumes with its memory",
            instead: "use protocol = \"ec2\" with an [aws] section: its reader tells hibernation apart",
        },
    },
    KnownAgent {
        names: &["fence_azure_arm"],
        off_means: "the VM is stopped or deallocated, or with network_fencing its network is cut",
        suspend_save_missing: "a hibernated VM is deallocated with its memory saved, and reads off",
        verdict: Verdict::Refused {
            why: "its off includes a hibernated VM (deallocated, memory saved), and with network_fencing a network cut rather than power",
            instead: "fence these VMs another way",
        },
    },
    KnownAgent {
        names: &["fence_pve"],
        off_means: "the Proxmox VE guest is stopped",
        suspend_save_missing: "a VM hibernated (qm suspend --todisk) is stopped with its memory saved, and reads off",
        verdict: Verdict::Refused {
            why: "its off includes a VM hibernated to disk, which resumes with its memory",
            instead: "fence these VMs another way",
        },
    },
    KnownAgent {
        names: &["fence_zvmip"],
        off_means: "the z/VM image is not active",
        suspend_save_missing: "missing_as_off is on by default, and its status reads an image z/VM does not know as off whatever the option says",
        verdict: Verdict::Refused {
            why: "it reads an image z/VM does not know as off (missing_as_off is on by default and its source ignores turning it off)",
            instead: "fence these guests another way",
        },
    },
    KnownAgent {
        names: &["fence_scsi", "fence_mpath"],
        off_means: "this node's SCSI persistent reservation key is not registered on the devices",
        suspend_save_missing: "says nothing of power: a running machine whose key is removed reads off",
        verdict: Verdict::Refused {
            why: "its off means a storage reservation is absent, not that the machine has no power",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &["fence_sbd"],
        off_means: "the node's SBD slot holds a reset or off message",
        suspend_save_missing: "says nothing of power: it reads the message, not the machine",
        verdict: Verdict::Refused {
            why: "its off means a poison-pill message was written, not that the machine has no power",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &[
            "fence_ifmib",
            "fence_brocade",
            "fence_cisco_mds",
            "fence_sanbox2",
        ],
        off_means: "a network or fabric switch port is down or disabled",
        suspend_save_missing: "says nothing of power: a running machine behind a disabled port reads off",
        verdict: Verdict::Refused {
            why: "its off means a switch port is down, a network or fabric cut, not that the machine has no power",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &["fence_kdump"],
        off_means: "the node's kdump kernel sent its message",
        suspend_save_missing: "says nothing of power",
        verdict: Verdict::Refused {
            why: "its off means a crash-dump message arrived, not that the machine has no power",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &["fence_heuristics_ping"],
        off_means: "nothing: it is a ping heuristic that succeeds or fails",
        suspend_save_missing: "says nothing of power",
        verdict: Verdict::Refused {
            why: "it answers a ping heuristic, not a power state",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &["fence_compute", "fence_evacuate"],
        off_means: "Nova's compute service on the host is disabled or forced down",
        suspend_save_missing: "says nothing of power",
        verdict: Verdict::Refused {
            why: "its off means a Nova service state, not that the machine has no power",
            instead: READ_THE_POWER,
        },
    },
    KnownAgent {
        names: &["fence_ack_manual", "fence_dummy"],
        off_means: "a person's acknowledgement, or a test file",
        suspend_save_missing: "says nothing of power",
        verdict: Verdict::Refused {
            why: "it reads no machine at all",
            instead: READ_THE_POWER,
        },
    },
];

/// What the table says of an agent known by `names` (its file name and the name its metadata
/// gives): refused if any of them is, accepted if every one is, else not listed.
pub fn lookup(names: &[&str]) -> Lookup {
    let rows: Vec<Option<&'static KnownAgent>> = names
        .iter()
        .map(|n| KNOWN.iter().find(|k| k.names.contains(n)))
        .collect();
    if let Some((name, row)) = names.iter().zip(&rows).find_map(|(n, r)| {
        r.filter(|r| r.verdict != Verdict::Accepted)
            .map(|r| (*n, r))
    }) {
        return Lookup::Refused(name.to_string(), row);
    }
    match rows.first() {
        Some(Some(row)) if rows.iter().all(Option::is_some) => Lookup::Accepted(row),
        _ => Lookup::Unlisted,
    }
}

/// The SNMP PDU agents. Each takes a plug of digits as the outlet's index without looking it up
/// (over SNMP v2c or v3 the PDU answers a GET of an outlet it does not have with noSuchInstance,
/// which these agents' APC and Tripplite tables read as off) and a name as the last outlet that
/// bears it. oobfence finds the plug in the agent's own outlet list (`list-status`), once,
/// before it believes an Off.
pub const OUTLET_AGENTS: [&str; 3] = ["fence_apc_snmp", "fence_tripplite_snmp", "fence_eaton_snmp"];

/// Whether the agent called `names` (its file name, the name its metadata gives) is one of
/// [`OUTLET_AGENTS`].
pub fn reads_outlets(names: &[&str]) -> bool {
    names.iter().any(|n| OUTLET_AGENTS.contains(n))
}

/// The table's answer for one agent.
#[derive(Debug)]
pub enum Lookup {
    Accepted(&'static KnownAgent),
    /// The name the table refuses, and its row.
    Refused(String, &'static KnownAgent),
    Unlisted,
}

/// The agents accepted as power sources, for messages.
pub fn accepted_names() -> Vec<&'static str> {
    KNOWN
        .iter()
        .filter(|k| k.verdict == Verdict::Accepted)
        .flat_map(|k| k.names.iter().copied())
        .collect()
}

/// `check-config`'s warning for an entry whose agent the table does not list, taken on the
/// operator's word (`unlisted_agent_off_means`).
pub fn vouched_warning(agent: &str) -> String {
    format!(
        "{agent} is not an agent oobfence has read: its Off fences on your word alone that it means no power and no saved state (a suspended, saved, hibernated or unknown machine must never read off); why and the reads say so"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_is_one_row_and_every_refusal_says_why_and_what_instead() {
        let mut seen = std::collections::BTreeSet::new();
        for row in KNOWN {
            for name in row.names {
                assert!(seen.insert(*name), "{name} is in two rows");
                assert!(name.starts_with("fence_"), "{name}");
            }
            if let Verdict::Refused { why, instead } = row.verdict {
                assert!(!why.is_empty() && !instead.is_empty(), "{:?}", row.names);
            }
        }
    }

    #[test]
    fn a_refused_name_wins_and_an_unknown_one_is_unlisted() {
        assert!(matches!(lookup(&["fence_idrac"]), Lookup::Accepted(_)));
        assert!(matches!(
            lookup(&["fence_idrac", "fence_ipmilan"]),
            Lookup::Accepted(_)
        ));
        // A copy of fence_vmware_rest under an accepted file name is still refused.
        assert!(matches!(
            lookup(&["fence_ipmilan", "fence_vmware_rest"]),
            Lookup::Refused(n, _) if n == "fence_vmware_rest"
        ));
        assert!(matches!(lookup(&["fence_mine"]), Lookup::Unlisted));
        assert!(matches!(
            lookup(&["fence_ipmilan", "fence_mine"]),
            Lookup::Unlisted
        ));
    }

    #[test]
    fn the_power_sources_page_names_every_agent_of_the_table() {
        let page = include_str!("../../../docs/power-sources.md");
        for name in KNOWN.iter().flat_map(|k| k.names) {
            assert!(
                page.contains(name),
                "docs/power-sources.md does not name {name}"
            );
        }
    }
}
