//! oobfence: out-of-band node fencing for Kubernetes.
//!
//! Proves through the machine's BMC (or cloud API) that a NotReady node is really powered off,
//! and only then tells Kubernetes, so that its ReadWriteOnce volumes are released.

pub mod config;
pub mod decision;
pub mod power;
pub mod secret;
