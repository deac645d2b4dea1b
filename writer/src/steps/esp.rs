//! `esp`: the EFI system partition: FAT32 built in memory with `fatfs`, holding the
//! bootloader, the kernel and initrd from the base layer, and a systemd-boot loader entry whose
//! command line names every layer's root hash.
//!
//! When the stack carries a BIOS loader and the plan has a BIOS boot partition, GRUB's core image
//! goes there (patched by [`crate::bios`]) and `grub/grub.cfg` on the ESP boots the same kernel,
//! initrd and command line; the MBR boot code is returned for the `partition-table` step.
//!
//! Reads the boot files from the base layer as written on the target (every block checked
//! against its tree), the verified stack, the node layer, the plan and the extra kernel
//! arguments; returns the kernel command line, what writing took ([`WriteStats`]) and the MBR
//! boot code, if any.

use std::io::{Cursor, Write};

use fatfs::{FatType, FileSystem, FormatVolumeOptions, FsOptions};

use ingot_artifact::layerfs::{LayerFs, LayerFsError};

use crate::bios::{self, BiosError};
use crate::boot::{BootChain, NODE_CREDENTIAL, VAR_CREDENTIAL};
use crate::engine::bytes::write_bytes;
use crate::engine::{EngineError, Stopped, WriteStats};
use crate::layout::{Content, DiskPlan};
use crate::node::NodeLayer;
use crate::report::{Reporter, Stage};
use crate::request::WriteSettings;
use crate::stack::OpenedStack;
use crate::target::{Target, TargetError};
use ingot_layers::boot::{BootLimitError, Cmdline};

/// What the `esp` step wrote.
pub struct EspWritten {
    /// The kernel command line the disk boots with.
    pub cmdline: String,
    pub stats: WriteStats,
    /// GRUB's MBR boot code, when the disk boots from BIOS firmware too.
    pub mbr_code: Option<Vec<u8>>,
    pub chain: BootChain,
}

