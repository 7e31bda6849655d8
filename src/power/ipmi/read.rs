//! One read: a session taken from the slot or opened, Get Chassis Status and Get System GUID
//! (then, for an off chassis, the off checks), and every answer and failure translated into a
//! reply — with the password scrubbed from anything the BMC echoed.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::commands::{ChassisStatus, GuidReply};
use super::rakp::Key;
use super::session::{self, Session, Timing, Trouble};
use super::slots::{Kept, arm_closer};
use super::{MIN_IDLE_EVIDENCE, RESENDS, Shared, completion_name, off_checks};
use crate::identity::{MachineIdentity, uuid_forms_of_ipmi_guid};
use crate::power::{PowerState, ReadDetail, ReadErrorKind, Reply};
use crate::secret::Secret;

/// What one exchange with the BMC learnt: the chassis status, what the machine says it is, and
/// how the session ran ("cipher suite 17, User").
pub(super) struct Answer {
    pub(super) status: ChassisStatus,
    pub(super) identity: MachineIdentity,
    pub(super) session: String,
    /// When the chassis reads off: its ACPI state and power draw.
    pub(super) off: Option<off_checks::OffChecks>,
}

/// How often an unanswered datagram is sent again: a fifth of the timeout, 0.2 s to 1 s.
fn resend_interval(timeout: Duration) -> Duration {
    (timeout / 5).clamp(Duration::from_millis(200), Duration::from_secs(1))
}

pub(super) fn timing(shared: &Shared, deadline: Instant) -> Timing {
    Timing {
        resend_every: resend_interval(shared.timeout),
        resends: RESENDS,
        deadline,
    }
}

pub(super) async fn read_task(shared: Arc<Shared>) -> Reply {
    let deadline = Instant::now() + shared.timeout;
    let lock = shared.slot.clone().lock_owned();
    let mut slot = match tokio::time::timeout_at(deadline, lock).await {
        Ok(g) => g,
        Err(_) => {
            return failed(Trouble::new(
                ReadErrorKind::Timeout,
                "an earlier read of this BMC still holds its session (one IPMI session per \
                 BMC at a time)",
            ));
        }
    };

    let mut kept_failure: Option<Trouble> = None;
    if let Some(mut kept) = slot.session.take() {
        let max_idle = slot.max_idle;
        if kept.reusable(shared.id, max_idle) {
            let idle = kept.last_used.elapsed();
            let now = Instant::now();
            // Half the time for the kept session; the rest for a new one if the BMC forgot it.
            let half = now + deadline.saturating_duration_since(now) / 2;
            let session = kept.session.as_mut().expect("reusable");
            match read_in(session, &shared, half).await {
                (Ok(answer), clean) => {
                    kept.reads += 1;
                    kept.last_used = Instant::now();
                    if clean {
                        slot.session = Some(kept);
                        arm_closer(&shared.slot, &mut slot);
                    }
                    return succeeded(&shared, answer);
                }
                (Err(t), _) => {
                    tracing::debug!(
                        node = %shared.node,
                        idle_ms = idle.as_millis() as u64,
                        error = %t.detail,
                        "kept IPMI session failed; opening a new one"
                    );
                    if t.kind == ReadErrorKind::Timeout && idle >= MIN_IDLE_EVIDENCE {
                        // The BMC forgot a session idle this long: keep them idle less.
                        slot.max_idle = (idle * 3 / 4).max(MIN_IDLE_EVIDENCE).min(max_idle);
                    }
                    kept_failure = Some(t);
                }
            }
        }
        // Anything else taken from the slot is dropped here, and closed.
    }

    let bmc = match resolve_bmc(&shared, deadline).await {
        Ok(a) => a,
        Err(t) => return failed(t),
    };
    let with_kept_failure = |mut t: Trouble| {
        if let Some(first) = &kept_failure {
            t.detail = format!(
                "{} (the kept session failed first: {})",
                t.detail, first.detail
            );
        }
        failed(t)
    };
    let Some(kuid) = Key::new(shared.password.expose().as_bytes()) else {
        return failed(Trouble::new(
            ReadErrorKind::Config,
            "the password is longer than IPMI 2.0's 20 bytes",
        ));
    };
    let opened = Session::open_first(
        bmc,
        &shared.suites,
        shared.privilege.level(),
        shared.username.as_bytes(),
        &kuid,
        timing(&shared, deadline),
    )
    .await;
    let mut session = match opened {
        Ok(s) => s,
        Err(t) => return with_kept_failure(t),
    };
    let now = Instant::now();
    match read_in(&mut session, &shared, deadline).await {
        (Ok(answer), clean) => {
            let mut kept = Kept {
                owner: shared.id,
                session: Some(session),
                opened: now,
                last_used: Instant::now(),
                reads: 1,
            };
            if clean {
                slot.session = Some(kept);
                arm_closer(&shared.slot, &mut slot);
            } else if let Some(s) = kept.session.take() {
                // Something odd on the wire: close it now and start clean next time.
                s.close().await;
            }
            succeeded(&shared, answer)
        }
        (Err(t), _) => {
            session.close().await;
            with_kept_failure(t)
        }
    }
}

