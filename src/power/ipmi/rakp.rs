//! RMCP+ session keys and authentication codes (IPMI 2.0 §13.28–13.32) for the two cipher
//! suites oobfence speaks:
//!
//! | suite | authentication | integrity | confidentiality |
//! |---|---|---|---|
//! | 3 | RAKP-HMAC-SHA1 | HMAC-SHA1-96 | AES-CBC-128 |
//! | 17 | RAKP-HMAC-SHA256 | HMAC-SHA256-128 | AES-CBC-128 |
//!
//! Pure functions over bytes, no I/O: what each side of the RAKP exchange proves, the session
//! integrity key (SIK) and the two keys derived from it (K1 signs packets, the first 16 bytes of
//! K2 encrypt them), and the confidentiality framing. Every code received is checked in constant
//! time (`hmac`'s own verification); the primitives are RustCrypto's.
//!
//! As the specification writes them (and ipmitool computes them): `m` is the remote console
//! (oobfence), `c` the managed system (the BMC), and every multi-byte number is little-endian.

use aes::Aes128;
use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::Sha256;

/// The key of a user (Kuid) or of the BMC (Kg) as RAKP uses it: at most 20 bytes, zero-padded
/// to 20, whatever the suite's hash.
pub const KEY_LEN: usize = 20;
/// AES-CBC-128's block, and the initialization vector before every encrypted payload.
pub const BLOCK: usize = 16;

/// A cipher suite this module implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128.
    Three,
    /// RAKP-HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128.
    Seventeen,
}

impl Suite {
    /// The cipher suite ID of the IPMI specification's table 22-20.
    pub fn id(self) -> u8 {
        match self {
            Suite::Three => 3,
            Suite::Seventeen => 17,
        }
    }

    /// The authentication, integrity and confidentiality algorithm numbers that Open Session
    /// proposes for this suite (tables 13-17 to 13-19).
    pub fn algorithms(self) -> (u8, u8, u8) {
        match self {
            Suite::Three => (0x01, 0x01, 0x01),
            Suite::Seventeen => (0x03, 0x04, 0x01),
        }
    }

    /// Bytes of the RAKP 2 key exchange code and of the SIK, K1 and K2: the hash's length.
    pub fn hash_len(self) -> usize {
        match self {
            Suite::Three => 20,
            Suite::Seventeen => 32,
        }
    }

    /// Bytes of RAKP 4's integrity check value and of every packet's AuthCode (the truncated
    /// HMAC: SHA1-96, SHA256-128).
    pub fn tag_len(self) -> usize {
        match self {
            Suite::Three => 12,
            Suite::Seventeen => 16,
        }
    }

    /// HMAC of the concatenated `parts` under `key`, whole.
    fn mac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        match self {
            Suite::Three => keyed::<Hmac<Sha1>>(key, parts)
                .finalize()
                .into_bytes()
                .to_vec(),
            Suite::Seventeen => keyed::<Hmac<Sha256>>(key, parts)
                .finalize()
                .into_bytes()
                .to_vec(),
        }
    }

    /// Whether `tag` is the HMAC of `parts` under `key`, whole or truncated to its first
    /// `tag.len()` bytes (never fewer than the suite's tag), compared in constant time.
    fn verify(self, key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        if tag.len() < self.tag_len() {
            return false;
        }
        match self {
            Suite::Three => keyed::<Hmac<Sha1>>(key, parts)
                .verify_truncated_left(tag)
                .is_ok(),
            Suite::Seventeen => keyed::<Hmac<Sha256>>(key, parts)
                .verify_truncated_left(tag)
                .is_ok(),
        }
    }
}

fn keyed<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> M {
    // HMAC takes a key of any length: this cannot fail.
    let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    for p in parts {
        m.update(p);
    }
    m
}

/// A RAKP key (Kuid or Kg): the secret, zero-padded to [`KEY_LEN`]. Never printed.
#[derive(Clone)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// The key for `secret`, or `None` when it is longer than [`KEY_LEN`] bytes (IPMI 2.0
    /// passwords are at most 20).
    pub fn new(secret: &[u8]) -> Option<Key> {
        let mut k = [0u8; KEY_LEN];
        k.get_mut(..secret.len())?.copy_from_slice(secret);
        Some(Key(k))
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(redacted)")
    }
}

