//! AWS EC2 power source: DescribeInstances (and DescribeVolumes for evidence), batched.
//!
//! EC2's Describe* calls share one account-wide rate limit, so reads are never one call per
//! node: every node's read goes to one batching task that waits a moment for others, then asks
//! for all of them in one DescribeInstances per 200 ids (an `instance-id` filter, so an unknown
//! id is simply absent from the answer instead of failing the whole call). The SDK's adaptive
//! retry handles `RequestLimitExceeded`; every attempt and every throttle is counted.
//!
//! State mapping: `stopped` → Off, `terminated` → Terminated, absent → NotFound (the core wants
//! two of those), `running` → On, `pending`/`stopping`/`shutting-down` → transitional. A
//! hibernated instance (`stopping`/`stopped` by hibernation, see [`instance_power_state`]) is
//! Suspended, never Off: it resumes with its memory, processes and bootID. Any API error or
//! timeout → error read.
//!
//! Identity: every instance in the answer reports its private IPs and DNS names
//! ([`MachineIdentity::Instance`]), which the core compares with the Node's addresses.
//!
//! Region: one reader asks one region, and an instance of another region is simply absent from
//! its answers (NotFound, as if it were gone). So a providerID whose zone is not in the
//! configured region is refused before any read ([`zone_region_mismatch`],
//! [`Ec2Source::for_provider_id`]).
//!
//! Longer than 600 lines: the batcher, the state and identity mapping and the evidence of held
//! volumes are one protocol's answer to one question; its corner cases each get a named error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::{BoxError, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, Instance, InstanceLifecycleType, InstanceStateName, VolumeAttachmentState,
};
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use super::{PowerSource, PowerState, ReadDetail, ReadErrorKind, Reply};
use crate::config::AwsConfig;
use crate::identity::MachineIdentity;

/// Ids per Describe* call (filter values are capped at 200 per filter).
pub const CHUNK: usize = 200;
/// How long the batcher waits for more reads after the first one arrives, at most.
const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// The batch closes sooner when no read arrives for this long: the reads of one decision pass
/// come together, and a lone read (`oobfence probe`) should not wait the whole window.
const BATCH_GAP: Duration = Duration::from_millis(5);
/// Most ids taken into one batch.
const MAX_BATCH: usize = 1000;
/// Pages followed per call, as a bound (each page holds up to 1000 instances).
const MAX_PAGES: usize = 20;

/// Extracts the instance id from a node's `spec.providerID`: `aws:///us-east-1a/i-0abc…` or
/// `aws:///i-0abc…`.
pub fn instance_id_from_provider_id(provider_id: &str) -> Result<String, String> {
    let rest = provider_id.strip_prefix("aws://").ok_or_else(|| {
        format!("providerID {provider_id:?} is not an AWS one (expected aws:///ZONE/i-...)")
    })?;
    let id = rest.rsplit('/').next().unwrap_or_default();
    let hex = id.strip_prefix("i-").unwrap_or_default();
    // EC2 instance ids are i- and 8 hex digits (before 2016) or 17; nothing in between.
    if !matches!(hex.len(), 8 | 17) || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "providerID {provider_id:?} does not end in an instance id (i- followed by 8 or 17 hex digits)"
        ));
    }
    Ok(id.to_string())
}

/// The availability zone a providerID names: `Some("us-east-1a")` for `aws:///us-east-1a/i-…`
/// (or `aws://us-east-1a/i-…`), `None` for the zone-less forms `aws:///i-…` and `aws://i-…`.
/// Err for a providerID [`instance_id_from_provider_id`] refuses, or one with more path parts
/// than a zone and an instance id.
pub fn zone_from_provider_id(provider_id: &str) -> Result<Option<&str>, String> {
    instance_id_from_provider_id(provider_id)?;
    let rest = provider_id.strip_prefix("aws://").unwrap_or_default();
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        [_id] => Ok(None),
        [zone, _id] => Ok(Some(zone)),
        _ => Err(format!(
            "providerID {provider_id:?} has more parts than a zone and an instance id \
             (expected aws:///ZONE/i-...)"
        )),
    }
}

