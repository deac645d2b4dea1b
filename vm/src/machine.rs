//! A VM described as a type ([`Machine`]) and rendered into QEMU's command line: one q35
//! machine that powers off instead of rebooting, its firmware, disks (virtio, or SCSI disks with
//! a WWN and serial), an optional directly booted kernel, user networking, 9p shares, a TPM and
//! its serial console. Rendering is pure: it copies, starts and checks nothing (the firmware's
//! files are found by [`crate::firmware::Lookup`], the TPM started by [`crate::swtpm`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use crate::accel::Accel;
use crate::firmware::{Firmware, QEMU};

/// What the machine boots from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    /// OVMF (`code`) with the variable store `vars`, used in place (pass a copy of the template:
    /// the firmware writes to it).
    Uefi { code: PathBuf, vars: PathBuf },
    /// OVMF's Secure Boot build with SMM and a secure flash, its variable store `vars` used in
    /// place.
    SecureBoot { code: PathBuf, vars: PathBuf },
    /// SeaBIOS.
    Bios { image: PathBuf },
}

impl Boot {
    /// The firmware this boots with.
    pub fn firmware(&self) -> Firmware {
        match self {
            Boot::Uefi { .. } => Firmware::Uefi,
            Boot::SecureBoot { .. } => Firmware::SecureBoot,
            Boot::Bios { .. } => Firmware::Bios,
        }
    }
}

/// A disk: a raw image file, and the identity the guest's kernel sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub image: PathBuf,
    /// None: a virtio-blk disk (`vda`); an identity: a SCSI disk (`sda`) on a virtio-scsi
    /// controller, with `/dev/disk/by-id/wwn-…` and its serial.
    pub id: Option<DiskId>,
}

/// A SCSI disk's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskId {
    /// `0x` and 16 hex digits (`/dev/disk/by-id/wwn-0x…`, `device/wwid` `naa.…`).
    pub wwn: String,
    pub serial: String,
}

/// A kernel QEMU boots directly (no firmware boot manager).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The kernel command line.
    pub append: String,
}

/// The machine's network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Net {
    /// No network device at all (`-nodefaults` creates none).
    #[default]
    None,
    /// QEMU's user networking on a virtio NIC.
    User(UserNet),
}

/// QEMU's user network as its defaults set it up (slirp), and the MAC a machine's NIC on it
/// has: what the guest is told by DHCP, and what `ingot vm`'s fixture tells the writer.
pub struct Slirp {
    pub mac: &'static str,
    pub guest: &'static str,
    pub prefix_len: u8,
    pub gateway: &'static str,
    pub dns: &'static str,
}

/// QEMU's user network (`10.0.2.0/24`), and the NIC's MAC (QEMU's default first one).
pub const SLIRP: Slirp = Slirp {
    mac: "52:54:00:12:34:56",
    guest: "10.0.2.15",
    prefix_len: 24,
    gateway: "10.0.2.2",
    dns: "10.0.2.3",
};

/// QEMU's user networking (slirp): the guest reaches out through the host's stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserNet {
    /// Nothing leaves but [`UserNet::guest_forwards`].
    pub restrict: bool,
    /// The host's `127.0.0.1:PORT` forwarded to the guest's SSH port 22.
    pub ssh_port: Option<u16>,
    /// Connections the guest opens to `10.0.2.100:PORT`, each handed to a host command.
    pub guest_forwards: Vec<GuestForward>,
}

/// A guest's TCP connection to `10.0.2.100:port`, given to `command` on the host (its stdin and
/// stdout), one process per connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestForward {
    pub port: u16,
    pub command: String,
}

/// A host directory the guest mounts over 9p with tag `tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub tag: String,
    pub path: PathBuf,
}

/// Where the serial console goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serial {
    /// A file, read while the guest runs.
    File(PathBuf),
    /// The terminal, with QEMU's monitor multiplexed on it (Ctrl-A X ends the VM).
    Terminal,
    /// No serial port (`-nodefaults` creates none).
    None,
}

/// A VM: everything its QEMU command line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub boot: Boot,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    /// In order; the firmware boots the first that boots.
    pub disks: Vec<Disk>,
    pub kernel: Option<Kernel>,
    pub net: Net,
    pub shares: Vec<Share>,
    /// A software TPM 2.0: the control socket of its swtpm ([`crate::swtpm::Swtpm`]).
    pub tpm: Option<PathBuf>,
    /// OEM strings (SMBIOS type 11) the firmware hands the guest, as a machine's firmware or
    /// BMC may.
    pub oem_strings: Vec<String>,
    pub serial: Serial,
}

impl Machine {
    /// A machine booting with `boot`, under TCG, with one CPU, 1 GiB, no disk and no network,
    /// its console in `serial`.
    pub fn new(boot: Boot, serial: Serial) -> Machine {
        Machine {
            boot,
            accel: Accel::Tcg,
            cpus: 1,
            memory_mib: 1024,
            disks: Vec::new(),
            kernel: None,
            net: Net::None,
            shares: Vec::new(),
            tpm: None,
            oem_strings: Vec::new(),
            serial,
        }
    }