/// What both sides of one RAKP exchange know once RAKP 2 has arrived.
#[derive(Clone, Debug)]
pub struct Exchange<'a> {
    /// SIDm: the session ID the console chose (Open Session Request).
    pub console_session: u32,
    /// SIDc: the session ID the BMC chose (Open Session Response).
    pub bmc_session: u32,
    /// Rm: the console's random number (RAKP 1).
    pub console_random: [u8; 16],
    /// Rc: the BMC's random number (RAKP 2).
    pub bmc_random: [u8; 16],
    /// GUIDc: the BMC's GUID (RAKP 2), as it sent it.
    pub bmc_guid: [u8; 16],
    /// ROLEm: RAKP 1's whole role byte (the requested maximum privilege, with the name-only
    /// lookup bit 0x10 when set).
    pub role: u8,
    /// UNAMEm: the user name as RAKP 1 sent it (empty for the null user).
    pub username: &'a [u8],
}

impl Exchange<'_> {
    /// ULENGTHm and UNAMEm as the messages carry them.
    fn name(&self) -> Vec<u8> {
        // RAKP 1 carries at most 16 bytes of name: the caller checked, the length fits a byte.
        let mut v = vec![self.username.len() as u8];
        v.extend_from_slice(self.username);
        v
    }

    /// What RAKP 2's code signs: SIDm, SIDc, Rm, Rc, GUIDc, ROLEm, ULENGTHm, UNAMEm.
    fn rakp2_input(&self) -> Vec<u8> {
        [
            &self.console_session.to_le_bytes()[..],
            &self.bmc_session.to_le_bytes(),
            &self.console_random,
            &self.bmc_random,
            &self.bmc_guid,
            &[self.role],
            &self.name(),
        ]
        .concat()
    }

    /// RAKP 2's key exchange authentication code: what the BMC proves it knows Kuid with.
    pub fn rakp2_code(&self, suite: Suite, kuid: &Key) -> Vec<u8> {
        suite.mac(&kuid.0, &[&self.rakp2_input()])
    }

    /// Whether RAKP 2's code is the one Kuid gives: a BMC that does not know the password (or
    /// another user's) fails here, before the console proves anything.
    pub fn rakp2_matches(&self, suite: Suite, kuid: &Key, code: &[u8]) -> bool {
        code.len() == suite.hash_len() && suite.verify(&kuid.0, &[&self.rakp2_input()], code)
    }

    /// RAKP 3's key exchange authentication code (over Rc, SIDm, ROLEm, ULENGTHm, UNAMEm):
    /// what the console proves it knows Kuid with.
    pub fn rakp3_code(&self, suite: Suite, kuid: &Key) -> Vec<u8> {
        suite.mac(
            &kuid.0,
            &[
                &self.bmc_random,
                &self.console_session.to_le_bytes(),
                &[self.role],
                &self.name(),
            ],
        )
    }

    /// The session integrity key (over Rm, Rc, ROLEm, ULENGTHm, UNAMEm), under Kg when the BMC
    /// has one set, otherwise under Kuid.
    pub fn sik(&self, suite: Suite, kg_or_kuid: &Key) -> Vec<u8> {
        suite.mac(
            &kg_or_kuid.0,
            &[
                &self.console_random,
                &self.bmc_random,
                &[self.role],
                &self.name(),
            ],
        )
    }

    /// RAKP 4's integrity check value: over Rm, SIDc and GUIDc, under the SIK, truncated to
    /// the suite's tag. What the BMC proves it derived the same session keys with.
    pub fn rakp4_icv(&self, suite: Suite, sik: &[u8]) -> Vec<u8> {
        let mut icv = suite.mac(sik, &[&self.rakp4_input()]);
        icv.truncate(suite.tag_len());
        icv
    }

    /// Whether RAKP 4's integrity check value is right, in constant time.
    pub fn rakp4_matches(&self, suite: Suite, sik: &[u8], icv: &[u8]) -> bool {
        icv.len() == suite.tag_len() && suite.verify(sik, &[&self.rakp4_input()], icv)
    }

    fn rakp4_input(&self) -> Vec<u8> {
        [
            &self.console_random[..],
            &self.bmc_session.to_le_bytes(),
            &self.bmc_guid,
        ]
        .concat()
    }
}

