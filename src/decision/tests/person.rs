//! A person's confirmation, as `oobfence confirm-off` checks it before writing: only a
//! NotReady node that reports a boot and whose kubelet has been silent a Lease's duration.

use super::*;
use crate::decision::confirmation::may_confirm;

const LEASE: Duration = Duration::from_secs(40);

#[test]
fn a_notready_node_silent_for_a_lease_duration_may_be_confirmed() {
    let down = Readiness::NotReady { since: t(0) };
    assert_eq!(
        may_confirm(&down, "boot-a", Some(t(0)), LEASE, t(40)),
        Ok(())
    );
    // Without a Lease there is nothing to renew: NotReady is all there is.
    assert_eq!(may_confirm(&down, "boot-a", None, LEASE, t(1)), Ok(()));
}

#[test]
fn a_renewal_within_the_lease_duration_is_a_living_kubelet() {
    let down = Readiness::NotReady { since: t(0) };
    let e = may_confirm(&down, "boot-a", Some(t(1)), LEASE, t(40)).unwrap_err();
    assert!(e.contains("renewed its Lease 39s ago"), "{e}");
    assert!(e.contains("not silent"), "{e}");
    // A renewal stamped ahead of the writer's clock is no silence either.
    assert!(may_confirm(&down, "boot-a", Some(t(50)), LEASE, t(40)).is_err());
}

#[test]
fn a_ready_node_one_without_a_condition_or_a_boot_is_refused_naming_why() {
    let e = may_confirm(&Readiness::Ready, "boot-a", None, LEASE, t(100)).unwrap_err();
    assert!(e.contains("is Ready"), "{e}");
    let e = may_confirm(&Readiness::NoCondition, "boot-a", None, LEASE, t(100)).unwrap_err();
    assert!(e.contains("no Ready condition"), "{e}");
    let down = Readiness::NotReady { since: t(0) };
    let e = may_confirm(&down, "", None, LEASE, t(100)).unwrap_err();
    assert!(e.contains("no bootID"), "{e}");
}
