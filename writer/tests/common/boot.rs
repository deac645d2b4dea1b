//! The boot tests' shared part: the boot fixture stack (`tests/boot/`) published behind a token,
//! a fixture machine written by the writer as CAPH runs it, and what a good boot's console shows.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ingot_testkit::machine::materialize;

use super::{partitions, repo_root};

pub const END: &str = "INGOT-BOOT-OK";
pub const FAILED: &str = "INGOT-BOOT-FAILED";

/// Runs a command, asserts it succeeded; its output.
pub use ingot_testkit::command::output_ok as run_ok;

/// The boot fixture stack: built, signed, published behind a token-checking front. Dropping it
/// stops the registry and removes its files.
pub struct Published {
    /// The layer trees `tests/boot/build-stack.sh` made (`stack/`), for variants of the stack.
    pub trees: tempfile::TempDir,
    pub stack: super::Stack,
    pub registry: super::Published,
}

/// Builds the boot fixture stack and publishes it as `stacks/boot:1.0.0` behind `token`.
pub fn publish(token: &str) -> Published {
    let trees = tempfile::tempdir_in("/var/tmp").unwrap();
    let started = Instant::now();
    let out = trees.path().join("stack");
    run_ok(Command::new(repo_root().join("tests/boot/build-stack.sh")).arg(&out));
    eprintln!("build-stack.sh: {:.1?}", started.elapsed());
    build_and_publish(trees, &out.join("stack.toml"), "1.0.0", token)
}

/// The boot fixture stack built with the release's signed UKI (db key `key`), its manifest
/// given the serial console as its own kernel arguments (the signed command line carries them),
/// published as `stacks/boot:1.0.0` behind `token`.
pub fn publish_secure(token: &str, key: &ingot::uki::SecureBootKey) -> Published {
    let trees = tempfile::tempdir_in("/var/tmp").unwrap();
    let started = Instant::now();
    let out = trees.path().join("stack");
    run_ok(Command::new(repo_root().join("tests/boot/build-stack.sh")).arg(&out));
    eprintln!("build-stack.sh: {:.1?}", started.elapsed());
    let manifest = super::secure_boot::with_kernel_args(
        &out.join("stack.toml"),
        "stack.toml",
        &ingot_testkit::qemu::KERNEL_ARGS,
    );
    let started = Instant::now();
    let stack = super::build_stack_with(&manifest, 4 << 20, Some(key.clone()));
    eprintln!("ingot build --secure-boot-key: {:.1?}", started.elapsed());
    let registry = super::publish_behind_token(
        &stack.layout,
        "stacks/boot:1.0.0",
        token,
        &stack.dir.path().join("registry"),
    );
    Published {
        trees,
        stack,
        registry,
    }
}

/// A new release of `p`'s stack: its trees copied, changed by `change`, built as `version` and
/// published as `stacks/boot:VERSION` behind `token` in a registry of its own.
pub fn republish(
    p: &Published,
    token: &str,
    version: &str,
    change: impl FnOnce(&Path),
) -> Published {
    let trees = tempfile::tempdir_in("/var/tmp").unwrap();
    let out = trees.path().join("stack");
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(p.trees.path().join("stack"))
            .arg(&out),
    );
    change(&out);
    let manifest = out.join("stack.toml");
    let text = fs::read_to_string(&manifest).unwrap();
    let text = text.replace("version = \"1.0.0\"", &format!("version = \"{version}\""));
    fs::write(&manifest, text).unwrap();
    build_and_publish(trees, &manifest, version, token)
}

/// `manifest` (in `trees`) built and published as `stacks/boot:VERSION` behind `token` in a
/// registry of its own.
fn build_and_publish(
    trees: tempfile::TempDir,
    manifest: &Path,
    version: &str,
    token: &str,
) -> Published {
    let stack = super::build_stack(manifest);
    let registry = super::publish_behind_token(
        &stack.layout,
        &format!("stacks/boot:{version}"),
        token,
        &stack.dir.path().join("registry"),
    );
    Published {
        trees,
        stack,
        registry,
    }
}

