//! The machine a VM is, written as a fixture machine (the format of
//! `tests/fixtures/machines/`, docs/machine-checks.md): the sysfs, procfs, udev and smartctl
//! files the writer's detection and gates read below `--sysroot`, with `dev/<disk>` linked to
//! the VM's disk images. The writer run against it takes the provisioning path CAPH takes
//! (detect, gate, guard, stage, seal, write, verify) and writes the images; the VM then boots
//! them as SCSI disks with the same WWNs and serials, so the guest sees the disks the writer saw.

use std::fs;
use std::path::{Path, PathBuf};

use crate::firmware::Firmware;
use crate::machine::DiskId;

/// The machine described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub firmware: Firmware,
    /// Hardware virtualization (`vmx` in cpuinfo and `/dev/kvm`): the writer's `--virt`.
    pub virt: bool,
    /// An NVIDIA GPU on the PCI bus (an H100's ids): the writer's `--gpu nvidia`. QEMU emulates
    /// no NVIDIA device, so only the writer sees it.
    pub nvidia_gpu: bool,
    pub cpus: u32,
    /// In order: `sda`, `sdb`, ...
    pub disks: Vec<NodeDisk>,
    /// QEMU's user networking: the rescue system's addresses the writer reads (`ip -json`,
    /// `/etc/resolv.conf`) are the guest's on it, so the node comes up on that network as a
    /// server comes up with its rescue system's addresses. Without it the writer reads none and
    /// says the node relies on DHCP (the VM has no network device).
    pub user_net: bool,
}

/// One disk: its image and size, and its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDisk {
    pub image: PathBuf,
    pub size_bytes: u64,
    pub id: DiskId,
}

impl NodeDisk {
    /// Disk `index` of a VM (its image `image`): a WWN and serial of its own.
    pub fn numbered(index: usize, image: PathBuf, size_bytes: u64) -> NodeDisk {
        NodeDisk {
            image,
            size_bytes,
            id: DiskId {
                wwn: format!("0x5000c500ab1e{:04x}", index + 1),
                serial: format!("INGOTVM{:04}", index + 1),
            },
        }
    }
}

/// The kernel name of SCSI disk `index`: `sda`, `sdb`, ...
pub fn disk_name(index: usize) -> String {
    // 26 disks are more than any VM here has.
    format!("sd{}", char::from(b'a' + (index % 26) as u8))
}

/// Writing the fixture failed.
#[derive(Debug, thiserror::Error)]
#[error("writing the machine fixture {}", path.display())]
pub struct FixtureError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Writes `node` as a fixture machine at `root` (which must not exist yet: a fixture is
/// written whole).
pub fn write(root: &Path, node: &Node) -> Result<(), FixtureError> {
    let w = Writer(root);
    fs::create_dir(root).map_err(|source| FixtureError {
        path: root.into(),
        source,
    })?;
    if node.firmware.is_uefi() {
        w.file("sys/firmware/efi/fw_platform_size", "64\n")?;
    }
    if node.firmware == Firmware::SecureBoot {
        // The Secure Boot machine has swtpm's TPM 2.0.
        w.file("sys/class/tpm/tpm0/tpm_version_major", "2\n")?;
    }
    if node.virt {
        // In fixtures `dev/kvm` is a marker file.
        w.file("dev/kvm", "")?;
    }
    w.file("proc/cpuinfo", &cpuinfo(node.cpus, node.virt))?;
    // q35's host bridge and the virtio-scsi controller the disks are on.
    w.pci("0000:00:00.0", 0x8086, 0x29c0, 0x060000)?;
    w.pci("0000:00:03.0", 0x1af4, 0x1048, 0x010000)?;
    if node.nvidia_gpu {
        w.pci("0000:01:00.0", 0x10de, 0x2330, 0x030200)?;
    }
    for (i, disk) in node.disks.iter().enumerate() {
        w.disk(i, disk)?;
    }
    if node.user_net {
        w.user_net()?;
    }
    Ok(())
}

/// `/proc/cpuinfo` of `cpus` processors, with `vmx` when `virt`.
fn cpuinfo(cpus: u32, virt: bool) -> String {
    let flags = format!(
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx \
         fxsr sse sse2 ht syscall nx lm constant_tsc nopl pni{} ssse3 cx16 sse4_1 sse4_2 popcnt \
         aes xsave avx hypervisor",
        if virt { " vmx" } else { "" }
    );
    (0..cpus.max(1))
        .map(|n| {
            format!(
                "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: QEMU Virtual CPU \
                 (ingot vm)\nflags\t\t: {flags}\n\n"
            )
        })
        .collect()
}

/// Files below the fixture's root.
struct Writer<'a>(&'a Path);