/// The region an availability zone name belongs to: `us-west-2a` → `us-west-2`; a Local Zone
/// (`us-west-2-lax-1a`) or a Wavelength Zone (`us-east-1-wl1-bos-wlz-1`) → its parent region
/// (`us-west-2`, `us-east-1`). `None` for anything that is not a zone name (a region, a zone id
/// such as `use1-az1`, an empty string).
pub fn region_of_zone(zone: &str) -> Option<&str> {
    // A region is two or more groups of letters and then a number (us-east-1, us-gov-west-1,
    // ap-southeast-3); a zone adds one letter to it, or a `-…` suffix for Local and Wavelength
    // Zones.
    let mut start = 0;
    let mut letter_groups = 0;
    for part in zone.split('-') {
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase()) {
            letter_groups += 1;
            start += part.len() + 1;
            continue;
        }
        let digits = part.bytes().take_while(u8::is_ascii_digit).count();
        if letter_groups < 2 || digits == 0 {
            return None;
        }
        let region = &zone[..start + digits];
        let letter = &part[digits..];
        let tail = &zone[start + part.len()..];
        let plain_zone =
            tail.is_empty() && letter.len() == 1 && letter.bytes().all(|b| b.is_ascii_lowercase());
        let local_zone = letter.is_empty()
            && tail.len() > 1
            && tail[1..].split('-').all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        return (plain_zone || local_zone).then_some(region);
    }
    None
}

/// Why a node with this providerID cannot be read through a reader of `region`; `None` only
/// when the providerID names an availability zone of `region`.
///
/// DescribeInstances answers for one region: an instance of another region is absent from the
/// answer, which reads as NotFound, and two of those would delete a Node whose instance runs.
/// A providerID without a zone, or with one that is not a zone name, cannot be checked, so it
/// gets a message too.
pub fn zone_region_mismatch(provider_id: &str, region: &str) -> Option<String> {
    let zone = match zone_from_provider_id(provider_id) {
        Ok(Some(zone)) => zone,
        Ok(None) => {
            return Some(format!(
                "providerID {provider_id:?} names no availability zone, so oobfence cannot \
                 check that the instance is in the [aws] region {region:?} (in another region \
                 it would look gone); only the aws:///ZONE/i-... form the AWS cloud provider \
                 sets can be fenced: leave this node out of [aws] nodes"
            ));
        }
        Err(e) => return Some(format!("{e}; its region cannot be checked")),
    };
    match region_of_zone(zone) {
        Some(r) if r == region => None,
        Some(r) => Some(format!(
            "providerID {provider_id:?} is in availability zone {zone} of region {r}, but the \
             [aws] region is {region:?}: DescribeInstances in {region} never lists the \
             instance, so it would look gone; run oobfence for region {r:?} for this node, \
             or leave it out of [aws] nodes"
        )),
        None => Some(format!(
            "providerID {provider_id:?} names {zone:?}, which is not an availability zone name \
             (REGION plus a letter, or a Local or Wavelength Zone REGION-...), so oobfence \
             cannot check that the instance is in the [aws] region {region:?}"
        )),
    }
}

/// Request and throttle counts. They are Prometheus counters so the daemon can register the
/// same ones it hands to the reader.
#[derive(Default, Debug, Clone)]
pub struct Ec2Stats {
    pub describe_instances_calls: Counter,
    pub describe_volumes_calls: Counter,
    /// HTTP attempts, retries included.
    pub attempts: Counter,
    /// Attempts answered with a throttling status (503 RequestLimitExceeded, 429).
    pub throttled: Counter,
}

#[derive(Debug)]
struct CountAttempts(Arc<Ec2Stats>);