/// Reads the chassis status, then the System GUID, through `session` until `deadline`. The
/// answer, and whether the session is clean enough to keep: nothing odd on the wire (a stray
/// answer, a resend, an unanswered GUID question).
pub(super) async fn read_in(
    session: &mut Session,
    shared: &Shared,
    deadline: Instant,
) -> (Result<Answer, Trouble>, bool) {
    let before = session.stray_and_resent();
    session.set_timing(timing(shared, deadline));
    let status = match session.chassis_status().await {
        Err(t) => return (Err(t), false),
        Ok(a) if a.completion != 0 => {
            return (
                Err(Trouble::new(
                    ReadErrorKind::Protocol,
                    format!(
                        "Get Chassis Status refused with completion code {:#04x}{}",
                        a.completion,
                        completion_name(a.completion)
                    ),
                )),
                false,
            );
        }
        Ok(a) => match ChassisStatus::parse(&a.data) {
            Ok(s) => s,
            Err(e) => {
                return (
                    Err(Trouble::new(ReadErrorKind::BadReply, e.to_string())),
                    false,
                );
            }
        },
    };
    // The power state is read; whatever becomes of the GUID question leaves it as read.
    let (identity, answered) = if Instant::now() >= deadline {
        (
            MachineIdentity::unreported(
                "no time was left within the read's deadline to ask for the System GUID",
            ),
            true,
        )
    } else {
        match session.system_guid().await {
            Ok(a) => (guid_identity(GuidReply::parse(a.completion, &a.data)), true),
            Err(t) => (
                MachineIdentity::unreported(format!("Get System GUID failed: {}", t.detail)),
                false,
            ),
        }
    };
    let off = if status.is_on() {
        None
    } else {
        Some(off_checks::ask(session, deadline, shared.power_draw).await)
    };
    let answered = answered && off.as_ref().is_none_or(|o| o.answered);
    let clean = answered && session.stray_and_resent() == before;
    let how = format!(
        "cipher suite {}, {}",
        session.suite().id(),
        session::role_name(session.privilege())
    );
    (
        Ok(Answer {
            status,
            identity,
            session: how,
            off,
        }),
        clean,
    )
}

pub(super) fn succeeded(shared: &Shared, answer: Answer) -> Reply {
    let Answer {
        status,
        identity,
        session,
        off,
    } = answer;
    let faults = status.faults();
    let events = status.last_events();
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if !faults.is_empty() {
        tracing::warn!(
            node = %shared.node,
            power = if status.is_on() { "on" } else { "off" },
            faults = %faults.join(", "),
            "IPMI chassis status reports power faults"
        );
    }
    let mut details = vec![
        ReadDetail::new("chassis power faults", list(&faults)),
        ReadDetail::new("last power event", list(&events)),
        ReadDetail::new("chassis status bytes", status.hex()),
        ReadDetail::new("session", session),
    ];
    let (state, power_draw) = match off {
        _ if status.is_on() => (PowerState::On, None),
        None => (PowerState::Off, None),
        Some(checks) => {
            let (state, more) = off_checks::apply(&checks);
            details.extend(more);
            (state, checks.power_draw)
        }
    };
    Reply {
        state,
        details,
        identity,
        reader: None,
        power_draw,
    }
}

pub(super) fn failed(t: Trouble) -> Reply {
    Reply::without_identity(
        PowerState::error(t.kind, t.detail),
        "the power read failed, so the System GUID was not asked for",
    )
}

/// The machine's identity from a Get System GUID answer. BMCs disagree on the byte order, so
/// the identity holds every UUID the 16 bytes may stand for.
pub(super) fn guid_identity(reply: GuidReply) -> MachineIdentity {
    match reply {
        GuidReply::Guid(guid) => MachineIdentity::SystemUuid {
            forms: uuid_forms_of_ipmi_guid(&guid),
            serial: None,
        },
        GuidReply::Refused(code) => MachineIdentity::unreported(format!(
            "the BMC refused Get System GUID with completion code {code:#04x}{}",
            completion_name(code)
        )),
        GuidReply::WrongLength(n) => MachineIdentity::unreported(format!(
            "the Get System GUID reply has {n} data bytes; 16 expected"
        )),
    }
}

/// Last line of defence: no detail or identity string leaves this source with the password in
/// it. (The GUID forms are hexadecimal digits and hyphens formatted here, not BMC text.)
pub(super) fn scrub_reply(password: &Secret, reply: Reply) -> Reply {
    let identity = match reply.identity {
        MachineIdentity::Unreported { reason } => {
            let secret = password.expose();
            if !secret.is_empty() && reason.contains(secret) {
                MachineIdentity::unreported(reason.replace(secret, "<redacted>"))
            } else {
                MachineIdentity::Unreported { reason }
            }
        }
        other => other,
    };
    Reply {
        state: scrub(password, reply.state),
        details: reply.details,
        identity,
        reader: reply.reader,
        power_draw: reply.power_draw,
    }
}

/// The password out of a state's detail.
pub(super) fn scrub(password: &Secret, state: PowerState) -> PowerState {
    let secret = password.expose();
    match state {
        PowerState::Error { kind, detail } if !secret.is_empty() && detail.contains(secret) => {
            PowerState::Error {
                kind,
                detail: detail.replace(secret, "<redacted>"),
            }
        }
        other => other,
    }
}

/// The BMC's socket address, resolved within the read's deadline.
pub(super) async fn resolve_bmc(
    shared: &Shared,
    deadline: Instant,
) -> Result<std::net::SocketAddr, Trouble> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let lookup = tokio::net::lookup_host((shared.host.as_str(), shared.port));
    match tokio::time::timeout(remaining, lookup).await {
        Ok(Ok(mut addrs)) => addrs.next().ok_or_else(|| {
            Trouble::new(
                ReadErrorKind::Unreachable,
                format!("{} resolves to no address", shared.host),
            )
        }),
        Ok(Err(e)) => Err(Trouble::new(
            ReadErrorKind::Unreachable,
            format!("cannot resolve {}: {e}", shared.host),
        )),
        Err(_) => Err(Trouble::new(
            ReadErrorKind::Timeout,
            format!("resolving {} took longer than the deadline", shared.host),
        )),
    }
}
