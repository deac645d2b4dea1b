//! What one region (a partition, or a whole disk without a table) holds: filesystems and the
//! signatures of LVM and md, read with positional reads only.

use std::io;

use serde::Serialize;

use super::slice::Slice;
use super::{lvm, md};

/// One thing found in a region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Finding {
    /// An ext2/3/4 filesystem with `/etc/os-release` (or `/usr/lib/os-release`).
    LinuxRoot {
        /// Its `PRETTY_NAME` (or `NAME`).
        pretty_name: String,
    },
    /// An ext2/3/4 filesystem that looks like `/boot` (kernels, GRUB config, BLS entries).
    Boot {
        /// What gave it away, e.g. `vmlinuz-6.8.0-45-generic`, `grub/grub.cfg`.
        evidence: Vec<String>,
    },
    /// A FAT filesystem with EFI boot loaders or BLS entries: an ESP firmware would boot from.
    EspWithEntries {
        /// The loaders and entries found, e.g. `EFI/ubuntu/shimx64.efi`.
        entries: Vec<String>,
    },
    /// A filesystem the guard cannot read without mounting (xfs, btrfs) or could not read
    /// (a damaged ext4 or FAT): it may be a Linux root, so it is counted as one.
    PossibleRoot {
        /// `xfs`, `btrfs`, `ext4`, `vfat`.
        fstype: String,
        /// Why it could not be looked into.
        why: String,
    },
    /// An ext2/3/4 filesystem with no sign of an OS.
    ExtData,
    /// A FAT filesystem with no boot entries.
    FatData,
    /// An LVM2 physical volume label.
    LvmPv {
        /// The PV UUID as LVM prints it.
        uuid: String,
        /// The volume group its metadata names (none for an orphan PV).
        volume_group: Option<lvm::VolumeGroup>,
        /// The md array (UUID) whose data holds the PV, when it sits inside a RAID1 member
        /// rather than on the region itself (installimage's LVM on software RAID).
        in_md_array: Option<String>,
    },
    /// A Linux md RAID member superblock.
    MdMember(md::MdMember),
}

impl Finding {
    /// Whether firmware or a boot loader could start an old OS from it.
    pub fn is_os(&self) -> bool {
        matches!(
            self,
            Finding::LinuxRoot { .. }
                | Finding::Boot { .. }
                | Finding::EspWithEntries { .. }
                | Finding::PossibleRoot { .. }
        )
    }

    /// For messages: what it is, in a few words.
    pub fn describe(&self) -> String {
        match self {
            Finding::LinuxRoot { pretty_name } => {
                format!("a Linux root filesystem ({pretty_name})")
            }
            Finding::Boot { evidence } => format!("a /boot filesystem ({})", evidence.join(", ")),
            Finding::EspWithEntries { entries } => {
                format!(
                    "an EFI system partition with boot entries ({})",
                    entries.join(", ")
                )
            }
            Finding::PossibleRoot { fstype, why } => {
                format!("a {fstype} filesystem, counted as a possible Linux root ({why})")
            }
            Finding::ExtData => "an ext filesystem without an OS".into(),
            Finding::FatData => "a FAT filesystem without boot entries".into(),
            Finding::LvmPv {
                uuid,
                volume_group,
                in_md_array,
            } => format!(
                "an LVM2 physical volume (PV UUID {uuid}{}{})",
                volume_group
                    .as_ref()
                    .map(|v| format!(", volume group {}", v.name))
                    .unwrap_or_default(),
                in_md_array
                    .as_ref()
                    .map(|a| format!(", inside md array {a}"))
                    .unwrap_or_default()
            ),
            Finding::MdMember(m) => format!(
                "an md RAID member (array UUID {}, level {}, metadata {})",
                m.array_uuid, m.level, m.metadata
            ),
        }
    }
}