impl Intercept for CountAttempts {
    fn name(&self) -> &'static str {
        "oobfence::CountAttempts"
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.attempts.inc();
        let status = context.response().status().as_u16();
        if status == 503 || status == 429 {
            self.0.throttled.inc();
        }
        Ok(())
    }
}

/// Records the access key id one call was signed with (the `Credential=` of its Authorization
/// header, as sent): the SDK re-reads a credentials file while it runs, so only the request
/// itself tells which credentials, and so which account, an answer came from.
#[derive(Debug, Clone, Default)]
struct SignedWith(Arc<std::sync::Mutex<Vec<Option<String>>>>);

impl SignedWith {
    /// The one key every attempt of the call was signed with; `None` when unsigned, unknown
    /// or not the same across attempts.
    fn key(&self) -> Option<String> {
        let keys = self.0.lock().map(|k| k.clone()).unwrap_or_default();
        let first = keys.first()?.clone()?;
        keys.iter()
            .all(|k| k.as_deref() == Some(first.as_str()))
            .then_some(first)
    }
}

impl Intercept for SignedWith {
    fn name(&self) -> &'static str {
        "oobfence::SignedWith"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let key = context
            .request()
            .headers()
            .get("authorization")
            .and_then(signing_key_id)
            .map(String::from);
        if let Ok(mut keys) = self.0.lock() {
            keys.push(key);
        }
        Ok(())
    }
}

/// The access key id in a SigV4 Authorization header
/// (`AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/ec2/aws4_request, ...`).
pub fn signing_key_id(authorization: &str) -> Option<&str> {
    let start = authorization.find("Credential=")? + "Credential=".len();
    authorization[start..]
        .split('/')
        .next()
        .filter(|k| !k.is_empty() && !k.contains([',', ' ']))
}

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
    /// Who answered ([`Ec2Reader::reader_id`] with the key the call was signed with).
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

/// One instance as DescribeInstances described it.
#[derive(Clone, Debug)]
struct Described {
    state: PowerState,
    root_device: Option<String>,
    identity: MachineIdentity,
}

struct ReadRequest {
    instance_id: String,
    reply: oneshot::Sender<Reply>,
}

/// One per daemon: the EC2 client and the batching task.
pub struct Ec2Reader {
    client: aws_sdk_ec2::Client,
    region: String,
    /// `[aws] endpoint_url`, if set.
    endpoint: Option<String>,
    timeout: Duration,
    requests: mpsc::Sender<ReadRequest>,
    pub stats: Arc<Ec2Stats>,
}

