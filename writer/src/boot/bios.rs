//! `boot::bios`: the chain for BIOS firmware, beside the loader entry. GRUB's i386-pc boot
//! code in the protective MBR and its core image in a GPT BIOS boot partition, patched exactly
//! as `grub-bios-setup` patches them, and a `grub.cfg` on the ESP booting the loader entry's
//! kernel, initrd and command line ([`super::loader_entry`] writes the rest of the ESP, so
//! UEFI firmware boots the same disk). The MBR code goes back to the `partition-table` step,
//! which patches it into the table's sector ([`mbr`]).
//!
//! The BIOS loads LBA 0 (`boot.img`), which reads the first sector of `core.img` from the LBA
//! patched in at 0x5c; that sector (`diskboot.img`) reads the rest of the core image from the
//! block list at its end. The core image was built with the prefix `(,gpt1)/grub`: GRUB takes
//! the drive the BIOS booted from, partition 1 (the ESP), and reads `grub/grub.cfg` there.

use super::esp;
use super::loader_entry::{self, BootFiles, Entry, INITRD_PATH, KERNEL_PATH};
use super::{BootDisk, EspError, Written};
use crate::engine::bytes::write_bytes;
use crate::engine::WriteStats;
use crate::layout::Content;
use crate::report::Stage;

/// `grub.cfg` on the ESP, where the core image's prefix points.
pub const GRUB_CFG_PATH: &str = "/grub/grub.cfg";

/// Offsets in `boot.img` (GRUB's `include/grub/i386/pc/boot.h`).
const BPB_START: usize = 0x03;
const BPB_END: usize = 0x5a;
const KERNEL_SECTOR: usize = 0x5c;
const BOOT_DRIVE: usize = 0x64;
const DRIVE_CHECK: usize = 0x66;
/// From here to the signature the MBR keeps the disk's own bytes (disk signature, partitions).
const WINDOWS_NT_MAGIC: usize = 0x1b8;
const SIGNATURE: usize = 0x1fe;
/// The first block list entry of `diskboot.img`: the last 12 bytes of the core image's first
/// sector (start LBA u64, sector count u16, load segment u16).
const BLOCKLIST: usize = 512 - 12;
/// Where diskboot loads the rest of the core image: segment 0x800 + one sector.
const CORE_SEGMENT: u16 = 0x820;

/// The BIOS chain; see the module docs.
pub fn write(disk: &BootDisk) -> Result<Written, EspError> {
    let dir = (disk.opened.descriptor().boot.bios.as_deref())
        .expect("the BIOS chain is chosen only for a stack with a BIOS loader");
    let base = loader_entry::open_base(disk)?;
    let files = BootFiles::read(disk, &base)?;
    let boot_img = base.read(&format!("{dir}/boot.img"))?;
    let core_img = base.read(&format!("{dir}/core.img"))?;
    let entry = Entry::new(disk)?;
    let cfg = grub_cfg(&entry.title, KERNEL_PATH, INITRD_PATH, &entry.cmdline);
    let mut esp_files = entry.files(&files);
    esp_files.push((&GRUB_CFG_PATH[1..], cfg.as_bytes()));
    let mut stats = esp::write(disk, &esp_files)?;
    stats += write_core(disk, &core_img)?;
    Ok(Written {
        cmdline: entry.cmdline.clone(),
        stats,
        mbr_code: Some(boot_img),
    })
}

/// GRUB's core image, patched for where it lies, written over the whole BIOS boot partition.
fn write_core(disk: &BootDisk, core_img: &[u8]) -> Result<WriteStats, EspError> {
    disk.reporter
        .stage(Stage::Esp, "writing GRUB's core image for BIOS firmware");
    let part = disk.plan.part(&Content::BiosBoot);
    let mut image = core(core_img, part.offset / 512, part.size)?;
    image.resize(part.size as usize, 0);
    let zeroed = disk.target.zero_range(part.offset, part.size)?;
    Ok(write_bytes(
        disk.target,
        "bios-boot",
        &image,
        part.offset,
        zeroed,
        disk.options,
        disk.reporter,
    )?)
}

