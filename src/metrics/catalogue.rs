//! The catalogue: every metric oobfence serves, registered with the HELP text the person on
//! call reads, and the series that exist from the start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::labels::*;
use super::{FloatGauge, GUARD_RECORD_REPAIRS, KnownGauge, Listed, Metrics};

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("oobfence");

        let node_state = Family::<NodeStateLabels, Gauge>::default();
        registry.register(
            "node_state",
            "Where each watched node that is not healthy stands: one series per such node, 1, labelled with its current state (healthy nodes are counted in oobfence_nodes only). suspect = NotReady within not_ready_grace, or Ready with a stale Lease and its power read ahead of NotReady; confirming = reading power to prove it off; blocked = NotReady but fencing refused (see oobfence_node_blocked); fenced = oobfence fenced it and it is still down; recovering = fenced and Ready again, waiting for the proof that lifts the fence",
            Listed(node_state.clone()),
        );
        let nodes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "nodes",
            "Watched nodes by state (healthy, suspect, confirming, blocked, fenced, recovering; see oobfence_node_state for each not-healthy node)",
            Listed(nodes.clone()),
        );
        for s in ALL_STATES {
            nodes
                .get_or_create(&StateLabels { state: s.as_str() })
                .set(0);
        }
        let actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "actions",
            "Writes oobfence made to the cluster, by action (taint = fenced with the out-of-service taint, delete_node = fenced by deleting the Node, untaint = fence lifted after recovery, clear_record = dropped its record after someone else removed the taint, delete_volumeattachment = one of a deleted Node's, release_pods = a fenced node's pods force-deleted with release_at_attestation, delete_pod = each of those pods) and result (success, failure, abandoned); a failed fence or unfence did not happen and is retried, a failed release leaves the pods to the pod garbage collector",
            Listed(actions.clone()),
        );
        let power_actions = Family::<PowerActionLabels, Counter>::default();
        registry.register(
            "power_actions",
            "Power actions oobfence sent to machines (opt-in actuation: [actuation] enabled and actuate = true on the source), by action (power_off = a hung node's machine cut, power_on = a fenced machine brought back), result (sent; refused = nothing sent, its source or its own read right before said no; failure = nothing known to have happened, retried; abandoned = the write-time re-check stopped it) and backend",
            Listed(power_actions.clone()),
        );
        let fences = Family::<FenceLabels, Counter>::default();
        registry.register(
            "fences",
            "Fences that landed, by action (taint, delete_node) and basis: attested = power proven off by a source that proves whose machine it read, unattested = by one that cannot (the config's mapping is all there is), person = no source could answer and a person confirmed the machine off (oobfence confirm-off, the oobfence.io/confirmed-off annotation; the journal and the Event name who and why)",
            Listed(fences.clone()),
        );
        for action in ["taint", "delete_node"] {
            for basis in FENCE_BASES {
                let _ = fences.get_or_create(&FenceLabels { action, basis });
            }
        }
        let would_act = Family::<WouldActLabels, Counter>::default();
        registry.register(
            "would_act",
            "Dry run only: fences (taint, delete_node) and unfences (untaint) oobfence decided on but did not write because dry_run = true",
            Listed(would_act.clone()),
        );
        let power_reads = Family::<ReadLabels, Counter>::default();
        registry.register(
            "power_reads",
            "Out-of-band power reads by backend and result (on, off, transitional, error); error_kind says why a read failed (timeout, unreachable, tls, auth, protocol, bad_reply, config). Errors never count as off",
            Listed(power_reads.clone()),
        );
        let fence_agent_reads = Family::<AgentReadLabels, Counter>::default();
        registry.register(
            "fence_agent_reads",
            "protocol = \"fence-agent\" only: power reads by fence agent (fence_ipmilan, fence_redfish, ...) and result (on, off, transitional, error); the same reads are in power_reads under backend=\"fence-agent\"",
            Listed(fence_agent_reads.clone()),
        );
        let power_reads_in_flight = Gauge::default();
        registry.register(
            "power_reads_in_flight",
            "Power reads under way now. A BMC read holds one of max_concurrent_reads slots (at the limit for long, reads queue and decisions wait on them); EC2 reads are batched and take none",
            power_reads_in_flight.clone(),
        );
        registry.register(
            "kubernetes_requests",
            "Requests oobfence sent to the Kubernetes API server, by HTTP method (GET counts lists, watches and fresh reads before a write): its load on the control plane",
            super::KUBERNETES_REQUESTS.clone(),
        );
        let power_read_duration = Family::<BackendLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0])
        });
        registry.register(
            "power_read_duration_seconds",
            "How long one power read took, connection and authentication included, by backend; slow reads delay fencing by as much",
            Listed(power_read_duration.clone()),
        );
        let blocked = Family::<BlockedLabels, Gauge>::default();
        registry.register(
            "blocked",
            "NotReady nodes oobfence refuses to fence right now, by reason: power-on (the machine is on: a partition or hung OS, a human must act), power-unknown (the BMC cannot be read), power-transitional (stuck powering on/off), no-power-source (no [[bmc]] entry maps the node), lease-renewed-recently (the kubelet is still alive), and the holds: paused, stale-view, self-partition, storm, storm-cooldown, fence-budget. Their ReadWriteOnce volumes stay attached",
            Listed(blocked.clone()),
        );
        let node_blocked = Family::<NodeReasonLabels, Gauge>::default();
        registry.register(
            "node_blocked",
            "1 for each NotReady node whose fencing is refused, with the reason (same values as oobfence_blocked); the series exists only while the node is blocked. The reason holds between re-reads, so it does not flap",
            Listed(node_blocked.clone()),
        );
        let power_sources_failing = Family::<FailingLabels, Gauge>::default();
        registry.register(
            "power_sources_failing",
            "Nodes whose latest power read (a healthy node's health read too), taken in the last 10 minutes, failed, by backend and error_kind; many at once with error_kind unreachable or timeout points at the management network rather than the machines",
            Listed(power_sources_failing.clone()),
        );
        let decision_pass_duration = Histogram::new([
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ]);
        registry.register(
            "decision_pass_duration_seconds",
            "How long the decision loop's once-a-second pass took: counting the guards over every node and deciding those whose inputs changed. A read's answer or a Node's change waits behind it; well under a second is what keeps decisions prompt",
            Listed(decision_pass_duration.clone()),
        );
        let notready_to_fence = Histogram::new([
            15.0, 30.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 1200.0, 3600.0,
        ]);
        registry.register(
            "notready_to_fence_seconds",
            "Time from a node's Ready condition turning False/Unknown to oobfence's fence landing (grace period, power reads and the write); how long pods with ReadWriteOnce volumes waited on oobfence",
            Listed(notready_to_fence.clone()),
        );
        let power_cut_to_fence = Histogram::new([
            5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 300.0, 600.0,
        ]);
        registry.register(
            "power_cut_to_fence_seconds",
            "Time from the last sign of life oobfence saw from a node's kubelet (a Lease renewal or a Ready heartbeat, by oobfence's clock; the power cut came at most one renewal interval later) to oobfence's fence landing: the whole wait a fence adds to a dead machine's volumes, with pre-attestation about the controller-manager's node-monitor grace",
            Listed(power_cut_to_fence.clone()),
        );
        let fence_to_volumes_released = Histogram::new([
            1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
        ]);
        registry.register(
            "fence_to_volumes_released_seconds",
            "Time from a fence to the last VolumeAttachment that pointed at the node (at fence time) being gone, i.e. until Kubernetes released its volumes; fences of nodes without VolumeAttachments are not counted",
            Listed(fence_to_volumes_released.clone()),
        );
        let fence_to_ebs_detached =
            Histogram::new([5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]);
        registry.register(
            "ec2_fence_to_volumes_detached_seconds",
            "EC2 only: time from a fence to every EBS data volume the instance held being detached from it (as DescribeVolumes reports)",
            Listed(fence_to_ebs_detached.clone()),
        );
        let fence_to_recovery = Histogram::new([
            60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0, 259200.0,
        ]);
        registry.register(
            "fence_to_recovery_seconds",
            "Time from oobfence fencing a node to oobfence lifting the fence after the node came back (Ready, powered on, new bootID)",
            Listed(fence_to_recovery.clone()),
        );
        let notready_to_power_off = Histogram::new([
            120.0, 180.0, 240.0, 300.0, 450.0, 600.0, 900.0, 1800.0, 3600.0,
        ]);
        registry.register(
            "notready_to_power_off_seconds",
            "Opt-in actuation: time from a node's Ready condition turning False/Unknown to oobfence sending the power-off to its machine ([actuation] after, the On read and the record before the command). The fence follows on the Off reads",
            Listed(notready_to_power_off.clone()),
        );
        let fenced_since = Family::<NodeActionLabels, FloatGauge>::default();
        registry.register(
            "fenced_since_timestamp_seconds",
            "Unix time oobfence fenced each node it holds fenced, with the action (taint, delete_node). A taint fence's series lasts until the fence is lifted; a delete_node fence's for an hour after the delete, or until the node registers again",
            Listed(fenced_since.clone()),
        );
        let taint_age = Family::<NodeLabels, FloatGauge>::default();
        registry.register(
            "out_of_service_taint_age_seconds",
            "Age of each out-of-service taint oobfence placed and that is still on its node. Joined with oobfence_node_state{state=\"recovering\"}: a node that is Ready again but still fenced (a taint left behind)",
            Listed(taint_age.clone()),
        );
        let power_source_last_success = Family::<NodeBackendLabels, FloatGauge>::default();
        registry.register(
            "power_source_last_success_timestamp_seconds",
            "When each node's power source last answered a read (any answer but an error), Unix seconds; 0 while it has not answered since oobfence started. Healthy nodes' machines are read every [policy] health_read_interval (default 10m), so `time() - this` well above that is a BMC or mapping that would fail the day its node dies",
            Listed(power_source_last_success.clone()),
        );
        let foreign_taints = Family::<ReadyLabels, Gauge>::default();
        registry.register(
            "foreign_out_of_service_taints",
            "Watched nodes carrying a node.kubernetes.io/out-of-service taint that oobfence did not place (a human or another fencer), by whether the node is Ready; oobfence never touches them, and one on a Ready node was probably left behind",
            Listed(foreign_taints.clone()),
        );
        let fenced_volume_attachments = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "fenced_volume_attachments",
            "VolumeAttachments that pointed at a node when oobfence fenced it and still exist: volumes Kubernetes has not released yet (pods needing them hang in ContainerCreating with a Multi-Attach error). The series goes away once they are all gone",
            Listed(fenced_volume_attachments.clone()),
        );
        let volume_watch_up = Gauge::default();
        registry.register(
            "volume_attachment_watch_up",
            "1 when oobfence's watch on storage.k8s.io VolumeAttachments works (needed for the volume release metrics and alert), 0 when it fails (RBAC: list/watch volumeattachments)",
            Listed(volume_watch_up.clone()),
        );
        let guard_record_ok = Gauge::default();
        guard_record_ok.set(1);
        registry.register(
            "guard_record_ok",
            "0 when the last read or write of the guards' record ([guards] record: the fence budget's fences and the storm cooldowns kept for a restart or a new [ha] leader) failed, else 1 (also with no record configured)",
            Listed(guard_record_ok.clone()),
        );
        let guard_record_repairs = Family::<CauseLabels, Counter>::default();
        registry.register(
            "guard_record_repairs",
            "Times the guards' record was found corrupt (text that is no record: cause corrupt) or gone (its key or ConfigMap deleted after it was seen: cause missing) and written again from what this daemon knows. Fences, cooldowns and power actions only the lost record held are forgotten: someone or something edits the ConfigMap",
            Listed(guard_record_repairs.clone()),
        );
        let guard_record_pending = Gauge::default();
        registry.register(
            "guard_record_pending",
            "1 while this instance may write but has not yet read the guards' record since it started or took over (the read fails, or is under way): no new fence and no power-off until it has counted its predecessor's fences and power actions",
            Listed(guard_record_pending.clone()),
        );
        let journal_records = Family::<JournalLabels, Counter>::default();
        registry.register(
            "journal_records",
            "Decision journal records by result: written, failed (the file cannot be written: check [journal] path, disk space, permissions), dropped (the writer fell behind)",
            Listed(journal_records.clone()),
        );
        let last_sync = FloatGauge::default();
        registry.register(
            "last_successful_sync_timestamp_seconds",
            "Unix time of the last decision pass over a synced node cache while the Kubernetes API answered; if it stops advancing, oobfence is not watching and will not fence",
            Listed(last_sync.clone()),
        );
        registry.register(
            "bmc_certificate_expiry_timestamp_seconds",
            crate::pinning::CERTIFICATE_EXPIRY_HELP,
            Listed(crate::pinning::CERTIFICATE_EXPIRY.clone()),
        );
        let kubeconfig_token_expiry = FloatGauge::default();
        registry.register(
            "kubeconfig_token_expiry_timestamp_seconds",
            "When the token in oobfence's kubeconfig expires (its JWT exp), Unix seconds, read at start and every 10 minutes; 0 when it has none (client certificates, an exec plugin, a token without exp). Once it passes, the API server refuses oobfence and nothing is fenced: mint a new one with `oobfence make-kubeconfig` before then",
            Listed(kubeconfig_token_expiry.clone()),
        );
        let config_reload_ok = Gauge::default();
        config_reload_ok.set(1);
        registry.register(
            "config_last_reload_successful",
            "1 if the last reload (SIGHUP, systemctl reload) applied the config file, 0 if it was refused and the daemon still runs the config it had (the reason is logged at ERROR); 1 before any reload",
            Listed(config_reload_ok.clone()),
        );
        let config_info = Family::<ConfigLabels, Gauge>::default();
        registry.register(
            "config_info",
            "1, labelled with the config in force: datacenter, action (taint, delete-node), dry_run, pre_attest, ha and the first 12 hex digits of the file's SHA-256 (as in the journal); a new series after each reload that applied a changed file",
            Listed(config_info.clone()),
        );
        let config_reload_time = FloatGauge::default();
        registry.register(
            "config_last_reload_success_timestamp_seconds",
            "When the config in force was loaded (at start, or by the last successful reload), Unix seconds",
            Listed(config_reload_time.clone()),
        );
        let nodes_watched = Gauge::default();
        registry.register(
            "nodes_watched",
            "Nodes in oobfence's cache (those matching kubernetes.node_selector); 0 usually means a wrong selector or kubeconfig",
            Listed(nodes_watched.clone()),
        );
        let identity_nodes = Family::<VerdictLabels, Gauge>::default();
        registry.register(
            "identity_nodes",
            "Mapped nodes by the verdict of the last identity read of their machine (system UUID, EC2 private address) against what the node's kubelet reported: match, mismatch (the config maps the node to another machine: it can never be fenced), unverifiable (the machine reports no usable identity), unknown (not read yet)",
            Listed(identity_nodes.clone()),
        );
        for verdict in IDENTITY_VERDICTS {
            identity_nodes
                .get_or_create(&VerdictLabels { verdict })
                .set(0);
        }
        let node_identity_problem = Family::<NodeProblemLabels, Gauge>::default();
        registry.register(
            "node_identity_problem",
            "1 for a node whose mapping cannot be trusted, healthy or not: identity-mismatch (its power source answers for another machine), region-mismatch (EC2 providerID zone outside [aws] region), shared-machine (another node maps to the same machine), off-while-alive (its power source read Off while the node was Ready and its kubelet went on living: it reads another machine or misreports; cleared when it reads On), identity-unverifiable (identity = \"checked\" and its machine proves no identity: no system UUID, a firmware placeholder one). Such a node is never fenced until the config or the machine is fixed",
            Listed(node_identity_problem.clone()),
        );
        let node_failure_domain = Family::<NodeDomainLabels, Gauge>::default();
        registry.register(
            "node_failure_domain",
            "1 for each watched node that is not healthy, labelled with its failure domain (the value of failure_domain_label): joins the per-node series to their rack or zone, so that a domain that went down whole is one alert, not one per node",
            Listed(node_failure_domain.clone()),
        );
        let identity_unchecked = Gauge::default();
        registry.register(
            "identity_unchecked_nodes",
            "Nodes whose config entry says identity = \"unchecked\": their Off reads count without the machine proving it is the node's",
            Listed(identity_unchecked.clone()),
        );
        let ec2 = crate::power::ec2::Ec2Stats::default();
        registry.register(
            "ec2_describe_instances_calls",
            "DescribeInstances calls oobfence made (one per 200 suspect instances per read round, never one per node)",
            ec2.describe_instances_calls.clone(),
        );
        registry.register(
            "ec2_describe_volumes_calls",
            "DescribeVolumes calls oobfence made (evidence of the EBS volumes a down instance holds)",
            ec2.describe_volumes_calls.clone(),
        );
        registry.register(
            "ec2_api_attempts",
            "HTTP attempts to the EC2 API, SDK retries included",
            ec2.attempts.clone(),
        );
        registry.register(
            "ec2_throttled_attempts",
            "EC2 API attempts answered with a throttling status (RequestLimitExceeded): the account-wide Describe* rate limit is being hit",
            ec2.throttled.clone(),
        );
        let paused = Gauge::default();
        registry.register(
            "paused",
            "1 while an operator has paused every write (the pause file, or the annotation oobfence.io/paused on the pause ConfigMap): nothing is fenced, unfenced or deleted, decisions and Events go on",
            paused.clone(),
        );
        let view_stale = Gauge::default();
        registry.register(
            "view_stale",
            "1 while oobfence's view of the cluster is stale (a watch broken, or no successful API call within max_view_age): no write is made on it",
            view_stale.clone(),
        );
        let leases_late = Gauge::default();
        registry.register(
            "leases_late",
            "Watched nodes whose kubelet oobfence has not seen alive for one renewal interval less than lease_stale_after (at least 1.5 intervals), stale ones included: what max_stale_leases counts",
            leases_late.clone(),
        );
        let leases_stale = Gauge::default();
        registry.register(
            "leases_stale",
            "Watched nodes whose kubelet oobfence has not seen alive (a Lease renewal or a Ready heartbeat) for lease_stale_after renewal intervals: their power is read ahead of NotReady",
            leases_stale.clone(),
        );
        let lease_storm = Gauge::default();
        registry.register(
            "lease_storm",
            "1 while more Leases are late at once (oobfence_leases_late) than max_stale_leases allows (and at least 3): the control plane or oobfence's view of it stopped hearing the kubelets, not the machines; nothing is read ahead of NotReady meanwhile",
            lease_storm.clone(),
        );
        let scope_hold = Family::<ScopeHoldLabels, Gauge>::default();
        registry.register(
            "scope_hold",
            "1 for each scope (datacenter, or domain=VALUE of failure_domain_label) where new fences are held: storm (more NotReady nodes than max_unhealthy / domain_max_unhealthy), storm-cooldown (a storm ended less than cooldown ago), self-partition (more than freeze_failing_share of the power sources read there fail: oobfence is likely the one cut off); 0 otherwise",
            Listed(scope_hold.clone()),
        );
        let scope_nodes = Family::<ScopeCountLabels, Gauge>::default();
        registry.register(
            "scope_nodes",
            "Per scope (datacenter, domain=VALUE): nodes, unhealthy (NotReady) nodes, power sources read in the last 10 minutes and those failing, as the storm guard and the freeze count them",
            Listed(scope_nodes.clone()),
        );
        let fence_budget_used = KnownGauge::default();
        registry.register(
            "fence_budget_used",
            "Fences made (or being written) in the last fence_budget_window; new fences are held while this reaches oobfence_fence_budget_limit. No sample until the first pass over a synced view of the cluster",
            fence_budget_used.clone(),
        );
        let fence_budget_limit = KnownGauge::default();
        registry.register(
            "fence_budget_limit",
            "Fences allowed in any fence_budget_window (fence_budget, a share taken of the nodes watched now). No sample until the first pass over a synced view of the cluster: before it, the nodes are not known and neither is a share of them",
            fence_budget_limit.clone(),
        );
        let leader = Family::<DatacenterLabels, Gauge>::default();
        registry.register(
            "leader",
            "1 while this instance may write to the cluster: always without [ha]; with [ha] while it holds the datacenter's Lease with time left before anyone else could take it. The instances of one datacenter sum to 1 when all is well, 0 when none writes",
            Listed(leader.clone()),
        );
        let lease_term = Family::<DatacenterLabels, Gauge>::default();
        registry.register(
            "lease_term",
            "[ha]: leaseTransitions of the datacenter's Lease as this instance last saw it; it grows by one each time another instance takes over",
            Listed(lease_term.clone()),
        );
        let ha_duplicate_identity = Family::<DatacenterLabels, Gauge>::default();
        registry.register(
            "ha_duplicate_identity",
            "[ha]: 1 while another process renews the datacenter's Lease under this instance's identity (the same [ha] identity on two hosts); this instance then writes nothing",
            Listed(ha_duplicate_identity.clone()),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the version label says which oobfence is running. Absent means oobfence is not being scraped",
            Listed(build_info),
        );
        for ready in ["true", "false"] {
            foreign_taints.get_or_create(&ReadyLabels { ready }).set(0);
        }
        for reason in BLOCKED_REASONS {
            blocked.get_or_create(&BlockedLabels { reason }).set(0);
        }
        // Counters an alert takes increase() of start at 0, so that their first event counts.
        for cause in GUARD_RECORD_REPAIRS {
            let _ = guard_record_repairs.get_or_create(&CauseLabels { cause });
        }
        for result in ["written", "failed", "dropped"] {
            let _ = journal_records.get_or_create(&JournalLabels { result });
        }
        for action in ["taint", "delete_node", "untaint"] {
            let _ = would_act.get_or_create(&WouldActLabels { action });
        }
        Metrics {
            ec2,
            registry,
            node_state,
            nodes,
            actions,
            power_actions,
            fences,
            would_act,
            power_reads,
            fence_agent_reads,
            power_reads_in_flight,
            power_read_duration,
            blocked,
            node_blocked,
            power_sources_failing,
            decision_pass_duration,
            notready_to_fence,
            power_cut_to_fence,
            fence_to_volumes_released,
            fence_to_ebs_detached,
            fence_to_recovery,
            notready_to_power_off,
            fenced_since,
            taint_age,
            power_source_last_success,
            foreign_taints,
            fenced_volume_attachments,
            volume_watch_up,
            guard_record_ok,
            guard_record_repairs,
            guard_record_pending,
            journal_records,
            last_sync,
            kubeconfig_token_expiry,
            config_reload_ok,
            config_info,
            config_reload_time,
            nodes_watched,
            identity_nodes,
            identity_unchecked,
            node_identity_problem,
            node_failure_domain,
            node_domains: Mutex::new(BTreeMap::new()),
            paused,
            view_stale,
            leases_late,
            leases_stale,
            lease_storm,
            scope_hold,
            scope_nodes,
            fence_budget_used,
            fence_budget_limit,
            leader,
            ha_duplicate_identity,
            lease_term,
            datacenter: String::new(),
            scopes_seen: Mutex::new(BTreeSet::new()),
            identity_problems_seen: Mutex::new(BTreeSet::new()),
            failing_seen: Mutex::new(BTreeSet::new()),
            deleted_fences: Mutex::new(BTreeMap::new()),
        }
    }
}