impl std::fmt::Debug for Ec2Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Reader")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl Ec2Reader {
    /// Builds the client from `[aws]` (explicit region; endpoint and profile when given;
    /// otherwise the standard credential chain) and starts the batching task.
    pub async fn new(cfg: &AwsConfig, stats: Ec2Stats) -> Arc<Ec2Reader> {
        let stats = Arc::new(stats);
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(cfg.region.clone()))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(cfg.timeout)
                    .connect_timeout(cfg.timeout.min(Duration::from_secs(5)))
                    .build(),
            );
        if let Some(url) = &cfg.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some(p) = &cfg.profile {
            loader = loader.profile_name(p);
        }
        let sdk = loader.load().await;
        let conf = aws_sdk_ec2::config::Builder::from(&sdk)
            .interceptor(CountAttempts(stats.clone()))
            .build();
        let client = aws_sdk_ec2::Client::from_conf(conf);
        let (tx, rx) = mpsc::channel(4096);
        let reader = Arc::new(Ec2Reader {
            client,
            region: cfg.region.clone(),
            endpoint: cfg.endpoint_url.clone(),
            timeout: cfg.timeout,
            requests: tx,
            stats,
        });
        tokio::spawn(batch_loop(Arc::downgrade(&reader), rx));
        reader
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Who answers through this reader, for a call signed with `key`: the region, the
    /// endpoint and the access key id (an identifier, not a secret: IAM lists it, and it finds
    /// the credentials in use). A "gone" answer only counts through the reader that once found
    /// the node's instance ([`crate::decision`]).
    pub fn reader_id(&self, key: Option<&str>) -> String {
        format!(
            "ec2 {} at {}, key {}",
            self.region,
            self.endpoint.as_deref().unwrap_or("the region's endpoint"),
            key.unwrap_or("unknown")
        )
    }

    /// Reads many instances: one DescribeInstances per [`CHUNK`] ids, then one DescribeVolumes
    /// per chunk of the instances that are down. Ids absent from the answer are NotFound.
    pub async fn read_many(
        &self,
        ids: &[String],
    ) -> HashMap<String, Result<InstanceRead, PowerState>> {
        let mut out = HashMap::new();
        for chunk in ids.chunks(CHUNK) {
            match self.describe_instances(chunk).await {
                Ok((mut found, key)) => {
                    let reader = self.reader_id(key.as_deref());
                    let down: Vec<String> = chunk
                        .iter()
                        .filter(|id| found.get(*id).is_none_or(|d| d.state.is_down()))
                        .cloned()
                        .collect();
                    let mut volumes = if down.is_empty() {
                        Ok(HashMap::new())
                    } else {
                        self.attached_volumes(&down).await
                    };
                    for id in chunk {
                        let Described {
                            state,
                            root_device,
                            identity,
                        } = found.remove(id).unwrap_or_else(|| Described {
                            state: PowerState::NotFound,
                            root_device: None,
                            identity: MachineIdentity::unreported(format!(
                                "{id} is absent from the DescribeInstances answer of {}",
                                self.region
                            )),
                        });
                        let vols = match &mut volumes {
                            Ok(v) => Ok(v
                                .remove(id)
                                .unwrap_or_default()
                                .into_iter()
                                .filter(|v| root_device.as_deref() != Some(v.device.as_str()))
                                .collect()),
                            Err(e) => Err(e.to_string()),
                        };
                        out.insert(
                            id.clone(),
                            Ok(InstanceRead {
                                state,
                                volumes: vols,
                                identity,
                                reader: reader.clone(),
                            }),
                        );
                    }
                }
                Err(e) => {
                    for id in chunk {
                        out.insert(id.clone(), Err(e.clone()));
                    }
                }
            }
        }
        out
    }

    /// instance id → what DescribeInstances said about it, and the access key id every page
    /// was signed with (`None` if unknown or not the same on every page).
    async fn describe_instances(
        &self,
        ids: &[String],
    ) -> Result<(HashMap<String, Described>, Option<String>), PowerState> {
        let mut found = HashMap::new();
        let mut token: Option<String> = None;
        let signed = SignedWith::default();
        for _ in 0..MAX_PAGES {
            self.stats.describe_instances_calls.inc();
            let call = self
                .client
                .describe_instances()
                .filters(
                    Filter::builder()
                        .name("instance-id")
                        .set_values(Some(ids.to_vec()))
                        .build(),
                )
                .max_results(1000)
                .set_next_token(token.take())
                .customize()
                .interceptor(signed.clone())
                .send();
            let out = bounded(self.timeout, call).await?;
            for r in out.reservations() {
                for i in r.instances() {
                    let Some(id) = i.instance_id() else { continue };
                    found.insert(
                        id.to_string(),
                        Described {
                            state: instance_power_state(i),
                            root_device: i.root_device_name().map(String::from),
                            identity: instance_identity(i),
                        },
                    );
                }
            }
            match out.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok((found, signed.key())),
            }
        }
        Err(PowerState::error(
            ReadErrorKind::BadReply,
            format!("DescribeInstances kept paging past {MAX_PAGES} pages"),
        ))
    }

    /// instance id → volumes attached to it.
    async fn attached_volumes(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<VolumeInfo>>, PowerState> {
        let mut by_instance: HashMap<String, Vec<VolumeInfo>> = HashMap::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            self.stats.describe_volumes_calls.inc();
            let call = self
                .client
                .describe_volumes()
                .filters(
                    Filter::builder()
                        .name("attachment.instance-id")
                        .set_values(Some(ids.to_vec()))
                        .build(),
                )
                .max_results(500)
                .set_next_token(token.take())
                .send();
            let out = bounded(self.timeout, call).await?;
            for v in out.volumes() {
                let Some(vid) = v.volume_id() else { continue };
                for a in v.attachments() {
                    let Some(iid) = a.instance_id() else { continue };
                    by_instance
                        .entry(iid.to_string())
                        .or_default()
                        .push(VolumeInfo {
                            volume_id: vid.to_string(),
                            device: a.device().unwrap_or_default().to_string(),
                            attachment_state: a
                                .state()
                                .map(VolumeAttachmentState::as_str)
                                .unwrap_or("unknown")
                                .to_string(),
                        });
                }
            }
            match out.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(by_instance),
            }
        }
        Err(PowerState::error(
            ReadErrorKind::BadReply,
            format!("DescribeVolumes kept paging past {MAX_PAGES} pages"),
        ))
    }

    /// Which of `volume_ids` are still attached to `instance_id` (for watching a fence's
    /// volumes until they are released).
    pub async fn still_attached(
        &self,
        instance_id: &str,
        volume_ids: &[String],
    ) -> Result<Vec<String>, PowerState> {
        let held = self.attached_volumes(&[instance_id.to_string()]).await?;
        Ok(held
            .get(instance_id)
            .map(|vs| {
                vs.iter()
                    .filter(|v| volume_ids.contains(&v.volume_id))
                    .map(|v| v.volume_id.clone())
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Queues one instance's read into the next batch.
    async fn read_one(&self, instance_id: &str) -> Reply {
        let (tx, rx) = oneshot::channel();
        let req = ReadRequest {
            instance_id: instance_id.to_string(),
            reply: tx,
        };
        if self.requests.send(req).await.is_err() {
            return Reply::without_identity(
                PowerState::error(ReadErrorKind::Config, "EC2 reader stopped"),
                "the read was never made",
            );
        }
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Reply::without_identity(
                PowerState::error(ReadErrorKind::Config, "EC2 batch dropped the read"),
                "the read was dropped",
            ),
            Err(_) => Reply::without_identity(
                PowerState::error(
                    ReadErrorKind::Timeout,
                    format!("no EC2 answer within {:?}", self.timeout),
                ),
                "EC2 did not answer",
            ),
        }
    }
}

async fn bounded<T, E>(
    limit: Duration,
    call: impl Future<Output = Result<T, SdkError<E>>>,
) -> Result<T, PowerState>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(limit + Duration::from_millis(500), call).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(sdk_error(&e)),
        Err(_) => Err(PowerState::error(
            ReadErrorKind::Timeout,
            format!("EC2 did not answer within {limit:?}"),
        )),
    }
}

