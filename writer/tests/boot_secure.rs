//! Secure Boot end to end: the boot fixture stack (`tests/boot/`) built with the release's
//! signed UKI (`ingot build --secure-boot-key`), published behind a token and written as CAPH
//! runs the writer, boots under OVMF's Secure Boot firmware whose variable store has the test's
//! own PK, KEK and db, enrolled from Setup Mode by systemd-boot's `secure-boot-enroll force`
//! with the `.auth` files `ingot key secure-boot` made (the documented enrollment path, run
//! once per test). The kernel must say Secure Boot is on, every layer of the machine must be
//! verified with the root hash of the signed command line, the node layer with the root hash of
//! the stub's credential; the same disk with one byte of the UKI's `.cmdline` changed, and with
//! the UKI's signature removed, must be refused by the firmware (`Access Denied`). A loader
//! entry of a db-signed systemd-boot that passes its own command line to the UKI (the base's
//! root hash zeroed) does not override the signed one under Secure Boot; with Secure Boot off
//! the same disk's kernel gets the entry's line (so the entry is really the one run). Every
//! boot's firmware also offers a command line as an SMBIOS OEM string (systemd-stub's
//! `io.systemd.stub.kernel-cmdline-extra`), and no kernel gets it. A BIOS
//! machine of the release gets GRUB and the loader entry and boots under SeaBIOS. With swtpm,
//! two machines of the release agree in PCR 11 (the value `ingot inspect` predicts, for which
//! the release's signed PCR policy has its first signature) and differ in PCR 12 (their node
//! credentials). The second of them is written and booted by `ingot vm --firmware secure-boot`
//! (a developer's VM: its own fixture machine, SCSI disks, its own swtpm), the enrolled variable
//! store placed in its state directory; the command's every other boot is in vm_boot. Its writer
//! seals the node's secrets and var's key to that swtpm, and its initramfs makes var LUKS2 with
//! the key systemd-creds opens.
//!
//! Needs root, qemu-system-x86_64, OVMF's Secure Boot build, docker-registry, sbsigntool,
//! efitools, faketime, mtools and what `tests/boot/build-stack.sh` needs; skipped with a
//! message without them, except in CI.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::boot::{
    bios_machine, machine, publish_secure, run_ok, Machine, Published, END, FAILED,
};
use common::secure_boot::{self, enroll, key_set};
use common::{caph_command, caph_write_for_boot, partitions, repo_root, vm};
use ingot_testkit::qemu::{boot_disk, boot_secure, Firmware, OVMF_VARS};
use ingot_testkit::skip::{have_root, have_tools};
use sha2::Digest as _;

const TOKEN: &str = "ghp_ingotSecureBootToken0123456789abcd";
/// What OVMF's boot manager prints for an image Secure Boot refuses.
const REFUSED: &str = "Access Denied";
/// The marker a loader entry adds to its own command line.
const OVERRIDE: &str = "ingot.override=loader";
/// A command line the firmware offers every Secure Boot boot (an SMBIOS OEM string, which
/// systemd-stub from 254 on appends, unsigned, even under Secure Boot; Debian 12's 252 has no
/// such feature): no kernel may get it.
const SMBIOS: &str = "io.systemd.stub.kernel-cmdline-extra=ingot.smbios=firmware";

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(
            test,
            &["qemu-system-x86_64", "docker-registry", "sbattach", "mmd"],
        )
        && secure_boot::usable(test)
}

/// A fixture machine written by the writer as CAPH runs it (with `--kernel-arg`s, which the
/// signed command line ignores); its first disk's image, partitions and events.
struct Written {
    _m: common::boot::Machine,
    image: PathBuf,
    esp: u64,
    events: String,
    stdout_summary: String,
}

fn write(p: &Published, m: Machine, name: &str) -> Written {
    let output = m.dir.path().join("output.json");
    let events = m.dir.path().join("events.jsonl");
    let cmd = caph_command(
        &p.registry.url,
        TOKEN,
        &repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml"),
        name,
        "sda",
        &m.root,
        &output,
        &events,
        &p.stack.public,
    );
    caph_write_for_boot(cmd, name);
    let image = m.images["sda"].clone();
    let esp = partitions(&image)
        .into_iter()
        .find(|p| p.0 == "ESP")
        .expect("an ESP")
        .1;
    let output: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&output).unwrap()).unwrap();
    Written {
        image,
        esp,
        events: fs::read_to_string(&events).unwrap(),
        stdout_summary: output["message"].as_str().unwrap_or_default().to_string(),
        _m: m,
    }
}

