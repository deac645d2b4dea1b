//! Disks from `/sys/block`, and CAPH's target spec (short names or WWNs) resolved to them.
//!
//! `lsblk -o WWN` (what CAPH collects and users copy into `rootDeviceHints`) prints udev's
//! `ID_WWN_WITH_EXTENSION`, else `ID_WWN` (util-linux `misc-utils/lsblk-properties.c`). udev
//! derives those from the device's identification page, which the kernel also exposes as sysfs
//! `device/wwid` (SCSI/SATA: `naa.5000c500a1b2c3d4`) or `wwid` (NVMe: `eui.0025388b91b1b2c3`),
//! and names the `/dev/disk/by-id/wwn-*` and `nvme-eui.*` links after it. A rescue system may lack
//! any one of these sources, so every one is read and any match counts.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::MachineError;
use crate::gate::{GateFailure, Reason};
use crate::{Facts, Sysroot};

/// One whole disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// Kernel name: `sda`, `nvme0n1`.
    pub name: String,
    /// Its device node below the sysroot (`<sysroot>/dev/sda`; in fixtures a link to an image).
    pub node: PathBuf,
    /// `major:minor`, from sysfs `dev`.
    pub dev: Option<String>,
    /// Size in bytes (sysfs `size` counts 512-byte sectors whatever the block size).
    pub size_bytes: u64,
    /// Logical block size in bytes.
    pub logical_block_size: u32,
    /// A spinning disk (`queue/rotational`).
    pub rotational: bool,
    /// Removable media (`removable`).
    pub removable: bool,
    /// Model, from sysfs `device/model` or udev `ID_MODEL`.
    pub model: Option<String>,
    /// Serial number, from udev or sysfs `device/serial`.
    pub serial: Option<String>,
    /// The WWN as `lsblk -o WWN` prints it (`0x5000c500a1b2c3d4`, `eui.0025388b91b1b2c3`).
    pub wwn: Option<String>,
    /// Every identifier found for it, normalised (see [`normalize_wwn`]); a spec matches any.
    pub identifiers: Vec<String>,
}

impl Disk {
    /// The kernel name of partition `number` of this disk: `sda1`, `nvme0n1p1`.
    pub fn partition_name(&self, number: u32) -> String {
        partition_name(&self.name, number)
    }
}

pub(crate) fn partition_name(disk: &str, number: u32) -> String {
    // The kernel inserts `p` when the disk name ends in a digit (nvme0n1p1, loop0p1).
    if disk.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{disk}p{number}")
    } else {
        format!("{disk}{number}")
    }
}

/// Device kinds that are never install targets unless named explicitly.
const SKIPPED_PREFIXES: &[&str] = &["loop", "ram", "zram", "dm-", "md", "sr", "fd"];

