//! `boot::uki`: the Secure Boot chain. The release's signed UKI (checked in `verify`), byte for
//! byte, as the removable-media loader, and this machine's own values as systemd-stub
//! credentials beside it (the node layer's root hash; `var`'s members). No loader entry, no
//! kernel or initrd of their own, no GRUB: nothing on the ESP could choose another command
//! line. `--kernel-arg` cannot reach the signed command line: it is ignored, with a warning.

use super::esp::{self, BOOT_EFI_PATH};
use super::{BootDisk, EspError, Written};
use crate::node::NodeLayer;
use crate::report::Stage;

/// Where systemd-stub looks for credentials next to the UKI it runs.
pub const CREDENTIALS_DIR: &str = "EFI/BOOT/BOOTX64.EFI.extra.d";
/// The systemd-stub credential holding the node layer's root hash: 64 lower-case hex digits,
/// nothing else (in [`CREDENTIALS_DIR`], copied by the stub to `/.extra/credentials/` in the
/// initrd and measured into TPM PCR 12).
pub const NODE_CREDENTIAL: &str = "ingot-node.cred";
/// The credential holding `var`'s members: `PARTUUID=UUID[,PARTUUID=UUID...]`.
pub const VAR_CREDENTIAL: &str = "ingot-var.cred";

/// The signed UKI chain; see the module docs.
pub fn write(disk: &BootDisk) -> Result<Written, EspError> {
    let uki = disk
        .opened
        .uki()
        .expect("the signed UKI chain is chosen only for a stack whose UKI verify kept");
    let credentials = credentials(disk.node, &disk.var);
    disk.reporter.stage(
        Stage::Esp,
        "writing the release's signed UKI and this machine's credentials to the ESP",
    );
    if !disk.kernel_args.is_empty() {
        disk.reporter.warning(
            Stage::Esp,
            format!(
                "--kernel-arg {} ignored: this stack boots UEFI machines from its signed UKI, \
                 whose command line cannot be changed (the stack's [boot] kernel_args are in it)",
                disk.kernel_args.join(" ")
            ),
        );
    }
    let signed = disk.opened.descriptor().uki.as_ref();
    let mut files: Vec<(&str, &[u8])> = vec![(BOOT_EFI_PATH, uki)];
    files.extend(credentials.iter().map(|(p, c)| (p.as_str(), c.as_bytes())));
    let stats = esp::write(disk, &files)?;
    Ok(Written {
        cmdline: signed.map(|u| u.cmdline.clone()).unwrap_or_default(),
        stats,
        mbr_code: None,
    })
}

/// The systemd-stub credentials beside the UKI, as (ESP path, content): `var`'s members and the
/// node layer's root hash (when there is a node layer).
fn credentials(node: Option<&NodeLayer>, var: &[uuid::Uuid]) -> Vec<(String, String)> {
    let members: Vec<String> = var.iter().map(|u| format!("PARTUUID={u}")).collect();
    let mut creds = vec![(
        format!("{CREDENTIALS_DIR}/{VAR_CREDENTIAL}"),
        members.join(","),
    )];
    if let Some(n) = node {
        creds.push((
            format!("{CREDENTIALS_DIR}/{NODE_CREDENTIAL}"),
            n.root_hash.to_string(),
        ));
    }
    creds
}