/// A file of `image`'s ESP (mtools), or `None` when it is not there.
fn esp_file(image: &Path, path: &str) -> Option<Vec<u8>> {
    let esp = partitions(image)
        .into_iter()
        .find(|p| p.0 == "ESP")
        .expect("an ESP")
        .1;
    let out = Command::new("mtype")
        .args(["-i", &format!("{}@@{esp}", image.display())])
        .arg(format!("::/{path}"))
        .output()
        .unwrap();
    out.status.success().then_some(out.stdout)
}

/// A second machine of the release, written and booted by `ingot vm` as a developer would
/// (its own fixture machine, SCSI disks, a TPM of its own), with the enrolled variable store
/// `vars` placed in its state directory (what its first boot would have enrolled); its console
/// and first disk.
fn ingot_vm_secure(p: &Published, vars: &Path, dir: &Path) -> (String, PathBuf) {
    let state = dir.join("vm");
    fs::create_dir_all(&state).unwrap();
    fs::copy(vars, state.join("vars.fd")).unwrap();
    let data = repo_root().join("bootstrap/tests/fixtures/cloud-config-worker-join.yaml");
    let mut args = vm::stack_args(&p.registry.url, &p.stack.public, &state);
    args.extend([
        std::ffi::OsStr::new("--firmware"),
        "secure-boot".as_ref(),
        "--name".as_ref(),
        "worker-8".as_ref(),
        "--bootstrap".as_ref(),
        data.as_os_str(),
        "--disk-size".as_ref(),
        "1G".as_ref(),
        "--cpus".as_ref(),
        "1".as_ref(),
        "--memory".as_ref(),
        "1024".as_ref(),
    ]);
    let out = vm::run(&args, &[("OCI_REGISTRY_AUTH_TOKEN", TOKEN)], vm::TIMEOUT);
    let console = vm::text(&out);
    assert_eq!(out.status.code(), Some(0), "{console}");
    assert!(
        console.contains("booting 1 disk(s) with secure-boot"),
        "{console}"
    );
    assert_sealed_by_ingot_vm(&state);
    // The writer sealed var's key with the secrets: the initramfs made var LUKS2 with it.
    for want in [
        "is empty: making it LUKS2 with the key sealed to this machine's TPM (first boot)",
        "is LUKS2, opened with its TPM-sealed key as /dev/mapper/ingot-var",
        "ingot: var /dev/mapper/ingot-var mounted read-write",
    ] {
        assert!(console.contains(want), "no {want:?}:\n{console}");
    }
    (console, state.join("disk0.img"))
}

/// `ingot vm` ran the machine's own TPM for the writer, which sealed the node's secrets to it
/// (the release has a PCR policy): output.json says so, and the join token of the bootstrap
/// data is nowhere on the disk. The node then booted on that TPM state (its console is checked
/// by the caller): sealing leaves the TPM orderly.
fn assert_sealed_by_ingot_vm(state: &Path) {
    let report: serde_json::Value =
        serde_json::from_slice(&fs::read(state.join("output.json")).unwrap()).unwrap();
    let secrets = &report["details"]["secrets"];
    assert_eq!(secrets["sealed"], true, "{secrets}");
    assert_eq!(secrets["var_encrypted"], true, "{secrets}");
    assert!(secrets["count"].as_u64().unwrap() >= 2, "{secrets}");
    let disk = fs::read(state.join("disk0.img")).unwrap();
    let token = b"6h4ylc.5x2jgkf0q8t7mw1d";
    assert!(
        !disk.windows(token.len()).any(|w| w == token),
        "the join token is on the disk in the clear"
    );
}

impl Written {
    /// A file of the ESP (mtools), or `None` when it is not there.
    fn esp_file(&self, path: &str) -> Option<Vec<u8>> {
        esp_file(&self.image, path)
    }

