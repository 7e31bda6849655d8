//! The node Leases as the loop needs them: each one's renewTime and duration by node name
//! ([`LeaseTimes`]), kept from the Lease watch ([`super::cache`]).

use k8s_openapi::api::coordination::v1::Lease;

use super::cache::{Cache, CacheWriter, cache};
use crate::cluster::LeaseTimes;

pub(super) type Leases = Cache<LeaseTimes>;
pub(super) type LeasesWriter = CacheWriter<LeaseTimes>;

pub(super) fn leases() -> (Leases, LeasesWriter) {
    cache()
}

/// What the cache keeps of a Lease.
pub(super) fn keep(lease: Lease) -> LeaseTimes {
    LeaseTimes::of(&lease)
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher;

    use super::*;

    fn lease(name: &str, renewed: i64) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                jiff::Timestamp::from_second(renewed).unwrap(),
            )),
            lease_duration_seconds: Some(40),
            ..Default::default()
        });
        l
    }

    /// A relist replaces what was kept (a Lease deleted while the watch was down goes), and
    /// the cache reads as synced only once the first list is complete.
    #[test]
    fn a_relist_replaces_the_leases_and_marks_the_cache_synced() {
        let (read, mut write) = leases();
        write.apply(watcher::Event::Init, keep);
        write.apply(watcher::Event::InitApply(lease("a", 10)), keep);
        write.apply(watcher::Event::InitApply(lease("b", 10)), keep);
        assert!(!read.is_synced(), "not synced before InitDone");
        assert_eq!(read.get("a"), None, "a list in progress is not served");
        write.apply(watcher::Event::InitDone, keep);
        assert!(read.is_synced());
        assert_eq!(
            read.get("a"),
            Some(LeaseTimes {
                renewed: Some(jiff::Timestamp::from_second(10).unwrap()),
                duration: Some(std::time::Duration::from_secs(40)),
                version: read.get("a").unwrap().version,
            })
        );
        write.apply(watcher::Event::Apply(lease("a", 20)), keep);
        assert_eq!(
            read.get("a").and_then(|t| t.renewed),
            Some(jiff::Timestamp::from_second(20).unwrap())
        );
        write.apply(watcher::Event::Delete(lease("b", 10)), keep);
        assert_eq!(read.get("b"), None);
        write.apply(watcher::Event::Init, keep);
        write.apply(watcher::Event::InitApply(lease("c", 30)), keep);
        write.apply(watcher::Event::InitDone, keep);
        assert_eq!(read.get("a"), None, "gone from the relist: gone");
        assert!(read.get("c").is_some());
    }
}
