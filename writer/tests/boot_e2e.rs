//! End to end: a disk written by ingot-writer, run as cluster-api-provider-hetzner runs it, boots
//! under QEMU with UEFI firmware (OVMF, TCG). The fixture stack (`tests/boot/build-stack.sh`:
//! Debian's kernel, busybox, systemd-boot, an initramfs running `boot/initramfs-tools/scripts/ingot`,
//! the implementation of `docs/boot-contract.md` a real base's initrd runs) is
//! built with the `ingot` library, published to a real docker-registry behind a token-checking
//! front, and written to fixture machines' disks. The serial console must show every selected
//! layer verified with the root hash on the ESP's command line, the per-node hostname and a file
//! from the sealed node layer, and the end marker; a flipped byte in the base or the node
//! partition must stop the boot with the kernel's dm-verity corruption message.
//!
//! Needs root (the writer's machine checks), qemu-system-x86_64, OVMF, docker-registry and the
//! tools `build-stack.sh` names; skipped with a message without root or qemu, except in CI, where
//! a missing piece fails the test.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ingot_testkit::machine::materialize;
use ingot_testkit::skip::{have_file, have_root, have_tools};

const TOKEN: &str = "ghp_ingotBootE2eToken0123456789abcdef";
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
const END: &str = "INGOT-BOOT-OK";
const FAILED: &str = "INGOT-BOOT-FAILED";

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(test, &["qemu-system-x86_64", "docker-registry"])
        && have_file(test, Path::new(OVMF_CODE))
}

use common::{partitions, repo_root};

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The boot fixture stack: built, signed, published behind a token-checking front. Dropping it
/// stops the registry and removes its files.
struct Published {
    _trees: tempfile::TempDir,
    stack: common::Stack,
    registry: common::Published,
}

fn publish() -> Published {
    let trees = tempfile::tempdir_in("/var/tmp").unwrap();
    let started = Instant::now();
    let out = trees.path().join("stack");
    run_ok(Command::new(repo_root().join("tests/boot/build-stack.sh")).arg(&out));
    eprintln!("build-stack.sh: {:.1?}", started.elapsed());
    let stack = common::build_stack(&out.join("stack.toml"));
    let registry = common::publish_behind_token(
        &stack.layout,
        "stacks/boot:1.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    Published {
        _trees: trees,
        stack,
        registry,
    }
}

/// A fixture machine's disk after a successful CAPH-style run of the writer.
struct Written {
    dir: tempfile::TempDir,
    image: PathBuf,
    /// The ESP loader entry's `options` line.
    cmdline: String,
    /// (name, root hash) of every layer on the kernel command line, lowest first.
    layers: Vec<(String, String)>,
    node_root: String,
    /// GPT partitions: (name, start byte, size bytes).
    parts: Vec<(String, u64, u64)>,
}

impl Written {
    fn part(&self, name: &str) -> (u64, u64) {
        let p = self
            .parts
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no partition {name}: {:?}", self.parts));
        (p.1, p.2)
    }

    /// A partition's bytes in a file of their own (for debugfs).
    fn extract(&self, name: &str) -> PathBuf {
        let (start, size) = self.part(name);
        let mut f = fs::File::open(&self.image).unwrap();
        f.seek(SeekFrom::Start(start)).unwrap();
        let mut buf = vec![0u8; size as usize];
        f.read_exact(&mut buf).unwrap();
        let path = self.dir.path().join(format!("{name}.img"));
        fs::write(&path, buf).unwrap();
        path
    }
}

/// Runs the writer as CAPH does (four positional arguments, the token in the environment,
/// `--sysroot` a fixture machine) and reads back what it put on the ESP.
fn write_machine(
    p: &Published,
    fixture: &str,
    disk: &str,
    devices: &str,
    bootstrap: &str,
    name: &str,
) -> Written {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let m = materialize(
        &repo_root().join("tests/fixtures/machines").join(fixture),
        &dir.path().join("machine"),
    )
    .unwrap_or_else(|e| panic!("materializing {fixture}: {e}"));
    let output = dir.path().join("output.json");
    let events = dir.path().join("events.jsonl");
    let out = common::caph_command(
        &p.registry.url,
        TOKEN,
        &repo_root().join("bootstrap/tests/fixtures").join(bootstrap),
        name,
        devices,
        &m.root,
        &output,
        &events,
        &p.stack.public,
    )
    .arg("--no-reboot")
    .args(["--kernel-arg", "console=ttyS0", "--kernel-arg", "panic=-1"])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success()
            && stdout
                .lines()
                .last()
                .unwrap_or("")
                .contains("IMAGE_URL_DONE"),
        "{fixture}: writer failed: {:?}\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let image = m.images[disk].clone();
    let parts = partitions(&image);

    // The command line the firmware hands the kernel: the ESP's loader entry.
    let (esp_start, _) = parts
        .iter()
        .find(|p| p.0 == "ESP")
        .map(|p| (p.1, p.2))
        .expect("an ESP");
    let entry = run_ok(
        Command::new("mtype")
            .arg("-i")
            .arg(format!("{}@@{esp_start}", image.display()))
            .arg("::/loader/entries/ingot.conf"),
    );
    let entry = String::from_utf8_lossy(&entry.stdout).into_owned();
    let cmdline = entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .unwrap_or_else(|| panic!("no options in the loader entry:\n{entry}"))
        .trim()
        .to_string();
    let arg = |key: &str| -> String {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {cmdline}"))
            .to_string()
    };
    let layers: Vec<(String, String)> = arg("ingot.layers=")
        .split(',')
        .map(|e| {
            let (n, r) = e.split_once(':').unwrap();
            (n.to_string(), r.to_string())
        })
        .collect();
    let node_root = arg("ingot.node=");
    assert!(cmdline.ends_with("console=ttyS0 panic=-1"), "{cmdline}");

    // The node layer's root hash is the one the writer reported sealing.
    let events = fs::read_to_string(&events).unwrap();
    let sealed = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .find(|m| m.contains("sealed") && m.contains("root hash "))
        .unwrap_or_else(|| panic!("no sealed message in the events:\n{events}"));
    assert!(sealed.ends_with(&node_root), "{sealed} vs {cmdline}");
    Written {
        dir,
        image,
        cmdline,
        layers,
        node_root,
        parts,
    }
}