/// Everything found in `region`. `filesystems: false` skips filesystem probes (a whole disk that
/// has a partition table), keeping the LVM and md probes.
pub fn probe(region: &Slice, filesystems: bool) -> io::Result<Vec<Finding>> {
    let mut out = Vec::new();
    if let Some(uuid) = lvm::probe_label(region) {
        out.push(Finding::LvmPv {
            uuid,
            volume_group: lvm::probe_vg(region),
            in_md_array: None,
        });
    }
    for m in md::probe(region) {
        // A RAID1 member with its superblock in front (1.1, 1.2) holds a plain copy of the array
        // at data_offset: an OS inside it boots just as well, and installimage puts LVM there,
        // so look there too.
        if m.level == 1 && m.data_offset_bytes > 0 && filesystems {
            let inner = region.sub(m.data_offset_bytes, region.len());
            if let Some(uuid) = lvm::probe_label(&inner) {
                out.push(Finding::LvmPv {
                    uuid,
                    volume_group: lvm::probe_vg(&inner),
                    in_md_array: Some(m.array_uuid.clone()),
                });
            }
            out.extend(probe_filesystem(&inner));
        }
        out.push(Finding::MdMember(m));
    }
    if filesystems {
        out.extend(probe_filesystem(region));
    }
    Ok(out)
}

fn probe_filesystem(region: &Slice) -> Option<Finding> {
    if region.bytes(1080, 2).is_some_and(|m| m == [0x53, 0xef]) {
        return Some(probe_ext(region));
    }
    if region.bytes(0, 4).is_some_and(|m| m == b"XFSB") {
        return Some(Finding::PossibleRoot {
            fstype: "xfs".into(),
            why: "xfs cannot be read without mounting it".into(),
        });
    }
    if region.bytes(0x10040, 8).is_some_and(|m| m == b"_BHRfS_M") {
        return Some(Finding::PossibleRoot {
            fstype: "btrfs".into(),
            why: "btrfs cannot be read without mounting it".into(),
        });
    }
    if looks_like_fat(region) {
        return Some(probe_fat(region));
    }
    None
}

fn probe_ext(region: &Slice) -> Finding {
    let fs = match ext4_view::Ext4::load(Box::new(region.clone())) {
        Ok(fs) => fs,
        Err(e) => {
            return Finding::PossibleRoot {
                fstype: "ext4".into(),
                why: format!("unreadable: {e}"),
            }
        }
    };
    for path in ["/etc/os-release", "/usr/lib/os-release"] {
        if let Ok(text) = fs.read_to_string(path) {
            return Finding::LinuxRoot {
                pretty_name: os_release_name(&text),
            };
        }
    }
    let mut evidence = Vec::new();
    if let Ok(dir) = fs.read_dir("/") {
        for entry in dir.flatten() {
            let name = entry.file_name().display().to_string();
            if name.starts_with("vmlinuz") || name.starts_with("vmlinux") {
                evidence.push(name);
            }
        }
    }
    for path in ["/grub/grub.cfg", "/grub2/grub.cfg", "/loader/entries"] {
        if fs.exists(path).unwrap_or(false) {
            evidence.push(path.trim_start_matches('/').to_string());
        }
    }
    evidence.sort();
    if evidence.is_empty() {
        Finding::ExtData
    } else {
        Finding::Boot { evidence }
    }
}

fn os_release_name(text: &str) -> String {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').trim_matches('\'').to_string())
    };
    field("PRETTY_NAME")
        .or_else(|| field("NAME"))
        .unwrap_or_else(|| "unnamed Linux".into())
}

/// A FAT boot sector: the 0x55AA signature, a sane sector size and a FAT type string (FAT12/16
/// at 0x36, FAT32 at 0x52). The string is what tells it apart from an MBR.
pub fn looks_like_fat(region: &Slice) -> bool {
    let Some(bs) = region.bytes(0, 512) else {
        return false;
    };
    let bytes_per_sector = u16::from_le_bytes([bs[11], bs[12]]);
    bs[510..512] == [0x55, 0xaa]
        && matches!(bytes_per_sector, 512 | 1024 | 2048 | 4096)
        && (bs[0x36..0x39] == *b"FAT" || bs[0x52..0x57] == *b"FAT32")
}

