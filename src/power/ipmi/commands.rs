//! What oobfence reads out of the BMC's answers: Get Chassis Status (NetFn Chassis 00h,
//! command 01h), Get System GUID (NetFn App 06h, command 37h; the machine's identity, see
//! [`crate::identity::uuid_forms_of_ipmi_guid`]), Get ACPI Power State (NetFn App 06h, command
//! 07h; a sleeping machine's chassis may read off) and DCMI Get Power Reading (NetFn Group
//! Extension 2Ch, command 02h, group DCh; the second witness for Off). The requests themselves
//! are sent by [`super::session`]. The ACPI and DCMI parsers live in [`acpi`].

use std::fmt;

pub mod acpi;

/// What a BMC answered to Get System GUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuidReply {
    /// The 16 GUID bytes, in the order they were sent.
    Guid([u8; 16]),
    /// A completion code other than 00h (C1h, "invalid command": the BMC does not have it).
    Refused(u8),
    /// Completion code 00h, but not the 16 data bytes the specification defines.
    WrongLength(usize),
}

impl GuidReply {
    /// From the completion code and the data after it.
    pub fn parse(completion_code: u8, data: &[u8]) -> GuidReply {
        if completion_code != 0 {
            return GuidReply::Refused(completion_code);
        }
        match <[u8; 16]>::try_from(data) {
            Ok(guid) => GuidReply::Guid(guid),
            Err(_) => GuidReply::WrongLength(data.len()),
        }
    }
}

/// The reply data of Get Chassis Status (after the completion code), IPMI 2.0 section 28.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChassisStatus {
    /// Byte 1, "current power state".
    pub power: u8,
    /// Byte 2, "last power event".
    pub last_event: u8,
    /// Byte 3, "misc. chassis state".
    pub misc: u8,
    /// Byte 4, front panel button capabilities (optional in the specification).
    pub front_panel: Option<u8>,
}

/// A Get Chassis Status reply whose data does not have the 3 or 4 bytes the specification
/// defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrongLength {
    pub len: usize,
}

impl fmt::Display for WrongLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Get Chassis Status reply has {} data bytes; 3 or 4 expected",
            self.len
        )
    }
}

/// Byte 1 bits 1 to 4: what the chassis says is wrong with its power.
const POWER_FAULTS: [(u8, &str); 4] = [
    (0x02, "power overload"),
    (0x04, "interlock active"),
    (0x08, "main power fault"),
    (0x10, "power control fault"),
];

/// Byte 2 bits 0 to 4: what caused the last power change.
const LAST_EVENTS: [(u8, &str); 5] = [
    (0x01, "AC failed"),
    (0x02, "power down by overload"),
    (0x04, "power down by interlock"),
    (0x08, "power down by power fault"),
    (0x10, "power on by IPMI command"),
];

impl ChassisStatus {
    pub fn parse(data: &[u8]) -> Result<ChassisStatus, WrongLength> {
        match *data {
            [power, last_event, misc] => Ok(ChassisStatus {
                power,
                last_event,
                misc,
                front_panel: None,
            }),
            [power, last_event, misc, front] => Ok(ChassisStatus {
                power,
                last_event,
                misc,
                front_panel: Some(front),
            }),
            _ => Err(WrongLength { len: data.len() }),
        }
    }

    /// Byte 1 bit 0: system power is on.
    pub fn is_on(&self) -> bool {
        self.power & 0x01 != 0
    }

    /// Names of the power fault bits set in byte 1, in bit order.
    pub fn faults(&self) -> Vec<&'static str> {
        POWER_FAULTS
            .iter()
            .filter(|(bit, _)| self.power & bit != 0)
            .map(|&(_, name)| name)
            .collect()
    }

    /// Names of the causes set in byte 2, in bit order.
    pub fn last_events(&self) -> Vec<&'static str> {
        LAST_EVENTS
            .iter()
            .filter(|(bit, _)| self.last_event & bit != 0)
            .map(|&(_, name)| name)
            .collect()
    }

    /// The reply bytes as hex, for the record.
    pub fn hex(&self) -> String {
        let mut out = format!(
            "{:02x} {:02x} {:02x}",
            self.power, self.last_event, self.misc
        );
        if let Some(f) = self.front_panel {
            out.push_str(&format!(" {f:02x}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_bit_and_faults() {
        let on = ChassisStatus::parse(&[0x01, 0x10, 0x40]).unwrap();
        assert!(on.is_on());
        assert!(on.faults().is_empty());
        assert_eq!(on.last_events(), ["power on by IPMI command"]);
        assert_eq!(on.hex(), "01 10 40");

        // Off with a main power fault is still off; the fault is reported beside it.
        let off = ChassisStatus::parse(&[0x08 | 0x10 | 0x60, 0x01, 0x00, 0x00]).unwrap();
        assert!(!off.is_on());
        assert_eq!(off.faults(), ["main power fault", "power control fault"]);
        assert_eq!(off.last_events(), ["AC failed"]);
        assert_eq!(off.hex(), "78 01 00 00");
    }

    #[test]
    fn only_3_or_4_data_bytes_are_accepted() {
        for data in [&[][..], &[0x01], &[0x00, 0x00], &[0, 0, 0, 0, 0]] {
            assert_eq!(
                ChassisStatus::parse(data),
                Err(WrongLength { len: data.len() })
            );
        }
    }

    #[test]
    fn a_guid_is_16_bytes_after_completion_code_00() {
        let guid: Vec<u8> = (0x10..0x20).collect();
        assert_eq!(
            GuidReply::parse(0x00, &guid),
            GuidReply::Guid(guid.clone().try_into().unwrap())
        );
        assert_eq!(GuidReply::parse(0xC1, &[]), GuidReply::Refused(0xC1));
        // A refusal stays a refusal whatever data comes with it.
        assert_eq!(GuidReply::parse(0xD4, &guid), GuidReply::Refused(0xD4));
        assert_eq!(
            GuidReply::parse(0x00, &guid[..15]),
            GuidReply::WrongLength(15)
        );
        let mut long = guid.clone();
        long.push(0);
        assert_eq!(GuidReply::parse(0x00, &long), GuidReply::WrongLength(17));
        assert_eq!(GuidReply::parse(0x00, &[]), GuidReply::WrongLength(0));
    }
}