/// A fixture machine's disks after a successful CAPH-style run of the writer, one of them
/// (`image`) selected for booting.
pub struct Written {
    pub dir: tempfile::TempDir,
    /// The fixture machine's root (`--sysroot`).
    pub root: PathBuf,
    /// Every disk of the machine by kernel name.
    pub images: BTreeMap<String, PathBuf>,
    /// The selected disk.
    pub image: PathBuf,
    /// The selected disk's ESP loader entry's `options` line.
    pub cmdline: String,
    /// (name, root hash) of every layer on the kernel command line, lowest first.
    pub layers: Vec<(String, String)>,
    pub node_root: String,
    /// The selected disk's GPT partitions: (name, start byte, size bytes).
    pub parts: Vec<(String, u64, u64)>,
}

impl Written {
    pub fn part(&self, name: &str) -> (u64, u64) {
        let p = self
            .parts
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no partition {name}: {:?}", self.parts));
        (p.1, p.2)
    }

    /// A partition's bytes in a file of their own (for debugfs).
    pub fn extract(&self, name: &str) -> PathBuf {
        let (start, size) = self.part(name);
        let mut f = fs::File::open(&self.image).unwrap();
        f.seek(SeekFrom::Start(start)).unwrap();
        let mut buf = vec![0u8; size as usize];
        f.read_exact(&mut buf).unwrap();
        let path = self.dir.path().join(format!("{name}.img"));
        fs::write(&path, buf).unwrap();
        path
    }

    /// The machine again, for another run of the writer over it.
    pub fn into_machine(self) -> Machine {
        Machine {
            dir: self.dir,
            root: self.root,
            images: self.images,
        }
    }

    /// Selects disk `name` for booting; its ESP must carry the same command line.
    pub fn select(&mut self, name: &str) {
        self.image = self.images[name].clone();
        self.parts = partitions(&self.image);
        let cmdline = esp_cmdline(&self.image, &self.parts);
        assert_eq!(cmdline, self.cmdline, "{name}'s ESP");
    }

    /// The value of `key` (`ingot.var=`) on the command line.
    pub fn arg(&self, key: &str) -> String {
        cmdline_arg(&self.cmdline, key)
    }
}

/// The value of `key` (`ingot.var=`) on `cmdline`.
pub fn cmdline_arg(cmdline: &str, key: &str) -> String {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {cmdline}"))
        .to_string()
}

/// The `var` members on `cmdline` (`ingot.var=PARTUUID=A,PARTUUID=B`), in disk order.
pub fn var_members(cmdline: &str) -> Vec<String> {
    cmdline_arg(cmdline, "ingot.var=")
        .split(',')
        .map(|m| {
            m.strip_prefix("PARTUUID=")
                .unwrap_or_else(|| panic!("{m} in {cmdline}"))
                .to_string()
        })
        .collect()
}

/// `var` came up from `present` of `of` members, `state` (`degraded`/`complete`), was formatted
/// (first boot) and mounted read-write on the md device.
pub fn assert_var_mirror(console: &str, present: usize, of: usize, state: &str) {
    let line = console
        .lines()
        .find(|l| l.starts_with("ingot: var: RAID1 /dev/md"))
        .unwrap_or_else(|| panic!("var not assembled:\n{console}"));
    assert!(
        line.contains(&format!(" assembled from {present} of {of} members "))
            && line.ends_with(&format!(", {state}")),
        "{line}"
    );
    let md = line.split_whitespace().nth(3).unwrap();
    for want in [
        format!("ingot: var {md} has no file system: formatting it (first boot)\n"),
        format!("ingot: var {md} mounted read-write (nosuid,nodev)\n"),
    ] {
        assert!(console.contains(&want), "missing {want:?}:\n{console}");
    }
}

/// The command line the firmware hands the kernel: the ESP's loader entry's `options`.
pub fn esp_cmdline(image: &Path, parts: &[(String, u64, u64)]) -> String {
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
    entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .unwrap_or_else(|| panic!("no options in the loader entry:\n{entry}"))
        .trim()
        .to_string()
}

/// A fixture machine built in a fresh directory, to be written by [`write`].
pub struct Machine {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub images: BTreeMap<String, PathBuf>,
}