pub(crate) fn list_disks(sysroot: &Sysroot) -> Result<Vec<Disk>, MachineError> {
    let dir = sysroot.path("/sys/block");
    let entries = std::fs::read_dir(&dir).map_err(|source| MachineError::Io {
        path: dir.clone(),
        source,
    })?;
    let mut disks = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| MachineError::Io {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if SKIPPED_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        disks.push(read_disk(sysroot, &name)?);
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(disks)
}

/// Read one disk's facts from `/sys/block/<name>` (and udev's database, `/dev/disk/by-id`).
pub fn read_disk(sysroot: &Sysroot, name: &str) -> Result<Disk, MachineError> {
    let base = format!("/sys/block/{name}");
    let size_path = sysroot.path(format!("{base}/size"));
    let sectors = sysroot
        .read_trimmed(format!("{base}/size"))
        .ok_or_else(|| MachineError::Parse {
            path: size_path.clone(),
            what: "missing or empty".into(),
        })?;
    let sectors: u64 = sectors.parse().map_err(|e| MachineError::Parse {
        path: size_path,
        what: format!("{sectors:?}: {e}"),
    })?;
    let attr = |rel: &str| sysroot.read_trimmed(format!("{base}/{rel}"));
    let flag = |rel: &str| attr(rel).is_some_and(|v| v == "1");
    let dev = attr("dev");
    let udev = dev
        .as_deref()
        .map(|d| read_udev(sysroot, d))
        .unwrap_or_default();
    let udev_get = |key: &str| {
        udev.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };

    // Every identifier, normalised; the first one found in lsblk's order is the display WWN.
    let mut ids = BTreeSet::new();
    let mut display = None;
    for key in ["ID_WWN_WITH_EXTENSION", "ID_WWN"] {
        if let Some(v) = udev_get(key) {
            display.get_or_insert_with(|| v.clone());
            ids.extend(wwn_keys(&v));
        }
    }
    for rel in ["wwid", "device/wwid"] {
        if let Some(v) = attr(rel) {
            // The kernel's `naa.` form is what udev prints as `0x`.
            let shown = match v.strip_prefix("naa.") {
                Some(hex) => format!("0x{hex}"),
                None => v.clone(),
            };
            if !v.starts_with("t10.") {
                display.get_or_insert(shown);
            }
            ids.extend(wwn_keys(&v));
        }
    }
    for link in by_id_links(sysroot, name) {
        if let Some(v) = link.strip_prefix("wwn-").or_else(|| {
            link.strip_prefix("nvme-").filter(|v| {
                v.starts_with("eui.") || v.starts_with("nvme.") || v.starts_with("uuid.")
            })
        }) {
            display.get_or_insert_with(|| v.to_string());
            ids.extend(wwn_keys(v));
        }
    }

    Ok(Disk {
        name: name.to_string(),
        node: sysroot.path(format!("/dev/{name}")),
        dev,
        size_bytes: sectors * 512,
        logical_block_size: attr("queue/logical_block_size")
            .and_then(|v| v.parse().ok())
            .unwrap_or(512),
        rotational: flag("queue/rotational"),
        removable: flag("removable"),
        model: attr("device/model").or_else(|| udev_get("ID_MODEL")),
        serial: udev_get("ID_SCSI_SERIAL")
            .or_else(|| udev_get("ID_SERIAL_SHORT"))
            .or_else(|| attr("device/serial")),
        wwn: display,
        identifiers: ids.into_iter().collect(),
    })
}

/// udev's database entry `/run/udev/data/b<major>:<minor>`: its `E:KEY=VALUE` lines.
fn read_udev(sysroot: &Sysroot, dev: &str) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(sysroot.path(format!("/run/udev/data/b{dev}"))) else {
        return vec![];
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// Names of `/dev/disk/by-id` links that point at the whole disk `name`.
fn by_id_links(sysroot: &Sysroot, name: &str) -> Vec<String> {
    let dir = sysroot.path("/dev/disk/by-id");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.file_name().is_some_and(|f| f.to_string_lossy() == name))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// One WWN in any of its spellings (`0x5000C500A1B2C3D4`, `naa.5000c500a1b2c3d4`,
/// `wwn-0x5000c500a1b2c3d4`, `/dev/disk/by-id/wwn-0x…`, `eui.0025…`, `nvme-eui.0025…`) as one
/// canonical key: lower case, without the `0x`/`naa.`/`eui.` prefix. `nvme.`, `uuid.` and `t10.`
/// forms keep their prefix: their bodies are not bare hex numbers.
pub fn normalize_wwn(s: &str) -> String {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_prefix("/dev/disk/by-id/").unwrap_or(&s);
    let s = s
        .strip_prefix("wwn-")
        .or_else(|| s.strip_prefix("nvme-"))
        .unwrap_or(s);
    ["0x", "naa.", "eui."]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(s)
        .to_string()
}

/// The keys a device identifier matches: itself, and for a 128-bit NAA (type 6, "registered
/// extended") also its first 64 bits, which is what udev's `ID_WWN` holds without the extension.
fn wwn_keys(raw: &str) -> Vec<String> {
    let key = normalize_wwn(raw);
    let mut keys = vec![key.clone()];
    if key.len() == 32 && key.starts_with('6') && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        keys.push(key[..16].to_string());
    }
    keys
}

/// Resolve CAPH's fourth argument (`"sda nvme0n1"` or `"0x5000c500a1b2c3d4 eui.0025…"`, any
/// mix, `/dev/` prefixes allowed) to disks, in the order given.
///
/// A short name may also name a device left out of [`Facts::disks`] (a loop device, for tests).
/// Fails with `disk-not-found`, listing every disk (name, size, WWN), when a name or WWN matches
/// nothing or the spec is empty; with `bad-target` when a token names a partition (the writer
/// takes whole disks), names a disk an earlier token named (`"sda sda"`, or a name and its
/// WWN), or is a WWN more than one disk has, naming the disks.
pub fn resolve_targets(
    sysroot: &Sysroot,
    facts: &Facts,
    spec: &str,
) -> Result<Vec<crate::Disk>, GateFailure> {
    let mut out: Vec<(Disk, &str)> = Vec::new();
    let tokens: Vec<&str> = spec.split_whitespace().collect();
    if tokens.is_empty() {
        return Err(GateFailure::new(
            Reason::DiskNotFound,
            None,
            format!(
                "no target disk given; disks: {}",
                list_for_humans(&facts.disks)
            ),
        ));
    }
    for token in tokens {
        let d = resolve_token(sysroot, facts, token)?;
        if let Some((_, earlier)) = out.iter().find(|(o, _)| o.name == d.name) {
            return Err(bad_target(
                token,
                format!(
                    "{token:?} names disk {}, which {earlier:?} already named: each target disk \
                 once",
                    d.name
                ),
            ));
        }
        out.push((d, token));
    }
    Ok(out.into_iter().map(|(d, _)| d).collect())
}

fn bad_target(token: &str, message: String) -> GateFailure {
    GateFailure::new(Reason::BadTarget, Some(token), message)
}

/// One token of the target spec: the disk it names.
fn resolve_token(sysroot: &Sysroot, facts: &Facts, token: &str) -> Result<Disk, GateFailure> {
    let name = token.strip_prefix("/dev/").unwrap_or(token);
    if let Some(d) = facts.disk(name) {
        return Ok(d.clone());
    }
    if !name.contains('/') {
        if let Some(parent) = partition_parent(sysroot, name) {
            return Err(bad_target(
                token,
                format!(
                    "{token:?} is a partition of disk {parent}, not a whole disk; name the disk"
                ),
            ));
        }
        if sysroot.path(format!("/sys/block/{name}")).is_dir() {
            if let Ok(d) = read_disk(sysroot, name) {
                return Ok(d);
            }
        }
    }
    let key = normalize_wwn(token);
    let matching: Vec<&Disk> = facts
        .disks
        .iter()
        .filter(|d| d.identifiers.contains(&key))
        .collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(GateFailure::new(
            Reason::DiskNotFound,
            Some(token),
            format!(
                "no disk is named or has the WWN {token:?}; disks: {}",
                list_for_humans(&facts.disks)
            ),
        )),
        many => Err(bad_target(
            token,
            format!(
                "the WWN {token:?} matches {} disks: {}; name the disk instead",
                many.len(),
                list_for_humans(&many.iter().map(|d| (*d).clone()).collect::<Vec<_>>())
            ),
        )),
    }
}

