//! Fixture machines for tests: a committed directory
//! `tests/fixtures/machines/<name>/` holds the machine's `sys/`, `proc/`, `dev/`, `run/udev/data/`
//! and `smartctl/` files plus a `disks.toml`; [`materialize`] copies it and builds the disk
//! images `disks.toml` describes, linking `dev/<disk>` to each. Images are never committed.
//!
//! Filesystems and partition tables are made by the real tools (`mkfs.ext4 -d`, `mkfs.fat` +
//! `mcopy`, `sgdisk`, `sfdisk`). LVM and md labels are written from their formats (see
//! `guard::write_pv`, `guard::write_md_v1` for why) and checked by `pvck`/`mdadm --examine` in
//! the tests. `docs/machine-checks.md` describes the format of `disks.toml`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use ingot_machine::guard::{parse_md_uuid, write_md_v1, write_pv, MdV1Params};
use ingot_machine::Sysroot;

/// Building a fixture machine failed.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// File system trouble.
    #[error("{path}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `disks.toml` is malformed or disagrees with the sysfs files.
    #[error("{path}: {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A tool that makes the content is not installed: tests skip on this one.
    #[error("{0} is not installed")]
    ToolMissing(String),
    /// A tool failed.
    #[error("{tool} failed: {stderr}")]
    Tool {
        /// The command.
        tool: String,
        /// Its standard error.
        stderr: String,
    },
}

type Result<T, E = FixtureError> = std::result::Result<T, E>;

fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FixtureError {
    let path = path.into();
    move |source| FixtureError::Io { path, source }
}

/// `disks.toml`: one `[[disk]]` per disk.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisksToml {
    /// The disks.
    pub disk: Vec<DiskSpec>,
}

/// One disk image.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    /// Kernel name; `sys/block/<name>/size` must say the same size.
    pub name: String,
    /// Size in MiB.
    pub size_mib: u64,
    /// `gpt`, `mbr` or absent (no table).
    pub table: Option<String>,
    /// Content of the whole disk when it has no table.
    pub content: Option<Content>,
    /// Partitions, in order, 1 MiB aligned (`mbr`: the fifth and later ones are logical
    /// partitions in an extended partition).
    #[serde(default)]
    pub partition: Vec<PartSpec>,
}

/// One partition.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartSpec {
    /// Size in MiB; absent: the rest of the disk (last partition only).
    pub size_mib: Option<u64>,
    /// GPT partition name.
    pub label: Option<String>,
    /// What it holds.
    pub content: Content,
}

/// What a disk or partition holds.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Content {
    /// Zeros.
    Blank,
    /// ext4 with `/usr/lib/os-release` (and `/etc/os-release` linking to it).
    LinuxRoot {
        /// `PRETTY_NAME`.
        pretty_name: String,
    },
    /// ext4 laid out as `/boot`: a kernel, an initrd, `grub/grub.cfg`.
    Boot,
    /// ext4 with a data file only.
    Ext4Data,
    /// FAT with `EFI/BOOT/BOOTX64.EFI` and `EFI/ubuntu/{shimx64,grubx64}.efi`.
    EspWithEntries,
    /// FAT with nothing in it.
    EspEmpty,
    /// An LVM2 physical volume label (orphan PV).
    LvmPv {
        /// PV UUID, `pvs` spelling (6-4-4-4-4-4-6).
        uuid: String,
    },
    /// An md member superblock.
    MdMember {
        /// Array UUID (`mdadm --examine` spelling or dashed).
        uuid: String,
        /// RAID level.
        level: i32,
        /// `1.0`, `1.1` or `1.2` (default).
        metadata: Option<String>,
        /// This member's slot (default 0).
        dev_number: Option<u32>,
        /// Members in the array (default 2).
        raid_disks: Option<u32>,
        /// What the array holds, written at the member's data offset (RAID1 keeps a plain copy
        /// there): installimage's /boot or root inside the mirror.
        inner: Option<Box<Content>>,
    },
}

/// A built fixture machine.
#[derive(Debug, Clone)]
pub struct Materialized {
    /// The machine's root directory (`<out_dir>/root`).
    pub root: PathBuf,
    /// Disk name to image file (`<out_dir>/images/<name>.img`).
    pub images: BTreeMap<String, PathBuf>,
}

