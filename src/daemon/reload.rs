//! `systemctl reload` (SIGHUP): the config file and the secrets it names are read again and,
//! when whole, take over from the next pass. What oobfence knows about the nodes (reads, fence
//! records, identity bindings, the guards' memory) carries over, except where a node's power
//! source is now another one: its old reads say nothing about the new machine. A binding kept
//! proves nothing about a reader with new credentials or a new endpoint: each read names its
//! reader, and the core counts a "gone" answer only through the one that learnt the binding.

use std::sync::Arc;

use super::notify::log_startup_warnings;
use super::reads::ReadSlots;
use super::state::Daemon;
use crate::config::Config;
use crate::power::PowerSources;

/// Building the new power sources (an EC2 client) gets this long.
const SOURCES_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a new config cannot be applied without a restart: it changes what the daemon set up
/// once (watches, listener, journal file, pause watch, leader election).
pub(super) fn fixed_settings_changed(old: &Config, new: &Config) -> Option<String> {
    let changed: Vec<&str> = [
        ("datacenter", old.datacenter != new.datacenter),
        ("[kubernetes]", old.kubernetes != new.kubernetes),
        ("server.listen", old.server.listen != new.server.listen),
        ("journal.path", old.journal.path != new.journal.path),
        (
            "[pause]",
            format!("{:?}", old.pause) != format!("{:?}", new.pause),
        ),
        ("[ha]", old.ha != new.ha),
        ("guards.record", old.guard_record != new.guard_record),
    ]
    .into_iter()
    .filter_map(|(key, differs)| differs.then_some(key))
    .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "{} changed, which only a restart applies (systemctl restart oobfence@{})",
            changed.join(", "),
            old.datacenter
        )
    })
}

/// A new config and the power sources built from it, ready to take over.
pub(super) struct Prepared {
    cfg: Arc<Config>,
    sources: Arc<PowerSources>,
    /// The kubeconfig's new token, accepted by the API server; `None`: the same one.
    token: Option<crate::cluster::credentials::Replacement>,
}

/// Reads the config file again and builds what it needs (secrets, CA files, an EC2 client),
/// away from the decision loop, which goes on deciding meanwhile; `running` is the config in
/// force. Any problem is returned as one line and changes nothing.
pub(super) async fn prepare(
    running: Arc<Config>,
    ec2_stats: crate::power::ec2::Ec2Stats,
    credentials: crate::cluster::Credentials,
) -> Result<Prepared, String> {
    let path = running.source.clone();
    let new = tokio::task::spawn_blocking(move || Config::load(&path))
        .await
        .map_err(|e| format!("reading the config failed: {e}"))?
        .map_err(|e| e.to_string())?;
    if let Some(why) = fixed_settings_changed(&running, &new) {
        return Err(why);
    }
    // The kubeconfig is read again too: a rotated token is used from this reload on.
    let kube_config = crate::cluster::load_kube_config(&new.kubernetes)
        .await
        .map_err(|e| e.to_string())?;
    let token = credentials.replacement(kube_config).await?;
    let new = Arc::new(new);
    let sources = tokio::time::timeout(SOURCES_DEADLINE, PowerSources::new(new.clone(), ec2_stats))
        .await
        .map_err(|_| {
            format!(
                "setting up the power sources took longer than {SOURCES_DEADLINE:?} ([aws] endpoint?)"
            )
        })?;
    Ok(Prepared {
        cfg: new,
        sources: Arc::new(sources),
        token,
    })
}

impl Daemon {
    /// Applies a prepared config, from the next pass on. The config in force may have changed
    /// since it was prepared (two reloads in a row): what only a restart applies is checked
    /// again against it.
    pub(super) fn apply_reload(&mut self, prepared: Prepared) -> Result<String, String> {
        let Prepared {
            cfg: new,
            sources,
            token,
        } = prepared;
        if let Some(why) = fixed_settings_changed(&self.cfg, &new) {
            return Err(why);
        }

        // Nodes whose power source is now another one start afresh; every node's source and
        // mapping are looked up again on its next decision.
        let mut remapped = 0;
        for (name, t) in &mut self.trackers {
            let node = self.nodes.get(name);
            let provider_id = node.as_deref().and_then(crate::cluster::provider_id);
            let before: Vec<_> = t
                .sources
                .iter()
                .map(|s| (s.level, s.target.clone()))
                .collect();
            let mut fresh = super::sources::build(&new, &sources, name, provider_id);
            let now: Vec<_> = fresh.iter().map(|s| (s.level, s.target.clone())).collect();
            if before != now {
                remapped += 1;
                self.shared.metrics.forget_power_source(name);
            }
            // The sources the reload leaves as they were keep what they read; the others go,
            // and so does any answer of theirs still on its way.
            super::sources::carry_over(&mut t.sources, &mut fresh, &mut t.next_generation);
            t.sources = fresh;
            t.sources_for = Some(provider_id.map(String::from));
            t.quiet = None;
        }
        if new.max_concurrent_reads != self.cfg.max_concurrent_reads {
            // Reads under way keep their old slots and finish; new ones take the new ones.
            self.read_slots = ReadSlots::new(
                new.max_concurrent_reads,
                self.shared.metrics.power_reads_in_flight.clone(),
            );
        }
        let token_note = match token {
            Some(t) => {
                let expiry = t.expiry();
                self.credentials.replace(t);
                self.shared
                    .metrics
                    .kubeconfig_token_expiry
                    .set(expiry.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0));
                match expiry {
                    Some(at) => format!("; the kubeconfig's new token is in use (expires {at})"),
                    None => "; the kubeconfig's new token is in use".to_string(),
                }
            }
            None => String::new(),
        };
        let summary = format!(
            "config {} reloaded (sha256 {}…, was {}…): {} [[bmc]] entries, action {}{}; {remapped} node(s) now read through another power source{token_note}",
            new.source.display(),
            &new.digest[..12.min(new.digest.len())],
            &self.cfg.digest[..12.min(self.cfg.digest.len())],
            new.bmc.len(),
            new.policy.action,
            if new.policy.dry_run { ", dry run" } else { "" },
        );
        self.journal.set_config_digest(&new.digest);
        self.shared.metrics.set_config_info(&new);
        self.shared.set_whoami(&new);
        let replaced = std::mem::replace(&mut self.sources, sources);
        // The old sources' Redfish sessions are logged out now, not left to the BMC's timeout
        // (its session slots are few); a read still under way through one logs in anew.
        tokio::spawn(async move { replaced.close_sessions().await });
        self.cfg = new;
        self.conflicts_of.clear();
        self.guards_epoch += 1;
        log_startup_warnings(&self.cfg);
        Ok(summary)
    }
}

impl Daemon {
    /// The reload's journal record: the digest before and after (the same when refused), and
    /// why a refused one was refused.
    pub(super) fn journal_reload(&self, digest_before: &str, result: &Result<String, String>) {
        let change = crate::journal::Change {
            digest_before: Some(digest_before.to_string()),
            digest_after: Some(self.cfg.digest.clone()),
            ..Default::default()
        };
        let (outcome, message) = match result {
            Ok(summary) => ("ok", summary.clone()),
            Err(why) => (
                "refused",
                format!("config reload refused, the daemon runs on with the config it had: {why}"),
            ),
        };
        let mut record =
            self.journal
                .daemon_record(crate::journal::Topic::Reload, "", outcome, message, change);
        if let Err(why) = result {
            record.error = Some(why.clone());
        }
        self.journal.submit(&record);
    }
}
