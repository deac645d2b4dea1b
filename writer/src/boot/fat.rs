//! `fat`: a FAT32 volume built in memory with `fatfs` from a list of (path, bytes), the same
//! bytes for the same files; and how much of it must be written. A leaf: it knows nothing of
//! disks, chains or steps (the chains hand it their files, `boot::esp` writes the image).

use std::io::{Cursor, Write};

use fatfs::{FatType, FileSystem, FormatVolumeOptions, FsOptions};

/// Why the volume could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FatError {
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
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> FatError + '_ {
    move |source| FatError::Io {
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
pub fn build(size: u64, files: &[(&str, &[u8])], volume_id: u32) -> Result<Vec<u8>, FatError> {
    let need: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    // FATs, directories and cluster slack: keep ESP_SPARE (the rule `plan` checks first).
    if need + ingot_layers::boot::ESP_SPARE > size {
        return Err(FatError::TooSmall { size, need });
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
fn fix_dot_entries(img: &mut [u8]) -> Result<(), FatError> {
    let bad = |m: &str| FatError::Malformed(m.to_string());
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

/// The volume up to its last non-zero byte, in whole MiB: the boot sector, both FATs, the
/// directories and the files (FAT32 allocates from the front). Only this is written and read
/// back: what lies past it are free clusters, which the FATs mark free and nothing reads, so
/// a disk's old bytes there (where the target could not be zeroed) do not matter, and a
/// 256 MiB ESP costs what its files cost.
pub fn used_len(image: &[u8]) -> usize {
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
        let files: Vec<(&str, &[u8])> = vec![
            ("EFI/BOOT/BOOTX64.EFI", b"MZ efi"),
            ("ingot/vmlinuz", &[1u8; 100_000]),
            ("ingot/initrd.img", &[2u8; 300_000]),
            ("loader/entries/ingot.conf", b"title t\noptions ro\n"),
            ("grub/grub.cfg", b"boot\n"),
            ("EFI/BOOT/BOOTX64.EFI.extra.d/ingot-node.cred", b"ab"),
        ];
        let a = build(64 << 20, &files, 7).unwrap();
        let b = build(64 << 20, &files, 7).unwrap();
        assert!(a == b, "two builds differ");
        assert!(build(4 << 20, &files, 7).is_err());
    }
}
