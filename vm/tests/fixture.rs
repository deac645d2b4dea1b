//! The machine fixture a VM writes, read by the writer's own detection and SMART gate
//! (ingot-machine): what the writer detects is what the VM was described as.

use std::path::Path;

use ingot_machine::host::Fixture;
use ingot_machine::{detect, gate_smart, Sysroot};
use ingot_vm::firmware::Firmware;
use ingot_vm::fixture::{self, Node, NodeDisk};

fn node(dir: &Path, firmware: Firmware, extras: bool, disks: usize) -> Node {
    Node {
        firmware,
        virt: extras,
        nvidia_gpu: extras,
        cpus: 2,
        disks: (0..disks)
            .map(|i| NodeDisk::numbered(i, dir.join(format!("disk{i}.img")), (3 + i as u64) << 30))
            .collect(),
        user_net: extras,
    }
}

/// On QEMU's user network the writer reads the guest's slirp address, gateway and name server,
/// on the NIC's MAC (what the node's networkd file matches); without it, nothing.
#[test]
fn the_writer_reads_the_user_network_as_the_rescue_systems() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("machine");
    fixture::write(&root, &node(dir.path(), Firmware::Uefi, true, 1)).unwrap();
    let read = |f: &str| std::fs::read(root.join("ip").join(f)).unwrap();
    let resolv = std::fs::read_to_string(root.join("etc/resolv.conf")).unwrap();
    let net = ingot_bootstrap::network_from_ip_json(
        &read("addr.json"),
        &read("route.json"),
        Some(&read("route6.json")),
        &resolv,
    )
    .unwrap();
    assert_eq!(net.interfaces.len(), 1, "{net:?}");
    let eth = &net.interfaces[0];
    assert_eq!(eth.mac, "52:54:00:12:34:56");
    assert_eq!(eth.addresses, ["10.0.2.15/24"]);
    assert_eq!(eth.gateway4.as_deref(), Some("10.0.2.2"));
    assert_eq!(net.dns, ["10.0.2.3"]);

    let bare = dir.path().join("bare");
    fixture::write(&bare, &node(dir.path(), Firmware::Uefi, false, 1)).unwrap();
    assert!(!bare.join("ip").exists() && !bare.join("etc/resolv.conf").exists());
}

/// A Secure Boot VM has swtpm's TPM 2.0, and the writer sees it; the others have none.
#[test]
fn the_writer_sees_the_secure_boot_machines_tpm() {
    let dir = tempfile::tempdir().unwrap();
    for (firmware, tpm) in [(Firmware::SecureBoot, Some(2)), (Firmware::Uefi, None)] {
        let root = dir.path().join(firmware.name());
        fixture::write(&root, &node(dir.path(), firmware, false, 1)).unwrap();
        assert_eq!(
            detect(&Sysroot::new(&root)).unwrap().tpm,
            tpm,
            "{firmware:?}"
        );
    }
}

#[test]
fn the_writer_detects_the_machine_the_vm_is() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("machine");
    let node = node(dir.path(), Firmware::Uefi, true, 2);
    fixture::write(&root, &node).unwrap();
    let facts = detect(&Sysroot::new(&root)).unwrap();
    assert!(
        facts.uefi && facts.virtualization && facts.nvidia_gpu,
        "{facts:?}"
    );
    let names: Vec<_> = facts.disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["sda", "sdb"]);
    for (disk, described) in facts.disks.iter().zip(&node.disks) {
        assert_eq!(disk.wwn.as_deref(), Some(described.id.wwn.as_str()));
        assert_eq!(disk.serial.as_deref(), Some(described.id.serial.as_str()));
        assert_eq!(disk.size_bytes, described.size_bytes);
        assert_eq!(disk.node.canonicalize().ok(), None, "no image yet");
        assert_eq!(std::fs::read_link(&disk.node).unwrap(), described.image);
        // QEMU's disk has no SMART: a warning, not a stop.
        let smart = gate_smart(disk, &Fixture::new(&root)).unwrap();
        assert_eq!(smart.warnings.len(), 1, "{smart:?}");
    }
}

#[test]
fn a_bios_machine_without_virtualization_or_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("machine");
    fixture::write(&root, &node(dir.path(), Firmware::Bios, false, 1)).unwrap();
    let facts = detect(&Sysroot::new(&root)).unwrap();
    assert!(!facts.uefi && !facts.cpu_virt_flags && !facts.kvm_device && !facts.nvidia_gpu);
    assert_eq!(facts.disks.len(), 1);
}

/// A fixture is written whole: an existing directory is not written over.
#[test]
fn an_existing_fixture_is_not_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let err = fixture::write(dir.path(), &node(dir.path(), Firmware::Uefi, false, 1)).unwrap_err();
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
}
