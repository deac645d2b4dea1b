//! A VM's state directory, which `ingot vm` boots from: the machine the VM is (`vm.json`), the
//! machine fixture the writer reads (`machine/`), the sparse disk images (`disk0.img`, ...), the
//! UEFI variable store (`vars.fd`), the TPM's state (`tpm/`), the bootstrap data given to the
//! writer (`bootstrap.data`), the writer's status file (`output.json`), the last boot's serial
//! console (`console.log`), the SSH port (`ssh-port`) and the private key `ingot vm ssh` logs in
//! with (`ssh-identity`). Kept (`--state DIR`), a second boot is the node's second boot, with the
//! disks and variables as the first left them, on the same machine.
use std::fs;
use std::path::{Path, PathBuf};

use crate::accel::Accel;
use crate::firmware::{Firmware, Images};
use crate::fixture::{self, Node, NodeDisk};
use crate::machine::{Boot, Disk, Machine, Net, Serial, UserNet};

/// The machine a VM is, kept in its state directory (`vm.json`) so that booting it again, or
/// writing over it, is the same machine unless a flag changes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// The machine's name (CAPH's third argument to the writer).
    pub name: String,
    pub firmware: Firmware,
    pub virt: bool,
    pub nvidia_gpu: bool,
    pub cpus: u32,
    pub memory_mib: u32,
    pub disks: usize,
    /// Each disk's size in bytes.
    pub disk_size: u64,
    /// QEMU's user networking (false: no network device at all).
    pub user_net: bool,
    /// With [`Spec::user_net`]: the host's `127.0.0.1:PORT` forwarded to the guest's SSH port.
    pub ssh_port: Option<u16>,
}

impl Default for Spec {
    /// `ingot vm`'s defaults: a UEFI machine with 2 CPUs, 2 GiB, one 8 GiB disk, no network.
    fn default() -> Spec {
        Spec {
            name: "ingot-vm".into(),
            firmware: Firmware::Uefi,
            virt: false,
            nvidia_gpu: false,
            cpus: 2,
            memory_mib: 2048,
            disks: 1,
            disk_size: 8 << 30,
            user_net: false,
            ssh_port: None,
        }
    }
}

/// Preparing or reading the state directory failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Fixture(#[from] fixture::FixtureError),
    #[error("{} holds no VM (no disk0.img): give the stack to write", dir.display())]
    Empty { dir: PathBuf },
    #[error("{}: --disks must be 1 or more", dir.display())]
    NoDisks { dir: PathBuf },
    #[error("{}: not the machine description `ingot vm` keeps", path.display())]
    Spec {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.into(),
        source,
    }
}

/// A VM's state directory.
#[derive(Clone, Debug)]
pub struct State {
    dir: PathBuf,
}

