//! Opening a session: Get Channel Authentication Capabilities, Open Session, RAKP 1–4, Set
//! Session Privilege Level. Every answer is checked field by field, and every refusal has an
//! error of its own that names what the BMC said.

use std::net::SocketAddr;

use tokio::net::UdpSocket;

use super::wire::{Wire, handshake_answer, handshake_packet, io_trouble, suite_advice};
use super::{
    AUTH_NONE, Login, NAME_ONLY_LOOKUP, NETFN_APP, PT_OPEN_REQUEST, PT_OPEN_RESPONSE, PT_RAKP1,
    PT_RAKP2, PT_RAKP3, PT_RAKP4, RMCP_HEADER, Session, Take, Timing, Trouble, USER, random,
    request_message, response_of, role_name,
};
use crate::power::ReadErrorKind;
use crate::power::ipmi::rakp::{Exchange, Key, SessionKeys, Suite};

impl Session {
    /// Logs in to the BMC at `peer` and raises the session to the login's role.
    pub async fn open(
        peer: SocketAddr,
        login: &Login<'_>,
        timing: Timing,
    ) -> Result<Session, Trouble> {
        if login.username.len() > 16 {
            return Err(Trouble::new(
                ReadErrorKind::Config,
                "user names are at most 16 bytes in IPMI 2.0",
            ));
        }
        let local: SocketAddr = if peer.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let socket = UdpSocket::bind(local)
            .await
            .map_err(|e| io_trouble(&e, peer))?;
        socket
            .connect(peer)
            .await
            .map_err(|e| io_trouble(&e, peer))?;
        let mut wire = Wire {
            socket,
            peer,
            timing,
            stray: 0,
            resent: 0,
        };

        // 1. Does the BMC speak IPMI 2.0 at all? (IPMI 1.5, session-less.)
        let caps = {
            let msg = request_message(NETFN_APP, 0x38, 0, &[0x8e, login.privilege]);
            let mut p = RMCP_HEADER.to_vec();
            p.extend([AUTH_NONE, 0, 0, 0, 0, 0, 0, 0, 0, msg.len() as u8]);
            p.extend(msg);
            p
        };
        let offered = wire.exchange(
            "Get Channel Authentication Capabilities",
            &caps,
            |d| {
                if d.len() < 14 || d[..4] != RMCP_HEADER || d[4] != AUTH_NONE {
                    return Take::Drop(None);
                }
                let len = usize::from(d[13]);
                let Some(answer) = d.get(14..14 + len).and_then(|m| response_of(m, NETFN_APP, 0x38, 0)) else {
                    return Take::Drop(None);
                };
                if answer.completion != 0 || answer.data.len() < 4 {
                    return Take::Fail(Trouble::new(
                        ReadErrorKind::Protocol,
                        format!(
                            "Get Channel Authentication Capabilities refused (completion code {:#04x})",
                            answer.completion
                        ),
                    ));
                }
                Take::Answer(answer.data[1] & 0x80 != 0 && answer.data[3] & 0x02 != 0)
            },
        )
        .await?;
        if !offered {
            return Err(Trouble::new(
                ReadErrorKind::Protocol,
                "the BMC does not offer IPMI 2.0 (RMCP+) on this channel; IPMI 1.5 is refused \
                 (it sends the password in clear or as MD5): enable IPMI 2.0 on the BMC",
            ));
        }

        // 2. Open Session: our session ID and the suite's algorithms.
        let console_id = loop {
            let id = u32::from_le_bytes(random::<4>()?);
            if id != 0 {
                break id;
            }
        };
        let (auth, integrity, conf) = login.suite.algorithms();
        let tag = random::<1>()?[0];
        let mut open = vec![tag, login.privilege, 0, 0];
        open.extend(console_id.to_le_bytes());
        for (kind, alg) in [(0u8, auth), (1, integrity), (2, conf)] {
            open.extend([kind, 0, 0, 8, alg, 0, 0, 0]);
        }
        let bmc_id = wire
            .exchange(
                "Open Session",
                &handshake_packet(PT_OPEN_REQUEST, &open),
                |d| {
                    let p = match handshake_answer(
                        d,
                        PT_OPEN_RESPONSE,
                        tag,
                        console_id,
                        "Open Session Response",
                        login,
                    ) {
                        None => return Take::Drop(None),
                        Some(Err(t)) => return Take::Fail(t),
                        Some(Ok(p)) => p,
                    };
                    if p.len() < 36 {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            format!("Open Session Response of {} bytes (36 expected)", p.len()),
                        ));
                    }
                    let chosen = (p[16], p[24], p[32]);
                    if chosen != (auth, integrity, conf) {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            format!(
                                "the BMC chose algorithms {chosen:?}, not cipher suite {}'s {:?}",
                                login.suite.id(),
                                (auth, integrity, conf)
                            ),
                        ));
                    }
                    let bmc_id = u32::from_le_bytes([p[8], p[9], p[10], p[11]]);
                    if bmc_id == 0 {
                        return Take::Fail(Trouble::new(
                            ReadErrorKind::Protocol,
                            "Open Session Response names session ID 0",
                        ));
                    }
                    Take::Answer(bmc_id)
                },
            )
            .await?;

        // 3. RAKP 1 and 2: the BMC proves it knows the password.
        let console_random = random::<16>()?;
        let role = login.privilege | NAME_ONLY_LOOKUP;
        let tag = random::<1>()?[0];
        let mut rakp1 = vec![tag, 0, 0, 0];
        rakp1.extend(bmc_id.to_le_bytes());
        rakp1.extend(console_random);
        rakp1.extend([role, 0, 0, login.username.len() as u8]);
        rakp1.extend_from_slice(login.username);
        let hash_len = login.suite.hash_len();
        let rakp2 = wire
            .exchange("RAKP message 1", &handshake_packet(PT_RAKP1, &rakp1), |d| {
                let p =
                    match handshake_answer(d, PT_RAKP2, tag, console_id, "RAKP message 2", login) {
                        None => return Take::Drop(None),
                        Some(Err(t)) => return Take::Fail(t),
                        Some(Ok(p)) => p,
                    };
                if p.len() != 40 + hash_len {
                    return Take::Fail(Trouble::new(
                        ReadErrorKind::Protocol,
                        format!(
                            "RAKP message 2 of {} bytes ({} expected)",
                            p.len(),
                            40 + hash_len
                        ),
                    ));
                }
                let rc: [u8; 16] = p[8..24].try_into().expect("16 bytes");
                let guid: [u8; 16] = p[24..40].try_into().expect("16 bytes");
                let ex = Exchange {
                    console_session: console_id,
                    bmc_session: bmc_id,
                    console_random,
                    bmc_random: rc,
                    bmc_guid: guid,
                    role,
                    username: login.username,
                };
                if !ex.rakp2_matches(login.suite, login.kuid, &p[40..]) {
                    return Take::Answer(None);
                }
                Take::Answer(Some((rc, guid)))
            })
            .await?;
        let Some((bmc_random, bmc_guid)) = rakp2 else {
            // Tell the BMC, as ipmitool does, so that it drops the half-open session now rather
            // than at its timeout: RAKP 3 with status "invalid integrity check value".
            let mut refusal = vec![random::<1>()?[0], 0x0f, 0, 0];
            refusal.extend(bmc_id.to_le_bytes());
            let _ = wire
                .socket
                .send(&handshake_packet(PT_RAKP3, &refusal))
                .await;
            return Err(Trouble::new(
                ReadErrorKind::Auth,
                "RAKP message 2: the BMC's key exchange code does not match the password \
                 (wrong password, or not the BMC answering)",
            ));
        };
        let ex = Exchange {
            console_session: console_id,
            bmc_session: bmc_id,
            console_random,
            bmc_random,
            bmc_guid,
            role,
            username: login.username,
        };

        // 4. RAKP 3 and 4: we prove it, the BMC proves it derived the same keys.
        let sik = ex.sik(login.suite, login.kuid);
        let tag = random::<1>()?[0];
        let mut rakp3 = vec![tag, 0, 0, 0];
        rakp3.extend(bmc_id.to_le_bytes());
        rakp3.extend(ex.rakp3_code(login.suite, login.kuid));
        let tag_len = login.suite.tag_len();
        wire.exchange("RAKP message 3", &handshake_packet(PT_RAKP3, &rakp3), |d| {
            let p = match handshake_answer(d, PT_RAKP4, tag, console_id, "RAKP message 4", login) {
                None => return Take::Drop(None),
                Some(Err(t)) => return Take::Fail(t),
                Some(Ok(p)) => p,
            };
            if p.len() != 8 + tag_len || !ex.rakp4_matches(login.suite, &sik, &p[8..]) {
                return Take::Fail(Trouble::new(
                    ReadErrorKind::Auth,
                    "RAKP message 4: the integrity check value does not match the session \
                         keys",
                ));
            }
            Take::Answer(())
        })
        .await?;

        let mut session = Session {
            wire,
            suite: login.suite,
            keys: SessionKeys::new(login.suite, &sik),
            console_id,
            bmc_id,
            out_seq: 0,
            last_in_seq: 0,
            rq_seq: 0,
            privilege: USER,
        };
        // 5. A session starts at User level; raise it when more was asked for.
        if login.privilege > USER {
            // The BMC holds the session from RAKP 4 on: whatever fails now closes it, or a few
            // failed reads fill the BMC's session slots until its own timeout.
            let a = match session.request(NETFN_APP, 0x3b, &[login.privilege]).await {
                Ok(a) => a,
                Err(t) => {
                    session.close_now();
                    return Err(t);
                }
            };
            if a.completion != 0 {
                session.close().await;
                return Err(Trouble::new(
                    ReadErrorKind::Auth,
                    format!(
                        "Set Session Privilege Level to {} refused (completion code {:#04x})",
                        role_name(login.privilege),
                        a.completion
                    ),
                ));
            }
            session.privilege = login.privilege;
        }
        Ok(session)
    }

    /// Logs in with the first of `suites` the BMC accepts: the next is tried only when the BMC
    /// refuses the suite itself (Open Session status, answered at once), never after a failed
    /// login. When it refuses them all, the error names each refusal and what to set.
    pub async fn open_first(
        peer: SocketAddr,
        suites: &[Suite],
        privilege: u8,
        username: &[u8],
        kuid: &Key,
        timing: Timing,
    ) -> Result<Session, Trouble> {
        let mut refused: Vec<String> = Vec::new();
        for suite in suites {
            let login = Login {
                suite: *suite,
                privilege,
                username,
                kuid,
            };
            match Session::open(peer, &login, timing).await {
                Ok(s) => return Ok(s),
                Err(t) if t.suite_refused => refused.push(t.detail),
                Err(mut t) => {
                    if !refused.is_empty() {
                        t.detail = format!("{} (after: {})", t.detail, refused.join("; "));
                    }
                    return Err(t);
                }
            }
        }
        Err(Trouble {
            suite_refused: true,
            ..Trouble::new(
                ReadErrorKind::Protocol,
                format!("{}: {}", refused.join("; "), suite_advice(suites)),
            )
        })
    }
}
