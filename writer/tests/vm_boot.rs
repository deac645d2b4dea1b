//! `ingot vm` end to end, as README's "Boot it" runs it (`tests/boot/try-vm`): the boot fixture
//! stack (`tests/boot/build-stack.sh`) built into a signed layout, written by `ingot-writer` run
//! as CAPH runs it onto two sparse disks of a BIOS machine with an NVIDIA GPU and the
//! control-plane role, then booted under SeaBIOS from the VM's SCSI disks: the layers the writer
//! selected for that machine are active, var is formatted on this first boot, the node powers
//! off and `ingot vm` exits 0. The same `--state` boots again: nothing written, var kept.
//!
//! Needs root (the writer's machine checks), qemu-system-x86_64, SeaBIOS and the tools
//! `build-stack.sh` names; skipped with a message without them, except in CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::boot::run_ok;
use ingot_testkit::skip::{have_file, have_root, have_tools};

const SEABIOS: &str = "/usr/share/seabios/bios-256k.bin";
/// TCG beside the rest of the suite: generous, never asserted on.
const TIMEOUT: Duration = Duration::from_secs(900);

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64"])
        && have_file(test, Path::new(SEABIOS))
}

/// The `ingot` binary the workspace build put beside `ingot-writer`.
fn ingot() -> PathBuf {
    let writer = Path::new(env!("CARGO_BIN_EXE_ingot-writer"));
    let ingot = writer.with_file_name("ingot");
    assert!(
        ingot.is_file(),
        "{} is not built (cargo test --workspace builds it)",
        ingot.display()
    );
    ingot
}

/// Runs `ingot vm ARGS` with one core held (TCG, one vCPU); its output, killed at [`TIMEOUT`].
fn ingot_vm(args: &[&std::ffi::OsStr]) -> Output {
    let _core = ingot_testkit::cores::hold(1);
    let started = Instant::now();
    let child = Command::new(ingot())
        .arg("vm")
        .args(args)
        .env("INGOT_WRITER", env!("CARGO_BIN_EXE_ingot-writer"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        while started.elapsed() < TIMEOUT {
            std::thread::sleep(Duration::from_secs(1));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = Command::new("kill").arg(pid.to_string()).status();
    });
    let out = child.wait_with_output().unwrap();
    drop(watchdog);
    eprintln!("ingot vm {args:?}: {:.1?}", started.elapsed());
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn ingot_vm_writes_and_boots_a_two_disk_gpu_control_plane_under_seabios_and_boots_it_again() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let trees = dir.path().join("trees");
    run_ok(Command::new(common::repo_root().join("tests/boot/build-stack.sh")).arg(&trees));
    let (key, public) = (dir.path().join("ingot.key"), dir.path().join("ingot.pub"));
    run_ok(
        Command::new(ingot())
            .args(["key", "generate", "-s"])
            .arg(&key)
            .arg("-p")
            .arg(&public),
    );
    let layout = dir.path().join("layout");
    run_ok(
        Command::new(ingot())
            .arg("build")
            .arg(trees.join("stack.toml"))
            .arg("--out")
            .arg(&layout)
            .arg("--sign-key")
            .arg(&key)
            .arg("--quiet"),
    );
    let state = dir.path().join("vm");
    let machine: [&std::ffi::OsStr; 14] = [
        "--state".as_ref(),
        state.as_os_str(),
        "--firmware".as_ref(),
        "bios".as_ref(),
        "--disks".as_ref(),
        "2".as_ref(),
        "--disk-size".as_ref(),
        "1G".as_ref(),
        "--cpus".as_ref(),
        "1".as_ref(),
        "--memory".as_ref(),
        "1024".as_ref(),
        "--name".as_ref(),
        "vm-cp-1".as_ref(),
    ];
    let mut first: Vec<&std::ffi::OsStr> = vec![layout.as_os_str(), "--trust-key".as_ref()];
    first.push(public.as_os_str());
    first.extend(["--role", "control-plane", "--gpu", "nvidia"].map(std::ffi::OsStr::new));
    first.extend(machine);
    let out = ingot_vm(&first);
    let console = text(&out);
    assert_eq!(out.status.code(), Some(0), "{console}");
    for want in [
        "IMAGE_URL_DONE wrote bootfix 1.0.0",
        "for vm-cp-1 (control-plane)",
        "ingot-node: hostname vm-cp-1",
        "ingot-node: layer active: base",
        "ingot-node: layer active: control-plane",
        "ingot-node: layer active: nvidia",
        "formatting it (first boot)",
        "INGOT-BOOT-OK",
    ] {
        assert!(console.contains(want), "no {want:?}:\n{console}");
    }
    // No uefi: the kata layer's rule (all(virt, uefi)) leaves it out.
    assert!(!console.contains("layer active: kata"), "{console}");

    let out = ingot_vm(&machine);
    let again = text(&out);
    assert_eq!(out.status.code(), Some(0), "{again}");
    assert!(again.contains("again as it was left"), "{again}");
    assert!(!again.contains("IMAGE_URL_DONE"), "written again:\n{again}");
    assert!(!again.contains("formatting it (first boot)"), "{again}");
    assert!(again.contains("INGOT-BOOT-OK"), "{again}");
}