impl Writer<'_> {
    fn err(&self, path: PathBuf) -> impl FnOnce(std::io::Error) -> FixtureError {
        move |source| FixtureError { path, source }
    }

    fn file(&self, rel: &str, text: &str) -> Result<(), FixtureError> {
        let path = self.0.join(rel);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(self.err(dir.into()))?;
        }
        fs::write(&path, text).map_err(self.err(path))
    }

    fn link(&self, rel: &str, target: &Path) -> Result<(), FixtureError> {
        let path = self.0.join(rel);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(self.err(dir.into()))?;
        }
        std::os::unix::fs::symlink(target, &path).map_err(self.err(path))
    }

    fn pci(&self, slot: &str, vendor: u16, device: u16, class: u32) -> Result<(), FixtureError> {
        let dir = format!("sys/bus/pci/devices/{slot}");
        self.file(&format!("{dir}/vendor"), &format!("0x{vendor:04x}\n"))?;
        self.file(&format!("{dir}/device"), &format!("0x{device:04x}\n"))?;
        self.file(&format!("{dir}/class"), &format!("0x{class:06x}\n"))
    }

    /// What `ip -json` and resolv.conf show on QEMU's user network ([`crate::machine::SLIRP`]):
    /// the guest's address, its gateway and the name server, on the NIC's MAC.
    fn user_net(&self) -> Result<(), FixtureError> {
        let s = &crate::machine::SLIRP;
        let lo = r#"{"ifindex":1,"ifname":"lo","flags":["LOOPBACK","UP","LOWER_UP"],"link_type":"loopback","address":"00:00:00:00:00:00","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8,"scope":"host"}]}"#;
        self.file(
            "ip/addr.json",
            &format!(
                r#"[{lo},{{"ifindex":2,"ifname":"eth0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"link_type":"ether","address":"{mac}","addr_info":[{{"family":"inet","local":"{ip}","prefixlen":{len},"scope":"global","label":"eth0"}}]}}]
"#,
                mac = s.mac,
                ip = s.guest,
                len = s.prefix_len
            ),
        )?;
        self.file(
            "ip/route.json",
            &format!(
                "[{{\"dst\":\"default\",\"gateway\":\"{}\",\"dev\":\"eth0\",\"flags\":[]}}]\n",
                s.gateway
            ),
        )?;
        self.file("ip/route6.json", "[]\n")?;
        self.file("etc/resolv.conf", &format!("nameserver {}\n", s.dns))
    }

    /// SCSI disk `index` as QEMU's `scsi-hd` shows it to a Linux guest.
    fn disk(&self, index: usize, disk: &NodeDisk) -> Result<(), FixtureError> {
        let name = disk_name(index);
        let dev = format!("8:{}", index * 16);
        let hex = disk.id.wwn.trim_start_matches("0x");
        let block = format!("sys/block/{name}");
        self.file(&format!("{block}/dev"), &format!("{dev}\n"))?;
        self.file(
            &format!("{block}/size"),
            &format!("{}\n", disk.size_bytes / 512),
        )?;
        self.file(&format!("{block}/ro"), "0\n")?;
        self.file(&format!("{block}/removable"), "0\n")?;
        self.file(&format!("{block}/queue/rotational"), "0\n")?;
        self.file(&format!("{block}/queue/logical_block_size"), "512\n")?;
        self.file(&format!("{block}/queue/physical_block_size"), "512\n")?;
        self.file(&format!("{block}/device/vendor"), "QEMU    \n")?;
        self.file(&format!("{block}/device/model"), "QEMU HARDDISK   \n")?;
        self.file(&format!("{block}/device/wwid"), &format!("naa.{hex}\n"))?;
        let wwn_link = format!("wwn-{}", disk.id.wwn);
        let scsi_link = format!("scsi-3{hex}");
        self.link(&format!("dev/{name}"), &disk.image)?;
        for link in [&wwn_link, &scsi_link] {
            self.link(
                &format!("dev/disk/by-id/{link}"),
                Path::new(&format!("../../{name}")),
            )?;
        }
        self.file(
            &format!("run/udev/data/b{dev}"),
            &format!(
                "S:disk/by-id/{wwn_link}\nS:disk/by-id/{scsi_link}\nE:ID_WWN={wwn}\n\
                 E:ID_SERIAL_SHORT={serial}\nE:ID_SCSI_SERIAL={serial}\nE:ID_MODEL=QEMU_HARDDISK\n\
                 E:ID_VENDOR=QEMU\n",
                wwn = disk.id.wwn,
                serial = disk.id.serial
            ),
        )?;
        // smartctl's answer for QEMU's disk: it has no SMART, which the gate takes as a warning.
        self.file(
            &format!("smartctl/{name}.json"),
            &format!(
                "{{\"smartctl\": {{\"exit_status\": 4, \"messages\": [{{\"string\": \
                 \"/dev/{name}: SMART not supported (QEMU HARDDISK)\", \"severity\": \
                 \"error\"}}]}}, \"model_name\": \"QEMU HARDDISK\"}}\n"
            ),
        )
    }
}
