//! Secure Boot for the boot tests: a key set enrolled into a copy of OVMF's variable store the
//! documented way (systemd-boot's `secure-boot-enroll`, run by `ingot vm`'s enrollment), and the
//! signed systemd-boot that did it.

use std::fs;
use std::path::{Path, PathBuf};

use ingot::uki::SecureBootKey;
use ingot_testkit::qemu::{Firmware, Lookup, OVMF_CODE_SECBOOT, OVMF_VARS};
use ingot_testkit::skip::{have_file, have_tools};
use ingot_vm::accel::Accel;

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

/// Enrolls the key set `ingot key secure-boot` wrote beside `key` the documented way, with
/// `ingot vm`'s own enrollment (`ingot_vm::secure_boot`): OVMF's variable store without keys
/// (Setup Mode), an ESP with a db-signed systemd-boot, `loader.conf` saying
/// `secure-boot-enroll force` and the `.auth` files in `loader/keys/auto/`; systemd-boot enrolls
/// them and resets the machine (`-no-reboot`: qemu exits).
pub fn enroll(dir: tempfile::TempDir, key: &SecureBootKey) -> Enrolled {
    let keys = key.cert.parent().unwrap();
    let vars = dir.path().join("vars.fd");
    fs::copy(OVMF_VARS, &vars).unwrap();
    let lookup = Lookup::system();
    let code = lookup
        .firmware(Firmware::SecureBoot)
        .unwrap_or_else(|e| panic!("{e}"))
        .code;
    let work = dir.path().join("enroll");
    let started = std::time::Instant::now();
    {
        let _core = ingot_testkit::cores::hold(1);
        ingot_vm::secure_boot::enroll(&lookup, keys, &code, &vars, Accel::Tcg, &work)
            .unwrap_or_else(|e| panic!("enrolling {}: {e}", keys.display()));
    }
    eprintln!("enroll: {:.1?}", started.elapsed());
    Enrolled {
        _dir: dir,
        vars,
        // What enrollment signed and booted.
        sdboot: work.join("BOOTX64.EFI"),
    }
}
