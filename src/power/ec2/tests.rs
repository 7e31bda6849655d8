use aws_sdk_ec2::types::{Instance, InstanceLifecycleType, InstanceStateName};

use super::*;

#[test]
fn provider_ids() {
    assert_eq!(
        instance_id_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0").unwrap(),
        "i-0123456789abcdef0"
    );
    assert_eq!(
        instance_id_from_provider_id("aws:///i-0123abcd").unwrap(),
        "i-0123abcd"
    );
    for bad in [
        "",
        "gce://p/z/i-0123abcd",
        "aws:///us-east-1a/",
        "aws:///us-east-1a/i-xyz",
        "aws:///us-east-1a/vol-0123abcd",
        "aws:///us-east-1a/i-0123456789abcdef0123",
    ] {
        assert!(instance_id_from_provider_id(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn state_mapping_only_stopped_is_off() {
    use InstanceStateName as N;
    assert_eq!(map_state(&N::Stopped), PowerState::Off);
    assert_eq!(map_state(&N::Terminated), PowerState::Terminated);
    assert_eq!(map_state(&N::Running), PowerState::On);
    for s in [N::Pending, N::Stopping, N::ShuttingDown] {
        assert!(
            matches!(map_state(&s), PowerState::Transitional { .. }),
            "{s:?}"
        );
    }
    assert!(matches!(
        map_state(&N::from("hibernating-maybe")),
        PowerState::Error { .. }
    ));
}

#[test]
fn volume_details_round_trip() {
    let vols = vec![
        VolumeInfo {
            volume_id: "vol-1".into(),
            device: "/dev/sdf".into(),
            attachment_state: "attached".into(),
        },
        VolumeInfo {
            volume_id: "vol-2".into(),
            device: "/dev/sdg".into(),
            attachment_state: "detaching".into(),
        },
    ];
    let d = volume_details(&Ok(vols));
    assert_eq!(
        d[0].value,
        "vol-1 on /dev/sdf (attached), vol-2 on /dev/sdg (detaching)"
    );
    assert_eq!(volume_ids(&d), vec!["vol-1", "vol-2"]);
    assert!(volume_ids(&volume_details(&Ok(Vec::new()))).is_empty());
    let unknown = volume_details(&Err("DescribeVolumes failed".into()));
    assert!(unknown[0].value.starts_with("unknown"));
    assert!(volume_ids(&unknown).is_empty());
}
/// An instance as DescribeInstances may describe it, to finish with `.build()`.
fn instance(
    state: InstanceStateName,
    code: Option<&str>,
    message: Option<&str>,
) -> aws_sdk_ec2::types::builders::InstanceBuilder {
    use aws_sdk_ec2::types::{InstanceState, StateReason};
    Instance::builder()
        .instance_id("i-0123456789abcdef0")
        .state(InstanceState::builder().name(state).build())
        .state_reason(
            StateReason::builder()
                .set_code(code.map(String::from))
                .set_message(message.map(String::from))
                .build(),
        )
}

fn configured_to_hibernate(
    b: aws_sdk_ec2::types::builders::InstanceBuilder,
) -> aws_sdk_ec2::types::builders::InstanceBuilder {
    b.hibernation_options(
        aws_sdk_ec2::types::HibernationOptions::builder()
            .configured(true)
            .build(),
    )
}

#[test]
fn hibernated_instances_are_suspended_never_off() {
    use InstanceStateName as N;
    let hibernated = instance(
        N::Stopped,
        Some(HIBERNATE_REASON),
        Some("Client.UserInitiatedHibernate: User initiated hibernate"),
    )
    .build();
    // The old mapping looked at the state name only, and a stopped name is Off.
    match instance_power_state(&hibernated) {
        PowerState::Suspended { detail } => {
            assert!(detail.starts_with("stopped by hibernation"), "{detail}");
            assert!(detail.contains(HIBERNATE_REASON), "{detail}");
        }
        other => panic!("a hibernated instance read as {other:?}"),
    }
    assert!(!instance_power_state(&hibernated).is_down());
    // Still writing its RAM to EBS: suspended too, not merely transitional.
    let stopping = instance(N::Stopping, Some(HIBERNATE_REASON), None).build();
    assert!(
        matches!(
            instance_power_state(&stopping),
            PowerState::Suspended { ref detail } if detail.starts_with("stopping by hibernation")
        ),
        "{:?}",
        instance_power_state(&stopping)
    );
    // Only the message says so: still hibernation.
    let by_message = instance(
        N::Stopped,
        None,
        Some("Client.UserInitiatedHibernate: User initiated hibernate"),
    )
    .build();
    assert_eq!(instance_power_state(&by_message).label(), "suspended");

    // A plain stop is Off, also on an instance that could hibernate.
    let stopped = instance(
        N::Stopped,
        Some("Client.UserInitiatedShutdown"),
        Some("Client.UserInitiatedShutdown: User initiated shutdown"),
    );
    assert_eq!(
        instance_power_state(&stopped.clone().build()),
        PowerState::Off
    );
    assert_eq!(
        instance_power_state(&configured_to_hibernate(stopped).build()),
        PowerState::Off
    );
    assert_eq!(
        instance_power_state(&instance(N::Stopped, None, None).build()),
        PowerState::Off
    );
    // A Spot interruption of an instance configured to hibernate may have hibernated it.
    let spot_stop = instance(
        N::Stopped,
        Some("Server.SpotInstanceShutdown"),
        Some("Server.SpotInstanceShutdown: Stopped due to Spot interruption"),
    );
    assert_eq!(
        instance_power_state(&spot_stop.clone().build()),
        PowerState::Off
    );
    // Configured alone, or Spot alone, is not enough.
    assert_eq!(
        instance_power_state(&configured_to_hibernate(spot_stop.clone()).build()),
        PowerState::Off
    );
    assert_eq!(
        instance_power_state(
            &spot_stop
                .clone()
                .instance_lifecycle(InstanceLifecycleType::Spot)
                .build()
        ),
        PowerState::Off
    );
    assert_eq!(
        instance_power_state(
            &configured_to_hibernate(spot_stop)
                .instance_lifecycle(InstanceLifecycleType::Spot)
                .build()
        )
        .label(),
        "suspended"
    );
    // A stale hibernation reason on a running or terminated instance changes nothing.
    assert_eq!(
        instance_power_state(&instance(N::Running, Some(HIBERNATE_REASON), None).build()),
        PowerState::On
    );
    assert_eq!(
        instance_power_state(&instance(N::Terminated, Some(HIBERNATE_REASON), None).build()),
        PowerState::Terminated
    );
    let no_state = Instance::builder().instance_id("i-0123abcd").build();
    assert_eq!(instance_power_state(&no_state).label(), "error");
}

#[test]
fn identity_lists_every_private_address_once() {
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstancePrivateIpAddress,
    };
    let i = Instance::builder()
        .instance_id("i-0123456789abcdef0")
        .private_ip_address("10.0.0.5")
        .private_dns_name("ip-10-0-0-5.ec2.internal")
        .network_interfaces(
            InstanceNetworkInterface::builder()
                .private_ip_address("10.0.0.5")
                .private_dns_name("ip-10-0-0-5.ec2.internal")
                .private_ip_addresses(
                    InstancePrivateIpAddress::builder()
                        .private_ip_address("10.0.0.5")
                        .private_dns_name("IP-10-0-0-5.ec2.internal")
                        .primary(true)
                        .build(),
                )
                .private_ip_addresses(
                    InstancePrivateIpAddress::builder()
                        .private_ip_address("10.0.0.6")
                        .private_dns_name("ip-10-0-0-6.ec2.internal")
                        .build(),
                )
                .ipv6_addresses(
                    InstanceIpv6Address::builder()
                        .ipv6_address("2600:1f18::5")
                        .build(),
                )
                .build(),
        )
        .network_interfaces(
            InstanceNetworkInterface::builder()
                .private_ip_address("10.0.1.7")
                .private_dns_name("")
                .build(),
        )
        .build();
    assert_eq!(
        instance_identity(&i),
        MachineIdentity::Instance {
            id: "i-0123456789abcdef0".into(),
            private_ips: vec![
                "10.0.0.5".into(),
                "10.0.0.6".into(),
                "2600:1f18::5".into(),
                "10.0.1.7".into()
            ],
            private_dns_names: vec![
                "ip-10-0-0-5.ec2.internal".into(),
                "ip-10-0-0-6.ec2.internal".into()
            ],
        }
    );
    // A terminated instance has no addresses left: an Instance identity with none.
    let gone = Instance::builder()
        .instance_id("i-0123abcd")
        .private_dns_name("")
        .build();
    assert_eq!(
        instance_identity(&gone),
        MachineIdentity::Instance {
            id: "i-0123abcd".into(),
            private_ips: vec![],
            private_dns_names: vec![],
        }
    );
    assert!(matches!(
        instance_identity(&Instance::builder().build()),
        MachineIdentity::Unreported { .. }
    ));
}

#[test]
fn zones_belong_to_their_region() {
    for (zone, region) in [
        ("us-east-1a", "us-east-1"),
        ("us-west-2d", "us-west-2"),
        ("eu-central-2b", "eu-central-2"),
        ("us-gov-west-1a", "us-gov-west-1"),
        ("cn-northwest-1c", "cn-northwest-1"),
        ("ap-southeast-3a", "ap-southeast-3"),
        // Local Zones and Wavelength Zones belong to their parent region.
        ("us-west-2-lax-1a", "us-west-2"),
        ("us-east-1-bos-1a", "us-east-1"),
        ("us-east-1-wl1-bos-wlz-1", "us-east-1"),
        ("ap-northeast-1-wl1-nrt-wlz-1", "ap-northeast-1"),
    ] {
        assert_eq!(region_of_zone(zone), Some(region), "{zone}");
    }
    for not_a_zone in [
        "",
        "us-east-1",
        "us-east-1ab",
        "us-east-1A",
        "use1-az1",
        "us-1a",
        "us-east-a",
        "us-east-1-",
        "us-east-1-lax-",
        "us-east-1a-lax-1a",
        "US-EAST-1A",
    ] {
        assert_eq!(region_of_zone(not_a_zone), None, "{not_a_zone:?}");
    }
}

#[test]
fn provider_id_zones() {
    let id = "i-0123456789abcdef0";
    assert_eq!(
        zone_from_provider_id(&format!("aws:///us-west-2a/{id}")),
        Ok(Some("us-west-2a"))
    );
    assert_eq!(
        zone_from_provider_id(&format!("aws://us-west-2a/{id}")),
        Ok(Some("us-west-2a"))
    );
    assert_eq!(zone_from_provider_id(&format!("aws:///{id}")), Ok(None));
    assert_eq!(zone_from_provider_id(&format!("aws://{id}")), Ok(None));
    assert!(zone_from_provider_id(&format!("aws:///a/b/{id}")).is_err());
    assert!(zone_from_provider_id("gce://p/z/i-0123abcd").is_err());
}

#[test]
fn region_mismatch_names_the_zone_and_both_regions() {
    let id = "i-0123456789abcdef0";
    // In the region: nothing to say.
    for pid in [
        format!("aws:///us-east-1a/{id}"),
        format!("aws://us-east-1c/{id}"),
        format!("aws:///us-east-1-bos-1a/{id}"),
        format!("aws:///us-east-1-wl1-bos-wlz-1/{id}"),
    ] {
        assert_eq!(zone_region_mismatch(&pid, "us-east-1"), None, "{pid}");
    }
    // Another region, also through a Local or Wavelength Zone.
    for (pid, zone, region) in [
        (format!("aws:///us-west-2a/{id}"), "us-west-2a", "us-west-2"),
        (
            format!("aws:///us-west-2-lax-1a/{id}"),
            "us-west-2-lax-1a",
            "us-west-2",
        ),
        (
            format!("aws:///us-west-2-wl1-las-wlz-1/{id}"),
            "us-west-2-wl1-las-wlz-1",
            "us-west-2",
        ),
        // A prefix of the configured region is still another region.
        (
            format!("aws:///us-east-11a/{id}"),
            "us-east-11a",
            "us-east-11",
        ),
    ] {
        let msg = zone_region_mismatch(&pid, "us-east-1").unwrap_or_else(|| panic!("{pid}"));
        assert!(msg.contains(zone), "{msg}");
        assert!(msg.contains(&format!("region {region}")), "{msg}");
        assert!(msg.contains("\"us-east-1\""), "{msg}");
    }
    // No zone, or no zone name: the region cannot be checked, and the message says so.
    for pid in [format!("aws:///{id}"), format!("aws://{id}")] {
        let msg = zone_region_mismatch(&pid, "us-east-1").unwrap();
        assert!(msg.contains("no availability zone"), "{msg}");
    }
    let msg = zone_region_mismatch(&format!("aws:///use1-az1/{id}"), "us-east-1").unwrap();
    assert!(msg.contains("not an availability zone name"), "{msg}");
    let msg = zone_region_mismatch("gce://p/z/x", "us-east-1").unwrap();
    assert!(msg.contains("not an AWS one"), "{msg}");
}

proptest::proptest! {
    #![proptest_config(crate::fuzz::config())]

    /// The one EC2 text oobfence parses itself, the Node's providerID (the answers are the
    /// SDK's): never a panic; an instance id only when it is one (i- and 8 or 17 hex digits,
    /// at the end of an aws:// providerID); and no region mismatch only when the zone is in
    /// the region.
    #[test]
    fn fuzz_provider_ids(p in crate::fuzz::text_like("aws:///us-east-1a/i-0123456789abcdef0")) {
        if let Ok(id) = instance_id_from_provider_id(&p) {
            let hex = id.strip_prefix("i-").unwrap_or_default();
            proptest::prop_assert!(hex.len() == 8 || hex.len() == 17, "{p:?} -> {id:?}");
            proptest::prop_assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{p:?} -> {id:?}");
            proptest::prop_assert!(p.starts_with("aws://") && p.ends_with(&id), "{p:?} -> {id:?}");
        }
        if zone_region_mismatch(&p, "us-east-1").is_none() {
            let zone = zone_from_provider_id(&p);
            proptest::prop_assert!(
                matches!(zone, Ok(Some(z)) if region_of_zone(z) == Some("us-east-1")),
                "{p:?}: {zone:?}"
            );
        }
    }
}

/// Found by `fuzz_provider_ids`: an id of 9 to 16 hex digits is no EC2 instance id, and was
/// taken for one.
#[test]
fn instance_ids_have_8_or_17_hex_digits() {
    assert!(instance_id_from_provider_id("aws:///us-east-1a/i-12345678").is_ok());
    assert!(instance_id_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0").is_ok());
    for bad in [
        "i-123456789",
        "i-0123456789abcdef",
        "i-1234567",
        "i-0123456789abcdef01",
    ] {
        let p = format!("aws:///us-east-1a/{bad}");
        assert!(instance_id_from_provider_id(&p).is_err(), "{p}");
    }
}

/// The key an answer came through is read off the request as signed: SigV4's `Credential=`.
#[test]
fn the_signing_key_is_read_off_the_authorization_header() {
    let header = "AWS4-HMAC-SHA256 Credential=ASIARTXV5AHDR3S7DBS7/20261125/us-east-1/ec2/aws4_request, SignedHeaders=host;x-amz-date, Signature=0123abcd";
    assert_eq!(signing_key_id(header), Some("ASIARTXV5AHDR3S7DBS7"));
    for unsigned in [
        "",
        "Bearer token",
        "AWS4-HMAC-SHA256 Credential=/20261125/us-east-1/ec2/aws4_request",
        "AWS4-HMAC-SHA256 Credential=, SignedHeaders=host",
    ] {
        assert_eq!(signing_key_id(unsigned), None, "{unsigned:?}");
    }
}

/// A call whose signing key was not seen gives a reader that names nobody: the decision core
/// matches it with no binding. One whose key was seen is known.
#[tokio::test]
async fn a_reader_whose_signing_key_was_not_seen_names_nobody() {
    use crate::decision::reading::reader_is_known;
    let cfg = AwsConfig {
        region: "us-east-1".into(),
        nodes: Vec::new(),
        endpoint_url: Some("https://127.0.0.1:9".into()),
        profile: None,
        timeout: Duration::from_secs(1),
        volume_release_warning: Duration::from_secs(60),
        identity: Default::default(),
        actuate: false,
    };
    let reader = Ec2Reader::new(&cfg, Default::default()).await;
    assert!(!reader_is_known(&reader.reader_id(None)));
    let source = Ec2Source::new(reader.clone(), "i-0123abcd".into());
    assert!(!reader_is_known(&source.reader_id()));
    let known = reader.reader_id(Some("AKIAIOSFODNN7EXAMPLE"));
    assert!(reader_is_known(&known), "{known}");
}
