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
//! This file holds the reader (the client, the batching task and its calls) and the source a
//! node reads through it; beside it, `provider_id` parses providerIDs and checks their region,
//! `instance` maps an instance to a power state, an identity and its volumes' evidence,
//! `interceptors` counts attempts and throttles and sees the signing key, and `errors` names
//! what a failed call says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, VolumeAttachmentState};
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::{PowerSource, PowerState, ReadErrorKind, Reply};
use crate::config::AwsConfig;
use crate::identity::MachineIdentity;

mod actions;
mod errors;
mod instance;
mod interceptors;
mod provider_id;
#[cfg(test)]
mod tests;

use errors::bounded;
pub use instance::{
    HIBERNATE_REASON, InstanceRead, VolumeInfo, instance_identity, instance_power_state, map_state,
    volume_details, volume_ids,
};
use interceptors::{CountAttempts, SignedWith};
pub use interceptors::{Ec2Stats, signing_key_id};
pub use provider_id::{
    instance_id_from_provider_id, region_of_zone, zone_from_provider_id, zone_region_mismatch,
};

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
        let at = format!(
            "ec2 {} at {}",
            self.region,
            self.endpoint.as_deref().unwrap_or("the region's endpoint")
        );
        match key {
            Some(key) => format!("{at}, key {key}"),
            // Matches no binding, not even one learnt through the same words.
            None => format!("{at}{}", crate::decision::reading::UNKNOWN_KEY),
        }
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

    fn act<'a>(
        &'a self,
        action: super::PowerAction,
        check: super::ActionCheck<'a>,
    ) -> BoxFuture<'a, super::ActionOutcome> {
        Box::pin(self.act_once(action, check))
    }

    fn action_support(&self) -> BoxFuture<'_, super::ActionSupport> {
        Box::pin(self.reader.dry_run_actions(&self.instance_id))
    }
}
