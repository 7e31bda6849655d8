//! Get ACPI Power State (IPMI 2.0 section 20.7, NetFn App 06h, command 07h) and DCMI Get Power
//! Reading (DCMI 1.5 section 6.6.1, NetFn Group Extension 2Ch, command 02h, group DCh).
//!
//! A machine asleep or hibernated (ACPI S1-S4) may read "off" in Get Chassis Status: S3 and
//! S4 cut main power. It resumes with its memory (S1-S3) or its memory image (S4), so with the
//! same bootID and the same processes, while its volumes may have been attached elsewhere.
//! Get ACPI Power State tells those states apart where the BMC tracks them.

use crate::decision::Watts;

/// The system power state byte of a Get ACPI Power State answer (bits 6:0, with the values
/// IPMI 2.0 section 20.6, Set ACPI Power State, defines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpiState(pub u8);

impl AcpiState {
    /// From the answer's completion code and data: `Ok` with the state, `Err` with what was
    /// wrong (a refusal's code, a short answer).
    pub fn parse(completion_code: u8, data: &[u8]) -> Result<AcpiState, AcpiTrouble> {
        if completion_code != 0 {
            return Err(AcpiTrouble::Refused(completion_code));
        }
        match data {
            // Byte 1 system power state, byte 2 device power state; bit 7 is reserved.
            [system, _device, ..] => Ok(AcpiState(system & 0x7f)),
            _ => Err(AcpiTrouble::WrongLength(data.len())),
        }
    }

    /// The specification's name for the state.
    pub fn name(self) -> &'static str {
        match self.0 {
            0x00 => "S0/G0 working",
            0x01 => "S1 sleeping, hardware context kept",
            0x02 => "S2 sleeping, processor context lost",
            0x03 => "S3 suspend to RAM",
            0x04 => "S4 suspend to disk",
            0x05 => "S5/G2 soft off",
            0x06 => "S4/S5 soft off, S4 and S5 not told apart",
            0x07 => "G3 mechanical off",
            0x08 => "sleeping in S1, S2 or S3",
            0x09 => "G1 sleeping, S1 to S4 not told apart",
            0x0a => "S5 entered by override",
            0x20 => "legacy on",
            0x21 => "legacy soft off",
            0x2a => "unknown",
            _ => "a value the specification does not define",
        }
    }

    /// Whether the machine may be asleep with its memory or its memory image kept: S1 to S4,
    /// and the states that do not tell S4 from S5 or S1-S4 from each other.
    pub fn memory_kept(self) -> bool {
        matches!(self.0, 0x01..=0x04 | 0x06 | 0x08 | 0x09)
    }
}

impl std::fmt::Display for AcpiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:02x}h)", self.name(), self.0)
    }
}

/// A Get ACPI Power State or Get Power Reading answer that says nothing usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiTrouble {
    /// A completion code other than 00h (C1h: the BMC does not implement the command).
    Refused(u8),
    /// Completion code 00h with fewer data bytes than the specification defines.
    WrongLength(usize),
}

/// DCMI's group extension identifier, the first data byte of every DCMI request and answer.
pub const DCMI_GROUP: u8 = 0xdc;

/// The request data of Get Power Reading: group DCh, mode 01h ("system power statistics"),
/// two reserved bytes.
pub const POWER_READING_REQUEST: [u8; 4] = [DCMI_GROUP, 0x01, 0x00, 0x00];

/// What a Get Power Reading answer says, when it says a current reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DcmiReading {
    /// The current power draw; the measurement is active.
    Current(Watts),
    /// The answer is well formed but its "power measurement active" bit is clear: its figures
    /// mean nothing.
    Inactive,
    /// The answer's first data byte is not the DCMI group (DCh).
    NotDcmi(u8),
}

/// From a Get Power Reading answer's completion code and data (DCMI 1.5 table 6-16): group
/// DCh, current, minimum, maximum and average power (2 bytes each, least significant first),
/// a timestamp and a period (4 bytes each), and the reading state (bit 6: measurement active).
pub fn power_reading(completion_code: u8, data: &[u8]) -> Result<DcmiReading, AcpiTrouble> {
    if completion_code != 0 {
        return Err(AcpiTrouble::Refused(completion_code));
    }
    if data.len() < 18 {
        return Err(AcpiTrouble::WrongLength(data.len()));
    }
    if data[0] != DCMI_GROUP {
        return Ok(DcmiReading::NotDcmi(data[0]));
    }
    if data[17] & 0x40 == 0 {
        return Ok(DcmiReading::Inactive);
    }
    let current = u16::from_le_bytes([data[1], data[2]]);
    Ok(DcmiReading::Current(Watts::whole(u32::from(current))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeping_states_keep_memory_and_off_states_do_not() {
        for s in [0x01, 0x02, 0x03, 0x04, 0x06, 0x08, 0x09] {
            assert!(AcpiState(s).memory_kept(), "{}", AcpiState(s));
        }
        for s in [0x00, 0x05, 0x07, 0x0a, 0x20, 0x21, 0x2a, 0x7f, 0x55] {
            assert!(!AcpiState(s).memory_kept(), "{}", AcpiState(s));
        }
        assert_eq!(AcpiState(0x04).to_string(), "S4 suspend to disk (04h)");
    }

    #[test]
    fn the_system_state_is_bits_6_to_0_of_byte_1() {
        assert_eq!(AcpiState::parse(0, &[0x84, 0x00]), Ok(AcpiState(0x04)));
        assert_eq!(AcpiState::parse(0, &[0x05, 0x03]), Ok(AcpiState(0x05)));
        assert_eq!(
            AcpiState::parse(0xc1, &[0x04, 0x00]),
            Err(AcpiTrouble::Refused(0xc1))
        );
        assert_eq!(
            AcpiState::parse(0, &[0x04]),
            Err(AcpiTrouble::WrongLength(1))
        );
    }

    #[test]
    fn a_power_reading_counts_only_when_active() {
        let mut data = vec![
            0xdc, 0xb4, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40,
        ];
        assert_eq!(
            power_reading(0, &data),
            Ok(DcmiReading::Current(Watts::whole(180)))
        );
        data[1..3].copy_from_slice(&0x0123u16.to_le_bytes());
        assert_eq!(
            power_reading(0, &data),
            Ok(DcmiReading::Current(Watts::whole(0x123)))
        );
        data[17] = 0x00;
        assert_eq!(power_reading(0, &data), Ok(DcmiReading::Inactive));
        data[17] = 0x40;
        data[0] = 0x00;
        assert_eq!(power_reading(0, &data), Ok(DcmiReading::NotDcmi(0x00)));
        assert_eq!(
            power_reading(0, &data[..17]),
            Err(AcpiTrouble::WrongLength(17))
        );
        assert_eq!(power_reading(0xc1, &[]), Err(AcpiTrouble::Refused(0xc1)));
    }
}