/// The `esp` step; see the module docs.
pub fn run(
    target: &Target,
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    plan: &DiskPlan,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<EspWritten, EspError> {
    let var = match &settings.mirror {
        Some(m) => m.members.clone(),
        None => vec![plan.part(&Content::Var).part_guid],
    };
    if let Some(uki) = opened.uki() {
        let creds = credentials(node, &var);
        return run_uki(target, opened, uki, &creds, plan, settings, reporter);
    }
    reporter.stage(
        Stage::Esp,
        "reading the boot files from the verified base layer and writing the ESP",
    );
    let d = opened.descriptor();
    let base = &opened.layers()[0];
    let base_part = plan.part(&Content::LayerData { index: 0 });
    let fs = LayerFs::on_target(
        &base.entry.name,
        target.clone_buffered()?,
        base_part.offset,
        base.verifier.clone(),
    )?;
    let (kernel, initrd, bootloader) = (
        fs.read(&d.boot.kernel)?,
        fs.read(&d.boot.initrd)?,
        fs.read(&d.boot.efi)?,
    );
    let bios_part = plan.find(&Content::BiosBoot);
    let bios_files = match (&d.boot.bios, bios_part) {
        (Some(dir), Some(_)) => Some((
            fs.read(&format!("{dir}/boot.img"))?,
            fs.read(&format!("{dir}/core.img"))?,
        )),
        _ => None,
    };
    let cmdline = cmdline(opened, node, var, settings).map_err(EspError::from)?;
    let title = format!("ingot {} {}", d.name, d.version);
    let entry = loader_entry(&title, &cmdline);
    let grub_cfg = bios_files
        .as_ref()
        .map(|_| bios::grub_cfg(&title, KERNEL_PATH, INITRD_PATH, &cmdline));
    let mut files: Vec<(&str, &[u8])> = vec![
        (BOOT_EFI_PATH, &bootloader),
        (&KERNEL_PATH[1..], &kernel),
        (&INITRD_PATH[1..], &initrd),
        ("loader/loader.conf", b"default ingot.conf\ntimeout 0\n"),
        ("loader/entries/ingot.conf", entry.as_bytes()),
    ];
    if let Some(cfg) = &grub_cfg {
        files.push((&bios::GRUB_CFG_PATH[1..], cfg.as_bytes()));
    }
    let mut stats = write_esp(target, plan, &files, settings, reporter)?;
    let mut mbr_code = None;
    if let (Some((boot_img, core_img)), Some(part)) = (bios_files, bios_part) {
        reporter.stage(Stage::Esp, "writing GRUB's core image for BIOS firmware");
        let mut core =
            bios::core(&core_img, part.offset / 512, part.size).map_err(EspError::from)?;
        core.resize(part.size as usize, 0);
        let zeroed = target.zero_range(part.offset, part.size)?;
        stats += write_bytes(
            target,
            "bios-boot",
            &core,
            part.offset,
            zeroed,
            settings.options,
            reporter,
        )?;
        mbr_code = Some(boot_img);
    }
    let chain = if mbr_code.is_some() {
        BootChain::LoaderEntryAndBios
    } else {
        BootChain::LoaderEntry
    };
    Ok(EspWritten {
        cmdline,
        stats,
        mbr_code,
        chain,
    })
}

/// Builds the ESP holding `files` and writes it to the plan's ESP partition.
fn write_esp(
    target: &Target,
    plan: &DiskPlan,
    files: &[(&str, &[u8])],
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<WriteStats, EspError> {
    let esp_part = plan.part(&Content::Esp);
    let volume_id = u32::from_le_bytes(plan.disk_guid.as_bytes()[..4].try_into().expect("4 bytes"));
    let image = build(esp_part.size, files, volume_id)?;
    let zeroed = target.zero_range(esp_part.offset, esp_part.size)?;
    let stats = write_bytes(
        target,
        "esp",
        &image[..used_len(&image)],
        esp_part.offset,
        zeroed,
        settings.options,
        reporter,
    )?;
    settings.options.check_stop("esp")?;
    Ok(stats)
}

/// The Secure Boot chain: the release's signed UKI, byte for byte, as the removable-media
/// loader, and this machine's own values as systemd-stub credentials beside it (the node
/// layer's root hash; `var`'s members). No loader entry, no kernel or initrd of their own, no
/// GRUB: nothing on the ESP could choose another command line. `--kernel-arg` cannot reach the
/// signed command line: it is ignored, with a warning.
fn run_uki(
    target: &Target,
    opened: &OpenedStack,
    uki: &[u8],
    credentials: &[(String, String)],
    plan: &DiskPlan,
    settings: &WriteSettings,
    reporter: &Reporter,
) -> Result<EspWritten, EspError> {
    reporter.stage(
        Stage::Esp,
        "writing the release's signed UKI and this machine's credentials to the ESP",
    );
    if !settings.kernel_args.is_empty() {
        reporter.warning(
            Stage::Esp,
            format!(
                "--kernel-arg {} ignored: this stack boots UEFI machines from its signed UKI, \
                 whose command line cannot be changed (the stack's [boot] kernel_args are in it)",
                settings.kernel_args.join(" ")
            ),
        );
    }
    let d = opened.descriptor();
    let signed = d
        .uki
        .as_ref()
        .map(|u| u.cmdline.clone())
        .unwrap_or_default();
    let mut files: Vec<(&str, &[u8])> = vec![(BOOT_EFI_PATH, uki)];
    files.extend(credentials.iter().map(|(p, c)| (p.as_str(), c.as_bytes())));
    let stats = write_esp(target, plan, &files, settings, reporter)?;
    Ok(EspWritten {
        cmdline: signed,
        stats,
        mbr_code: None,
        chain: BootChain::SignedUki,
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

/// The kernel command line for this stack, node layer and `var` (every member of its mirror),
/// refused when it breaks a boot contract limit (see [`Cmdline::checked`]). The `plan` step
/// checks it the same way before any disk is wiped.
pub fn cmdline(
    opened: &OpenedStack,
    node: Option<&NodeLayer>,
    var: Vec<uuid::Uuid>,
    settings: &WriteSettings,
) -> Result<String, BootLimitError> {
    let d = opened.descriptor();
    // The stack's own arguments, then the writer's.
    let extra: Vec<String> = d
        .boot
        .kernel_args
        .iter()
        .chain(&settings.kernel_args)
        .cloned()
        .collect();
    Cmdline {
        stack: (&d.name, &d.version),
        layers: opened
            .layers()
            .iter()
            .map(|p| (p.entry.name.as_str(), p.verifier.root_hash()))
            .collect(),
        node: node.map(|n| &n.root_hash),
        var,
        extra: &extra,
    }
    .checked()
}

/// The volume up to its last non-zero byte, in whole MiB: the boot sector, both FATs, the
/// directories and the files (FAT32 allocates from the front). Only this is written and read
/// back: what lies past it are free clusters, which the FATs mark free and nothing reads, so
/// a disk's old bytes there (where the target could not be zeroed) do not matter, and a
/// 256 MiB ESP costs what its files cost.
fn used_len(image: &[u8]) -> usize {
    const MIB: usize = 1 << 20;
    static ZERO: [u8; 4096] = [0; 4096];
    // Page by page from the end (a memcmp each): the free area is most of the volume.
    let pages = image.len().div_ceil(ZERO.len());
    let used_pages = (0..pages)
        .rev()
        .find(|&p| {
            let page = &image[p * ZERO.len()..((p + 1) * ZERO.len()).min(image.len())];
            page != &ZERO[..page.len()]
        })
        .map_or(0, |p| p + 1);
    (used_pages * ZERO.len())
        .div_ceil(MIB)
        .saturating_mul(MIB)
        .min(image.len())
}

/// The removable-media boot loader path: the firmware boots it with no boot entries.
pub const BOOT_EFI_PATH: &str = "EFI/BOOT/BOOTX64.EFI";
/// Where systemd-stub looks for credentials next to the UKI it runs.
pub const CREDENTIALS_DIR: &str = "EFI/BOOT/BOOTX64.EFI.extra.d";
pub const KERNEL_PATH: &str = "/ingot/vmlinuz";
pub const INITRD_PATH: &str = "/ingot/initrd.img";

#[derive(Debug, thiserror::Error)]
pub enum EspError {
    #[error("building the ESP ({what})")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the ESP's {size} bytes cannot hold the boot files ({need} bytes)")]
    TooSmall { size: u64, need: u64 },
    #[error("the FAT32 volume is malformed after fixing directory entries: {0}")]
    Malformed(String),
    #[error("the stack's BIOS loader")]
    Bios(#[from] BiosError),
    #[error("reading the boot files from the base layer")]
    BootFiles(#[from] LayerFsError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Stopped(#[from] Stopped),
    #[error("the kernel command line")]
    Cmdline(#[from] BootLimitError),
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> EspError + '_ {
    move |source| EspError::Io {
        what: what.to_string(),
        source,
    }
}

/// Cluster size that keeps FAT32 above its 65,525-cluster minimum for `size` bytes.
fn cluster_size(size: u64) -> u32 {
    let mut c = 4096u32;
    while c > 512 && size / (c as u64) < 70_000 {
        c /= 2;
    }
    c
}

/// Builds the ESP image (`size` bytes) holding `files` (paths relative to the root; their
/// directories are made), the FAT volume id seeded by `volume_id` (same contents, same bytes).
pub fn build(size: u64, files: &[(&str, &[u8])], volume_id: u32) -> Result<Vec<u8>, EspError> {
    let need: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    // FATs, directories and cluster slack: keep ESP_SPARE (the rule `plan` checks first).
    if need + ingot_layers::boot::ESP_SPARE > size {
        return Err(EspError::TooSmall { size, need });
    }
    let mut image = Cursor::new(vec![0u8; size as usize]);
    let options = FormatVolumeOptions::new()
        .fat_type(FatType::Fat32)
        .bytes_per_cluster(cluster_size(size))
        .volume_id(volume_id)
        .volume_label(*b"ESP        ");
    fatfs::format_volume(&mut image, options).map_err(io("formatting FAT32"))?;
    image.set_position(0);
    {
        // The default time provider without chrono stamps 1980-01-01: deterministic.
        let fs =
            FileSystem::new(&mut image, FsOptions::new()).map_err(io("opening the new volume"))?;
        {
            let root = fs.root_dir();
            let mut made = std::collections::BTreeSet::new();
            for (path, bytes) in files {
                let mut dir = String::new();
                for part in path
                    .split('/')
                    .collect::<Vec<_>>()
                    .split_last()
                    .map_or(&[][..], |(_, d)| d)
                {
                    if !dir.is_empty() {
                        dir.push('/');
                    }
                    dir.push_str(part);
                    if made.insert(dir.clone()) {
                        root.create_dir(&dir).map_err(io(&dir))?;
                    }
                }
                let mut f = root.create_file(path).map_err(io(path))?;
                f.truncate().map_err(io(path))?;
                f.write_all(bytes).map_err(io(path))?;
                f.flush().map_err(io(path))?;
            }
        }
        fs.unmount().map_err(io("closing the volume"))?;
    }
    let mut bytes = image.into_inner();
    fix_dot_entries(&mut bytes)?;
    Ok(bytes)
}

/// fatfs 0.3.6 writes a long-name entry before `.` and `..` in every new directory and points a
/// first-level directory's `..` at the root's cluster instead of 0 (rust-fatfs #117, fixed only
/// on its unreleased master). `fsck.fat` and some firmware reject that, so rewrite each
/// directory's first four slots to `.`, `..`, deleted, deleted, with `..` = 0 under the root.
fn fix_dot_entries(img: &mut [u8]) -> Result<(), EspError> {
    let bad = |m: &str| EspError::Malformed(m.to_string());
    let u16_at = |img: &[u8], o: usize| u16::from_le_bytes([img[o], img[o + 1]]) as usize;
    let u32_at = |img: &[u8], o: usize| {
        u32::from_le_bytes(img[o..o + 4].try_into().expect("4 bytes")) as usize
    };
    let bps = u16_at(img, 11);
    let spc = img[13] as usize;
    let reserved = u16_at(img, 14);
    let fats = img[16] as usize;
    let fat_size = u32_at(img, 36);
    let root = u32_at(img, 44);
    if bps == 0 || spc == 0 {
        return Err(bad("zero sector or cluster size"));
    }
    let cluster_bytes = bps * spc;
    let fat_start = reserved * bps;
    let data_start = (reserved + fats * fat_size) * bps;
    let cluster_off = |c: usize| data_start + (c - 2) * cluster_bytes;

    // Directories to visit: (first cluster, parent is root).
    let mut stack = vec![(root, true, true)]; // (cluster, is_root, parent_is_root)
    let mut visited = 0;
    while let Some((first, is_root, parent_is_root)) = stack.pop() {
        visited += 1;
        if visited > 1000 {
            return Err(bad("directory tree too deep"));
        }
        if !is_root {
            let o = cluster_off(first);
            let slot = |i: usize| o + 32 * i;
            let is_lfn = |img: &[u8], i: usize| img[slot(i) + 11] == 0x0F;
            let name = |img: &[u8], i: usize| img[slot(i)..slot(i) + 11].to_vec();
            if is_lfn(img, 0)
                && name(img, 1) == b".          "
                && is_lfn(img, 2)
                && name(img, 3) == b"..         "
            {
                let dot: Vec<u8> = img[slot(1)..slot(1) + 32].to_vec();
                let mut dotdot: Vec<u8> = img[slot(3)..slot(3) + 32].to_vec();
                if parent_is_root {
                    dotdot[20..22].fill(0);
                    dotdot[26..28].fill(0);
                }
                img[slot(0)..slot(0) + 32].copy_from_slice(&dot);
                img[slot(1)..slot(1) + 32].copy_from_slice(&dotdot);
                for i in [2, 3] {
                    img[slot(i)..slot(i) + 32].fill(0);
                    img[slot(i)] = 0xE5;
                }
            }
        }
        // Walk this directory's cluster chain for subdirectories.
        let mut cluster = first;
        let mut hops = 0;
        'chain: while (2..0x0FFF_FFF8).contains(&cluster) {
            hops += 1;
            if hops > 65_536 {
                return Err(bad("cluster chain loops"));
            }
            let o = cluster_off(cluster);
            for e in (o..o + cluster_bytes).step_by(32) {
                let b0 = img[e];
                if b0 == 0 {
                    break 'chain;
                }
                let attr = img[e + 11];
                if b0 == 0xE5 || attr == 0x0F || attr & 0x10 == 0 || b0 == b'.' {
                    continue;
                }
                let c = (u16_at(img, e + 20) << 16) | u16_at(img, e + 26);
                stack.push((c, false, is_root));
            }
            cluster = u32_at(img, fat_start + 4 * cluster) & 0x0FFF_FFFF;
        }
    }
    Ok(())
}

/// The systemd-boot entry for a stack: `options` is the whole kernel command line.
pub fn loader_entry(title: &str, options: &str) -> String {
    format!("title {title}\nlinux {KERNEL_PATH}\ninitrd {INITRD_PATH}\noptions {options}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_len_ends_at_the_last_mib_with_data() {
        let mut v = vec![0u8; 8 << 20];
        assert_eq!(used_len(&v), 0);
        v[0] = 1;
        assert_eq!(used_len(&v), 1 << 20);
        v[(3 << 20) + 5] = 1;
        assert_eq!(used_len(&v), 4 << 20);
        let last = v.len() - 1;
        v[last] = 1;
        assert_eq!(used_len(&v), 8 << 20);
        // A volume whose size is not whole MiB ends where it ends.
        let mut w = vec![0u8; (1 << 20) + 10];
        w[(1 << 20) + 3] = 1;
        assert_eq!(used_len(&w), (1 << 20) + 10);
    }

    #[test]
    fn cluster_sizes_keep_fat32_valid() {
        for mib in [64u64, 100, 128, 256, 512, 1024] {
            let c = cluster_size(mib << 20);
            assert!(
                (mib << 20) / c as u64 >= 65_525,
                "{mib} MiB with {c}-byte clusters"
            );
        }
    }

    #[test]
    fn builds_a_deterministic_volume() {
        let entry = loader_entry("t", "ro");
        let files: Vec<(&str, &[u8])> = vec![
            (BOOT_EFI_PATH, b"MZ efi"),
            ("ingot/vmlinuz", &[1u8; 100_000]),
            ("ingot/initrd.img", &[2u8; 300_000]),
            ("loader/entries/ingot.conf", entry.as_bytes()),
            ("grub/grub.cfg", b"boot\n"),
            ("EFI/BOOT/BOOTX64.EFI.extra.d/ingot-node.cred", b"ab"),
        ];
        let a = build(64 << 20, &files, 7).unwrap();
        let b = build(64 << 20, &files, 7).unwrap();
        assert!(a == b, "two builds differ");
        assert!(build(4 << 20, &files, 7).is_err());
    }
}