fn sdk_error<E>(e: &SdkError<E>) -> PowerState
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match e {
        SdkError::TimeoutError(_) => {
            PowerState::error(ReadErrorKind::Timeout, "EC2 call timed out")
        }
        SdkError::DispatchFailure(d) => {
            let kind = if d.is_timeout() {
                ReadErrorKind::Timeout
            } else {
                ReadErrorKind::Unreachable
            };
            PowerState::error(kind, format!("cannot reach EC2: {}", chain(e)))
        }
        SdkError::ServiceError(s) => {
            let err = s.err();
            let code = err.code().unwrap_or("unknown");
            let kind = match code {
                "AuthFailure"
                | "UnauthorizedOperation"
                | "InvalidClientTokenId"
                | "SignatureDoesNotMatch"
                | "ExpiredToken" => ReadErrorKind::Auth,
                _ => ReadErrorKind::Protocol,
            };
            let msg = err.message().unwrap_or_default();
            PowerState::error(
                kind,
                format!("EC2 {code} (HTTP {}): {msg}", s.raw().status().as_u16()),
            )
        }
        SdkError::ResponseError(_) => PowerState::error(
            ReadErrorKind::BadReply,
            format!("EC2 reply unreadable: {}", chain(e)),
        ),
        _ => {
            let text = chain(e);
            let kind = if text.contains("credential") {
                ReadErrorKind::Auth
            } else {
                ReadErrorKind::Config
            };
            PowerState::error(kind, format!("EC2 call failed: {text}"))
        }
    }
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// Collects reads after the first arrives, until none comes for [`BATCH_GAP`] or for
/// [`BATCH_WINDOW`] in all, then answers them all from one [`Ec2Reader::read_many`].
async fn batch_loop(reader: std::sync::Weak<Ec2Reader>, mut rx: mpsc::Receiver<ReadRequest>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let window_end = tokio::time::Instant::now() + BATCH_WINDOW;
        while batch.len() < MAX_BATCH {
            let deadline = window_end.min(tokio::time::Instant::now() + BATCH_GAP);
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                _ => break,
            }
        }
        let Some(reader) = reader.upgrade() else {
            return;
        };
        let mut ids: Vec<String> = batch.iter().map(|r| r.instance_id.clone()).collect();
        ids.sort();
        ids.dedup();
        let results = reader.read_many(&ids).await;
        for req in batch {
            let reply = match results.get(&req.instance_id) {
                Some(Ok(read)) => Reply {
                    state: read.state.clone(),
                    details: volume_details(&read.volumes),
                    identity: read.identity.clone(),
                    reader: Some(read.reader.clone()),
                    power_draw: None,
                },
                Some(Err(e)) => {
                    Reply::without_identity(e.clone(), "the DescribeInstances call failed")
                }
                None => Reply::without_identity(
                    PowerState::error(ReadErrorKind::Config, "instance missing from its batch"),
                    "the read was not in its batch",
                ),
            };
            let _ = req.reply.send(reply);
        }
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