fn probe_fat(region: &Slice) -> Finding {
    let fs = match fatfs::FileSystem::new(region.clone(), fatfs::FsOptions::new()) {
        Ok(fs) => fs,
        Err(e) => {
            return Finding::PossibleRoot {
                fstype: "vfat".into(),
                why: format!("unreadable: {e}"),
            }
        }
    };
    let root = fs.root_dir();
    let mut entries = Vec::new();
    // FAT names are case-insensitive; firmware looks for \EFI\<vendor>\*.efi.
    fn find<'a>(dir: &fatfs::Dir<'a, Slice>, name: &str) -> Option<fatfs::DirEntry<'a, Slice>> {
        dir.iter()
            .flatten()
            .find(|e| e.file_name().eq_ignore_ascii_case(name))
    }
    if let Some(efi) = find(&root, "EFI").filter(|e| e.is_dir()) {
        for vendor in efi.to_dir().iter().flatten() {
            let vname = vendor.file_name();
            if !vendor.is_dir() || vname == "." || vname == ".." {
                continue;
            }
            for f in vendor.to_dir().iter().flatten() {
                if f.is_file() && f.file_name().to_ascii_lowercase().ends_with(".efi") {
                    entries.push(format!("EFI/{}/{}", vname, f.file_name()));
                }
            }
        }
    }
    if let Some(loader) = find(&root, "loader").filter(|e| e.is_dir()) {
        if let Some(dir) = find(&loader.to_dir(), "entries").filter(|e| e.is_dir()) {
            for f in dir.to_dir().iter().flatten() {
                if f.is_file() && f.file_name().to_ascii_lowercase().ends_with(".conf") {
                    entries.push(format!("loader/entries/{}", f.file_name()));
                }
            }
        }
    }
    entries.sort();
    if entries.is_empty() {
        Finding::FatData
    } else {
        Finding::EspWithEntries { entries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use std::sync::Arc;

    #[test]
    fn os_release_pretty_name() {
        let t = "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nID=ubuntu\n";
        assert_eq!(os_release_name(t), "Ubuntu 24.04.1 LTS");
        assert_eq!(os_release_name("NAME=Debian\n"), "Debian");
    }

    fn slice_of(bytes: &[u8]) -> (tempfile::NamedTempFile, Slice) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let file = Arc::new(File::open(f.path()).unwrap());
        let s = Slice::whole(file, bytes.len() as u64);
        (f, s)
    }

    #[test]
    fn xfs_and_btrfs_count_as_possible_roots() {
        let mut img = vec![0u8; 0x20000];
        img[..4].copy_from_slice(b"XFSB");
        let (_f, s) = slice_of(&img);
        assert!(
            matches!(probe_filesystem(&s), Some(Finding::PossibleRoot { fstype, .. }) if fstype == "xfs")
        );
        let mut img = vec![0u8; 0x20000];
        img[0x10040..0x10048].copy_from_slice(b"_BHRfS_M");
        let (_f, s) = slice_of(&img);
        assert!(
            matches!(probe_filesystem(&s), Some(Finding::PossibleRoot { fstype, .. }) if fstype == "btrfs")
        );
        let (_f, s) = slice_of(&[0u8; 4096]);
        assert_eq!(probe_filesystem(&s), None);
    }

    #[test]
    fn slices_refuse_writes_and_reads_past_their_end() {
        let (_f, s) = slice_of(&[7u8; 1024]);
        let mut sub = s.sub(512, 4096);
        assert_eq!(sub.len(), 512);
        assert!(sub.write(&[0]).is_err());
        let mut buf = [0u8; 16];
        assert!(sub.read_at(500, &mut buf).is_err());
        sub.read_at(496, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 16]);
    }
}