#[derive(Debug, thiserror::Error)]
pub enum BiosError {
    #[error("{file}: {problem} (not GRUB's i386-pc {file})")]
    NotGrub { file: &'static str, problem: String },
    #[error("core.img is {size} bytes; the BIOS boot partition holds {room}")]
    TooLarge { size: usize, room: u64 },
}

fn not_grub(file: &'static str, problem: impl Into<String>) -> BiosError {
    BiosError::NotGrub {
        file,
        problem: problem.into(),
    }
}

/// The MBR: `boot_img`'s code with the BIOS parameter block and everything from the disk
/// signature on (the protective partition entry, 0x55AA) taken from `protective`, the core
/// image's first LBA patched in, the boot drive taken from the BIOS (0xff), and the check for
/// BIOSes that pass a bad drive number enabled (its jump replaced by two NOPs), as
/// `grub-bios-setup` does for a hard disk.
pub fn mbr(boot_img: &[u8], protective: &[u8; 512], core_lba: u64) -> Result<[u8; 512], BiosError> {
    if boot_img.len() != 512 {
        return Err(not_grub(
            "boot.img",
            format!("{} bytes, not 512", boot_img.len()),
        ));
    }
    if boot_img[SIGNATURE..] != [0x55, 0xaa] {
        return Err(not_grub("boot.img", "no 0x55AA boot signature"));
    }
    // The jump over the drive check (`jmp short`), which grub-bios-setup turns into NOPs.
    if boot_img[DRIVE_CHECK] != 0xeb {
        return Err(not_grub("boot.img", "no drive-check jump at 0x66"));
    }
    let mut out = [0u8; 512];
    out.copy_from_slice(boot_img);
    out[BPB_START..BPB_END].copy_from_slice(&protective[BPB_START..BPB_END]);
    out[KERNEL_SECTOR..KERNEL_SECTOR + 8].copy_from_slice(&core_lba.to_le_bytes());
    out[BOOT_DRIVE] = 0xff;
    out[DRIVE_CHECK..DRIVE_CHECK + 2].copy_from_slice(&[0x90, 0x90]);
    out[WINDOWS_NT_MAGIC..].copy_from_slice(&protective[WINDOWS_NT_MAGIC..]);
    Ok(out)
}

/// The core image as it goes into the BIOS boot partition at `core_lba` (512-byte sectors):
/// its first block list entry points at the sectors after the first, which is what
/// `grub-bios-setup` writes for a core image embedded in one piece.
pub fn core(core_img: &[u8], core_lba: u64, room: u64) -> Result<Vec<u8>, BiosError> {
    if core_img.len() <= 512 {
        return Err(not_grub(
            "core.img",
            format!("only {} bytes", core_img.len()),
        ));
    }
    if core_img.len() as u64 > room {
        return Err(BiosError::TooLarge {
            size: core_img.len(),
            room,
        });
    }
    let segment = u16::from_le_bytes([core_img[BLOCKLIST + 10], core_img[BLOCKLIST + 11]]);
    if segment != CORE_SEGMENT {
        return Err(not_grub(
            "core.img",
            format!("block list load segment {segment:#x}, not {CORE_SEGMENT:#x}"),
        ));
    }
    let sectors = core_img.len().div_ceil(512);
    let rest = u16::try_from(sectors - 1)
        .map_err(|_| not_grub("core.img", format!("{sectors} sectors")))?;
    let mut out = core_img.to_vec();
    out.resize(sectors * 512, 0);
    out[BLOCKLIST..BLOCKLIST + 8].copy_from_slice(&(core_lba + 1).to_le_bytes());
    out[BLOCKLIST + 8..BLOCKLIST + 10].copy_from_slice(&rest.to_le_bytes());
    // The entry below is the list's terminator (a zero count).
    out[BLOCKLIST - 12..BLOCKLIST].fill(0);
    Ok(out)
}

/// `grub/grub.cfg`: boot the ESP's kernel and initrd at once with `cmdline`, each word quoted
/// for GRUB's shell-like parser.
pub fn grub_cfg(title: &str, kernel: &str, initrd: &str, cmdline: &str) -> String {
    let args: Vec<String> = cmdline.split_whitespace().map(quote).collect();
    format!(
        "# {title}\nset timeout=0\nlinux {} {}\ninitrd {}\nboot\n",
        quote(kernel),
        args.join(" "),
        quote(initrd)
    )
}

/// A word as GRUB's parser reads it back unchanged: plain when it has only safe characters,
/// single-quoted otherwise (a `'` inside as `'\''`).
fn quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "._:,=/+-@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot_img() -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0] = 0xeb;
        b[DRIVE_CHECK] = 0xeb;
        b[DRIVE_CHECK + 1] = 0x05;
        b[BPB_START + 1] = 0x42;
        b[0x100] = 0xcd;
        b[WINDOWS_NT_MAGIC + 10] = 0x77; // boot.img code that reaches into the table area
        b[SIGNATURE] = 0x55;
        b[SIGNATURE + 1] = 0xaa;
        b
    }

    #[test]
    fn mbr_keeps_the_partition_table_and_patches_the_core_lba() {
        let mut protective = [0u8; 512];
        protective[0x1c2] = 0xee;
        protective[SIGNATURE] = 0x55;
        protective[SIGNATURE + 1] = 0xaa;
        let m = mbr(&boot_img(), &protective, 0x1_0000_0800).unwrap();
        assert_eq!(m[0x100], 0xcd, "boot code kept");
        assert_eq!(m[BPB_START + 1], 0, "BPB from the disk");
        assert_eq!(&m[0x5c..0x64], &0x1_0000_0800u64.to_le_bytes());
        assert_eq!(m[0x64], 0xff);
        assert_eq!(&m[0x66..0x68], &[0x90, 0x90]);
        assert_eq!(&m[WINDOWS_NT_MAGIC..], &protective[WINDOWS_NT_MAGIC..]);
        let mut bad = boot_img();
        bad[SIGNATURE] = 0;
        assert!(mbr(&bad, &protective, 1).is_err());
        assert!(mbr(&bad[..100], &protective, 1).is_err());
    }

    #[test]
    fn core_block_list_points_past_its_first_sector() {
        let mut img = vec![0x11u8; 3 * 512 + 100];
        img[BLOCKLIST..BLOCKLIST + 12].copy_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0x20, 0x08]);
        let c = core(&img, 4096, 1 << 20).unwrap();
        assert_eq!(c.len(), 4 * 512);
        assert_eq!(&c[BLOCKLIST..BLOCKLIST + 8], &4097u64.to_le_bytes());
        assert_eq!(&c[BLOCKLIST + 8..BLOCKLIST + 10], &3u16.to_le_bytes());
        assert_eq!(&c[BLOCKLIST + 10..512], &[0x20, 0x08]);
        assert!(c[BLOCKLIST - 12..BLOCKLIST].iter().all(|b| *b == 0));
        assert!(core(&img, 4096, 1024).is_err(), "too large");
        img[BLOCKLIST + 11] = 0x07;
        assert!(core(&img, 4096, 1 << 20).is_err(), "not diskboot's segment");
    }

    /// GRUB's own images, where grub-pc-bin is installed.
    #[test]
    fn accepts_grubs_images() {
        let dir = std::path::Path::new("/usr/lib/grub/i386-pc");
        let Ok(boot) = std::fs::read(dir.join("boot.img")) else {
            eprintln!("skipping: no {}", dir.display());
            return;
        };
        let mut protective = [0u8; 512];
        protective[SIGNATURE] = 0x55;
        protective[SIGNATURE + 1] = 0xaa;
        mbr(&boot, &protective, 2048).unwrap();
        let diskboot = std::fs::read(dir.join("diskboot.img")).unwrap();
        let mut img = diskboot.clone();
        img.resize(4096, 0);
        core(&img, 2048, 1 << 20).unwrap();
    }

    #[test]
    fn grub_cfg_quotes_what_grub_would_expand() {
        let cfg = grub_cfg(
            "ingot x 1",
            "/ingot/vmlinuz",
            "/ingot/initrd.img",
            "ingot.layers=base:ab,cp:cd ro a$b console=ttyS0",
        );
        assert!(cfg
            .contains("linux /ingot/vmlinuz ingot.layers=base:ab,cp:cd ro 'a$b' console=ttyS0\n"));
        assert!(cfg.contains("initrd /ingot/initrd.img\nboot\n"));
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
