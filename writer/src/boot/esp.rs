//! `boot::esp`: a chain's files written as the EFI system partition: their FAT32 image
//! ([`super::fat`]) the size of the plan's ESP, its volume id from the disk GUID (the same disk,
//! the same bytes), written up to its last used MiB and read back.

use super::{fat, BootDisk, EspError};
use crate::engine::bytes::write_bytes;
use crate::engine::WriteStats;
use crate::layout::Content;

/// The removable-media boot loader path: the firmware boots it with no boot entries.
pub const BOOT_EFI_PATH: &str = "EFI/BOOT/BOOTX64.EFI";

/// Builds the ESP holding `files` (paths relative to its root) and writes it to `disk`'s ESP
/// partition.
pub fn write(disk: &BootDisk, files: &[(&str, &[u8])]) -> Result<WriteStats, EspError> {
    let esp_part = disk.plan.part(&Content::Esp);
    let guid = disk.plan.disk_guid.as_bytes();
    let volume_id = u32::from_le_bytes(guid[..4].try_into().expect("4 bytes"));
    let image = fat::build(esp_part.size, files, volume_id)?;
    let zeroed = disk.target.zero_range(esp_part.offset, esp_part.size)?;
    let stats = write_bytes(
        disk.target,
        "esp",
        &image[..fat::used_len(&image)],
        esp_part.offset,
        zeroed,
        disk.options,
        disk.reporter,
    )?;
    disk.options.check_stop("esp")?;
    Ok(stats)
}