/// The keys of an established session: K1 signs every packet, K2's first 16 bytes encrypt
/// every payload.
#[derive(Clone)]
pub struct SessionKeys {
    suite: Suite,
    k1: Vec<u8>,
    aes: [u8; BLOCK],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys(suite {}, redacted)", self.suite.id())
    }
}

/// K1 and K2 are HMACs of these 20-byte constants under the SIK (§13.32), whatever the hash.
const CONST_1: [u8; 20] = [0x01; 20];
const CONST_2: [u8; 20] = [0x02; 20];

/// Why an encrypted payload could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("encrypted payload of {0} bytes is not an IV and whole AES blocks")]
    Length(usize),
    #[error("encrypted payload's confidentiality pad is malformed")]
    Padding,
}

impl SessionKeys {
    pub fn new(suite: Suite, sik: &[u8]) -> SessionKeys {
        let k2 = suite.mac(sik, &[&CONST_2]);
        let mut aes = [0u8; BLOCK];
        aes.copy_from_slice(&k2[..BLOCK]);
        SessionKeys {
            suite,
            k1: suite.mac(sik, &[&CONST_1]),
            aes,
        }
    }

    /// The AuthCode of a packet whose bytes from the session header's AuthType/Format field to
    /// the Next Header byte are `signed`.
    pub fn auth_code(&self, signed: &[u8]) -> Vec<u8> {
        let mut code = self.suite.mac(&self.k1, &[signed]);
        code.truncate(self.suite.tag_len());
        code
    }

    /// Whether `code` is the AuthCode of `signed`, in constant time.
    pub fn auth_code_matches(&self, signed: &[u8], code: &[u8]) -> bool {
        code.len() == self.suite.tag_len() && self.suite.verify(&self.k1, &[signed], code)
    }

    /// `payload` encrypted for the wire: `iv`, then AES-CBC-128 of the payload followed by the
    /// confidentiality pad (1, 2, 3, ...) and its length, to whole blocks. `iv` must be fresh
    /// random bytes for every payload.
    pub fn seal(&self, iv: [u8; BLOCK], payload: &[u8]) -> Vec<u8> {
        let pad = (BLOCK - (payload.len() + 1) % BLOCK) % BLOCK;
        let mut out = Vec::with_capacity(BLOCK + payload.len() + pad + 1);
        out.extend_from_slice(&iv);
        out.extend_from_slice(payload);
        out.extend((1..=pad as u8).collect::<Vec<u8>>());
        out.push(pad as u8);
        let body = &mut out[BLOCK..];
        let len = body.len();
        cbc::Encryptor::<Aes128>::new(&self.aes.into(), &iv.into())
            .encrypt_padded_mut::<NoPadding>(body, len)
            .expect("the body is whole blocks");
        out
    }

    /// The payload inside `sealed` (IV, then whole AES blocks), its pad checked and removed.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < 2 * BLOCK || !sealed.len().is_multiple_of(BLOCK) {
            return Err(OpenError::Length(sealed.len()));
        }
        let (iv, body) = sealed.split_at(BLOCK);
        let mut buf = body.to_vec();
        let iv: [u8; BLOCK] = iv.try_into().expect("split at BLOCK");
        cbc::Decryptor::<Aes128>::new(&self.aes.into(), &iv.into())
            .decrypt_padded_mut::<NoPadding>(&mut buf)
            .map_err(|_| OpenError::Length(sealed.len()))?;
        let pad = usize::from(*buf.last().expect("at least one block"));
        if pad >= BLOCK || pad + 1 > buf.len() {
            return Err(OpenError::Padding);
        }
        let end = buf.len() - pad - 1;
        if !buf[end..end + pad]
            .iter()
            .enumerate()
            .all(|(i, b)| usize::from(*b) == i + 1)
        {
            return Err(OpenError::Padding);
        }
        buf.truncate(end);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests;
