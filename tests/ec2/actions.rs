//! Power actions against moto: StopInstances with Force and StartInstances for the node's
//! instance only, after the caller's check on a fresh DescribeInstances answer; a refused check
//! sends nothing; a DryRun of each says whether the credentials may.

use oobfence::power::ec2::Ec2Source;
use oobfence::power::{ActionOutcome, PowerAction, PowerSource, checked};

use super::*;

/// Reads until EC2 says `want` (moto moves stopping → stopped on the next describe).
async fn reads_until(src: &Ec2Source, want: PowerState) {
    for _ in 0..40 {
        if src.read().await == want {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    panic!("the instance never read {want:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_force_and_start_go_to_the_nodes_instance_after_the_check() {
    let moto = MotoServer::start().await;
    let ec2 = moto.client();
    let ids = run_instances(&ec2, 2).await;
    let r = reader(&moto.endpoint()).await;
    let src = Ec2Source::new(r.clone(), ids[0].clone());
    let bystander = Ec2Source::new(r.clone(), ids[1].clone());

    let support = src.action_support().await;
    assert!(
        support.off.as_ref().is_ok_and(|s| s.contains("DryRun")),
        "{support:?}"
    );
    assert!(support.on.is_ok(), "{support:?}");
    // The DryRuns stopped nothing.
    assert_eq!(src.read().await, PowerState::On);

    let running = |r: &Reply| match r.state {
        PowerState::On => Ok(()),
        ref s => Err(format!("not running: {s}")),
    };
    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(running(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { answer } if answer.contains("StopInstances (Force)") && answer.contains(&ids[0])),
        "{outcome:?}"
    );
    reads_until(&src, PowerState::Off).await;
    assert_eq!(
        bystander.read().await,
        PowerState::On,
        "only the node's instance"
    );

    let outcome = src
        .act(PowerAction::Off, &|r: &Reply| checked(running(r)))
        .await;
    assert!(
        matches!(&outcome, ActionOutcome::Refused { .. }),
        "{outcome:?}"
    );

    let outcome = src.act(PowerAction::On, &|_: &Reply| checked(Ok(()))).await;
    assert!(
        matches!(&outcome, ActionOutcome::Sent { answer } if answer.contains("StartInstances")),
        "{outcome:?}"
    );
    reads_until(&src, PowerState::On).await;
}