impl Materialized {
    /// The sysroot to detect, gate and guard.
    pub fn sysroot(&self) -> Sysroot {
        Sysroot::new(&self.root)
    }

    /// SHA-256 of every image, to show that checks left them alone.
    pub fn digests(&self) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (name, path) in &self.images {
            out.insert(
                name.clone(),
                crate::digest::sha256_file(path).map_err(io(path))?,
            );
        }
        Ok(out)
    }
}

const MIB: u64 = 1 << 20;

/// Copy the fixture machine `fixture_dir` to `<out_dir>/root`, build its disk images in
/// `<out_dir>/images` and link `root/dev/<disk>` to them.
pub fn materialize(fixture_dir: &Path, out_dir: &Path) -> Result<Materialized> {
    let toml_path = fixture_dir.join("disks.toml");
    let text = std::fs::read_to_string(&toml_path).map_err(io(&toml_path))?;
    let spec: DisksToml = toml::from_str(&text).map_err(|e| FixtureError::Invalid {
        path: toml_path.clone(),
        what: e.to_string(),
    })?;
    let root = out_dir.join("root");
    let images_dir = out_dir.join("images");
    copy_tree(fixture_dir, &root)?;
    std::fs::create_dir_all(&images_dir).map_err(io(&images_dir))?;
    std::fs::create_dir_all(root.join("dev")).map_err(io(root.join("dev")))?;

    let mut images = BTreeMap::new();
    for disk in &spec.disk {
        let bytes = disk.size_mib * MIB;
        let sysfs_size = root.join(format!("sys/block/{}/size", disk.name));
        let sectors: Option<u64> = std::fs::read_to_string(&sysfs_size)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        if sectors != Some(bytes / 512) {
            return Err(FixtureError::Invalid {
                path: sysfs_size,
                what: format!(
                    "says {sectors:?} sectors, disks.toml {} MiB = {} sectors",
                    disk.size_mib,
                    bytes / 512
                ),
            });
        }
        let image = images_dir.join(format!("{}.img", disk.name));
        let f = File::create(&image).map_err(io(&image))?;
        f.set_len(bytes).map_err(io(&image))?;
        drop(f);
        match disk.table.as_deref() {
            None => {
                let content = disk.content.clone().unwrap_or(Content::Blank);
                fill(&image, 0, bytes, &content, &disk.name)?;
            }
            Some(kind @ ("gpt" | "mbr")) => {
                if disk.content.is_some() {
                    return Err(FixtureError::Invalid {
                        path: toml_path.clone(),
                        what: format!("{}: content and a table", disk.name),
                    });
                }
                let places = partition(&image, kind, &disk.partition, bytes)?;
                for (i, (offset, size)) in places.into_iter().enumerate() {
                    let what = format!("{}{}", disk.name, i + 1);
                    fill(&image, offset, size, &disk.partition[i].content, &what)?;
                }
            }
            Some(other) => {
                return Err(FixtureError::Invalid {
                    path: toml_path.clone(),
                    what: format!("{}: unknown table {other:?}", disk.name),
                })
            }
        }
        let link = root.join("dev").join(&disk.name);
        let _ = std::fs::remove_file(&link);
        let target = std::fs::canonicalize(&image).map_err(io(&image))?;
        std::os::unix::fs::symlink(&target, &link).map_err(io(&link))?;
        images.insert(disk.name.clone(), target);
    }
    Ok(Materialized { root, images })
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for entry in std::fs::read_dir(from).map_err(io(from))? {
        let entry = entry.map_err(io(from))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        if entry.file_name() == "disks.toml" && from.join("disks.toml") == src {
            continue;
        }
        let kind = entry.file_type().map_err(io(&src))?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&src).map_err(io(&src))?;
            std::os::unix::fs::symlink(target, &dst).map_err(io(&dst))?;
        } else if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(io(&src))?;
        }
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            FixtureError::ToolMissing(tool.clone())
        } else {
            FixtureError::Tool {
                tool: tool.clone(),
                stderr: e.to_string(),
            }
        }
    })?;
    if !out.status.success() {
        return Err(FixtureError::Tool {
            tool: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out.stdout)
}

/// Partition `image` with sgdisk (GPT) or sfdisk (MBR); returns each partition's (offset, size)
/// in bytes, as `sfdisk --json` reads them back.
fn partition(image: &Path, kind: &str, parts: &[PartSpec], bytes: u64) -> Result<Vec<(u64, u64)>> {
    let invalid = |what: String| FixtureError::Invalid {
        path: image.to_path_buf(),
        what,
    };
    if parts.iter().rev().skip(1).any(|p| p.size_mib.is_none()) {
        return Err(invalid("only the last partition may omit size_mib".into()));
    }
    if kind == "gpt" {
        sgdisk_table(image, parts)?;
    } else {
        sfdisk_table(image, parts)?;
    }
    read_back(image, parts, bytes)
}

/// Each partition's (offset, size) in bytes, as `sfdisk --json` reads them back; refused when
/// the table does not hold `parts` within `bytes`.
fn read_back(image: &Path, parts: &[PartSpec], bytes: u64) -> Result<Vec<(u64, u64)>> {
    let invalid = |what: String| FixtureError::Invalid {
        path: image.to_path_buf(),
        what,
    };
    #[derive(Deserialize)]
    struct Dump {
        partitiontable: Table,
    }
    #[derive(Deserialize)]
    struct Table {
        partitions: Vec<Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        start: u64,
        size: u64,
        #[serde(rename = "type")]
        kind: String,
    }
    let json = run(Command::new("sfdisk").arg("--json").arg(image))?;
    let dump: Dump =
        serde_json::from_slice(&json).map_err(|e| invalid(format!("sfdisk --json: {e}")))?;
    let places: Vec<(u64, u64)> = dump
        .partitiontable
        .partitions
        .iter()
        .filter(|e| !matches!(e.kind.as_str(), "5" | "f" | "85"))
        .map(|e| (e.start * 512, e.size * 512))
        .collect();
    if places.len() != parts.len() || places.iter().any(|&(o, s)| o + s > bytes) {
        return Err(invalid(format!(
            "asked for {} partitions, the table has {places:?}",
            parts.len()
        )));
    }
    Ok(places)
}

/// A GPT table with sgdisk, one partition a `PartSpec`.
fn sgdisk_table(image: &Path, parts: &[PartSpec]) -> Result<()> {
    let mut cmd = Command::new("sgdisk");
    for (i, p) in parts.iter().enumerate() {
        let n = i + 1;
        let end = p
            .size_mib
            .map(|m| format!("+{m}M"))
            .unwrap_or_else(|| "0".into());
        cmd.arg(format!("--new={n}:0:{end}"));
        cmd.arg(format!("--typecode={n}:{}", gpt_code(&p.content)));
        cmd.arg(format!(
            "--change-name={n}:{}",
            p.label.clone().unwrap_or_else(|| format!("part{n}"))
        ));
    }
    run(cmd.arg(image))?;
    Ok(())
}

/// An MBR table with sfdisk, one partition a `PartSpec`.
fn sfdisk_table(image: &Path, parts: &[PartSpec]) -> Result<()> {
    // Up to four partitions are primary; with more, the fourth record is an extended
    // partition holding the rest as logical partitions (sfdisk places their EBRs).
    let mut script = String::from("label: dos\nunit: sectors\n");
    let primaries = if parts.len() > 4 { 3 } else { parts.len() };
    let size = |p: &PartSpec| {
        p.size_mib
            .map(|m| format!("size={}, ", m * MIB / 512))
            .unwrap_or_default()
    };
    for p in &parts[..primaries] {
        script += &format!("{}type={:x}\n", size(p), mbr_code(&p.content));
    }
    if parts.len() > 4 {
        script += "type=5\n";
        for p in &parts[3..] {
            script += &format!("{}type={:x}\n", size(p), mbr_code(&p.content));
        }
    }
    let mut child = Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FixtureError::ToolMissing("sfdisk".into()),
            _ => FixtureError::Tool {
                tool: "sfdisk".into(),
                stderr: e.to_string(),
            },
        })?;
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(io(image))?;
    let out = child.wait_with_output().map_err(io(image))?;
    if !out.status.success() {
        return Err(FixtureError::Tool {
            tool: format!("sfdisk {}", image.display()),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

fn gpt_code(c: &Content) -> &'static str {
    match c {
        Content::EspWithEntries | Content::EspEmpty => "ef00",
        Content::LvmPv { .. } => "8e00",
        Content::MdMember { .. } => "fd00",
        Content::Boot => "ea00",
        Content::LinuxRoot { .. } => "8304",
        Content::Blank | Content::Ext4Data => "8300",
    }
}

fn mbr_code(c: &Content) -> u8 {
    match c {
        Content::EspWithEntries | Content::EspEmpty => 0xef,
        Content::LvmPv { .. } => 0x8e,
        Content::MdMember { .. } => 0xfd,
        _ => 0x83,
    }
}

/// Fill `[offset, offset + len)` of `image` with `content`.
fn fill(image: &Path, offset: u64, len: u64, content: &Content, what: &str) -> Result<()> {
    let invalid = |w: String| FixtureError::Invalid {
        path: image.to_path_buf(),
        what: format!("{what}: {w}"),
    };
    match content {
        Content::Blank => Ok(()),
        Content::LinuxRoot { pretty_name } => {
            let tree = Staging::new()?;
            let id = pretty_name
                .split_whitespace()
                .next()
                .unwrap_or("linux")
                .to_ascii_lowercase();
            tree.file(
                "usr/lib/os-release",
                &format!(
                    "NAME=\"{}\"\nPRETTY_NAME=\"{pretty_name}\"\nID={id}\n",
                    pretty_name.split_whitespace().next().unwrap_or("Linux")
                ),
            )?;
            tree.symlink("etc/os-release", "../usr/lib/os-release")?;
            tree.file("etc/fstab", "LABEL=root / ext4 defaults 0 1\n")?;
            tree.file("etc/hostname", "old-node\n")?;
            ext4(image, offset, len, &tree, "root")
        }
        Content::Boot => {
            let tree = Staging::new()?;
            tree.file("vmlinuz-6.8.0-45-generic", "not a kernel\n")?;
            tree.file("initrd.img-6.8.0-45-generic", "not an initrd\n")?;
            tree.file(
                "grub/grub.cfg",
                "menuentry 'Ubuntu' { linux /vmlinuz-6.8.0-45-generic root=LABEL=root }\n",
            )?;
            ext4(image, offset, len, &tree, "boot")
        }
        Content::Ext4Data => {
            let tree = Staging::new()?;
            tree.file("data/README", "backups\n")?;
            ext4(image, offset, len, &tree, "data")
        }
        Content::EspWithEntries | Content::EspEmpty => fill_esp(
            image,
            offset,
            len,
            matches!(content, Content::EspWithEntries),
        ),
        Content::LvmPv { uuid } => {
            let bytes = write_pv(uuid, len)
                .ok_or_else(|| invalid(format!("bad PV uuid {uuid:?} or size")))?;
            write_at(image, offset, &bytes)
        }
        Content::MdMember {
            uuid,
            level,
            metadata,
            dev_number,
            raid_disks,
            inner,
        } => {
            let member = MdMember {
                uuid,
                level: *level,
                metadata: metadata.as_deref(),
                dev_number: dev_number.unwrap_or(0),
                raid_disks: raid_disks.unwrap_or(2),
                inner: inner.as_deref(),
            };
            fill_md_member(image, offset, len, &member, what)
        }
    }
}

/// A FAT ESP, with another system's loader files when `with_entries`.
fn fill_esp(image: &Path, offset: u64, len: u64, with_entries: bool) -> Result<()> {
    let tmp = scratch(len)?;
    run(Command::new("mkfs.fat")
        .args(["-n", "ESP", "-i", "12345678"])
        .arg(tmp.path()))?;
    if with_entries {
        let tree = Staging::new()?;
        tree.file("EFI/BOOT/BOOTX64.EFI", "MZ not a loader\n")?;
        tree.file("EFI/ubuntu/shimx64.efi", "MZ not a loader\n")?;
        tree.file("EFI/ubuntu/grubx64.efi", "MZ not a loader\n")?;
        tree.file("EFI/ubuntu/grub.cfg", "configfile $prefix/grub.cfg\n")?;
        run(Command::new("mcopy")
            .env("MTOOLS_SKIP_CHECK", "1")
            .args(["-s", "-i"])
            .arg(tmp.path())
            .arg(tree.path().join("EFI"))
            .arg("::/"))?;
    }
    copy_in(tmp.path(), image, offset)
}

/// The fields of `Content::MdMember`, defaults applied.
struct MdMember<'a> {
    uuid: &'a str,
    level: i32,
    metadata: Option<&'a str>,
    dev_number: u32,
    raid_disks: u32,
    inner: Option<&'a Content>,
}

/// An md v1 member superblock, and the array data (`inner`) where the metadata version puts it.
fn fill_md_member(image: &Path, offset: u64, len: u64, m: &MdMember, what: &str) -> Result<()> {
    let invalid = |w: String| FixtureError::Invalid {
        path: image.to_path_buf(),
        what: format!("{what}: {w}"),
    };
    let array_uuid =
        parse_md_uuid(m.uuid).ok_or_else(|| invalid(format!("bad md uuid {:?}", m.uuid)))?;
    let dev_number = m.dev_number;
    let mut device_uuid = array_uuid;
    device_uuid.reverse();
    device_uuid[0] ^= dev_number as u8 + 1;
    let params = MdV1Params {
        metadata: m.metadata.unwrap_or("1.2").into(),
        array_uuid,
        device_uuid,
        name: "rescue:0".into(),
        level: m.level,
        raid_disks: m.raid_disks,
        dev_number,
        time: 1_700_000_000,
        clean: true,
    };
    let (at, sb) =
        write_md_v1(&params, len).ok_or_else(|| invalid("bad md metadata or size".into()))?;
    if let Some(inner) = m.inner {
        // 1.1 and 1.2 keep the data 1 MiB in (write_md_v1), 1.0 at the start.
        let data = if params.metadata == "1.0" { 0 } else { 1 << 20 };
        let data_len = if params.metadata == "1.0" {
            at
        } else {
            len - data
        };
        fill(
            image,
            offset + data,
            data_len,
            inner,
            &format!("{what} (array data)"),
        )?;
    }
    write_at(image, offset + at, &sb)
}

/// A scratch directory tree that becomes a filesystem.
struct Staging(tempfile::TempDir);

impl Staging {
    fn new() -> Result<Self> {
        Ok(Staging(
            tempfile::tempdir().map_err(io(std::env::temp_dir()))?,
        ))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn file(&self, rel: &str, text: &str) -> Result<()> {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("has a parent")).map_err(io(&p))?;
        std::fs::write(&p, text).map_err(io(&p))
    }

    fn symlink(&self, rel: &str, target: &str) -> Result<()> {
        let p = self.0.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("has a parent")).map_err(io(&p))?;
        std::os::unix::fs::symlink(target, &p).map_err(io(&p))
    }
}