/// The disk a partition `name` belongs to, when sysfs says it is one (`/sys/class/block/<name>`
/// holds a `partition` file and sits in its disk's directory).
fn partition_parent(sysroot: &Sysroot, name: &str) -> Option<String> {
    let class = sysroot.path(format!("/sys/class/block/{name}"));
    if !class.join("partition").exists() {
        return None;
    }
    let real = std::fs::canonicalize(&class).ok();
    Some(
        real.as_deref()
            .and_then(|p| p.parent())
            .and_then(|p| p.file_name())
            .map_or_else(|| "?".to_string(), |p| p.to_string_lossy().into_owned()),
    )
}

fn list_for_humans(disks: &[Disk]) -> String {
    if disks.is_empty() {
        return "none".into();
    }
    disks
        .iter()
        .map(|d| {
            format!(
                "{} ({} bytes, wwn {})",
                d.name,
                d.size_bytes,
                d.wwn.as_deref().unwrap_or("none")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wwn_spellings_normalise_to_one_key() {
        let k = "5000c500a1b2c3d4";
        for s in [
            "0x5000c500a1b2c3d4",
            "0x5000C500A1B2C3D4",
            "naa.5000c500a1b2c3d4",
            "wwn-0x5000c500a1b2c3d4",
            "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4",
        ] {
            assert_eq!(normalize_wwn(s), k, "{s}");
        }
        assert_eq!(
            normalize_wwn("nvme-eui.0025388B91B1B2C3"),
            "0025388b91b1b2c3"
        );
        assert_eq!(normalize_wwn("eui.0025388b91b1b2c3"), "0025388b91b1b2c3");
        assert_eq!(normalize_wwn("nvme.144d-5334-0001"), "nvme.144d-5334-0001");
    }

    #[test]
    fn extended_naa_also_matches_its_first_64_bits() {
        let keys = wwn_keys("naa.600508b1001c4d1e8f2a3b4c5d6e7f80");
        assert!(keys.contains(&"600508b1001c4d1e".to_string()));
        assert_eq!(
            wwn_keys("0x5000c500a1b2c3d4"),
            vec!["5000c500a1b2c3d4".to_string()]
        );
    }

    #[test]
    fn partition_names() {
        assert_eq!(partition_name("sda", 2), "sda2");
        assert_eq!(partition_name("nvme0n1", 1), "nvme0n1p1");
    }
}