/// A qemu process, killed on drop (a failing assertion must not leave it running).
struct Qemu(std::process::Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Boots the disk image under qemu (q35, OVMF with fresh variables, TCG, virtio disk) until
/// it powers off; returns the serial console, CRs and escape sequences dropped.
fn boot(w: &Written, what: &str) -> String {
    let vars = w.dir.path().join(format!("vars-{what}.fd"));
    fs::copy(OVMF_VARS, &vars).unwrap();
    let log = w.dir.path().join(format!("serial-{what}.log"));
    let qemu_err = w.dir.path().join(format!("qemu-{what}.err"));
    let started = Instant::now();
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-smp", "1",
        ])
        .args(["-m", "1024", "-display", "none", "-monitor", "none"])
        .args(["-nodefaults", "-no-reboot"])
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"
        ))
        .arg("-drive")
        .arg(format!(
            "if=pflash,format=raw,unit=1,file={}",
            vars.display()
        ))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", w.image.display()))
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&qemu_err).unwrap())
        .spawn()
        .expect("qemu-system-x86_64");
    let mut q = Qemu(child);
    let status = loop {
        if let Some(s) = q.0.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > BOOT_TIMEOUT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = ingot_testkit::console::clean(&fs::read(&log).unwrap_or_default());
    let Some(status) = status else {
        panic!("{what}: no poweroff within {BOOT_TIMEOUT:?}; console:\n{console}");
    };
    let err = fs::read_to_string(&qemu_err).unwrap_or_default();
    assert!(status.success(), "{what}: qemu {status}: {err}\n{console}");
    eprintln!(
        "{what}: booted and powered off in {:.1?}",
        started.elapsed()
    );
    for l in console.lines().filter(|l| {
        l.starts_with("ingot") || l.starts_with("INGOT") || l.contains("device-mapper: verity:")
    }) {
        eprintln!("{what}| {l}");
    }
    console
}
/// The file system block that holds byte 0 of `path` in an ext4 image (debugfs `bmap`).
fn block_of(fs_image: &Path, path: &str) -> u64 {
    let out = run_ok(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("bmap {path} 0"))
            .arg(fs_image),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let block: u64 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("debugfs bmap {path}: {text:?}"));
    assert!(block > 0, "{path} has no data block (inline?)");
    block
}

