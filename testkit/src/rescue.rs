//! The rescue VM: a stand-in for Hetzner's rescue system under QEMU (TCG), where md, device-mapper,
//! sysfs, udev's by-id links and SMART are the kernel's own, not a fixture directory.
//!
//! `tests/rescue/build-rescue.sh` builds the system (Debian's kernel, busybox, udev, mdadm, lvm2,
//! smartctl, sgdisk); [`Rescue::boot`] boots it with the given disks attached as `scsi-hd` devices
//! on a virtio-scsi controller (each with `wwn=` and `serial=`), a 9p share `job` holding the job
//! script and its inputs (and receiving its results), and user networking restricted to one
//! forward: the VM's `127.0.0.1:PORT` reaches the host's `127.0.0.1:PORT` (a registry), nothing
//! else. [`caph`] runs a command there exactly as cluster-api-provider-hetzner runs its
//! imageURLCommand. See `tests/rescue/README.md`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

pub use crate::qemu::{boot_disk, run_qemu, Firmware, TIMEOUT};
/// The firmware's files, for the tests that check for them.
pub use ingot_vm::firmware::*;
use ingot_vm::machine::{DiskId, GuestForward, Kernel, Net, Serial, Share, UserNet};

/// A disk of the VM: a raw image file with the identity the kernel sees.
pub struct Disk {
    pub image: PathBuf,
    /// `0x` and 16 hex digits (`/dev/disk/by-id/wwn-0x…`, `device/wwid` `naa.…`).
    pub wwn: String,
    pub serial: String,
}

impl Disk {
    /// A sparse, all-zero disk of `size` bytes.
    pub fn create(image: PathBuf, size: u64, wwn: &str, serial: &str) -> Disk {
        let f = fs::File::create(&image).unwrap();
        f.set_len(size).unwrap();
        Disk {
            image,
            wwn: wwn.to_string(),
            serial: serial.to_string(),
        }
    }

    /// SHA-256 of the whole image, hex.
    pub fn sha256(&self) -> String {
        crate::digest::sha256_file(&self.image).unwrap()
    }
}

/// The rescue system's kernel and initramfs.
pub struct Rescue {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl Rescue {
    /// Built once per test process (below `tmp`, the test's `CARGO_TARGET_TMPDIR`), with the
    /// shared libraries `binaries` need.
    pub fn get(tmp: &Path, binaries: &[&Path]) -> &'static Rescue {
        static BUILT: OnceLock<Rescue> = OnceLock::new();
        BUILT.get_or_init(|| {
            let out = tmp.join(format!("rescue-vm-{}", std::process::id()));
            let started = Instant::now();
            let status = Command::new(repo_root().join("tests/rescue/build-rescue.sh"))
                .arg(&out)
                .args(binaries)
                .stdout(Stdio::null())
                .status()
                .expect("tests/rescue/build-rescue.sh");
            assert!(status.success(), "build-rescue.sh: {status}");
            eprintln!("build-rescue.sh: {:.1?}", started.elapsed());
            Rescue {
                kernel: out.join("vmlinuz"),
                initrd: out.join("initrd.img"),
            }
        })
    }

    /// Boots the rescue system with `disks` (in order: scsi-id 0, 1, ...) and the 9p share `job`
    /// (which must hold `job.sh`), runs the job and waits for the poweroff. `registry` is a port
    /// on the host's 127.0.0.1 the VM may reach at its own 127.0.0.1. Returns the serial console.
    pub fn boot(
        &self,
        firmware: Firmware,
        disks: &[&Disk],
        job: &Path,
        registry: Option<u16>,
    ) -> String {
        assert!(
            job.join("job.sh").exists(),
            "no job.sh in {}",
            job.display()
        );
        let work = tempfile::tempdir_in("/var/tmp").unwrap();
        let log = work.path().join("serial.log");
        let mut m = crate::qemu::machine(firmware, 2, 2048, work.path());
        let mut append = format!("{} loglevel=4", crate::qemu::KERNEL_ARGS.join(" "));
        // restrict=on leaves the forward to the registry the VM's only way out.
        let mut net = UserNet {
            restrict: true,
            ..UserNet::default()
        };
        if let Some(port) = registry {
            append.push_str(&format!(" ingot.registry={port}"));
            // One process per connection.
            net.guest_forwards.push(GuestForward {
                port,
                command: format!("/bin/busybox nc 127.0.0.1 {port}"),
            });
        }
        m.kernel = Some(Kernel {
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            append,
        });
        m.net = Net::User(net);
        m.disks = disks
            .iter()
            .map(|d| ingot_vm::machine::Disk {
                image: d.image.clone(),
                id: Some(DiskId {
                    wwn: d.wwn.clone(),
                    serial: d.serial.clone(),
                }),
            })
            .collect();
        m.shares.push(Share {
            tag: "job".into(),
            path: job.to_path_buf(),
        });
        m.serial = Serial::File(log.clone());
        let cmd = m.command();
        run_qemu(cmd, &log, &work.path().join("qemu.err"), "rescue")
    }
}