impl State {
    pub fn new(dir: impl Into<PathBuf>) -> State {
        State { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The machine fixture the writer reads (`--sysroot`).
    pub fn machine(&self) -> PathBuf {
        self.dir.join("machine")
    }

    /// Disk `index`'s image.
    pub fn disk(&self, index: usize) -> PathBuf {
        self.dir.join(format!("disk{index}.img"))
    }

    pub fn vars(&self) -> PathBuf {
        self.dir.join("vars.fd")
    }

    pub fn tpm(&self) -> PathBuf {
        self.dir.join("tpm")
    }

    pub fn bootstrap(&self) -> PathBuf {
        self.dir.join("bootstrap.data")
    }

    /// The writer's status file (`--report`).
    pub fn report(&self) -> PathBuf {
        self.dir.join("output.json")
    }

    /// Where the SSH port of the running VM is kept, for `ingot vm ssh`.
    pub fn ssh_port_file(&self) -> PathBuf {
        self.dir.join("ssh-port")
    }

    /// Where the path of the private key `ingot vm ssh` logs in with is kept (the one beside
    /// `--ssh-key`'s public key).
    pub fn ssh_identity_file(&self) -> PathBuf {
        self.dir.join("ssh-identity")
    }

    /// Keeps what `ingot vm ssh` needs: the forwarded port (none: the file goes) and, when
    /// given, the private key to log in with.
    pub fn keep_ssh(&self, port: Option<u16>, identity: Option<&Path>) -> Result<(), StateError> {
        let file = self.ssh_port_file();
        match port {
            Some(port) => fs::write(&file, format!("{port}\n")).map_err(io(&file))?,
            None => match fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&file)(e)),
                _ => {}
            },
        }
        if let Some(key) = identity {
            let key = fs::canonicalize(key).map_err(io(key))?;
            let file = self.ssh_identity_file();
            fs::write(&file, format!("{}\n", key.display())).map_err(io(&file))?;
        }
        Ok(())
    }

    /// The private key `ingot vm ssh` logs in with, when one is kept.
    pub fn ssh_identity(&self) -> Option<PathBuf> {
        let text = fs::read_to_string(self.ssh_identity_file()).ok()?;
        Some(PathBuf::from(text.trim_end_matches('\n')))
    }

    /// The last boot's serial console, as the terminal showed it.
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// The machine description (`vm.json`).
    pub fn spec_file(&self) -> PathBuf {
        self.dir.join("vm.json")
    }

    /// The machine this VM was last written or booted as; None for a VM that has none kept.
    pub fn kept_spec(&self) -> Result<Option<Spec>, StateError> {
        let path = self.spec_file();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StateError::Spec { path, source })
    }

    /// Keeps `spec` as this VM's machine (written whole: a crash leaves the old one or the
    /// new one).
    pub fn keep_spec(&self, spec: &Spec) -> Result<(), StateError> {
        let path = self.spec_file();
        let tmp = self.dir.join(".vm.json.tmp");
        let mut text = serde_json::to_string_pretty(spec).expect("a Spec serializes");
        text.push('\n');
        fs::write(&tmp, text).map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Whether a VM was written here before (its first disk exists).
    pub fn written(&self) -> bool {
        self.disk(0).exists()
    }

    /// The disk images here, in order.
    pub fn disks(&self) -> Vec<PathBuf> {
        (0..)
            .map(|i| self.disk(i))
            .take_while(|d| d.exists())
            .collect()
    }

    /// Makes the directory ready for the writer: the disk images (sparse, `spec.disk_size`
    /// each; existing ones are kept, as re-provisioning writes over a server's disks) and the
    /// machine fixture, written anew. Returns the machine the writer will see.
    pub fn prepare(&self, spec: &Spec) -> Result<Node, StateError> {
        if spec.disks == 0 {
            return Err(StateError::NoDisks {
                dir: self.dir.clone(),
            });
        }
        fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let mut disks = Vec::new();
        for i in 0..spec.disks {
            let image = self.disk(i);
            let size = match fs::metadata(&image) {
                Ok(m) => m.len(),
                Err(_) => {
                    let f = fs::File::create(&image).map_err(io(&image))?;
                    f.set_len(spec.disk_size).map_err(io(&image))?;
                    spec.disk_size
                }
            };
            let image = fs::canonicalize(&image).map_err(io(&image))?;
            disks.push(NodeDisk::numbered(i, image, size));
        }
        let node = Node {
            firmware: spec.firmware,
            virt: spec.virt,
            nvidia_gpu: spec.nvidia_gpu,
            cpus: spec.cpus,
            disks,
            user_net: spec.user_net,
        };
        let machine = self.machine();
        if machine.exists() {
            fs::remove_dir_all(&machine).map_err(io(&machine))?;
        }
        fixture::write(&machine, &node)?;
        Ok(node)
    }

    /// The writer's fourth CAPH argument for this VM's `disks`: their WWNs, as CAPH passes
    /// `rootDeviceHints`.
    pub fn root_devices(node: &Node) -> String {
        node.disks
            .iter()
            .map(|d| d.id.wwn.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The machine that boots this directory's disks with `images` (the variable store copied
    /// from their template on the first boot, kept after), under `accel`, its console on the
    /// terminal.
    pub fn machine_to_boot(
        &self,
        spec: &Spec,
        images: Images,
        accel: Accel,
    ) -> Result<Machine, StateError> {
        let disks = self.disks();
        if disks.is_empty() {
            return Err(StateError::Empty {
                dir: self.dir.clone(),
            });
        }
        let vars = self.vars();
        if let Some(template) = &images.vars_template {
            if !vars.exists() {
                fs::copy(template, &vars).map_err(io(&vars))?;
            }
        }
        let boot = match spec.firmware {
            Firmware::Uefi => Boot::Uefi {
                code: images.code,
                vars,
            },
            Firmware::SecureBoot => Boot::SecureBoot {
                code: images.code,
                vars,
            },
            Firmware::Bios => Boot::Bios { image: images.code },
        };
        let mut m = Machine::new(boot, Serial::Terminal);
        (m.accel, m.cpus, m.memory_mib) = (accel, spec.cpus, spec.memory_mib);
        m.disks = disks
            .into_iter()
            .enumerate()
            .map(|(i, image)| Disk {
                id: Some(NodeDisk::numbered(i, image.clone(), 0).id),
                image,
            })
            .collect();
        if spec.user_net {
            m.net = Net::User(UserNet {
                ssh_port: spec.ssh_port,
                ..UserNet::default()
            });
        }
        Ok(m)
    }
}