/// A file's content read from an ext4 image (debugfs `cat`).
fn cat(fs_image: &Path, path: &str) -> String {
    let out = run_ok(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("cat {path}"))
            .arg(fs_image),
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Flips every bit of one byte of the image, in place; flipping again restores it.
fn flip(image: &Path, offset: u64) {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0xff;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

/// The text the node's init printed between its markers for /etc/ingot/node.json.
fn printed_node_json(console: &str) -> String {
    let start = "ingot-node: --- /etc/ingot/node.json\n";
    let from = console
        .find(start)
        .unwrap_or_else(|| panic!("node.json not printed:\n{console}"))
        + start.len();
    let to = console[from..].find("\ningot-node: --- end").unwrap() + from;
    console[from..to].trim_end_matches('\n').to_string()
}

/// A good boot: every selected layer and the node layer verified with the root hash on the
/// command line, nothing else activated, the staged identity, the end marker.
fn assert_good_boot(
    p: &Published,
    w: &Written,
    console: &str,
    machine_name: &str,
    want: &[&str],
    not: &[&str],
) {
    let names: Vec<&str> = w.layers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want, "{}", w.cmdline);
    for (name, root) in &w.layers {
        // The root hash on the command line is the signed descriptor's.
        let signed = &p.stack.layers.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(root, signed, "{name}");
        let line = format!("ingot: layer {name} verified root hash {root}\n");
        assert!(console.contains(&line), "missing {line:?}:\n{console}");
        let marker = format!("ingot-node: layer active: {name}\n");
        assert!(console.contains(&marker), "missing {marker:?}:\n{console}");
    }
    let line = format!("ingot: layer node verified root hash {}\n", w.node_root);
    assert!(console.contains(&line), "missing {line:?}:\n{console}");
    // Layers this machine does not get: not on the disk, not activated, not in the tree.
    let on_disk: BTreeSet<&str> = w.parts.iter().map(|p| p.0.as_str()).collect();
    for name in not {
        assert!(!on_disk.contains(format!("ingot-{name}").as_str()));
        assert!(!on_disk.contains(format!("ingot-{name}-verity").as_str()));
        assert!(!w.cmdline.contains(&format!("{name}:")), "{}", w.cmdline);
        assert!(
            !console.contains(&format!("ingot: layer {name} ")),
            "{name}"
        );
        assert!(
            !console.contains(&format!("layer active: {name}\n")),
            "{name}"
        );
    }
    assert!(
        console.contains(&format!("ingot-node: hostname {machine_name}\n")),
        "{console}"
    );
    // node.json as the node read it through the overlay is the sealed layer's file.
    let node_img = w.extract("ingot-node");
    let sealed = cat(&node_img, "/etc/ingot/node.json");
    assert!(sealed.contains(machine_name), "{sealed}");
    assert_eq!(printed_node_json(console), sealed.trim_end_matches('\n'));
    // Boot contract v2: the stacked layers are read-only, /etc and /var writable.
    for line in [
        "ingot-node: root is read-only\n",
        "ingot-node: /etc/ingot is writable\n",
        "ingot-node: /var is writable\n",
    ] {
        assert!(console.contains(line), "missing {line:?}:\n{console}");
    }
    assert!(console.contains(&format!("{END}\n")), "{console}");
    assert!(!console.contains(FAILED), "{console}");
    assert!(!console.contains("is corrupted"), "{console}");
}

/// One flipped byte in a data block of `layer`'s partition (the first block of `file`): the
/// boot stops with the kernel's dm-verity corruption message for that block and the failure
/// marker. The byte is restored afterwards.
fn assert_tamper_stops_boot(w: &Written, layer: &str, label: &str, file: &str) {
    let fs_image = w.extract(label);
    let block = block_of(&fs_image, file);
    let (start, _) = w.part(label);
    let offset = start + block * 4096 + 17;
    flip(&w.image, offset);
    let console = boot(w, &format!("tampered-{layer}"));
    flip(&w.image, offset);
    // The data partition's device number, as the initramfs printed it; the kernel names it.
    let opened = format!("ingot: layer {layer} data ");
    let line = console
        .lines()
        .find(|l| l.starts_with(&opened))
        .unwrap_or_else(|| panic!("layer {layer} not opened:\n{console}"));
    let majmin = line
        .split(['(', ')'])
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    let kernel = format!("device-mapper: verity: {majmin}: data block {block} is corrupted");
    assert!(console.contains(&kernel), "missing {kernel:?}:\n{console}");
    assert!(
        console.contains(&format!("{FAILED}: layer {layer}: ")),
        "{console}"
    );
    assert!(
        !console.contains(&format!("ingot: layer {layer} verified")),
        "{console}"
    );
    assert!(!console.contains(END), "{console}");
    assert!(!console.contains("ingot-node: hostname"), "{console}");
}

/// The worker (base only) and the control plane (base, control-plane, kata) are written and
/// booted side by side; the worker's disk is then tampered with, once in the base layer and
/// once in the node layer, and booted again after each flip is undone.
#[test]
fn written_disks_boot_verified_and_tampering_stops_them() {
    if !usable("written_disks_boot_verified_and_tampering_stops_them") {
        return;
    }
    let p = publish();
    std::thread::scope(|s| {
        let p = &p;
        s.spawn(move || {
            let w = write_machine(
                p,
                "kvm-control-plane",
                "sda",
                "sda",
                "cloud-config-controlplane-init.yaml",
                "cp-1",
            );
            let console = boot(&w, "control-plane");
            assert_good_boot(
                p,
                &w,
                &console,
                "cp-1",
                &["base", "control-plane", "kata"],
                &["nvidia"],
            );
        });
        s.spawn(move || {
            let w = write_machine(
                p,
                "cpu-worker",
                "sda",
                "0x5002538e40a1b2c3",
                "cloud-config-worker-join.yaml",
                "worker-7",
            );
            let console = boot(&w, "worker");
            assert_good_boot(
                p,
                &w,
                &console,
                "worker-7",
                &["base"],
                &["control-plane", "nvidia", "kata"],
            );
            assert!(
                console.contains("formatting it (first boot)"),
                "var formatted on first boot:\n{console}"
            );
            assert_tamper_stops_boot(&w, "base", "ingot-base", "/sbin/init");
            assert_tamper_stops_boot(&w, "node", "ingot-node", "/etc/ingot/node.json");
            // Restored, it boots again (var keeps its file system).
            let again = boot(&w, "worker-again");
            assert!(again.contains(&format!("{END}\n")), "{again}");
            assert!(!again.contains(FAILED), "{again}");
            assert!(!again.contains("formatting it"), "{again}");
        });
    });
}