    /// A copy of the disk whose ESP `change` edits through mtools (as an attacker with the ESP
    /// would), given the copy's `image@@offset`.
    fn with_esp(&self, dir: &Path, what: &str, change: impl FnOnce(&str)) -> PathBuf {
        let image = dir.join(format!("{what}.img"));
        run_ok(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(&self.image)
                .arg(&image),
        );
        change(&format!("{}@@{}", image.display(), self.esp));
        image
    }

    /// A copy of the disk whose UKI is `change`d.
    fn with_uki(&self, dir: &Path, what: &str, change: impl FnOnce(&Path)) -> PathBuf {
        let uki = dir.join(format!("{what}.efi"));
        self.with_esp(dir, what, |at| {
            run_ok(
                Command::new("mcopy")
                    .args(["-i", at, "::/EFI/BOOT/BOOTX64.EFI"])
                    .arg(&uki),
            );
            change(&uki);
            run_ok(
                Command::new("mcopy")
                    .args(["-o", "-i", at])
                    .arg(&uki)
                    .arg("::/EFI/BOOT/BOOTX64.EFI"),
            );
        })
    }

    /// A copy of the disk that boots the release's UKI through a db-signed systemd-boot whose
    /// loader entry passes its own command line (`options`, the UKI's load options): the
    /// signed line with the base's root hash zeroed, and a marker. The UKI and its credentials
    /// move to `EFI/Linux/`, where the stub looks beside the image it was loaded from.
    fn with_loader_entry(&self, dir: &Path, what: &str, sdboot: &Path, options: &str) -> PathBuf {
        let files = dir.join(what);
        fs::create_dir_all(&files).unwrap();
        let local = |name: &str, bytes: &[u8]| {
            let path = files.join(name);
            fs::write(&path, bytes).unwrap();
            path
        };
        let uki = local("ingot.efi", &self.esp_file("EFI/BOOT/BOOTX64.EFI").unwrap());
        let creds: Vec<(String, PathBuf)> = ["ingot-node.cred", "ingot-var.cred"]
            .iter()
            .map(|c| {
                let at = format!("EFI/BOOT/BOOTX64.EFI.extra.d/{c}");
                (c.to_string(), local(c, &self.esp_file(&at).unwrap()))
            })
            .collect();
        let conf = local("loader.conf", b"timeout 0\ndefault override.conf\n");
        let entry = local(
            "override.conf",
            format!("title override\nefi /EFI/Linux/ingot.efi\noptions {options}\n").as_bytes(),
        );
        self.with_esp(dir, what, |at| {
            let mmd = |d: &str| run_ok(Command::new("mmd").args(["-i", at, d]));
            let put = |from: &Path, to: &str| {
                run_ok(
                    Command::new("mcopy")
                        .args(["-o", "-i", at])
                        .arg(from)
                        .arg(to),
                );
            };
            for d in [
                "::/EFI/Linux",
                "::/EFI/Linux/ingot.efi.extra.d",
                "::/loader",
            ] {
                mmd(d);
            }
            mmd("::/loader/entries");
            put(&uki, "::/EFI/Linux/ingot.efi");
            for (name, path) in &creds {
                put(path, &format!("::/EFI/Linux/ingot.efi.extra.d/{name}"));
            }
            put(sdboot, "::/EFI/BOOT/BOOTX64.EFI");
            put(&conf, "::/loader/loader.conf");
            put(&entry, "::/loader/entries/override.conf");
        })
    }
}

/// A good Secure Boot boot of machine `name`: Secure Boot on, the signed command line, the base
/// verified with its signed root hash and the other layers left out (a worker), the node layer
/// with the credential's root hash, the end marker.
fn assert_secure_boot(console: &str, signed: &str, node: &str, name: &str) {
    for l in console.lines().filter(|l| {
        l.starts_with("ingot") || l.contains("ecure boot") || l.contains("Kernel command line")
    }) {
        eprintln!("{name}| {l}");
    }
    assert!(
        console.contains("Secure boot enabled"),
        "Secure Boot not on:\n{console}"
    );
    assert!(
        console.contains(&format!("Kernel command line: {signed}")),
        "not the signed line:\n{console}"
    );
    assert!(!console.contains(FAILED), "{console}");
    let layers = signed
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ingot.layers="))
        .unwrap();
    for entry in layers.split(',') {
        let (layer, root) = entry.split_once(':').unwrap();
        let line = if layer == "base" {
            format!("ingot: layer base verified root hash {root}\n")
        } else {
            format!("ingot: layer {layer} not on this disk: not selected for this machine\n")
        };
        assert!(console.contains(&line), "missing {line:?}:\n{console}");
    }
    let line = format!("ingot: layer node verified root hash {node}\n");
    assert!(console.contains(&line), "missing {line:?}:\n{console}");
    assert!(
        console.contains(&format!("ingot-node: hostname {name}\n")),
        "{console}"
    );
    assert!(console.contains(&format!("{END}\n")), "{console}");
}

