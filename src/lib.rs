//! oobfence: out-of-band node fencing for Kubernetes.
//!
//! Proves through the machine's BMC (or cloud API) that a NotReady node is really powered off,
//! and only then tells Kubernetes, so that its ReadWriteOnce volumes are released.
//!
//! Dependencies point one way: `cli → daemon → {cluster, power, decision, observers}`, with
//! `config` below the sources and the core importing nothing that does I/O. No two modules use
//! each other, through any chain (`tests/module_graph.rs` checks it).
//!
//! - [`decision`]: the pure core — why a node is or is not fenced — and the words it decides on.
//! - [`identity`]: whether the machine that answered a read is the node's machine.
//! - [`power`]: power sources (Redfish, IPMI, EC2), one file each, behind one trait;
//!   [`pinning`]: the BMC certificates an operator pinned (the config reads the pins).
//! - [`cluster`]: every Kubernetes read and write; [`api_error`]: what a failed request means,
//!   in an operator's words.
//! - [`daemon`]: the loop that ties them together; it publishes [`status`], which [`http`]
//!   serves; [`cli`] faces the operator.
//! - [`pause`]: the operator's switch that holds every write; [`leader`]: which of two hosts
//!   writes.
//! - [`metrics`], [`journal`], [`volumes`]: what oobfence reports about what it did and what
//!   followed (Prometheus metrics, the decision journal, VolumeAttachment release).
//! - [`whoami`]: who a daemon is (datacenter, config file, digest), so that a command talks
//!   to the daemon of its config and to no other.

pub mod api_error;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod decision;
#[cfg(test)]
mod fuzz;
pub mod http;
pub mod identity;
pub mod journal;
pub mod kubeconfig;
pub mod leader;
pub mod metrics;
pub mod pause;
pub mod pinning;
pub mod power;
pub mod report;
pub mod secret;
pub mod status;
pub mod volumes;
pub mod whoami;

/// The log filter when `OOBFENCE_LOG` is not set (the unit sets the same). The libraries speak
/// at WARN and up only; two not at all, as oobfence logs those failures itself, once, saying
/// what they mean: the Kubernetes client's ERROR line per failed request (a watch that fails is
/// one line of oobfence's), and the TLS platform verifier's per refused BMC certificate (one
/// classified read error, `tls: ...`). The AWS SDK's INFO lines (credentials loaded, with the
/// access key ID) stay out of the journal.
pub const DEFAULT_LOG_FILTER: &str = "info,kube=warn,hyper=warn,rustls=warn,aws_config=warn,kube_client::client::builder=off,rustls_platform_verifier=off";

/// `oobfence --version`: the version, the commit, the build date, target and profile.
pub const VERSION_LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("OOBFENCE_GIT_COMMIT"),
    ", built ",
    env!("OOBFENCE_BUILD_DATE"),
    ", ",
    env!("OOBFENCE_BUILD_TARGET"),
    ", ",
    env!("OOBFENCE_BUILD_PROFILE"),
    ")"
);