    /// QEMU's command line for this machine.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(QEMU);
        cmd.args(self.args());
        cmd
    }

    /// QEMU's arguments for this machine.
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Args::default();
        let machine = match self.boot {
            Boot::SecureBoot { .. } => "q35,smm=on",
            _ => "q35",
        };
        a.pair("-machine", machine)
            .pair("-accel", self.accel.name())
            .pair("-cpu", "max")
            .pair("-smp", self.cpus.to_string())
            .pair("-m", self.memory_mib.to_string())
            .pair("-display", "none")
            .pair("-monitor", "none")
            .one("-nodefaults")
            .one("-no-reboot");
        self.firmware(&mut a);
        for s in &self.oem_strings {
            a.pair("-smbios", format!("type=11,value={s}"));
        }
        if let Some(k) = &self.kernel {
            a.pair("-kernel", &k.kernel)
                .pair("-initrd", &k.initrd)
                .pair("-append", &k.append);
        }
        if let Net::User(user) = &self.net {
            a.pair("-netdev", netdev(user)).pair(
                "-device",
                format!("virtio-net-pci,netdev=n0,mac={}", SLIRP.mac),
            );
        }
        self.disks(&mut a);
        for s in &self.shares {
            let path = s.path.display();
            let tag = &s.tag;
            a.pair(
                "-virtfs",
                format!("local,path={path},mount_tag={tag},security_model=none,id={tag}"),
            );
        }
        if let Some(socket) = &self.tpm {
            a.pair(
                "-chardev",
                format!("socket,id=chrtpm,path={}", socket.display()),
            )
            .pair("-tpmdev", "emulator,id=tpm0,chardev=chrtpm")
            .pair("-device", "tpm-tis,tpmdev=tpm0");
        }
        match &self.serial {
            Serial::File(log) => a.pair("-serial", format!("file:{}", log.display())),
            Serial::Terminal => a.pair("-serial", "mon:stdio"),
            Serial::None => &mut a,
        };
        a.0
    }

    fn firmware(&self, a: &mut Args) {
        let flash = |a: &mut Args, code: &PathBuf, vars: &PathBuf| {
            a.pair(
                "-drive",
                format!(
                    "if=pflash,format=raw,unit=0,readonly=on,file={}",
                    code.display()
                ),
            )
            .pair(
                "-drive",
                format!("if=pflash,format=raw,unit=1,file={}", vars.display()),
            );
        };
        match &self.boot {
            Boot::Uefi { code, vars } => flash(a, code, vars),
            Boot::SecureBoot { code, vars } => {
                a.pair("-global", "driver=cfi.pflash01,property=secure,value=on");
                flash(a, code, vars);
            }
            Boot::Bios { image } => {
                a.pair("-bios", image);
            }
        }
    }

    fn disks(&self, a: &mut Args) {
        if self.disks.iter().any(|d| d.id.is_some()) {
            a.pair("-device", "virtio-scsi-pci,id=scsi0");
        }
        for (i, d) in self.disks.iter().enumerate() {
            let image = d.image.display();
            match &d.id {
                None => a.pair("-drive", format!("file={image},format=raw,if=virtio")),
                Some(id) => a
                    .pair(
                        "-drive",
                        format!("file={image},if=none,id=d{i},format=raw,cache=unsafe"),
                    )
                    .pair(
                        "-device",
                        format!(
                            "scsi-hd,drive=d{i},bus=scsi0.0,scsi-id={i},wwn={},serial={}",
                            id.wwn, id.serial
                        ),
                    ),
            };
        }
    }
}

/// `-netdev`'s value for user networking.
fn netdev(user: &UserNet) -> String {
    let mut netdev = "user,id=n0".to_string();
    if user.restrict {
        netdev.push_str(",restrict=on");
    }
    if let Some(port) = user.ssh_port {
        netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{port}-:22"));
    }
    for f in &user.guest_forwards {
        netdev.push_str(&format!(
            ",guestfwd=tcp:10.0.2.100:{}-cmd:{}",
            f.port, f.command
        ));
    }
    netdev
}

