//! The release's unified kernel image (UKI): systemd-stub from the base layer, the base's
//! kernel and initrd, its os-release and the signed command line
//! ([`ingot_layers::boot::signed_cmdline`]), laid out with `objcopy` at the section addresses
//! systemd-stub 252's manual gives (Debian 12 has no `ukify`), then Authenticode-signed with the
//! release's Secure Boot db key by `sbsign`.
//!
//! Both tools stamp the current time (objcopy the PE header's TimeDateStamp, sbsign the
//! PKCS#7 signingTime): both run under `faketime` frozen at the stack's `source_date_epoch`, so
//! two builds of one manifest with one key give the same bytes (an RSA PKCS#1 v1.5 signature
//! has no randomness). Writing PE layout and Authenticode ourselves would be a second, untested
//! implementation of what the firmware checks; these are the tools the reference recipe uses.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use ingot_artifact::image_file::ImageFile;
use ingot_artifact::pcr_policy::{self, PcrKey};
use ingot_layers::descriptor::BootFiles;

use crate::tool::ToolError;

/// Where systemd-boot-efi installs the stub, in the base layer.
pub const STUB_PATH: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
/// os-release, in the order systemd reads it.
const OS_RELEASE: [&str; 2] = ["/etc/os-release", "/usr/lib/os-release"];
/// Section addresses from systemd-stub(7) and systemd-measure(1) of systemd 252 (the stub
/// itself ends below 0x20000), with the file each is written to in the work directory.
const SECTIONS: [(&str, &str, &str); 6] = [
    (".osrel", "0x20000", "osrel"),
    (".cmdline", "0x30000", "cmdline"),
    (".pcrsig", "0x80000", "pcrsig.json"),
    (".pcrpkey", "0x90000", "pcrpkey.pem"),
    (".linux", "0x2000000", "linux"),
    (".initrd", "0x3000000", "initrd"),
];

/// The operator's Secure Boot db key and certificate (PEM).
#[derive(Debug, Clone)]
pub struct SecureBootKey {
    pub key: PathBuf,
    pub cert: PathBuf,
}

/// The keys a UKI is made with: the Secure Boot db key signs the image, the PCR key (if any)
/// signs its PCR 11 policy.
pub struct Signer<'a> {
    pub db: &'a SecureBootKey,
    pub pcr: Option<&'a PcrKey>,
}

/// What goes into the UKI from the base layer.
pub struct BootParts {
    pub stub: Vec<u8>,
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    pub osrel: Vec<u8>,
}

/// Why no UKI was made.
#[derive(Debug, thiserror::Error)]
pub enum UkiError {
    #[error("the base layer's {what} {path:?}: {reason}")]
    BaseFile {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("the signed command line is {len} bytes, more than the {max} x86 Linux keeps")]
    CmdlineTooLong { len: usize, max: usize },
    #[error(transparent)]
    PcrPolicy(#[from] ingot_artifact::pcr_policy::PcrPolicyError),
}

/// The stub, kernel, initrd and os-release from the base layer's built image `img` (symlinks
/// followed, as the kernel would).
pub fn read_parts(img: &Path, boot: &BootFiles) -> Result<BootParts, UkiError> {
    let file = File::open(img).map_err(|source| UkiError::Io {
        what: "opening",
        path: img.to_owned(),
        source,
    })?;
    let fs = ext4_view::Ext4::load(Box::new(ImageFile(file))).map_err(|e| UkiError::BaseFile {
        what: "image",
        path: img.display().to_string(),
        reason: e.to_string(),
    })?;
    let read = |what: &'static str, path: &str| {
        fs.read(path).map_err(|e| UkiError::BaseFile {
            what,
            path: path.to_string(),
            reason: format!("{e} (a Secure Boot build needs it)"),
        })
    };
    let osrel = OS_RELEASE
        .iter()
        .find_map(|p| fs.read(*p).ok())
        .ok_or_else(|| UkiError::BaseFile {
            what: "os-release",
            path: OS_RELEASE.join(" or "),
            reason: "missing".into(),
        })?;
    Ok(BootParts {
        stub: read("systemd-stub (systemd-boot-efi)", STUB_PATH)?,
        kernel: read("kernel", &boot.kernel)?,
        initrd: read("initrd", &boot.initrd)?,
        osrel,
    })
}