fn scratch(len: u64) -> Result<tempfile::NamedTempFile> {
    let tmp = tempfile::NamedTempFile::new().map_err(io(std::env::temp_dir()))?;
    tmp.as_file().set_len(len).map_err(io(tmp.path()))?;
    Ok(tmp)
}

fn ext4(image: &Path, offset: u64, len: u64, tree: &Staging, label: &str) -> Result<()> {
    let tmp = scratch(len)?;
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", label, "-E", "root_owner=0:0", "-d"])
        .arg(tree.path())
        .arg(tmp.path()))?;
    copy_in(tmp.path(), image, offset)
}

/// Copy `src` into `image` at `offset`, skipping zero blocks so the image stays sparse.
fn copy_in(src: &Path, image: &Path, offset: u64) -> Result<()> {
    let mut from = File::open(src).map_err(io(src))?;
    let to = OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(io(image))?;
    let mut buf = vec![0u8; 64 << 10];
    let mut pos = 0u64;
    loop {
        let n = from.read(&mut buf).map_err(io(src))?;
        if n == 0 {
            return Ok(());
        }
        if buf[..n].iter().any(|&b| b != 0) {
            to.write_all_at(&buf[..n], offset + pos)
                .map_err(io(image))?;
        }
        pos += n as u64;
    }
}

fn write_at(image: &Path, offset: u64, bytes: &[u8]) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(io(image))?;
    f.write_all_at(bytes, offset).map_err(io(image))
}