/// One imageURLCommand run as CAPH starts it: the binary copied to `/root/image-url-command`
/// (with the trusted key and `/root/image-url-command.toml` beside it, unless the binary has
/// both built in), the bootstrap data to `/root/bootstrap.data`, then
/// `OCI_REGISTRY_AUTH_TOKEN='TOKEN' nohup /root/image-url-command URL /root/bootstrap.data NAME 'DEVICES' > LOG`
/// in the background, polled until it exits.
pub struct Caph<'a> {
    pub command: &'a Path,
    pub url: &'a str,
    pub token: &'a str,
    pub bootstrap: &'a Path,
    pub machine_name: &'a str,
    /// CAPH's fourth argument: `sda sdb` or WWNs, space-separated.
    pub devices: &'a str,
    /// The stack's public key, put where the writer reads it without flags
    /// (`INGOT_TRUST_KEY`); None: the command has it built in (a `ci/image-url-command` build).
    pub trust_key: Option<&'a Path>,
    /// `/root/image-url-command.toml`, beside the command; None: no such file. TCG's emulated
    /// disks on a shared, loaded host read at a few MiB/s, which says nothing about a server's
    /// disk, so a test lowers `min_read_speed` here or in the built-in settings.
    pub settings_beside: Option<&'a str>,
    /// Shell run in the rescue system before the command (e.g. building an old installation).
    pub before: &'a str,
    /// Shell run after the command's results are saved (e.g. inspecting md arrays); its output
    /// is in [`CaphRun::after`].
    pub after: &'a str,
    /// Arguments after CAPH's four. CAPH passes none; a test that boots the written disk adds
    /// `--kernel-arg console=ttyS0` to read the node's console.
    pub extra_args: &'a [&'a str],
}

/// What came back from the rescue VM.
pub struct CaphRun {
    /// The command's exit status (None: no status came back).
    pub exit: Option<i32>,
    /// The command's stdout and stderr, as CAPH's log file has them.
    pub log: String,
    /// `/root/output.json` after the command exited.
    pub output_json: serde_json::Value,
    /// Every distinct `message` of output.json, polled once a second as CAPH polls it.
    pub messages: Vec<String>,
    /// Output of [`Caph::after`] and [`Caph::before`].
    pub before: String,
    pub after: String,
    pub console: String,
}

impl CaphRun {
    pub fn last_line(&self) -> &str {
        self.log.lines().last().unwrap_or_default()
    }

    pub fn show(&self) -> String {
        format!(
            "exit {:?}\n--- log\n{}\n--- output.json\n{}\n--- before\n{}\n--- after\n{}\n--- console\n{}",
            self.exit, self.log, self.output_json, self.before, self.after, self.console
        )
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `run` in a rescue VM booted with `firmware` and `disks`, the registry at host port
/// `registry`.
pub fn caph(
    rescue: &Rescue,
    firmware: Firmware,
    disks: &[&Disk],
    registry: u16,
    run: &Caph<'_>,
) -> CaphRun {
    let job = tempfile::tempdir_in("/var/tmp").unwrap();
    let j = job.path();
    // Without debug information: a test build's writer is 250 MB, mostly that, and the rescue
    // system holds it in RAM as CAPH's copy does.
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(j.join("image-url-command"))
        .arg(run.command)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(run.command, j.join("image-url-command")).unwrap();
    }
    fs::copy(run.bootstrap, j.join("bootstrap.data")).unwrap();
    let mut setup = String::new();
    if let Some(key) = run.trust_key {
        fs::copy(key, j.join("trust.pub")).unwrap();
        setup += "cp $J/trust.pub /root/trust.pub\nexport INGOT_TRUST_KEY=/root/trust.pub\n";
    }
    if let Some(settings) = run.settings_beside {
        fs::write(j.join("settings.toml"), settings).unwrap();
        setup += "cp $J/settings.toml /root/image-url-command.toml\n";
    }
    fs::write(j.join("before.sh"), run.before).unwrap();
    fs::write(j.join("after.sh"), run.after).unwrap();
    let script = format!(
        r#"J=/mnt/job
sh $J/before.sh >$J/before.log 2>&1
cp $J/image-url-command /root/image-url-command
chmod 0755 /root/image-url-command
cp $J/bootstrap.data /root/bootstrap.data
{setup}cd /root
OCI_REGISTRY_AUTH_TOKEN={token} nohup /root/image-url-command {url} /root/bootstrap.data {name} {devices}{extra} > /root/image-url-command.log 2>&1 &
pid=$!
echo "rescue: image-url-command started"
while kill -0 $pid 2>/dev/null; do
  [ -f /root/output.json ] && {{ tr -d '\n' </root/output.json; echo; }} >>$J/polled.jsonl
  sleep 1
done
wait $pid
echo $? >$J/exit
cp /root/image-url-command.log $J/log
[ -f /root/output.json ] && cp /root/output.json $J/output.json
echo "rescue: image-url-command exited $(cat $J/exit)"
sh $J/after.sh >$J/after.log 2>&1
sync
"#,
        setup = setup,
        token = shell_quote(run.token),
        url = shell_quote(run.url),
        name = shell_quote(run.machine_name),
        devices = shell_quote(run.devices),
        extra = run
            .extra_args
            .iter()
            .map(|a| format!(" {}", shell_quote(a)))
            .collect::<String>(),
    );
    fs::write(j.join("job.sh"), script).unwrap();
    let console = rescue.boot(firmware, disks, j, Some(registry));
    let read = |name: &str| fs::read_to_string(j.join(name)).unwrap_or_default();
    let messages = read("polled.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["message"].as_str().map(str::to_string))
        .fold(Vec::new(), |mut v, m| {
            if v.last() != Some(&m) {
                v.push(m);
            }
            v
        });
    CaphRun {
        exit: read("exit").trim().parse().ok(),
        log: read("log"),
        output_json: serde_json::from_str(&read("output.json")).unwrap_or_default(),
        messages,
        before: read("before.log"),
        after: read("after.log"),
        console,
    }
}
