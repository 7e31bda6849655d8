//! Fence agents whose "off" is not a machine without power. `fence_vmware_rest` reads a
//! SUSPENDED VM as off (Debian's fence-agents 4.12: `'SUSPENDED': "off"`); a suspended VM
//! resumes with its memory and writes to volumes attached elsewhere. The real agent against
//! the project's vCenter REST server, through a real daemon process and a reload.

use super::*;
use support::daemon_process::DaemonProcess;
use support::k8s::{bound_pod, free_port, kubeconfig_path, pods_on, with_claim};
use support::vcenter::{self, VcenterRest};

/// A node whose VM is suspended (its kubelet silent, NotReady, a pod with a claim bound to
/// it) beside a control node on a Redfish BMC. A reload maps the VM's node to the real
/// `fence_vmware_rest`, which its vCenter answers "off" for the suspended VM: the reload is
/// refused naming why, the daemon serves on with its old config, and the node is never fenced
/// and its pod kept; the control node's power cut is fenced.
pub(super) fn a_suspended_vm_behind_a_real_agent_is_never_fenced() -> ScenarioFuture {
    Box::pin(async {
        let s = Scenario::redfish("fm-suspended", 1).await;
        let control = s.node("control", 0).await;
        let vm_node = s
            .node_reporting(
                "vm",
                FIRST_BOOT,
                KubeletIdentity::uuid("42a1b2c3-d4e5-f607-1829-3a4b5c6d7e8f"),
            )
            .await;
        let vcenter = VcenterRest::start(&[("vm-101", &vm_node.name, "POWERED_ON")]);
        let pod = format!("{}-db", vm_node.name);
        bound_pod(&s.client, &vm_node.name, &pod, with_claim).await;
        let rec = WriteRecorder::start(&s.client, &s.group).await;
        let listen = format!("127.0.0.1:{}", free_port());
        let config = s.write_config(&kubeconfig_path(), &listen);
        let daemon = DaemonProcess::start(&config, &listen, s.dir(), &[], &[]).await;
        // The VM is suspended: its kubelet stops with it.
        vcenter.set_vms(&[("vm-101", &vm_node.name, "SUSPENDED")]);
        vm_node.die(FIRST_BOOT).await;
        // What the agent itself says of it: off.
        let status = std::process::Command::new("/usr/sbin/fence_vmware_rest")
            .args([
                "--ip=127.0.0.1",
                &format!("--ipport={}", vcenter.port()),
                &format!("--username={}", vcenter::USERNAME),
                &format!("--password={}", vcenter::PASSWORD),
                &format!("--plug={}", vm_node.name),
                "--action=status",
            ])
            .output()
            .expect("run fence_vmware_rest");
        assert_eq!(
            status.status.code(),
            Some(2),
            "the agent reads the suspended VM as off: {}",
            String::from_utf8_lossy(&status.stdout)
        );
        // The reload that would trust it.
        s.map_fence_agent(
            "vm",
            vcenter::PASSWORD,
            &format!(
                "agent = \"fence_vmware_rest\"\nusername = \"{}\"\nplug = \"{{node}}\"\noptions = {{ ip = \"127.0.0.1\", ipport = \"{}\" }}",
                vcenter::USERNAME,
                vcenter.port()
            ),
        );
        s.write_config(&kubeconfig_path(), &listen);
        let refused = daemon.reload_refused().await;
        assert!(refused.contains("fence_vmware_rest"), "{refused}");
        assert!(refused.contains("SUSPENDED"), "{refused}");
        // The daemon serves on: the control node's power cut is fenced.
        power_cut(&s, &control, 0).await;
        wait_taint(&control, EVENT_BOUND).await;
        let r = daemon
            .wait_report(
                &vm_node.name,
                "no power source (the reload refused)",
                EVENT_BOUND,
                |r| r["rule"] == "no-power-source",
            )
            .await;
        assert!(r["fence"].is_null(), "{r}");
        assert!(
            pods_on(&s.client, &vm_node.name).await.contains(&pod),
            "the suspended VM's pod was deleted"
        );
        assert!(!FakeNode::has_oos_taint(&vm_node.get().await));
        daemon.stop().await;
        let expected = vec![Write::Taint(control.name.clone())];
        let seen = rec.writes_once_seen(&expected).await;
        for n in [&control, &vm_node] {
            n.delete().await;
        }
        Outcome {
            name: "fence agent: a suspended VM behind fence_vmware_rest, mapped by a reload",
            expected,
            seen,
        }
    })
}