/// `YYYY-MM-DD hh:mm:ss` of an RFC 3339 UTC time: a frozen clock for `faketime`.
fn frozen_clock(created: &str) -> String {
    created.trim_end_matches('Z').replace('T', " ")
}

/// Runs `tool` (from `package`) with `args` under `faketime`, the clock frozen at `created`.
fn run(
    tool: &'static str,
    package: &'static str,
    created: &str,
    args: &[&std::ffi::OsStr],
) -> Result<(), UkiError> {
    let mut cmd = Command::new("faketime");
    cmd.env("TZ", "UTC")
        .arg("-f")
        .arg(frozen_clock(created))
        .arg(tool)
        .args(args);
    match crate::tool::run("faketime", "faketime", &mut cmd) {
        Ok(()) => Ok(()),
        // faketime ran, the tool failed (or was not found: say which package brings it).
        Err(ToolError::Failed { status, stderr, .. }) => {
            let stderr = if stderr.contains("No such file") && stderr.contains(tool) {
                format!("{stderr} (install {package})")
            } else {
                stderr
            };
            Err(ToolError::Failed {
                tool,
                status,
                stderr,
            }
            .into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Assembles and signs the UKI in `work` with the clock frozen at `created` (the descriptor's
/// RFC 3339 time, from `source_date_epoch`); returns its bytes. With a PCR key the UKI also
/// carries `.pcrpkey` and the `.pcrsig` of the PCR 11 values its own sections leave.
pub fn make(
    parts: &BootParts,
    cmdline: &str,
    created: &str,
    keys: &Signer,
    work: &Path,
) -> Result<Vec<u8>, UkiError> {
    let max = ingot_layers::boot::COMMAND_LINE_SIZE - 1;
    if cmdline.len() > max {
        return Err(UkiError::CmdlineTooLong {
            len: cmdline.len(),
            max,
        });
    }
    fs::create_dir_all(work).map_err(|source| UkiError::Io {
        what: "creating",
        path: work.to_owned(),
        source,
    })?;
    let mut sections: Vec<(&str, Vec<u8>)> = vec![
        (".osrel", parts.osrel.clone()),
        (".cmdline", cmdline.as_bytes().to_vec()),
        (".linux", parts.kernel.clone()),
        (".initrd", parts.initrd.clone()),
    ];
    if let Some(pcr) = keys.pcr {
        sections.push((".pcrpkey", pcr.public_pem().as_bytes().to_vec()));
        let measured: Vec<(&str, &[u8])> = sections.iter().map(|(n, b)| (*n, &b[..])).collect();
        let stub = ingot_artifact::uki::pcr11_of(&measured);
        let sig = pcr.sign(stub, &pcr_policy::PHASES)?;
        let json = serde_json::to_vec(&sig).expect("a PcrSig serialises");
        sections.push((".pcrsig", json));
    }
    write_file(&work.join("stub.efi"), &parts.stub)?;
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    for (section, vma, file) in SECTIONS {
        let Some((_, bytes)) = sections.iter().find(|(n, _)| *n == section) else {
            continue;
        };
        write_file(&work.join(file), bytes)?;
        let mut add = std::ffi::OsString::from(format!("{section}="));
        add.push(work.join(file));
        args.extend(["--add-section".into(), add]);
        args.extend([
            "--change-section-vma".into(),
            format!("{section}={vma}").into(),
        ]);
    }
    let unsigned = work.join("uki.unsigned.efi");
    let signed = work.join("uki.efi");
    args.push(work.join("stub.efi").into());
    args.push(unsigned.clone().into());
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    run("objcopy", "binutils", created, &refs)?;
    let sign: [&std::ffi::OsStr; 7] = [
        "--key".as_ref(),
        keys.db.key.as_os_str(),
        "--cert".as_ref(),
        keys.db.cert.as_os_str(),
        "--output".as_ref(),
        signed.as_os_str(),
        unsigned.as_os_str(),
    ];
    run("sbsign", "sbsigntool", created, &sign)?;
    fs::read(&signed).map_err(|source| UkiError::Io {
        what: "reading",
        path: signed,
        source,
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), UkiError> {
    fs::write(path, bytes).map_err(|source| UkiError::Io {
        what: "writing",
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_the_epoch_in_utc() {
        assert_eq!(frozen_clock("2023-11-14T22:13:20Z"), "2023-11-14 22:13:20");
    }
}
