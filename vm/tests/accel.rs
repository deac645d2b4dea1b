//! The accelerator choice against the real QEMU and this machine's `/dev/kvm`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use ingot_testkit::{skip, test_name};
use ingot_vm::accel::{self, Accel, ProbeError, Unusable};

/// The probe guest's bytes are probe.S as GNU as assembles it (the comments there are the code).
#[test]
fn the_probe_image_is_probe_s_assembled() {
    if !skip::have_tools(test_name!(), &["as", "objcopy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/accel/probe.S");
    let (object, image) = (dir.path().join("probe.o"), dir.path().join("probe.bin"));
    run(Command::new("as")
        .arg("--64")
        .arg("-o")
        .arg(&object)
        .arg(&source));
    run(Command::new("objcopy")
        .args(["-O", "binary", "-j", ".text"])
        .arg(&object)
        .arg(&image));
    assert!(std::fs::read(&image).unwrap() == accel::probe_image());
}

/// The oracle that makes the probe trustworthy: under TCG the same guest finishes with its
/// status, so a KVM probe that fails fails because of KVM, not the guest.
#[test]
fn the_probe_guest_finishes_under_tcg() {
    if !skip::have_tool(test_name!(), accel::QEMU) {
        return;
    }
    let ran = accel::probe(Accel::Tcg).expect("the probe guest under TCG");
    eprintln!("probe guest under TCG: {ran:?}");
}

/// The choice is made within 10 s (the bound), and a fall back to TCG says why. Where
/// KVM is PVM (kvm_pvm: no hardware virtualization, each guest instruction emulated) the
/// probe guest must not finish in time.
#[test]
fn the_choice_falls_back_to_tcg_within_10_s_naming_why() {
    if !skip::have_tool(test_name!(), accel::QEMU) {
        return;
    }
    let started = Instant::now();
    let choice = accel::choose(None).unwrap();
    let took = started.elapsed();
    eprintln!("{:?} after {took:?}: {:?}", choice.accel, choice.warning());
    assert!(took.as_secs() < 10, "{took:?}");
    match choice.accel {
        Accel::Tcg => assert!(choice.warning().is_some_and(|w| !w.contains('\n'))),
        Accel::Kvm => assert!(choice.why.is_none()),
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        assert!(
            matches!(
                choice.why,
                Some(Unusable::Probe(ProbeError::TimedOut { .. }))
            ),
            "{choice:?}"
        );
    }
}

#[test]
fn forced_tcg_is_taken_as_it_is() {
    let choice = accel::choose(Some(Accel::Tcg)).unwrap();
    assert_eq!(choice.accel, Accel::Tcg);
    assert!(choice.why.is_none() && choice.warning().is_none());
}

/// Forced KVM skips the probe (KVM here even where the probe fails) but not `/dev/kvm`.
#[test]
fn forced_kvm_needs_dev_kvm_but_no_probe() {
    let opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm");
    match (accel::choose(Some(Accel::Kvm)), opens) {
        (Ok(choice), Ok(_)) => assert!(choice.accel == Accel::Kvm && choice.why.is_none()),
        (Err(err), Err(_)) => eprintln!("forced KVM refused: {err}"),
        (chosen, opens) => panic!("choice {chosen:?} but /dev/kvm opening gave {opens:?}"),
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}