/// A command line being rendered.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn one(&mut self, flag: &str) -> &mut Args {
        self.0.push(flag.into());
        self
    }

    fn pair(&mut self, flag: &str, value: impl Into<OsString>) -> &mut Args {
        self.0.push(flag.into());
        self.0.push(value.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(m: &Machine) -> String {
        m.args()
            .iter()
            .map(|a| a.to_str().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    }

    const BASE: &str = "-machine q35 -accel tcg -cpu max -smp 1 -m 1024 -display none \
                        -monitor none -nodefaults -no-reboot";

    /// What the UEFI boot tests ran before this crate rendered it, argument for argument.
    #[test]
    fn a_uefi_machine_with_a_virtio_disk() {
        let mut m = Machine::new(
            Boot::Uefi {
                code: "/fw/code.fd".into(),
                vars: "/w/vars.fd".into(),
            },
            Serial::File("/w/serial.log".into()),
        );
        m.disks.push(Disk {
            image: "/w/disk.img".into(),
            id: None,
        });
        assert_eq!(
            rendered(&m),
            format!(
                "{BASE} -drive if=pflash,format=raw,unit=0,readonly=on,file=/fw/code.fd \
                 -drive if=pflash,format=raw,unit=1,file=/w/vars.fd \
                 -drive file=/w/disk.img,format=raw,if=virtio -serial file:/w/serial.log"
            )
        );
        assert_eq!(m.command().get_program(), QEMU);
    }

    /// Secure Boot: SMM, the secure flash, OEM strings, a TPM; KVM and two CPUs.
    #[test]
    fn a_secure_boot_machine_with_a_tpm() {
        let mut m = Machine::new(
            Boot::SecureBoot {
                code: "/fw/secboot.fd".into(),
                vars: "/w/vars.fd".into(),
            },
            Serial::Terminal,
        );
        m.accel = Accel::Kvm;
        (m.cpus, m.memory_mib) = (2, 2048);
        m.tpm = Some("/w/tpm/ctrl.sock".into());
        m.oem_strings.push("io.systemd.credential:x=y".into());
        let text = rendered(&m);
        assert!(
            text.starts_with(
                "-machine q35,smm=on -accel kvm -cpu max -smp 2 -m 2048 -display none"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "-no-reboot -global driver=cfi.pflash01,property=secure,value=on \
                 -drive if=pflash,format=raw,unit=0,readonly=on,file=/fw/secboot.fd \
                 -drive if=pflash,format=raw,unit=1,file=/w/vars.fd \
                 -smbios type=11,value=io.systemd.credential:x=y"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "-chardev socket,id=chrtpm,path=/w/tpm/ctrl.sock \
                 -tpmdev emulator,id=tpm0,chardev=chrtpm -device tpm-tis,tpmdev=tpm0 \
                 -serial mon:stdio"
            ),
            "{text}"
        );
    }

    /// The rescue VM: SeaBIOS, a direct kernel, restricted user networking with one guest
    /// forward, SCSI disks with WWN and serial, a 9p share.
    #[test]
    fn a_bios_machine_with_scsi_disks_a_kernel_a_share_and_user_networking() {
        let mut m = Machine::new(
            Boot::Bios {
                image: "/fw/bios.bin".into(),
            },
            Serial::File("/w/s.log".into()),
        );
        m.kernel = Some(Kernel {
            kernel: "/r/vmlinuz".into(),
            initrd: "/r/initrd.img".into(),
            append: "console=ttyS0 ingot.registry=5000".into(),
        });
        m.net = Net::User(UserNet {
            restrict: true,
            ssh_port: Some(2222),
            guest_forwards: vec![GuestForward {
                port: 5000,
                command: "/bin/busybox nc 127.0.0.1 5000".into(),
            }],
        });
        for (i, wwn) in ["0x5000c500a1b2c3d4", "0x5000c500a1b2c3d5"]
            .iter()
            .enumerate()
        {
            m.disks.push(Disk {
                image: format!("/w/d{i}.img").into(),
                id: Some(DiskId {
                    wwn: wwn.to_string(),
                    serial: format!("S{i}"),
                }),
            });
        }
        m.shares.push(Share {
            tag: "job".into(),
            path: "/j".into(),
        });
        let args: Vec<String> = m
            .args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let text = args.join(" ");
        assert!(
            text.contains("-no-reboot -bios /fw/bios.bin -kernel /r/vmlinuz"),
            "{text}"
        );
        // The command line is one argument, spaces and all.
        assert!(args.contains(&"console=ttyS0 ingot.registry=5000".to_string()));
        assert!(!args.contains(&"/bin/busybox nc 127.0.0.1 5000".to_string()));
        assert!(
            text.contains(
                "-netdev user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:2222-:22,\
                 guestfwd=tcp:10.0.2.100:5000-cmd:/bin/busybox nc 127.0.0.1 5000 \
                 -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56 -device virtio-scsi-pci,id=scsi0 \
                 -drive file=/w/d0.img,if=none,id=d0,format=raw,cache=unsafe \
                 -device scsi-hd,drive=d0,bus=scsi0.0,scsi-id=0,wwn=0x5000c500a1b2c3d4,serial=S0 \
                 -drive file=/w/d1.img,if=none,id=d1,format=raw,cache=unsafe \
                 -device scsi-hd,drive=d1,bus=scsi0.0,scsi-id=1,wwn=0x5000c500a1b2c3d5,serial=S1 \
                 -virtfs local,path=/j,mount_tag=job,security_model=none,id=job \
                 -serial file:/w/s.log"
            ),
            "{text}"
        );
    }

    /// No network unless asked: `-nodefaults` leaves no NIC and nothing adds one.
    #[test]
    fn no_network_device_by_default() {
        let m = Machine::new(Boot::Bios { image: "/b".into() }, Serial::Terminal);
        let text = rendered(&m);
        assert!(!text.contains("-net") && !text.contains("-nic"), "{text}");
    }
}
