//! The IPMI commands oobfence sends, defined through ipmi-rs's public `IpmiCommand` trait (the
//! crate has no chassis or session-management commands of its own).

use std::fmt;

use ipmi_rs::connection::{IpmiCommand, Message, NetFn};

/// Get Chassis Status: NetFn Chassis (00h), command 01h, no request data.
pub struct GetChassisStatus;

impl From<GetChassisStatus> for Message {
    fn from(_: GetChassisStatus) -> Message {
        Message::new_request(NetFn::Chassis, 0x01, Vec::new())
    }
}

impl IpmiCommand for GetChassisStatus {
    type Output = ChassisStatus;
    type Error = WrongLength;

    fn parse_success_response(data: &[u8]) -> Result<ChassisStatus, WrongLength> {
        ChassisStatus::parse(data)
    }
}

/// Close Session: NetFn App (06h), command 3Ch, data = the BMC's (managed system) session ID.
pub struct CloseSession {
    pub bmc_session_id: u32,
}

impl From<CloseSession> for Message {
    fn from(c: CloseSession) -> Message {
        Message::new_request(NetFn::App, 0x3C, c.bmc_session_id.to_le_bytes().to_vec())
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
    fn request_encodings() {
        let m: Message = GetChassisStatus.into();
        assert_eq!((m.netfn_raw(), m.cmd(), m.data()), (0x00, 0x01, &[][..]));
        let m: Message = CloseSession {
            bmc_session_id: 0x0A0B0C0D,
        }
        .into();
        assert_eq!(
            (m.netfn_raw(), m.cmd(), m.data()),
            (0x06, 0x3C, &[0x0D, 0x0C, 0x0B, 0x0A][..])
        );
    }
}