/// The PCR 11 and PCR 12 a boot with a TPM printed (lower-case hex).
fn pcrs(console: &str) -> (String, String) {
    let pcr = |i: u32| {
        let prefix = format!("ingot: pcr {i} ");
        console
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no PCR {i}:\n{console}"))
            .trim()
            .to_lowercase()
    };
    (pcr(11), pcr(12))
}

/// The firmware refused the disk's UKI: no kernel ran.
fn assert_refused(console: &str, what: &str) {
    assert!(console.contains(REFUSED), "{what}: not refused:\n{console}");
    assert!(
        !console.contains("Linux version"),
        "{what}: a kernel ran:\n{console}"
    );
    assert!(!console.contains(END), "{what}:\n{console}");
}

/// The ESP of a written Secure Boot machine: the release's UKI byte for byte, the credentials,
/// nothing that could choose another line; the summary and the `--kernel-arg` warning. Returns
/// the node credential (the node layer's root hash).
fn assert_secure_esp(p: &Published, w: &Written) -> String {
    let descriptor = &ingot_testkit::layout::read(&p.stack.layout).descriptor;
    let uki_blob = fs::read(ingot_testkit::layout::blob_path(
        &p.stack.layout,
        descriptor["uki"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    assert!(
        w.esp_file("EFI/BOOT/BOOTX64.EFI").unwrap() == uki_blob,
        "UKI not byte for byte"
    );
    for absent in [
        "loader/loader.conf",
        "loader/entries/ingot.conf",
        "ingot/vmlinuz",
        "grub/grub.cfg",
    ] {
        assert!(
            w.esp_file(absent).is_none(),
            "{absent} on a Secure Boot ESP"
        );
    }
    let node = String::from_utf8(
        w.esp_file("EFI/BOOT/BOOTX64.EFI.extra.d/ingot-node.cred")
            .expect("the node credential"),
    )
    .unwrap();
    assert_eq!(node.len(), 64, "{node:?}");
    let var = String::from_utf8(
        w.esp_file("EFI/BOOT/BOOTX64.EFI.extra.d/ingot-var.cred")
            .unwrap(),
    )
    .unwrap();
    assert!(
        var.starts_with("PARTUUID=") && !var.contains(' '),
        "{var:?}"
    );
    // This machine (the writer's own fixture) has no TPM: the summary says the secrets are
    // in the clear, and why (the `ingot vm` machine beside it has one and seals them).
    assert!(
        w.stdout_summary.contains(
            "boots from signed UKI (Secure Boot); this node's 3 secrets are in the clear on its \
             disks, and var is not encrypted: this machine has no TPM"
        ),
        "{}",
        w.stdout_summary
    );
    let ignored = format!(
        "--kernel-arg {} ignored",
        ingot_testkit::qemu::KERNEL_ARGS.join(" ")
    );
    assert!(
        w.events.contains(&ignored),
        "no warning for --kernel-arg:\n{}",
        w.events
    );
    node
}

/// The consoles of two machines of one release: the same UKI, the same PCR 11, the one
/// `ingot inspect` predicts for `layout`; two nodes: two credentials, two PCR 12 values.
fn assert_pcrs_of_one_release(one: &str, two: &str, layout: &Path) {
    let (pcr_one, pcr_two) = (pcrs(one), pcrs(two));
    assert_eq!(
        pcr_one.0, pcr_two.0,
        "PCR 11 differs between two machines of one release"
    );
    assert_ne!(
        pcr_one.1, pcr_two.1,
        "PCR 12 is the same for two node credentials"
    );
    let source = ingot_artifact::verify::LayoutSource::open(layout).unwrap();
    let report = ingot::inspect::inspect(&source, None, None, false).unwrap();
    let predicted = report.pcr11.expect("inspect predicts PCR 11");
    assert_eq!(pcr_one.0, predicted, "PCR 11 is not the predicted value");
    // The release's signed PCR policy (checked by inspect) has a signature for exactly the
    // value the TPM holds while the initramfs runs: the stub's phase, `.pcrpkey` measured.
    let policy = report.pcr_policy.expect("a PCR policy");
    assert_eq!(policy.phases, ["", "sysinit", "sysinit:ready"]);
    // The initramfs put the UKI's .pcrsig where systemd opens sealed credentials with it.
    let (r, _) = ingot_artifact::verify::verify_metadata(
        &source,
        &ingot_artifact::verify::Trust {
            key: None,
            allow_unsigned: true,
        },
    )
    .unwrap();
    let uki = ingot_artifact::verify::read_uki(&source, &r.descriptor)
        .unwrap()
        .expect("a UKI");
    let pcrsig = ingot_artifact::uki::section(&uki, ".pcrsig").unwrap();
    let line = format!(
        "ingot-node: pcr signature {}\n",
        hex::encode(sha2::Sha256::digest(pcrsig))
    );
    for console in [one, two] {
        assert!(console.contains(&line), "missing {line:?}:\n{console}");
    }
}

#[test]
fn the_signed_uki_boots_with_secure_boot_and_a_changed_one_does_not() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    // The key set first; then the stack is built while the enrollment VM runs.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let key = key_set(dir.path(), "ingot boot test");
    let (enrolled, p) = std::thread::scope(|s| {
        let enrolled = s.spawn(|| enroll(dir, &key));
        let p = publish_secure(TOKEN, &key);
        (enrolled.join().unwrap(), p)
    });
    let descriptor = &ingot_testkit::layout::read(&p.stack.layout).descriptor;
    let signed = descriptor["uki"]["cmdline"].as_str().unwrap().to_string();
    let w = write(&p, machine("cpu-worker"), "worker-7");

    let node = assert_secure_esp(&p, &w);

    let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
    let changed = w.with_uki(scratch.path(), "cmdline-byte", |uki| {
        let mut bytes = fs::read(uki).unwrap();
        let section = ingot_artifact::uki::section(&bytes, ".cmdline").unwrap();
        let start = section.as_ptr() as usize - bytes.as_ptr() as usize;
        let at = start + String::from_utf8_lossy(section).find("base:").unwrap() + 5;
        bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
        fs::write(uki, bytes).unwrap();
    });
    let unsigned = w.with_uki(scratch.path(), "unsigned", |uki| {
        run_ok(Command::new("sbattach").arg("--remove").arg(uki));
    });
    // A loader entry's own command line: the base's root hash zeroed, and a marker.
    let base_root = base_root(&signed);
    let options = format!(
        "{} {OVERRIDE}",
        signed.replace(base_root, &"0".repeat(base_root.len()))
    );
    let entry = |what| w.with_loader_entry(scratch.path(), what, &enrolled.sdboot, &options);
    let (on_disk, off_disk) = (entry("loader-entry"), entry("loader-entry-off"));

    // A BIOS machine (Hetzner's cloud VMs) of the same release: no Secure Boot there, so the
    // writer gives it the loader entry and GRUB, as for a stack without a UKI.
    let bios = write(&p, bios_machine("cpu-worker"), "hcloud-worker-1");

    let (vars, no_keys) = (enrolled.vars.as_path(), Path::new(OVMF_VARS));
    // Every boot side by side: name, disk, variable store, TPM, the texts that end it early.
    let boots: [(&str, &Path, &Path, bool, &[&str]); 5] = [
        ("secure-boot", &w.image, vars, true, &[]),
        ("changed-cmdline", &changed, vars, false, &[REFUSED, END]),
        ("unsigned-uki", &unsigned, vars, false, &[REFUSED, END]),
        ("loader-entry", &on_disk, vars, false, &[]),
        // Secure Boot off (the store without keys): the kernel gets the entry's line, so the
        // entry is really what systemd-boot ran.
        (
            "loader-entry-off",
            &off_disk,
            no_keys,
            false,
            &[FAILED, END],
        ),
    ];
    let vm_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut disk2 = PathBuf::new();
    let consoles: BTreeMap<&str, String> = std::thread::scope(|s| {
        // A second machine of the same release through `ingot vm`: another node layer, so
        // another credential.
        let second = s.spawn(|| ingot_vm_secure(&p, vars, vm_dir.path()));
        let running: Vec<_> = boots
            .iter()
            .map(|&(what, disk, vars, tpm, until)| {
                (
                    what,
                    s.spawn(move || boot_secure(&[disk], vars, tpm, until, &[SMBIOS], what)),
                )
            })
            .chain([(
                "bios",
                s.spawn(|| boot_disk(&bios.image, Firmware::Bios, "bios")),
            )])
            .collect();
        let mut consoles: BTreeMap<&str, String> = running
            .into_iter()
            .map(|(what, t)| (what, t.join().unwrap()))
            .collect();
        let (console, disk) = second.join().unwrap();
        consoles.insert("secure-boot-2", console);
        disk2 = disk;
        consoles
    });
    let node2 = String::from_utf8(
        esp_file(&disk2, "EFI/BOOT/BOOTX64.EFI.extra.d/ingot-node.cred").unwrap(),
    )
    .unwrap();
    assert_ne!(node, node2);
    let c = |what: &str| consoles[what].as_str();
    assert_secure_boot(c("secure-boot"), &signed, &node, "worker-7");
    assert_secure_boot(c("secure-boot-2"), &signed, &node2, "worker-8");
    assert_pcrs_of_one_release(c("secure-boot"), c("secure-boot-2"), &p.stack.layout);
    assert_refused(c("changed-cmdline"), "one byte of .cmdline changed");
    assert_refused(c("unsigned-uki"), "signature removed");
    assert_loader_entries(&consoles, &signed, &node, &options);
    assert_bios(&bios, c("bios"), &signed);
}

/// The loader entry's own command line: ignored under Secure Boot (the signed one, every hash
/// verified), used with Secure Boot off; and no kernel got the firmware's SMBIOS line.
fn assert_loader_entries(
    consoles: &BTreeMap<&str, String>,
    signed: &str,
    node: &str,
    options: &str,
) {
    let on = consoles["loader-entry"].as_str();
    assert_secure_boot(on, signed, node, "worker-7");
    assert!(!on.contains(OVERRIDE), "{on}");
    let off = consoles["loader-entry-off"].as_str();
    assert!(
        off.contains(&format!("Kernel command line: {options}")),
        "Secure Boot off: the entry's line was not used, so the test proves nothing:\n{off}"
    );
    assert!(off.contains(FAILED), "{off}");
    for (what, console) in consoles {
        assert!(
            !console.contains("ingot.smbios=firmware"),
            "{what}: the firmware's SMBIOS line reached the kernel:\n{console}"
        );
    }
}

/// The base's root hash on a command line (`ingot.layers=base:ROOT,...`).
fn base_root(line: &str) -> &str {
    line.split_whitespace()
        .find_map(|a| a.strip_prefix("ingot.layers=base:"))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("no base layer in {line:?}"))
}

/// The BIOS machine of a Secure Boot release: written and booted as from a stack without a UKI
/// (the loader entry and GRUB, the UKI and credentials not on its ESP), its base verified with
/// the release's root hash, the writer's `--kernel-arg`s on its line.
fn assert_bios(w: &Written, console: &str, signed: &str) {
    assert!(
        w.stdout_summary
            .contains("boots from boot loader entry (UEFI) and GRUB (BIOS); "),
        "{}",
        w.stdout_summary
    );
    assert!(w.esp_file("grub/grub.cfg").is_some(), "no grub.cfg");
    assert!(w
        .esp_file("EFI/BOOT/BOOTX64.EFI.extra.d/ingot-node.cred")
        .is_none());
    let base = base_root(signed);
    for want in [
        format!("ingot: layer base verified root hash {base}\n"),
        "ingot-node: hostname hcloud-worker-1\n".to_string(),
        format!("{END}\n"),
    ] {
        assert!(console.contains(&want), "bios: no {want:?}:\n{console}");
    }
    let line = console
        .lines()
        .find(|l| l.contains("Kernel command line: "))
        .unwrap_or_else(|| panic!("bios: no command line:\n{console}"));
    assert!(!line.contains("ingot.boot=uki"), "{line}");
    assert!(
        line.contains("no_timer_check"),
        "the writer's --kernel-arg: {line}"
    );
}
