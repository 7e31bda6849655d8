//! One instance as EC2 describes it: its power state (hibernation is Suspended, never Off), its
//! identity (private IPs and DNS names), and the evidence of the volumes it holds.

use aws_sdk_ec2::types::{Instance, InstanceLifecycleType, InstanceStateName};

use crate::identity::MachineIdentity;
use crate::power::{PowerState, ReadDetail, ReadErrorKind};

/// What EC2 said about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceRead {
    pub state: PowerState,
    /// Non-root EBS volumes attached to it (read only for instances that are down), or why
    /// they could not be listed.
    pub volumes: Result<Vec<VolumeInfo>, String>,
    /// Its private addresses ([`instance_identity`]); Unreported when it is absent from the
    /// answer.
    pub identity: MachineIdentity,
    /// Who answered ([`super::Ec2Reader::reader_id`] with the key the call was signed with).
    pub reader: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    pub volume_id: String,
    pub device: String,
    /// `attached`, `attaching`, `detaching`, `detached`, `busy`.
    pub attachment_state: String,
}

/// Maps an EC2 instance state name to a power state.
pub fn map_state(name: &InstanceStateName) -> PowerState {
    match name {
        InstanceStateName::Stopped => PowerState::Off,
        InstanceStateName::Terminated => PowerState::Terminated,
        InstanceStateName::Running => PowerState::On,
        InstanceStateName::Pending
        | InstanceStateName::Stopping
        | InstanceStateName::ShuttingDown => PowerState::Transitional {
            detail: name.as_str().to_string(),
        },
        other => PowerState::error(
            ReadErrorKind::BadReply,
            format!("unknown EC2 instance state {:?}", other.as_str()),
        ),
    }
}

/// The state reason EC2 gives an instance that a user (or the API) hibernated.
pub const HIBERNATE_REASON: &str = "Client.UserInitiatedHibernate";

/// Maps one DescribeInstances instance to a power state: [`map_state`] on its state name,
/// except that an instance stopping or stopped by hibernation is Suspended.
///
/// A hibernated instance is `stopped` like a powered-off one, but it resumes with its RAM, its
/// processes and the same bootID: a kubelet that comes back from it still runs the pods the
/// cluster has rescheduled elsewhere. The signals, from DescribeInstances alone:
/// - `StateReason.Code` `Client.UserInitiatedHibernate` (StopInstances with Hibernate=true, on
///   demand or Spot). It says hibernation was *initiated*: when the OS cannot hibernate, EC2
///   falls back to a plain stop, and the read may then be Suspended for a machine that is
///   really off, which only blocks a fence, never causes one.
/// - Any other state reason that mentions hibernation (none is documented besides the one
///   above; an undocumented one is not taken as a plain stop).
/// - A Spot instance launched with `HibernationOptions.Configured` and stopped by a Spot
///   interruption (`Server.SpotInstance…`): that combination is how a Spot request asks EC2
///   to hibernate on interruption, and the state reason does not say whether it did.
///
/// `HibernationOptions.Configured` alone only says the instance *can* hibernate: a plain
/// StopInstances on it is still Off.
pub fn instance_power_state(instance: &Instance) -> PowerState {
    let Some(name) = instance.state().and_then(|s| s.name()) else {
        return PowerState::error(
            ReadErrorKind::BadReply,
            "DescribeInstances answered without a state",
        );
    };
    if matches!(
        name,
        InstanceStateName::Stopped | InstanceStateName::Stopping
    ) && let Some(why) = hibernation(instance)
    {
        return PowerState::Suspended {
            detail: format!("{} {why}", name.as_str()),
        };
    }
    map_state(name)
}

/// Why a stopping or stopped instance counts as hibernated, if it does.
fn hibernation(instance: &Instance) -> Option<String> {
    let reason = instance.state_reason()?;
    let code = reason.code().unwrap_or_default();
    let message = reason.message().unwrap_or_default();
    let stated = || {
        if message.is_empty() || message.starts_with(code) {
            format!(
                "(state reason {})",
                if message.is_empty() { code } else { message }
            )
        } else {
            format!("(state reason {code}: {message})")
        }
    };
    let mentions = |s: &str| s.to_ascii_lowercase().contains("hibernat");
    if code == HIBERNATE_REASON || mentions(code) || mentions(message) {
        return Some(format!("by hibernation {}", stated()));
    }
    let spot = instance.instance_lifecycle() == Some(&InstanceLifecycleType::Spot);
    let configured = instance
        .hibernation_options()
        .and_then(|h| h.configured())
        .unwrap_or(false);
    if spot && configured && code.starts_with("Server.SpotInstance") {
        return Some(format!(
            "by a Spot interruption of an instance configured to hibernate {}",
            stated()
        ));
    }
    None
}

/// What an instance says it is: its id, and every private IPv4 and IPv6 address and private
/// DNS name of the instance and its network interfaces, without duplicates. A terminated
/// instance has lost its network interfaces and reports none; empty strings are dropped.
pub fn instance_identity(instance: &Instance) -> MachineIdentity {
    let Some(id) = instance.instance_id() else {
        return MachineIdentity::unreported("DescribeInstances answered without an instance id");
    };
    let mut ips: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    fn add(list: &mut Vec<String>, value: Option<&str>) {
        if let Some(v) = value.map(str::trim).filter(|v| !v.is_empty())
            && !list.iter().any(|have| have.eq_ignore_ascii_case(v))
        {
            list.push(v.to_string());
        }
    }
    add(&mut ips, instance.private_ip_address());
    add(&mut names, instance.private_dns_name());
    for nic in instance.network_interfaces() {
        add(&mut ips, nic.private_ip_address());
        add(&mut names, nic.private_dns_name());
        for a in nic.private_ip_addresses() {
            add(&mut ips, a.private_ip_address());
            add(&mut names, a.private_dns_name());
        }
        for a in nic.ipv6_addresses() {
            add(&mut ips, a.ipv6_address());
        }
    }
    MachineIdentity::Instance {
        id: id.to_string(),
        private_ips: ips,
        private_dns_names: names,
    }
}

/// The `volumes` evidence: `vol-… on /dev/sdf (attached), …`, `none` for no data volumes, or
/// `unknown (why)`.
pub fn volume_details(volumes: &Result<Vec<VolumeInfo>, String>) -> Vec<ReadDetail> {
    let volumes = match volumes {
        Ok(v) => v,
        Err(e) => return vec![ReadDetail::new("volumes", format!("unknown ({e})"))],
    };
    let value = if volumes.is_empty() {
        "none".to_string()
    } else {
        volumes
            .iter()
            .map(|v| format!("{} on {} ({})", v.volume_id, v.device, v.attachment_state))
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![ReadDetail::new("volumes", value)]
}

/// Volume ids back out of a read's `volumes` detail.
pub fn volume_ids(details: &[ReadDetail]) -> Vec<String> {
    details
        .iter()
        .filter(|d| d.name == "volumes")
        .flat_map(|d| d.value.split(", "))
        .filter_map(|v| v.split(' ').next())
        .filter(|v| v.starts_with("vol-"))
        .map(String::from)
        .collect()
}
