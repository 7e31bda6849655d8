//! Reads against moto: instance states as power states (with the volumes as evidence), the
//! addresses DescribeInstances shows as the machine's identity, and a providerID of another
//! region as a config error, never "not found".

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_states_map_to_power_states_with_volumes_as_evidence() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 3).await;
    let (running, stopped, terminated) = (&ids[0], &ids[1], &ids[2]);
    let data = attach_data_volume(&ec2, stopped).await;
    ec2.stop_instances()
        .instance_ids(stopped)
        .send()
        .await
        .unwrap();
    ec2.terminate_instances()
        .instance_ids(terminated)
        .send()
        .await
        .unwrap();

    let r = reader(&moto.endpoint()).await;
    assert_eq!(read(&r, running).await.0, PowerState::On);
    let (state, details) = read(&r, stopped).await;
    assert_eq!(state, PowerState::Off);
    // The data volume is evidence; moto's auto-created root volume is not.
    assert_eq!(volume_ids(&details), vec![data.clone()], "{details:?}");
    assert_eq!(read(&r, terminated).await.0, PowerState::Terminated);
    assert_eq!(
        read(&r, "i-0123456789abcdef0").await.0,
        PowerState::NotFound
    );
    // The stopped instance keeps its volume attached until something detaches it.
    let held = r
        .still_attached(stopped, std::slice::from_ref(&data))
        .await
        .unwrap();
    assert_eq!(held, vec![data.clone()]);
    ec2.detach_volume()
        .volume_id(&data)
        .instance_id(stopped)
        .send()
        .await
        .unwrap();
    assert!(r.still_attached(stopped, &[data]).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_report_the_instance_addresses_describe_instances_shows() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 2).await;
    let (running, stopped) = (&ids[0], &ids[1]);
    ec2.stop_instances()
        .instance_ids(stopped)
        .send()
        .await
        .unwrap();
    let r = reader(&moto.endpoint()).await;

    for (id, want_state) in [(running, PowerState::On), (stopped, PowerState::Off)] {
        let truth = describe_instance(&ec2, id).await;
        let ip = truth.private_ip_address().expect("moto gives a private IP");
        let dns = truth
            .private_dns_name()
            .expect("moto gives a private DNS name");
        assert!(!ip.is_empty() && !dns.is_empty(), "{truth:?}");
        let reply = read_reply(&r, id).await;
        assert_eq!(reply.state, want_state);
        let MachineIdentity::Instance {
            id: got_id,
            private_ips,
            private_dns_names,
        } = &reply.identity
        else {
            panic!("{id}: {:?}", reply.identity);
        };
        assert_eq!(got_id, id);
        assert!(
            private_ips.iter().any(|a| a == ip),
            "{ip} not in {private_ips:?}"
        );
        assert!(
            private_dns_names.iter().any(|n| n == dns),
            "{dns} not in {private_dns_names:?}"
        );
        // Every address the read reports is one DescribeInstances has for this instance.
        let nic_ips: Vec<&str> = truth
            .network_interfaces()
            .iter()
            .flat_map(|n| n.private_ip_addresses())
            .filter_map(|a| a.private_ip_address())
            .chain([ip])
            .collect();
        for a in private_ips {
            assert!(
                nic_ips.contains(&a.as_str()),
                "{a} is not {id}'s: {nic_ips:?}"
            );
        }
        // The core's check: a Node reporting that address is this instance's, another is not.
        let node = |addresses: &[&str]| NodeIdentity {
            system_uuid: String::new(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            uuid_shared_with: Vec::new(),
        };
        assert!(verify(&node(&[ip]), &reply.identity).is_match());
        assert!(verify(&node(&["host-a", dns]), &reply.identity).is_match());
        assert_eq!(
            verify(&node(&["10.255.255.254"]), &reply.identity).label(),
            "mismatch"
        );
    }

    // Absent from the answer: NotFound, and no identity, with the reason.
    let gone = read_reply(&r, "i-0123456789abcdef0").await;
    assert_eq!(gone.state, PowerState::NotFound);
    match &gone.identity {
        MachineIdentity::Unreported { reason } => {
            assert!(reason.contains("i-0123456789abcdef0"), "{reason}");
        }
        other => panic!("an absent instance reported {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_id_of_another_region_is_a_config_error_never_not_found() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    // An instance in moto's us-east-1 (the configured region), addressed with a zone of
    // us-west-2.
    let here = run_instances(&ec2, 1).await.remove(0);
    // The failure this guards against: an instance of us-west-2 read in us-east-1 is absent
    // from the answer, which reads as NotFound, as if it were gone.
    let west = client_in(&moto.endpoint(), "us-west-2");
    let there = run_instances_in(&west, 1, "us-west-2a").await.remove(0);
    let r = reader(&moto.endpoint()).await;
    assert_eq!(
        read(&r, &there).await.0,
        PowerState::NotFound,
        "moto no longer keeps regions apart: this test proves nothing"
    );

    let sources =
        PowerSources::new(Arc::new(config(&moto.endpoint(), "5s")), Default::default()).await;
    for id in [&here, &there] {
        let pid = format!("aws:///us-west-2a/{id}");
        let refused = match Ec2Source::for_provider_id(r.clone(), &pid) {
            Ok(_) => panic!("{pid} was accepted for region us-east-1"),
            Err(e) => e,
        };
        assert!(
            refused.contains("us-west-2a") && refused.contains("us-east-1"),
            "{refused}"
        );
        // The node's source, as the daemon builds it: every read is a Config error naming the
        // zone and the region, however often it is read.
        let mapped = sources
            .for_node("n1", Some(&pid))
            .expect("[aws] maps every node");
        for _ in 0..3 {
            let reply = mapped.source.read_reply().await;
            match &reply.state {
                PowerState::Error { kind, detail } => {
                    assert_eq!(*kind, ReadErrorKind::Config, "{detail}");
                    assert!(
                        detail.contains("us-west-2a") && detail.contains("us-east-1"),
                        "{detail}"
                    );
                }
                other => panic!("{pid} read as {other:?}"),
            }
            assert!(!reply.state.is_down());
        }
    }
    // The same instance with its own zone reads normally.
    let ok = Ec2Source::for_provider_id(r.clone(), &format!("aws:///us-east-1a/{here}"))
        .expect("a zone of us-east-1");
    assert_eq!(ok.instance_id(), here);
    assert_eq!(ok.read_reply().await.state, PowerState::On);
    let mapped = sources
        .for_node("n1", Some(&format!("aws:///us-east-1a/{here}")))
        .unwrap();
    assert_eq!(mapped.source.read().await, PowerState::On);
    // Without a zone the region cannot be checked: refused too, and the message says why.
    let no_zone = match Ec2Source::for_provider_id(r.clone(), &format!("aws:///{here}")) {
        Ok(_) => panic!("a providerID without a zone was accepted"),
        Err(e) => e,
    };
    assert!(no_zone.contains("no availability zone"), "{no_zone}");
}