/// One node's view of EC2.
pub struct Ec2Source {
    reader: Arc<Ec2Reader>,
    instance_id: String,
}

impl Ec2Source {
    /// A source for an instance id, without the region check: prefer
    /// [`Ec2Source::for_provider_id`].
    pub fn new(reader: Arc<Ec2Reader>, instance_id: String) -> Ec2Source {
        Ec2Source {
            reader,
            instance_id,
        }
    }

    /// The source for a Node's `spec.providerID`, read in the reader's region. Err (to be
    /// reported as a Config error read, never as NotFound) when the providerID is not an AWS
    /// instance one, or when its zone is not in the reader's region or cannot be checked
    /// ([`zone_region_mismatch`]): such an instance would be absent from every answer and
    /// look gone.
    pub fn for_provider_id(reader: Arc<Ec2Reader>, provider_id: &str) -> Result<Ec2Source, String> {
        let instance_id = instance_id_from_provider_id(provider_id)?;
        if let Some(problem) = zone_region_mismatch(provider_id, reader.region()) {
            return Err(problem);
        }
        Ok(Ec2Source::new(reader, instance_id))
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    pub fn reader(&self) -> &Arc<Ec2Reader> {
        &self.reader
    }
}

impl PowerSource for Ec2Source {
    fn backend(&self) -> &'static str {
        "ec2"
    }

    fn address(&self) -> String {
        format!("{}/{}", self.reader.region, self.instance_id)
    }

    fn reader_id(&self) -> String {
        self.reader.reader_id(None)
    }

    fn read(&self) -> BoxFuture<'_, PowerState> {
        Box::pin(async move { self.read_reply().await.state })
    }

    fn read_reply(&self) -> BoxFuture<'_, Reply> {
        Box::pin(self.reader.read_one(&self.instance_id))
    }

    fn batches_reads(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
