//! IPMI power actions: Chassis Control (NetFn Chassis 00h, command 02h) power down (00h) or
//! power up (01h), IPMI 2.0 section 28.3. It needs the Operator privilege: an entry that logs
//! in as User is refused before anything is sent. The action takes the BMC's session slot,
//! logs in afresh at the entry's privilege, reads the chassis and the System GUID in that same
//! session, hands the reply to the caller's check, and only then sends the command.

use std::sync::Arc;

use tokio::time::Instant;

use super::rakp::Key;
use super::read::{failed, read_in, scrub, scrub_reply, succeeded, timing};
use super::session::{Session, Trouble};
use super::{Shared, completion_name};
use crate::config::ipmi::Privilege;
use crate::power::{ActionCheck, ActionOutcome, PowerAction, PowerState, ReadErrorKind};

/// NetFn Chassis, command Chassis Control.
const CHASSIS: u8 = 0x00;
const CHASSIS_CONTROL: u8 = 0x02;

/// Chassis Control's request byte for `action`.
pub fn chassis_control(action: PowerAction) -> u8 {
    match action {
        PowerAction::Off => 0x00,
        PowerAction::On => 0x01,
    }
}

/// Why an entry cannot send Chassis Control, if it cannot.
pub fn privilege_refusal(privilege: Privilege) -> Option<String> {
    (privilege == Privilege::User).then(|| {
        "Chassis Control needs the Operator privilege and the entry logs in as user: set \
         privilege = \"operator\" (an Operator account is enough)"
            .to_string()
    })
}

pub(super) async fn act_task(
    shared: Arc<Shared>,
    action: PowerAction,
    check: ActionCheck<'_>,
) -> ActionOutcome {
    if let Some(why) = privilege_refusal(shared.privilege) {
        return ActionOutcome::Refused { why };
    }
    let fail = |t: Trouble| ActionOutcome::Failed {
        error: scrub(&shared.password, failed(t).state),
    };
    // The read, the command and the logins: twice a read's time.
    let deadline = Instant::now() + shared.timeout * 2;
    let lock = shared.slot.clone().lock_owned();
    let mut slot = match tokio::time::timeout_at(deadline, lock).await {
        Ok(g) => g,
        Err(_) => {
            return fail(Trouble::new(
                ReadErrorKind::Timeout,
                "a read of this BMC still holds its session (one IPMI session per BMC at a time)",
            ));
        }
    };
    // A kept session is closed: the action logs in anew, at the entry's own privilege.
    if let Some(mut kept) = slot.session.take()
        && let Some(s) = kept.session.take()
    {
        s.close().await;
    }
    let bmc = match super::read::resolve_bmc(&shared, deadline).await {
        Ok(a) => a,
        Err(t) => return fail(t),
    };
    let Some(kuid) = Key::new(shared.password.expose().as_bytes()) else {
        return ActionOutcome::Refused {
            why: "the password is longer than IPMI 2.0's 20 bytes".into(),
        };
    };
    let mut session = match Session::open_first(
        bmc,
        &shared.suites,
        shared.privilege.level(),
        shared.username.as_bytes(),
        &kuid,
        timing(&shared, deadline),
    )
    .await
    {
        Ok(s) => s,
        Err(t) => return fail(t),
    };
    let outcome = act_in(&mut session, &shared, action, check, deadline).await;
    session.close().await;
    outcome
}

async fn act_in(
    session: &mut Session,
    shared: &Shared,
    action: PowerAction,
    check: ActionCheck<'_>,
    deadline: Instant,
) -> ActionOutcome {
    let reply = match read_in(session, shared, deadline).await {
        (Ok(answer), _) => scrub_reply(&shared.password, succeeded(shared, answer)),
        (Err(t), _) => {
            return ActionOutcome::Failed {
                error: scrub(&shared.password, PowerState::error(t.kind, t.detail)),
            };
        }
    };
    if let Err(why) = check(&reply).await {
        return ActionOutcome::Refused { why };
    }
    let code = chassis_control(action);
    match session.request(CHASSIS, CHASSIS_CONTROL, &[code]).await {
        Ok(a) if a.completion == 0 => ActionOutcome::Sent {
            answer: format!("Chassis Control {code:#04x} ({action}): completion code 0x00"),
        },
        // D4h: insufficient privilege for the command.
        Ok(a) if a.completion == 0xD4 => ActionOutcome::Refused {
            why: format!(
                "the BMC refused Chassis Control with completion code 0xd4 (insufficient privilege): the account needs the Operator privilege, and logged in as {}",
                shared.privilege.as_str()
            ),
        },
        Ok(a) => ActionOutcome::Failed {
            error: PowerState::error(
                ReadErrorKind::Protocol,
                format!(
                    "Chassis Control refused with completion code {:#04x}{}",
                    a.completion,
                    completion_name(a.completion)
                ),
            ),
        },
        Err(t) => ActionOutcome::Failed {
            error: scrub(&shared.password, PowerState::error(t.kind, t.detail)),
        },
    }
}
