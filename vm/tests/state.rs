//! The state directory `ingot vm` boots from: sparse disks, the fixture the writer reads, and
//! the machine that boots them with the same disks the writer saw.

use std::os::unix::fs::MetadataExt;

use ingot_machine::{detect, Sysroot};
use ingot_vm::accel::Accel;
use ingot_vm::firmware::{Firmware, Images};
use ingot_vm::machine::{Boot, Net, Serial};
use ingot_vm::state::{Spec, State};

fn spec(disks: usize) -> Spec {
    Spec {
        name: "vm-1".into(),
        firmware: Firmware::Uefi,
        virt: false,
        nvidia_gpu: true,
        cpus: 2,
        memory_mib: 2048,
        disks,
        disk_size: 8 << 30,
        user_net: true,
        ssh_port: Some(2222),
    }
}

#[test]
fn prepare_makes_sparse_disks_and_the_fixture_the_boot_matches() {
    let dir = tempfile::tempdir().unwrap();
    let state = State::new(dir.path().join("vm"));
    assert!(!state.written());
    let node = state.prepare(&spec(2)).unwrap();
    assert!(state.written());
    for i in 0..2 {
        let m = std::fs::metadata(state.disk(i)).unwrap();
        assert_eq!(m.len(), 8 << 30);
        assert_eq!(m.blocks(), 0, "disk {i} is not sparse");
    }
    let facts = detect(&Sysroot::new(state.machine())).unwrap();
    assert!(facts.uefi && facts.nvidia_gpu && !facts.virtualization);
    let wwns: Vec<_> = facts.disks.iter().map(|d| d.wwn.clone().unwrap()).collect();
    assert_eq!(State::root_devices(&node), wwns.join(" "));

    let template = dir.path().join("vars-template.fd");
    std::fs::write(&template, b"vars").unwrap();
    let images = Images {
        code: "/fw/code.fd".into(),
        vars_template: Some(template),
    };
    let m = state
        .machine_to_boot(&spec(2), images.clone(), Accel::Tcg)
        .unwrap();
    // The guest's disks are the writer's: the same WWNs and serials, in the same order.
    let booted: Vec<_> = m.disks.iter().map(|d| d.id.clone().unwrap()).collect();
    let written: Vec<_> = node.disks.iter().map(|d| d.id.clone()).collect();
    assert_eq!(booted, written);
    assert_eq!(
        m.boot,
        Boot::Uefi {
            code: "/fw/code.fd".into(),
            vars: state.vars()
        }
    );
    assert_eq!(std::fs::read(state.vars()).unwrap(), b"vars");
    assert!(matches!(&m.net, Net::User(u) if u.ssh_port == Some(2222)));
    assert_eq!(m.serial, Serial::Terminal);
    // A second boot keeps the variable store as the first left it.
    std::fs::write(state.vars(), b"changed by the firmware").unwrap();
    state.machine_to_boot(&spec(2), images, Accel::Tcg).unwrap();
    assert_eq!(
        std::fs::read(state.vars()).unwrap(),
        b"changed by the firmware"
    );
}

/// Re-provisioning writes over the same disks: their contents stay until the writer runs,
/// and the fixture is written anew.
#[test]
fn prepare_again_keeps_the_disks() {
    let dir = tempfile::tempdir().unwrap();
    let state = State::new(dir.path());
    state.prepare(&spec(1)).unwrap();
    std::fs::write(state.disk(0), b"written before").unwrap();
    std::fs::write(state.machine().join("stale"), b"").unwrap();
    state.prepare(&spec(1)).unwrap();
    assert_eq!(std::fs::read(state.disk(0)).unwrap(), b"written before");
    assert!(!state.machine().join("stale").exists());
}

#[test]
fn an_empty_state_has_nothing_to_boot() {
    let dir = tempfile::tempdir().unwrap();
    let images = Images {
        code: "/b".into(),
        vars_template: None,
    };
    let err = State::new(dir.path())
        .machine_to_boot(&spec(1), images, Accel::Tcg)
        .unwrap_err();
    assert!(err.to_string().contains("no disk0.img"), "{err}");
    let err = State::new(dir.path()).prepare(&spec(0)).unwrap_err();
    assert!(err.to_string().contains("--disks"), "{err}");
}

/// The machine is kept whole and read back; a directory without one has none; a damaged one is
/// refused naming the file, not taken for the defaults.
#[test]
fn the_machine_is_kept_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let state = State::new(dir.path());
    assert_eq!(state.kept_spec().unwrap(), None);
    state.keep_spec(&spec(2)).unwrap();
    assert_eq!(state.kept_spec().unwrap(), Some(spec(2)));
    let text = std::fs::read_to_string(state.spec_file()).unwrap();
    assert!(text.contains("\"firmware\": \"uefi\""), "{text}");
    std::fs::write(state.spec_file(), b"{\"firmware\": \"uefi\"").unwrap();
    let err = state.kept_spec().unwrap_err().to_string();
    assert!(err.contains("vm.json"), "{err}");
    assert_eq!(Spec::default().firmware, Firmware::Uefi);
}

/// A key set without its files is refused before anything runs, naming the file.
#[test]
fn enrolling_an_incomplete_key_set_names_the_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("PK.auth"), b"").unwrap();
    let err = ingot_vm::secure_boot::enroll(
        &ingot_vm::firmware::Lookup::system(),
        dir.path(),
        std::path::Path::new("/fw/code.fd"),
        &dir.path().join("vars.fd"),
        Accel::Tcg,
        &dir.path().join("work"),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("KEK.auth") && text.contains("ingot key secure-boot"),
        "{text}"
    );
    assert!(!dir.path().join("work").exists());
}

/// What `ingot vm ssh` reads: the port is kept or removed with the machine's network, the key
/// kept by its absolute path.
#[test]
fn the_ssh_port_and_key_are_kept_for_ingot_vm_ssh() {
    let dir = tempfile::tempdir().unwrap();
    let state = State::new(dir.path());
    let key = dir.path().join("id_ed25519");
    std::fs::write(&key, b"key").unwrap();
    state.keep_ssh(Some(2222), Some(&key)).unwrap();
    let port = std::fs::read_to_string(state.ssh_port_file()).unwrap();
    assert_eq!(port, "2222\n");
    assert_eq!(state.ssh_identity(), Some(key.canonicalize().unwrap()));
    state.keep_ssh(None, None).unwrap();
    assert!(!state.ssh_port_file().exists());
    assert_eq!(state.ssh_identity(), Some(key.canonicalize().unwrap()));
    state.keep_ssh(None, None).unwrap();
}