pub fn machine(fixture: &str) -> Machine {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let m = materialize(
        &repo_root().join("tests/fixtures/machines").join(fixture),
        &dir.path().join("machine"),
    )
    .unwrap_or_else(|e| panic!("materializing {fixture}: {e}"));
    Machine {
        dir,
        root: m.root,
        images: m.images,
    }
}

/// [`machine`] without UEFI (its `/sys/firmware/efi` removed), as Hetzner's cloud VMs boot.
pub fn bios_machine(fixture: &str) -> Machine {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let copy = dir.path().join("fixture");
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(repo_root().join("tests/fixtures/machines").join(fixture))
            .arg(&copy),
    );
    fs::remove_dir_all(copy.join("sys/firmware/efi")).unwrap();
    let m = materialize(&copy, &dir.path().join("machine"))
        .unwrap_or_else(|e| panic!("materializing {fixture} without UEFI: {e}"));
    Machine {
        dir,
        root: m.root,
        images: m.images,
    }
}

/// Runs the writer as CAPH does (four positional arguments, the token in the environment,
/// `--sysroot` a fixture machine) and reads back what it put on disk `disk`'s ESP.
pub fn write_machine(
    p: &Published,
    token: &str,
    fixture: &str,
    disk: &str,
    devices: &str,
    bootstrap: &str,
    name: &str,
) -> Written {
    write(p, token, machine(fixture), disk, devices, bootstrap, name)
}

/// [`write_machine`] over an existing machine (a second run rewrites a finished node).
pub fn write(
    p: &Published,
    token: &str,
    m: Machine,
    disk: &str,
    devices: &str,
    bootstrap: &str,
    name: &str,
) -> Written {
    let output = m.dir.path().join("output.json");
    let events = m.dir.path().join("events.jsonl");
    let _ = fs::remove_file(&events);
    let cmd = super::caph_command(
        &p.registry.url,
        token,
        &repo_root().join("bootstrap/tests/fixtures").join(bootstrap),
        name,
        devices,
        &m.root,
        &output,
        &events,
        &p.stack.public,
    );
    super::caph_write_for_boot(cmd, name);
    let image = m.images[disk].clone();
    let parts = partitions(&image);
    let cmdline = esp_cmdline(&image, &parts);
    let mut w = Written {
        dir: m.dir,
        root: m.root,
        images: m.images,
        image,
        cmdline,
        layers: Vec::new(),
        node_root: String::new(),
        parts,
    };
    w.layers = w
        .arg("ingot.layers=")
        .split(',')
        .map(|e| {
            let (n, r) = e.split_once(':').unwrap();
            (n.to_string(), r.to_string())
        })
        .collect();
    w.node_root = w.arg("ingot.node=");
    assert!(
        w.cmdline.ends_with("console=ttyS0 panic=-1"),
        "{}",
        w.cmdline
    );

    // The node layer's root hash is the one the writer reported sealing.
    let events = fs::read_to_string(&events).unwrap();
    let sealed = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .find(|m| m.contains("sealed") && m.contains("root hash "))
        .unwrap_or_else(|| panic!("no sealed message in the events:\n{events}"));
    assert!(sealed.ends_with(&w.node_root), "{sealed} vs {}", w.cmdline);
    w
}

/// Boots the selected disk alone under OVMF until it powers off; prints the boot's own lines.
pub fn boot(w: &Written, what: &str) -> String {
    boot_disks(&[&w.image], what)
}

/// Boots `images` (the firmware boots the first) under OVMF; prints the boot's own lines.
pub fn boot_disks(images: &[&Path], what: &str) -> String {
    let console =
        ingot_testkit::qemu::boot_disks(images, ingot_testkit::qemu::Firmware::Uefi, what);
    for l in console.lines().filter(|l| {
        l.starts_with("ingot") || l.starts_with("INGOT") || l.contains("device-mapper: verity:")
    }) {
        eprintln!("{what}| {l}");
    }
    console
}

/// A file's content read from an ext4 image (debugfs `cat`).
pub fn cat(fs_image: &Path, path: &str) -> String {
    let out = run_ok(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("cat {path}"))
            .arg(fs_image),
    );
    String::from_utf8(out.stdout).unwrap()
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
pub fn assert_good_boot(
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
