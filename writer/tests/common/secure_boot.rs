//! Secure Boot for the boot tests: a key set enrolled into a copy of OVMF's variable store the
//! documented way (systemd-boot's `secure-boot-enroll`), and the signed systemd-boot that did it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use ingot::uki::SecureBootKey;
use ingot_testkit::qemu::{run_qemu, vm_secure_boot, OVMF_CODE_SECBOOT, OVMF_VARS};
use ingot_testkit::skip::{have_file, have_tools};

use super::boot::run_ok;

/// Debian's systemd-boot (package `systemd-boot-efi`), signed by the tests with their db key.
pub const SDBOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

/// The tools [`enroll`] and `ingot build --secure-boot-key` run.
pub const TOOLS: [&str; 7] = [
    "sbsign",
    "faketime",
    "objcopy",
    "openssl",
    "cert-to-efi-sig-list",
    "sign-efi-sig-list",
    "mcopy",
];

/// Whether the tools, OVMF's Secure Boot build and systemd-boot are here (in CI they must be).
pub fn usable(test: &str) -> bool {
    have_tools(test, &TOOLS)
        && have_file(test, Path::new(OVMF_CODE_SECBOOT))
        && have_file(test, Path::new(SDBOOT))
}

/// `manifest` with `args` as its own kernel arguments (`[boot] kernel_args`, which the signed
/// command line carries), written beside it as `name`; returns its path.
pub fn with_kernel_args(manifest: &Path, name: &str, args: &[&str]) -> PathBuf {
    let list = args
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = fs::read_to_string(manifest).unwrap();
    assert!(!text.contains("kernel_args"), "{}", manifest.display());
    let text = text.replacen("[boot]\n", &format!("[boot]\nkernel_args = [{list}]\n"), 1);
    assert!(
        text.contains("kernel_args"),
        "no [boot] in {}",
        manifest.display()
    );
    let out = manifest.with_file_name(name);
    fs::write(&out, text).unwrap();
    out
}

/// A fresh PK/KEK/db set (`ingot key secure-boot`) in `dir/keys`; the db key signs.
pub fn key_set(dir: &Path, name: &str) -> SecureBootKey {
    let keys = dir.join("keys");
    let owner = uuid::Uuid::new_v4().to_string();
    ingot::sb_keys::generate(&keys, name, &owner, false).unwrap();
    SecureBootKey {
        key: keys.join("db.key"),
        cert: keys.join("db.crt"),
    }
}

/// An OVMF variable store with the test's key set enrolled (Secure Boot on).
pub struct Enrolled {
    _dir: tempfile::TempDir,
    pub vars: PathBuf,
    /// systemd-boot, signed with the db key.
    pub sdboot: PathBuf,
}

/// Makes a key set and enrolls it the documented way: OVMF's variable store without keys
/// (Setup Mode), an ESP with a db-signed systemd-boot, `loader.conf` saying
/// `secure-boot-enroll force` and the `.auth` files in `loader/keys/auto/`; systemd-boot enrolls
/// them and resets the machine (`-no-reboot`: qemu exits).
pub fn enroll(dir: tempfile::TempDir, key: &SecureBootKey) -> Enrolled {
    // `ingot key secure-boot` writes the .auth files beside the db key.
    let keys = key.cert.parent().unwrap().to_path_buf();
    let sdboot = dir.path().join("systemd-bootx64.efi");
    run_ok(
        Command::new("sbsign")
            .arg("--key")
            .arg(&key.key)
            .arg("--cert")
            .arg(&key.cert)
            .arg("--output")
            .arg(&sdboot)
            .arg(SDBOOT),
    );
    let read = |p: PathBuf| fs::read(p).unwrap();
    let (sd, pk, kek, db) = (
        read(sdboot.clone()),
        read(keys.join("PK.auth")),
        read(keys.join("KEK.auth")),
        read(keys.join("db.auth")),
    );
    let files: Vec<(&str, &[u8])> = vec![
        ("EFI/BOOT/BOOTX64.EFI", &sd),
        (
            "loader/loader.conf",
            b"secure-boot-enroll force\ntimeout 0\n",
        ),
        ("loader/keys/auto/PK.auth", &pk),
        ("loader/keys/auto/KEK.auth", &kek),
        ("loader/keys/auto/db.auth", &db),
    ];
    let esp = dir.path().join("enroll-esp.img");
    fs::write(
        &esp,
        ingot_writer::boot::fat::build(64 << 20, &files, 7).unwrap(),
    )
    .unwrap();
    let vars = dir.path().join("vars.fd");
    fs::copy(OVMF_VARS, &vars).unwrap();
    let log = dir.path().join("enroll.serial");
    let mut cmd = vm_secure_boot(1, 512, &vars);
    cmd.arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", esp.display()))
        .arg("-serial")
        .arg(format!("file:{}", log.display()));
    let console = run_qemu(cmd, &log, &dir.path().join("enroll.err"), "enroll");
    assert!(
        console.contains("Enrolling secure boot keys"),
        "systemd-boot did not enroll:\n{console}"
    );
    Enrolled {
        _dir: dir,
        vars,
        sdboot,
    }
}
