//! Secure Boot for a VM: a key set (`ingot key secure-boot --out DIR`: `PK.auth`, `KEK.auth`,
//! `db.auth`, `db.key`, `db.crt`) enrolled into the VM's variable store the documented way.
//! OVMF's variable store template has no keys (Setup Mode); a FAT disk with systemd-boot
//! signed by the db key, `loader.conf` saying `secure-boot-enroll force` and the `.auth` files
//! in `loader/keys/auto/` boots once under OVMF's Secure Boot build, systemd-boot enrolls the
//! keys and resets the machine (`-no-reboot`: QEMU exits). From then on Secure Boot is on.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::accel::Accel;
use crate::firmware::{Lookup, Missing};
use crate::machine::{Boot, Disk, Machine, Serial};
use crate::run::{self, End, Watch};

/// Debian's systemd-boot, which enrolls the keys.
pub const SDBOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
/// What systemd-boot prints when it enrolls.
pub const ENROLLING: &str = "Enrolling secure boot keys";
/// The key set's files enrollment needs.
pub const KEY_FILES: [&str; 5] = ["PK.auth", "KEK.auth", "db.auth", "db.key", "db.crt"];
/// The enrollment boot under TCG takes well under a minute; generous for a loaded host.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Enrolling failed.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error(transparent)]
    Missing(#[from] Missing),
    #[error(
        "{} is not in the key set {} (make one with `ingot key secure-boot --out DIR`)",
        file,
        dir.display()
    )]
    KeyFile { dir: PathBuf, file: &'static str },
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{tool} failed: {stderr}")]
    Tool { tool: String, stderr: String },
    #[error(transparent)]
    Run(#[from] run::RunError),
    #[error("systemd-boot did not enroll the keys ({end:?}); the console's end:\n{tail}")]
    NotEnrolled { end: End, tail: String },
}

/// Enrolls the key set in `keys` into the variable store `vars` (a copy of OVMF's template,
/// written in place), with OVMF's Secure Boot build `code`, under `accel`; `work` holds the
/// enrollment disk and its console.
pub fn enroll(
    lookup: &Lookup,
    keys: &Path,
    code: &Path,
    vars: &Path,
    accel: Accel,
    work: &Path,
) -> Result<(), EnrollError> {
    for file in KEY_FILES {
        if !keys.join(file).is_file() {
            return Err(EnrollError::KeyFile {
                dir: keys.into(),
                file,
            });
        }
    }
    let sdboot = lookup.file(SDBOOT, "systemd-boot", "systemd-boot-efi")?;
    let sbsign = lookup.program("sbsign", "sbsigntool")?;
    let mkfs = lookup.program("mkfs.fat", "dosfstools")?;
    let mmd = lookup.program("mmd", "mtools")?;
    let mcopy = lookup.program("mcopy", "mtools")?;
    std::fs::create_dir_all(work).map_err(|source| EnrollError::Io {
        path: work.into(),
        source,
    })?;
    let signed = work.join("BOOTX64.EFI");
    tool(
        Command::new(sbsign)
            .arg("--key")
            .arg(keys.join("db.key"))
            .arg("--cert")
            .arg(keys.join("db.crt"))
            .arg("--output")
            .arg(&signed)
            .arg(&sdboot),
    )?;
    let conf = work.join("loader.conf");
    std::fs::write(&conf, "secure-boot-enroll force\ntimeout 0\n").map_err(|source| {
        EnrollError::Io {
            path: conf.clone(),
            source,
        }
    })?;
    let esp = work.join("enroll-esp.img");
    tool(
        Command::new(mkfs)
            .args(["-C", "-n", "ENROLL"])
            .arg(&esp)
            .arg("65536"),
    )?;
    let mut dirs = Command::new(mmd);
    dirs.arg("-i").arg(&esp);
    for d in [
        "EFI",
        "EFI/BOOT",
        "loader",
        "loader/keys",
        "loader/keys/auto",
    ] {
        dirs.arg(format!("::/{d}"));
    }
    tool(&mut dirs)?;
    let mut files: Vec<(PathBuf, String)> = vec![
        (signed, "EFI/BOOT/BOOTX64.EFI".into()),
        (conf, "loader/loader.conf".into()),
    ];
    for auth in ["PK.auth", "KEK.auth", "db.auth"] {
        files.push((keys.join(auth), format!("loader/keys/auto/{auth}")));
    }
    for (from, to) in files {
        tool(
            Command::new(&mcopy)
                .arg("-i")
                .arg(&esp)
                .arg(from)
                .arg(format!("::/{to}")),
        )?;
    }
    let log = work.join("enroll.serial");
    let mut m = Machine::new(
        Boot::SecureBoot {
            code: code.into(),
            vars: vars.into(),
        },
        Serial::File(log.clone()),
    );
    m.accel = accel;
    m.memory_mib = 512;
    m.disks.push(Disk {
        image: esp,
        id: None,
    });
    let stderr = work.join("enroll.err");
    let watch = Watch {
        log: &log,
        stderr: &stderr,
        until: &[],
        timeout: TIMEOUT,
        silence: None,
    };
    let ran = run::watch(m.command(), &watch)?;
    if !ran.console.contains(ENROLLING) {
        return Err(EnrollError::NotEnrolled {
            end: ran.end,
            tail: crate::console::tail(&ran.console, 20),
        });
    }
    Ok(())
}

/// Runs a tool to its end; its stderr when it failed.
fn tool(cmd: &mut Command) -> Result<(), EnrollError> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|source| EnrollError::Io {
        path: name.clone().into(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EnrollError::Tool {
            tool: name,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
