//! `boot::loader_entry`: the UEFI chain of a stack without a signed UKI. The base layer's boot
//! loader (systemd-boot) as the removable-media loader, its kernel and initrd, read from the
//! base layer as written on the disk (every block checked against its tree), and a loader
//! entry whose command line ([`super::cmdline`]) names every layer's root hash. The BIOS chain
//! (`boot::bios`) puts the same files on the ESP and boots the same entry with GRUB.

use ingot_artifact::layerfs::LayerFs;

use super::esp::{self, BOOT_EFI_PATH};
use super::{cmdline, BootDisk, EspError, Written};
use crate::layout::Content;
use crate::report::Stage;

/// Where the kernel and initrd go on the ESP (the loader entry's and `grub.cfg`'s paths).
pub const KERNEL_PATH: &str = "/ingot/vmlinuz";
pub const INITRD_PATH: &str = "/ingot/initrd.img";

/// The loader entry chain; see the module docs.
pub fn write(disk: &BootDisk) -> Result<Written, EspError> {
    let base = open_base(disk)?;
    let files = BootFiles::read(disk, &base)?;
    let entry = Entry::new(disk)?;
    let stats = esp::write(disk, &entry.files(&files))?;
    Ok(Written {
        cmdline: entry.cmdline,
        stats,
        mbr_code: None,
    })
}

/// The base layer as written on `disk`, read through its tree.
pub fn open_base(disk: &BootDisk) -> Result<LayerFs, EspError> {
    disk.reporter.stage(
        Stage::Esp,
        "reading the boot files from the verified base layer and writing the ESP",
    );
    let base = &disk.opened.layers()[0];
    let part = disk.plan.part(&Content::LayerData { index: 0 });
    Ok(LayerFs::on_target(
        &base.entry.name,
        disk.target.clone_buffered()?,
        part.offset,
        base.verifier.clone(),
    )?)
}

/// The boot files the descriptor names, read from the base layer.
pub struct BootFiles {
    kernel: Vec<u8>,
    initrd: Vec<u8>,
    bootloader: Vec<u8>,
}

impl BootFiles {
    pub fn read(disk: &BootDisk, base: &LayerFs) -> Result<BootFiles, EspError> {
        let boot = &disk.opened.descriptor().boot;
        Ok(BootFiles {
            kernel: base.read(&boot.kernel)?,
            initrd: base.read(&boot.initrd)?,
            bootloader: base.read(&boot.efi)?,
        })
    }
}

/// The loader entry: its title and the whole kernel command line.
pub struct Entry {
    pub title: String,
    pub cmdline: String,
    text: String,
}

impl Entry {
    pub fn new(disk: &BootDisk) -> Result<Entry, EspError> {
        let d = disk.opened.descriptor();
        let cmdline = cmdline::build(disk.opened, disk.node, disk.var.clone(), disk.kernel_args)?;
        let title = format!("ingot {} {}", d.name, d.version);
        let text = loader_entry(&title, &cmdline);
        Ok(Entry {
            title,
            cmdline,
            text,
        })
    }

    /// The ESP's files for this entry: the loader, the kernel, the initrd and the loader's
    /// configuration.
    pub fn files<'a>(&'a self, boot: &'a BootFiles) -> Vec<(&'a str, &'a [u8])> {
        vec![
            (BOOT_EFI_PATH, &boot.bootloader),
            (&KERNEL_PATH[1..], &boot.kernel),
            (&INITRD_PATH[1..], &boot.initrd),
            ("loader/loader.conf", b"default ingot.conf\ntimeout 0\n"),
            ("loader/entries/ingot.conf", self.text.as_bytes()),
        ]
    }
}

/// The systemd-boot entry for a stack: `options` is the whole kernel command line.
pub fn loader_entry(title: &str, options: &str) -> String {
    format!("title {title}\nlinux {KERNEL_PATH}\ninitrd {INITRD_PATH}\noptions {options}\n")
}
