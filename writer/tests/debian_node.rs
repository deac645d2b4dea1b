//! A real node, end to end: the Debian stack (`ingot build manifests/debian/stack.toml` by a
//! copy of the binary outside the checkout: Debian 12 packages, the base's own initramfs-tools
//! initrd with `boot/initramfs-tools`, the first-boot units of `boot/systemd`, the nvidia, kata
//! and control-plane layers installed by apt over the base, every layer's SBOM checked by
//! pyspdxtools and ntia-conformance-checker) is built once, with a container image this test
//! makes itself (busybox) as the
//! control plane's preload and a stand-in `kubeadm` that records its arguments and checks the
//! config it is pointed at. It is published behind the token-checking registry front, written
//! CAPH-style onto a control plane's and four workers' disks, and each boots under QEMU (OVMF,
//! SeaBIOS or OVMF's Secure Boot build) with no network device at all. The test's own bootstrap data installs a check unit whose
//! `INGOT-CHECK` lines on the serial console say what the node saw: systemd's state and failed
//! units, the kubeadm runs, containerd's images and a container run from the preload, which
//! places are writable, the node's identity, the boot time. Every command of the check that could
//! hang runs under a bound of its own (a hang prints `INGOT-CHECK timeout WHAT after Ns` and fails
//! the test naming it), and a console silent for [`SILENCE`] fails the boot (a guest frozen
//! whole). The control plane boots twice. Boot contract version 3: on first boot the data's own
//! commands, as root, write `/etc/ingot-probe`, install and enable a unit of their own under
//! /etc/systemd/system, and drop files into /opt/cni/bin and /etc/kubernetes; the second boot
//! must show the first two gone (and the unit not run), the CNI directory empty of the drop,
//! /etc/kubernetes and kubeadm's state kept, /var's writes kept and the first boot's work not
//! repeated. Beside it: a BIOS cloud VM, which then gets one byte of systemd flipped in its base
//! partition and must not come up; a GPU worker that gets the nvidia layer (no kata) and shows its
//! module built for the base's kernel, refused by the kernel only for want of a GPU; and a
//! two-disk server whose `var` is mirrored and which boots from either disk alone, degraded. The
//! control plane (KVM and UEFI) and the two-disk server also get the kata layer: its modules load
//! and /dev/kvm exists on both, and on the control plane's first boot the layer's QEMU boots a
//! guest under KVM inside the node (once a run: nested KVM under TCG costs a minute of a core);
//! its second boot forces that guest to hang and shows the bound stopping it. The same trees
//! (from the tree cache, `--locked`) are also built as a Secure Boot release (`ingot build --secure-boot-key --pcr-key`, a signed
//! UKI with a signed PCR 11 policy), and a control plane of it is made with `ingot vm
//! --firmware secure-boot` (the test's own keys enrolled, the machine's own swtpm): the writer
//! seals the node's secrets (SSH host keys, the test's CA keys, the kubeadm config with its
//! token) to that TPM, none of them is on the disk, the node boots with the kernel locked down
//! and every layer verified against the signed command line, opens them, sshd serves the sealed
//! host keys and the bootstrap reads the CA keys; booted again on a cleared TPM it opens
//! nothing, and neither sshd nor anything that joins starts.
//!
//! The check unit itself is the harness: sealed in the node layer like any data file, and pulled
//! into every boot by `systemd.wants=ingot-check.service` on the kernel command line (the
//! writer's `--kernel-arg`; the Secure Boot release's own `[boot] kernel_args`), since an enable link written at run time does not survive a reboot
//! any more (that is the point) and cloud-config cannot seal a symlink.
//!
//! Needs root, mmdebstrap (and Debian's archive), qemu-system-x86_64, OVMF (and its Secure Boot
//! build), docker-registry, busybox-static, debugfs, ssh-keygen, sbsigntool, efitools, faketime,
//! mtools and systemd-boot-efi; skipped with a message without them, except in CI, where a
//! missing piece fails the test.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ingot_testkit::machine::materialize;
use ingot_testkit::qemu::{self, OVMF_CODE};
use ingot_testkit::skip::{have_file, have_root, have_tools};
use ingot_vm::machine::Serial;
use sha2::{Digest, Sha256};

use common::boot::{assert_var_mirror, esp_cmdline, run_ok, var_members};
use common::secure_boot;
use common::{partitions, repo_root};
use ingot::uki::SecureBootKey;

const TOKEN: &str = "ghp_ingotDebianNodeToken0123456789abcdef";
/// TCG beside the rest of `ci/test`, at most one guest per host core at once (testkit's `cores`;
/// counted from the guest's start): generous, and never asserted on.
const BOOT_TIMEOUT: Duration = Duration::from_secs(2400);
/// A boot whose console prints nothing for this long has hung (a guest frozen whole, which no
/// bound inside it can stop): more than the check script's longest bound (the nested guest's
/// 300 s) with room for a starved guest, far less than [`BOOT_TIMEOUT`].
const SILENCE: Duration = Duration::from_secs(600);
/// The control plane's bootstrap token (its kubeadm config's `bootstrapTokens`): sealed with the
/// rest of that config on the Secure Boot control plane, so never on its disk.
const CP_TOKEN: &str = "ingotc.p0k8s5ealedt0ken";
const IMAGE_REF: &str = "example.invalid/ingot/busybox:1.0";
const CHECK: &str = "INGOT-CHECK ";
/// What pulls the check unit into every boot (module docs).
const CHECK_ARG: &str = "systemd.wants=ingot-check.service";
/// The control plane's kernel never halts its vCPU while idle: TCG (QEMU 7.2, Debian 12) loses
/// the wakeup of a halted vCPU now and then while a nested KVM guest runs in it, and the whole
/// guest then sleeps for ever at 0% CPU (the vCPU thread in `qemu_wait_io_event`). A loop of the
/// nested boot on an AMD host froze at its 20th boot; with `idle=poll`, 60 of 60 ran. A real
/// node has no use for it: it is the test's `--kernel-arg` for the machine that runs the nested
/// guest.
const NESTED_ARG: &str = "idle=poll";
/// The disk the enlarged fixture machines get (sparse): the Debian base is about 1 GiB.
const DISK_MIB: u64 = 4096;

fn usable(test: &str) -> bool {
    have_root(test)
        && have_tools(
            test,
            &[
                "qemu-system-x86_64",
                "mmdebstrap",
                "docker-registry",
                "debugfs",
                "ssh-keygen",
                "busybox",
            ],
        )
        && have_file(test, Path::new(OVMF_CODE))
        && common::secure_boot::usable(test)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Stores `bytes` as a blob of an OCI layout; returns its descriptor's digest and size.
fn blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let hex = sha256_hex(bytes);
    fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
    (format!("sha256:{hex}"), bytes.len())
}

/// A tiny runnable image (busybox-static as /bin/busybox, sh, echo, ls, cat) as an OCI image
/// layout at `layout`, named [`IMAGE_REF`]; returns its manifest digest.
fn preload_image(work: &Path, layout: &Path) -> String {
    let root = work.join("image-root");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "echo", "ls", "cat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = work.join("layer.tar");
    run_ok(
        Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
            ])
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&root)
            .arg("bin"),
    );
    fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    let (layer, layer_size) = blob(layout, &fs::read(&tar).unwrap());
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    });
    let (config, config_size) = blob(layout, config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer, "size": layer_size}],
    });
    let (digest, size) = blob(layout, manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest, "size": size,
                       "annotations": {"io.containerd.image.name": IMAGE_REF,
                                       "org.opencontainers.image.ref.name": "1.0"}}],
    });
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    digest
}

/// The stand-in kubeadm: appends one line per run to /var/lib/ingot-test/kubeadm.log with its
/// arguments and the kind, node name and sha256 of the config `--config` points at; fails when
/// there is none.
const KUBEADM: &str = r#"#!/bin/sh
set -eu
cfg= prev=
for a in "$@"; do
  [ "$prev" = --config ] && cfg=$a
  case "$a" in --config=*) cfg=${a#--config=} ;; esac
  prev=$a
done
[ -n "$cfg" ] && [ -f "$cfg" ] || { echo "stand-in kubeadm: no config file '$cfg'" >&2; exit 1; }
kind=$(sed -n 's/^kind: *//p' "$cfg" | head -1)
name=$(sed -n 's/^ *name: *//p' "$cfg" | head -1)
sum=$(sha256sum "$cfg" | cut -d' ' -f1)
mkdir -p /var/lib/ingot-test /etc/kubernetes/pki /etc/kubernetes/manifests
echo "args=$* kind=$kind name=$name sha256=$sum" >>/var/lib/ingot-test/kubeadm.log
# kubeadm's own state, as the real one leaves it: kubeconfig, PKI, static pod manifests.
boot=$(cat /proc/sys/kernel/random/boot_id)
echo "stand-in kubeconfig $boot" >/etc/kubernetes/admin.conf
echo "stand-in ca $boot" >/etc/kubernetes/pki/ca.crt
echo "stand-in manifest $boot" >/etc/kubernetes/manifests/ingot-test.yaml
"#;

/// What the check unit runs: waits for the boot to finish, prints what the node sees as
/// `INGOT-CHECK ...` lines, and powers off.
const CHECK_SCRIPT: &str = r#"#!/bin/sh
say() { echo "INGOT-CHECK $*"; }
# fd 3 is the unit's own output (journal and console) even inside $(...) and pipes.
exec 3>&1
# bounded SECONDS WHAT CMD...: every command that could hang runs under a limit of its own, so a
# hang fails the check in minutes and says what hung (`timeout WHAT after Ns`, exit 124).
bounded() {
  limit=$1 what=$2
  shift 2
  timeout -k 10 "$limit" "$@"
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then say "timeout $what after ${limit}s" >&3; fi
  return $rc
}
state=$(bounded 1200 is-system-running systemctl is-system-running --wait)
say "state $state"
say "multi-user $(systemctl is-active multi-user.target)"
systemctl list-units --failed --plain --no-legend | while read -r unit rest; do say "failed-unit $unit"; done
say "boot-id $(cat /proc/sys/kernel/random/boot_id)"
mkdir -p /var/lib/ingot-test
[ -f /etc/ingot-test-persist ] || cat /proc/sys/kernel/random/boot_id >/etc/ingot-test-persist
[ -f /var/lib/ingot-test/persist ] || cat /proc/sys/kernel/random/boot_id >/var/lib/ingot-test/persist
say "persist-etc $(cat /etc/ingot-test-persist)"
say "persist-var $(cat /var/lib/ingot-test/persist)"
if [ -f /var/lib/ingot-test/kubeadm.log ]; then
  while read -r l; do say "kubeadm $l"; done </var/lib/ingot-test/kubeadm.log
fi
for u in ingot-preload ingot-bootstrap; do
  say "condition $u $(systemctl show -P ConditionResult $u.service) $(systemctl show -P ActiveState $u.service)"
done
bounded 120 ctr-images ctr -n k8s.io images ls | while read -r l; do say "image $l"; done
if bounded 120 ctr-images ctr -n k8s.io images ls -q | grep -qx 'IMAGE_REF'; then
  out=$(bounded 300 ctr-run ctr -n k8s.io run --rm IMAGE_REF ingot-check-$$ /bin/sh -c 'echo hello-from-preload; ls /sys/class/net' 2>&1)
  for l in $out; do say "container $l"; done
fi
for d in /etc/kubernetes /etc/cni/net.d /opt/cni/bin /var/lib/kubelet; do
  if mkdir -p "$d" && echo written >"$d/ingot-write-test"; then say "write $d ok"; else say "write $d failed"; fi
done
for d in /usr /usr/bin /sbin /lib /opt; do
  err=$(sh -c "echo x >$d/ingot-write-test" 2>&1) && say "write $d ok" || say "write $d refused: $err"
done
for m in /var /etc /etc/kubernetes /opt/cni/bin; do
  say "mount $m $(awk -v m=$m '$5==m {o=$6} END {print o}' /proc/self/mountinfo)"
done
for f in /etc/ingot-probe /etc/systemd/system/ingot-probe.service /opt/cni/bin/ingot-probe /etc/kubernetes/ingot-probe; do
  if [ -e "$f" ]; then say "probe $f present $(cat "$f" | head -1)"; else say "probe $f absent"; fi
done
say "probe-enabled $(systemctl is-enabled ingot-probe.service 2>&1)"
[ -f /var/lib/ingot-test/probe-ran ] && while read -r l; do say "probe-ran $l"; done </var/lib/ingot-test/probe-ran
[ -f /var/lib/ingot-test/bootstrap-pki ] && while read -r sum path; do say "bootstrap-pki $path $sum"; done </var/lib/ingot-test/bootstrap-pki
for u in ssh ingot-unseal; do say "unit $u $(systemctl is-active $u.service)"; done
# A sealed host key (a symlink into /run/ingot/secrets): a full line of its body's private part
# (the third from the end), which the test then looks for on the disk (a test key, so printing it
# costs nothing).
for k in /etc/ssh/ssh_host_*_key; do [ -L "$k" ] && say "host-key-line $k $(tail -n 3 "$k" | head -n 1)"; done
for f in admin.conf pki/ca.crt manifests/ingot-test.yaml; do
  say "kube-state $f $(cat /etc/kubernetes/$f 2>&1)"
done
say "hostname $(hostname)"
say "machine-id $(cat /etc/machine-id)"
bounded 180 ssh-keyscan ssh-keyscan -T 120 -t ed25519,rsa 127.0.0.1 2>/dev/null | ssh-keygen -lf - | while read -r bits fp rest; do say "sshd-key $fp"; done
say "uname $(uname -r)"
bounded 120 containerd-config containerd config dump 2>&1 | while IFS= read -r l; do say "ctr-dump $l"; done
bounded 120 journalctl journalctl -b -u containerd -o cat | grep -m1 'Start cri plugin with config' | while IFS= read -r l; do say "cri-config $l"; done
say "md-units $(systemctl list-units --all --plain --no-legend 'mdmonitor*' 'mdadm*' 'mdcheck*' | awk '{print $1 "=" $3 "/" $4}' | tr '\n' ' ')"
# The nvidia layer, where it is: its module is for this kernel and loads, refused only for want
# of a GPU; the CUDA library is in ld.so's cache; nvidia-smi runs and finds no driver.
if modinfo nvidia-current >/dev/null 2>&1; then
  say "nv-vermagic $(modinfo -F vermagic nvidia-current)"
  out=$(bounded 120 nv-modprobe modprobe nvidia-current 2>&1); say "nv-modprobe rc=$? $out"
  bounded 120 journalctl journalctl -k -b -o cat | grep -m1 'NVRM: No NVIDIA GPU found' | while IFS= read -r l; do say "nv-kernel $l"; done
  bounded 120 journalctl journalctl -k -b -o cat | grep -m1 'nvidia: module verification failed' | while IFS= read -r l; do say "nv-kernel $l"; done
  ldconfig -p | awk '$1 ~ /^lib(cuda|nvidia-ml)\.so\.1$/ {print $1, $NF}' | while read -r l; do say "nv-ldconfig $l"; done
  for f in /usr/bin/nvidia-smi /usr/lib/x86_64-linux-gnu/libcuda.so.1; do say "nv-link $f $(readlink $f)"; done
  out=$(bounded 120 nvidia-smi nvidia-smi 2>&1); say "nv-smi rc=$? $(echo "$out" | head -1)"
  say "nv-user $(getent passwd nvpd | cut -d: -f1,7)"
fi
# The kata layer, where it is: the KVM and vhost modules are loaded and /dev/kvm exists. A
# machine whose data asks for it (/etc/ingot-test/nested: the control plane) also boots a guest
# under KVM with the layer's QEMU (the base's own kernel, a busybox initramfs that prints a
# marker and powers off), once: on its first boot. Its second boot forces that guest to hang
# (its init never powers off) under a short bound, to show the bound stops a hung guest and
# names it. Nested KVM under TCG costs a minute of a core, and once hung a whole boot's limit.
if command -v qemu-system-x86_64 >/dev/null; then
  say "kvm-modules $(lsmod | awk '$1 ~ /^(kvm|kvm_amd|kvm_intel|vhost_vsock|vhost_net)$/ {print $1}' | sort | tr '\n' ' ')"
  say "kvm-device $(stat -c %F /dev/kvm 2>&1)"
fi
if command -v qemu-system-x86_64 >/dev/null && [ -e /etc/ingot-test/nested ]; then
  if [ -e /var/lib/ingot-test/nested-ran ]; then
    l2_limit=30 l2_end='while :; do /bin/busybox sleep 1; done'
  else
    l2_limit=300 l2_end='/bin/busybox poweroff -f'
  fi
  touch /var/lib/ingot-test/nested-ran
  say "l2-start limit ${l2_limit}s"
  l2=$(mktemp -d)
  mkdir -p $l2/root/bin
  cp /bin/busybox $l2/root/bin/
  for lib in $(ldd /bin/busybox | grep -o '/[^ ]*'); do mkdir -p $l2/root$(dirname $lib); cp $lib $l2/root$lib; done
  printf '#!/bin/busybox sh\n/bin/busybox echo "ingot-l2 alive $(/bin/busybox uname -r)"\n%s\n' "$l2_end" >$l2/root/init
  chmod 755 $l2/root/init
  (cd $l2/root && find . | cpio -o -H newc --quiet) >$l2/initrd
  bounded $l2_limit l2-qemu qemu-system-x86_64 -accel kvm -cpu host -m 256 -nodefaults -display none -serial stdio -no-reboot \
    -kernel /boot/vmlinuz -initrd $l2/initrd -append 'console=ttyS0 panic=-1 quiet' </dev/null >$l2/out 2>&1
  say "l2-exit $?"
  grep -a 'ingot-l2' $l2/out | tr -d '\r' | while IFS= read -r l; do say "l2 $l"; done
  grep -a 'qemu-system' $l2/out | head -3 | while IFS= read -r l; do say "l2-error $l"; done
  rm -rf $l2
fi
say "analyze $(bounded 60 systemd-analyze systemd-analyze time | head -1)"
# A machine the test logs into (/etc/ingot-test/ssh-wait: the `ingot vm` one) stays up until the
# host's `ingot vm ssh` has run, which leaves what it saw in /run/ingot-test-ssh.
if [ -e /etc/ingot-test/ssh-wait ]; then
  n=0
  while [ ! -s /run/ingot-test-ssh ] && [ $n -lt 900 ]; do sleep 1; n=$((n + 1)); done
  if [ -s /run/ingot-test-ssh ]; then say "ssh-login $(cat /run/ingot-test-ssh)"; else say "timeout ssh-login after 900s"; fi
fi
say "done"
systemctl poweroff --no-block
"#;

const CHECK_UNIT: &str = "[Unit]\nDescription=ingot test: what the node sees\nAfter=ingot-preload.service ingot-bootstrap.service kubelet.service\n\n[Service]\nType=simple\nExecStart=/etc/ingot-test/check\nStandardOutput=journal+console\nStandardError=journal+console\n\n[Install]\nWantedBy=multi-user.target\n";

/// The kubeadm config a role's bootstrap data stages (jinja: the node name is the hostname).
fn kubeadm_config(control_plane: bool) -> String {
    if control_plane {
        format!("apiVersion: kubeadm.k8s.io/v1beta3\nkind: InitConfiguration\nbootstrapTokens:\n- token: {CP_TOKEN}\nnodeRegistration:\n  name: '{{{{ ds.meta_data.hostname }}}}'\n  criSocket: unix:///run/containerd/containerd.sock\n")
    } else {
        "apiVersion: kubeadm.k8s.io/v1beta3\nkind: JoinConfiguration\nnodeRegistration:\n  name: '{{ ds.meta_data.hostname }}'\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 192.0.2.10:6443\n    token: abcdef.0123456789abcdef\n    unsafeSkipCAVerification: true\n".to_string()
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

/// The first boot's writes outside the named state, as root from runcmd: a file in /etc, a unit of
/// its own (enabled and run once now, it logs the boot it ran in), a CNI plugin, a file in
/// /etc/kubernetes. Contract version 3: only the last survives a reboot.
const PROBES: &[&str] = &[
    "echo probe >/etc/ingot-probe",
    "printf '[Unit]\\nDescription=ingot test: a unit written at run time\\n[Service]\\nType=oneshot\\nExecStart=/bin/sh -c \"cat /proc/sys/kernel/random/boot_id >>/var/lib/ingot-test/probe-ran\"\\n[Install]\\nWantedBy=multi-user.target\\n' >/etc/systemd/system/ingot-probe.service",
    "systemctl daemon-reload",
    "systemctl enable --now ingot-probe.service",
    "echo plugin >/opt/cni/bin/ingot-probe",
    "echo kube >/etc/kubernetes/ingot-probe",
];

/// CABPK-shaped cloud-config: the kubeadm config under /run/kubeadm, the check unit and script
/// (under /etc: the node layer may carry nothing under /usr), and runcmd running kubeadm, then
/// the [`PROBES`]. `ssh_wait`: the check waits for the test's `ingot vm ssh` before it ends.
fn bootstrap_data(control_plane: bool, ssh_wait: bool) -> String {
    bootstrap_data_with(control_plane, ssh_wait, &[])
}

/// [`bootstrap_data`] that also writes `secrets` (path, content; mode 0600, as CABPK writes the
/// cluster's CA keys into /etc/kubernetes/pki), and whose first command records each one's
/// SHA-256 as the bootstrap read it (`/var/lib/ingot-test/bootstrap-pki`, which the check prints).
fn bootstrap_data_with(
    control_plane: bool,
    ssh_wait: bool,
    secrets: &[(String, String)],
) -> String {
    let (config, cmd) = if control_plane {
        (
            "/run/kubeadm/kubeadm.yaml",
            "kubeadm init --config /run/kubeadm/kubeadm.yaml",
        )
    } else {
        (
            "/run/kubeadm/kubeadm-join-config.yaml",
            "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml",
        )
    };
    let script = CHECK_SCRIPT.replace("IMAGE_REF", IMAGE_REF);
    let probes: String = PROBES
        .iter()
        .map(|p| format!("- {}\n", serde_json::to_string(p).unwrap()))
        .collect();
    // The control plane (KVM and UEFI, so the kata layer) boots the nested guest (CHECK_SCRIPT).
    let mut nested = if control_plane {
        "-   path: /etc/ingot-test/nested\n    content: |\n      yes\n".to_string()
    } else {
        String::new()
    };
    if ssh_wait {
        nested.push_str("-   path: /etc/ingot-test/ssh-wait\n    content: |\n      yes\n");
    }
    let mut first = String::new();
    for (path, content) in secrets {
        nested.push_str(&format!(
            "-   path: {path}\n    owner: root:root\n    permissions: '0600'\n    content: |\n{}",
            indent(content)
        ));
    }
    if !secrets.is_empty() {
        let paths: Vec<&str> = secrets.iter().map(|(p, _)| p.as_str()).collect();
        let cmd = format!(
            "mkdir -p /var/lib/ingot-test && sha256sum {} >/var/lib/ingot-test/bootstrap-pki",
            paths.join(" ")
        );
        first = format!("- {}\n", serde_json::to_string(&cmd).unwrap());
    }
    format!(
        "## template: jinja\n#cloud-config\nwrite_files:\n{nested}-   path: {config}\n    owner: root:root\n    permissions: '0640'\n    content: |\n{}-   path: /etc/ingot-test/check\n    permissions: '0755'\n    content: |\n{}-   path: /etc/systemd/system/ingot-check.service\n    permissions: '0644'\n    content: |\n{}runcmd:\n{first}- {cmd}\n- mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\n{probes}",
        indent(&kubeadm_config(control_plane)),
        indent(&script),
        indent(CHECK_UNIT),
    )
}

/// The built and published Debian stack.
struct Published {
    stack: common::Stack,
    registry: common::Published,
    digest: String,
    /// The base's kernel release (`uname -r`), read from its tree.
    kver: String,
    /// The handlers of the base's RuntimeClass objects.
    runtime_classes: Vec<String>,
    /// The db key the release's UKI is signed with (the Secure Boot release only).
    secure_boot: Option<SecureBootKey>,
    /// The Secure Boot release built again with another PCR key (its UKI db-signed alike).
    other_pcr_key: Option<common::Stack>,
}

/// The two releases of one set of trees: as most fleets build it, and with a signed UKI.
struct Releases {
    plain: Published,
    secure: Published,
}

/// Where the Debian build keeps what it made between runs: the `.deb` cache (`debs`), the tree
/// cache (`trees`), the DKMS modules (`modules`) and the stack.lock it last wrote. A machine's
/// first run makes every tree; later ones take them from the tree cache unless the archive moved
/// (the build runs with `--update`, which asks the archive first and keeps the lock when nothing
/// is newer). `INGOT_TEST_DEBIAN_CACHE` puts it elsewhere.
fn debian_cache() -> PathBuf {
    std::env::var_os("INGOT_TEST_DEBIAN_CACHE").map_or_else(
        || PathBuf::from("/var/cache/ingot-debian/ingot"),
        PathBuf::from,
    )
}

/// The operator inputs of the test's stack: a stand-in kubeadm ([`KUBEADM`]) and the busybox
/// image to preload. Returns their directories and the image's digest.
fn inputs(work: &Path) -> (PathBuf, PathBuf, String) {
    let images = work.join("images");
    let digest = preload_image(work, &images.join("busybox"));
    let k8s = work.join("kubernetes");
    fs::create_dir_all(&k8s).unwrap();
    fs::write(k8s.join("kubeadm"), KUBEADM).unwrap();
    (k8s, images, digest)
}

/// One `ingot build` of the Debian manifest by the installed binary (away from the checkout,
/// no cargo variable in its environment); `extra` after the common arguments. Returns the
/// signed stack and what the build said.
fn cli_build(
    ingot: &Path,
    manifest: &Path,
    inputs: &[String],
    extra: &[&str],
) -> (common::Stack, String) {
    let dir = tempfile::tempdir_in(manifest.parent().unwrap()).unwrap();
    let (key, public) = (
        dir.path().join("release.key"),
        dir.path().join("release.pub"),
    );
    run_ok(
        Command::new(ingot)
            .args(["key", "generate", "-s"])
            .arg(&key)
            .arg("-p")
            .arg(&public),
    );
    let layout = dir.path().join("layout");
    let cache = debian_cache();
    let mut cmd = Command::new(ingot);
    cmd.current_dir(dir.path())
        .arg("build")
        .arg(manifest)
        .arg("--out")
        .arg(&layout)
        .arg("--sign-key")
        .arg(&key)
        .arg("--deb-cache")
        .arg(cache.join("debs"))
        .args(inputs)
        .args(extra);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CARGO") {
            cmd.env_remove(k);
        }
    }
    let started = Instant::now();
    let out = cmd.env_remove("RUST_LOG").output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "ingot build {} {}: {:.1?}\n{said}",
        manifest.display(),
        extra.join(" "),
        started.elapsed()
    );
    assert!(out.status.success(), "ingot build failed:\n{said}");
    let layers = ingot_testkit::layout::read(&layout).root_hashes();
    let stack = common::Stack {
        dir,
        layout,
        public,
        layers,
    };
    (stack, said)
}

/// Each layer's tree as the build reported it: `layer NAME: reused (tree cache KEY…` or
/// `layer NAME: built: …, tree cache KEY`, found in the tree cache.
fn trees_of(said: &str) -> BTreeMap<String, PathBuf> {
    let trees = debian_cache().join("trees");
    let mut out = BTreeMap::new();
    for line in said.lines() {
        let Some(rest) = line.strip_prefix("layer ") else {
            continue;
        };
        let Some((name, what)) = rest.split_once(": ") else {
            continue;
        };
        let Some(key) = what.split("tree cache ").nth(1) else {
            continue;
        };
        let short: String = key.chars().take_while(char::is_ascii_hexdigit).collect();
        let entry = fs::read_dir(&trees)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}-{short}")))
            })
            .unwrap_or_else(|| panic!("no tree of layer {name} ({short}) in {}", trees.display()));
        out.insert(name.to_owned(), entry.join("tree"));
    }
    out
}

/// The stack built by `ingot build manifests/debian/stack.toml` from an installed binary in a
/// directory that is not a checkout, three times: as most fleets build it, then as a Secure
/// Boot release (the harness's kernel arguments in its manifest, since the signed line cannot
/// take the writer's `--kernel-arg`) and the same release again with another PCR key. The
/// second and third builds are `--locked` and make no tree: every layer comes from the tree
/// cache.
fn publish(work: &Path) -> Releases {
    let (k8s, images, digest) = inputs(work);
    let bin = work.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let ingot = bin.join("ingot");
    ingot_testkit::command::copy_executable(&common::vm::ingot(), &ingot);
    let m = work.join("m");
    fs::create_dir_all(&m).unwrap();
    let manifest = m.join("stack.toml");
    fs::copy(repo_root().join("manifests/debian/stack.toml"), &manifest).unwrap();
    let cache = debian_cache();
    fs::create_dir_all(&cache).unwrap();
    let kept_lock = cache.join("stack.lock");
    if kept_lock.exists() {
        fs::copy(&kept_lock, m.join("stack.lock")).unwrap();
    }
    let given = [
        format!("--input=kubernetes={}", k8s.display()),
        format!("--input=images={}", images.display()),
    ];
    let (stack, said) = cli_build(&ingot, &manifest, &given, &["--update"]);
    fs::copy(m.join("stack.lock"), &kept_lock).unwrap();
    let trees = trees_of(&said);
    assert_eq!(
        trees.keys().collect::<Vec<_>>(),
        ["base", "control-plane", "kata", "nvidia"],
        "{said}"
    );
    let kver = assert_security_kernel(&trees["base"], work);
    let classes = runtime_classes(&trees["base"]);
    assert_inspect(&stack);
    assert_sboms(&stack, work);
    let key = secure_boot::key_set(work, "ingot Debian node test");
    let mut args = qemu::KERNEL_ARGS.to_vec();
    args.push(CHECK_ARG);
    let secure_manifest = secure_boot::with_kernel_args(&manifest, "secure.toml", &args);
    let signed = |pcr: &str| {
        let (_, pem) = ingot_artifact::pcr_policy::PcrKey::generate().unwrap();
        let path = m.join(pcr);
        fs::write(&path, pem).unwrap();
        let (stack, said) = cli_build(
            &ingot,
            &secure_manifest,
            &given,
            &[
                "--locked",
                "--secure-boot-key",
                key.key.to_str().unwrap(),
                "--secure-boot-cert",
                key.cert.to_str().unwrap(),
                "--pcr-key",
                path.to_str().unwrap(),
            ],
        );
        for layer in trees.keys() {
            assert!(
                said.contains(&format!("layer {layer}: reused (tree cache")),
                "a locked build made layer {layer} again:\n{said}"
            );
        }
        stack
    };
    let secure = signed("pcr.key");
    // The same release signed by the same db key, but with a PCR key of its own: its UKI boots
    // under Secure Boot and its PCR policy is not the release's.
    let other = signed("other-pcr.key");
    let mut secure = published(
        secure,
        digest.clone(),
        kver.clone(),
        classes.clone(),
        Some(key),
    );
    secure.other_pcr_key = Some(other);
    Releases {
        plain: published(stack, digest, kver, classes, None),
        secure,
    }
}

/// Every layer's SBOM gives every package it lists its `.deb`'s SHA-256 (from stack.lock), and
/// pyspdxtools and ntia-conformance-checker accept each.
fn assert_sboms(stack: &common::Stack, work: &Path) {
    let layout = ingot_testkit::layout::read(&stack.layout);
    for (layer, _) in &stack.layers {
        let (path, sbom) = layout.sbom(layer);
        let packages = ingot_testkit::spdx::packages(&sbom);
        for p in &packages {
            let sha = &p["checksums"][0];
            assert!(
                sha["algorithm"] == "SHA256"
                    && sha["checksumValue"].as_str().is_some_and(|v| v.len() == 64),
                "layer {layer}: {} has no SHA-256 in its SBOM",
                p["name"]
            );
        }
        let file = work.join(format!("{layer}.spdx.json"));
        fs::copy(&path, &file).unwrap();
        ingot_testkit::spdx::tools_accept(&file, &format!("layer {layer}'s SBOM"));
        eprintln!(
            "layer {layer}: SBOM of {} packages, each with its .deb's SHA-256",
            packages.len()
        );
    }
}

/// `ingot inspect` lists the four layers, each with its kind and rule, and says what the nvidia
/// layer's kernel modules need under Secure Boot.
fn assert_inspect(stack: &common::Stack) {
    let source = ingot_artifact::verify::LayoutSource::open_tagged(&stack.layout, None).unwrap();
    let report = ingot::inspect::inspect(&source, None, None, false).unwrap();
    let table = ingot::inspect::render_table(&report);
    eprintln!("{table}");
    let rows: Vec<(String, String, String)> = report
        .layers
        .iter()
        .map(|l| (l.name.clone(), l.kind.clone(), l.rule.clone()))
        .collect();
    let row = |n: &str, k: &str, r: &str| (n.to_string(), k.to_string(), r.to_string());
    assert_eq!(
        rows,
        [
            row("base", "base", "-"),
            row("nvidia", "nvidia", "gpu == nvidia"),
            row("kata", "kata", "all(virt, uefi)"),
            row("control-plane", "control-plane", "role == control-plane"),
        ]
    );
    for (name, kind, rule) in &rows {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
        assert!(line.contains(kind) && line.contains(rule), "{line}");
    }
    assert!(
        table.contains("layer `nvidia`: kernel modules") && table.contains("Secure Boot"),
        "{table}"
    );
}

/// The base's one kernel, `KVER` (its only `/usr/lib/modules/KVER`), is bookworm-security's
/// current one: apt, given the three suites the build uses (the same mirrors) and the base's own
/// dpkg status (`/usr/lib/ingot/dpkg/status`), has no newer candidate for `linux-image-amd64` or
/// `linux-image-KVER` than what is installed, which is what `packages.txt` records.
fn assert_security_kernel(base: &Path, work: &Path) -> String {
    let kernels: Vec<String> = fs::read_dir(base.join("usr/lib/modules"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let [kver] = kernels.as_slice() else {
        panic!("the base has {kernels:?} in /usr/lib/modules, not one kernel");
    };
    let packages = fs::read_to_string(base.join("usr/share/ingot/packages.txt")).unwrap();
    let recorded = |pkg: &str| {
        packages
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{pkg} ")))
            .unwrap_or_else(|| panic!("packages.txt has no {pkg}:\n{packages}"))
            .to_string()
    };
    let apt = work.join("apt");
    for d in ["lists/partial", "cache/archives/partial", "sources.list.d"] {
        fs::create_dir_all(apt.join(d)).unwrap();
    }
    let env = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.to_string());
    let (mirror, security) = (
        env("INGOT_DEBIAN_MIRROR", "http://deb.debian.org/debian"),
        env(
            "INGOT_DEBIAN_SECURITY_MIRROR",
            "http://deb.debian.org/debian-security",
        ),
    );
    let key = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]";
    fs::write(
        apt.join("sources.list"),
        format!(
            "deb {key} {mirror} bookworm main\ndeb {key} {mirror} bookworm-updates main\ndeb {key} {security} bookworm-security main\n"
        ),
    )
    .unwrap();
    let opts = |cmd: &mut Command| {
        for (k, v) in [
            ("Dir::State::Lists", apt.join("lists")),
            ("Dir::Cache", apt.join("cache")),
            ("Dir::Etc::SourceList", apt.join("sources.list")),
            ("Dir::Etc::SourceParts", apt.join("sources.list.d")),
            ("Dir::State::status", base.join("usr/lib/ingot/dpkg/status")),
        ] {
            cmd.arg("-o").arg(format!("{k}={}", v.display()));
        }
        cmd.args([
            "-o",
            "APT::Sandbox::User=root",
            "-o",
            "Debug::NoLocking=true",
        ]);
    };
    let started = Instant::now();
    let mut update = Command::new("apt-get");
    opts(&mut update);
    run_ok(update.args(["-q", "update"]));
    for pkg in [
        "linux-image-amd64".to_string(),
        format!("linux-image-{kver}"),
    ] {
        let mut policy = Command::new("apt-cache");
        opts(&mut policy);
        let out = run_ok(policy.args(["policy", &pkg]));
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |f: &str| {
            out.lines()
                .find_map(|l| l.trim().strip_prefix(f))
                .unwrap_or_else(|| panic!("no {f} in apt-cache policy {pkg}:\n{out}"))
                .trim()
                .to_string()
        };
        let (installed, candidate) = (field("Installed:"), field("Candidate:"));
        eprintln!("{pkg}: installed {installed}, candidate {candidate}");
        assert_eq!(installed, candidate, "{pkg} is not the current one:\n{out}");
        assert_eq!(installed, recorded(&pkg), "{pkg}: packages.txt");
    }
    eprintln!(
        "base kernel {kver}, checked against apt in {:.1?}",
        started.elapsed()
    );
    kver.clone()
}

/// The RuntimeClass objects the base ships (`/usr/share/ingot/runtimeclasses.yaml`): `kata` and
/// `nvidia`, each `node.k8s.io/v1` with the handler of its name; returns the handlers.
fn runtime_classes(base: &Path) -> Vec<String> {
    let path = base.join("usr/share/ingot/runtimeclasses.yaml");
    let text = fs::read_to_string(&path).unwrap();
    let mut handlers = Vec::new();
    for doc in text.split("\n---\n") {
        let field = |f: &str| {
            doc.lines()
                .find_map(|l| l.strip_prefix(f))
                .unwrap_or_else(|| panic!("{}: no {f:?} in {doc}", path.display()))
                .trim()
                .to_string()
        };
        assert_eq!(field("apiVersion: "), "node.k8s.io/v1");
        assert_eq!(field("kind: "), "RuntimeClass");
        let handler = field("handler: ");
        assert_eq!(field("  name: "), handler, "{doc}");
        handlers.push(handler);
    }
    assert_eq!(handlers, ["kata", "nvidia"], "{text}");
    handlers
}

fn published(
    stack: common::Stack,
    digest: String,
    kver: String,
    runtime_classes: Vec<String>,
    secure_boot: Option<SecureBootKey>,
) -> Published {
    let registry = common::publish_behind_token(
        &stack.layout,
        "stacks/debian-node:12.0.0",
        TOKEN,
        &stack.dir.path().join("registry"),
    );
    Published {
        stack,
        registry,
        digest,
        kver,
        runtime_classes,
        secure_boot,
        other_pcr_key: None,
    }
}

/// A machine's disks written by the writer run as CAPH runs it, one of them (`image`) selected
/// for booting.
struct Written {
    dir: tempfile::TempDir,
    /// Every disk of the machine by kernel name.
    images: BTreeMap<String, PathBuf>,
    image: PathBuf,
    parts: Vec<(String, u64, u64)>,
    /// The selected disk's loader entry's command line (the Secure Boot release: the signed one).
    cmdline: String,
    hostname: String,
    /// Units that may fail on this machine (they need hardware the VM lacks).
    may_fail: &'static [&'static str],
}

impl Written {
    /// A partition's bytes in a file of their own (for debugfs).
    fn extract(&self, name: &str) -> PathBuf {
        let (_, start, size) = self
            .parts
            .iter()
            .find(|p| p.0 == name)
            .unwrap_or_else(|| panic!("no partition {name}: {:?}", self.parts))
            .clone();
        let mut from = fs::File::open(&self.image).unwrap();
        from.seek(SeekFrom::Start(start)).unwrap();
        let path = self.dir.path().join(format!("{name}.img"));
        let mut to = fs::File::create(&path).unwrap();
        std::io::copy(&mut from.take(size), &mut to).unwrap();
        path
    }

    /// `mtools`'s `image@@offset` of the selected disk's ESP.
    fn esp(&self) -> String {
        let (_, start, _) = self.parts.iter().find(|p| p.0 == "ESP").expect("an ESP");
        format!("{}@@{start}", self.image.display())
    }

    /// Copies the ESP's file `from` (`::/PATH`) to `to`.
    fn esp_copy(&self, from: &str, to: &Path) {
        run_ok(
            Command::new("mcopy")
                .args(["-i", &self.esp(), from])
                .arg(to),
        );
    }

    /// Puts `from` on the ESP as `to` (`::/PATH`), replacing it.
    fn esp_put(&self, from: &Path, to: &str) {
        run_ok(
            Command::new("mcopy")
                .args(["-o", "-i", &self.esp()])
                .arg(from)
                .arg(to),
        );
    }

    /// Selects disk `name` for booting; its ESP must carry the same command line.
    fn select(&mut self, name: &str) {
        self.image = self.images[name].clone();
        self.parts = partitions(&self.image);
        let cmdline = esp_cmdline(&self.image, &self.parts);
        assert_eq!(cmdline, self.cmdline, "{name}'s ESP");
    }
}

/// A fixture machine as the test writes it.
struct Node {
    fixture: &'static str,
    /// CAPH's root device hints: `sda`, or the disks' WWNs.
    devices: &'static str,
    name: &'static str,
    cp: bool,
    /// Its disks, each enlarged to [`DISK_MIB`] (the fixture lists them first, in this order).
    disks: &'static [&'static str],
    /// A Hetzner cloud VM: legacy BIOS (the fixture's `/sys/firmware/efi` removed).
    bios: bool,
    /// The layers the stack's rules select for it.
    layers: &'static [&'static str],
    /// Units that may fail on it (they need hardware the VM lacks).
    may_fail: &'static [&'static str],
}

impl Node {
    /// A server with UEFI and one disk.
    const fn uefi(
        fixture: &'static str,
        devices: &'static str,
        name: &'static str,
        cp: bool,
        layers: &'static [&'static str],
    ) -> Node {
        Node {
            fixture,
            devices,
            name,
            cp,
            disks: &["sda"],
            bios: false,
            layers,
            may_fail: &[],
        }
    }
}

/// A copy of `node`'s fixture machine whose disks are [`DISK_MIB`] large (and without UEFI for a
/// BIOS node).
fn enlarged_fixture(node: &Node, at: &Path) -> PathBuf {
    let from = repo_root()
        .join("tests/fixtures/machines")
        .join(node.fixture);
    run_ok(Command::new("cp").arg("-a").arg(&from).arg(at));
    let toml = at.join("disks.toml");
    let text = fs::read_to_string(&toml).unwrap();
    let want = format!("size_mib = {DISK_MIB}");
    let text = text.replacen("size_mib = 512", &want, node.disks.len());
    assert_eq!(text.matches(&want).count(), node.disks.len(), "{text}");
    fs::write(&toml, text).unwrap();
    for disk in node.disks {
        fs::write(
            at.join("sys/block").join(disk).join("size"),
            format!("{}\n", DISK_MIB * 2048),
        )
        .unwrap();
    }
    if node.bios {
        fs::remove_dir_all(at.join("sys/firmware/efi")).unwrap();
    }
    at.to_path_buf()
}

fn write_machine(p: &Published, node: &Node) -> Written {
    let Node {
        fixture,
        devices,
        name,
        cp,
        ..
    } = *node;
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let fixture_dir = enlarged_fixture(node, &dir.path().join("fixture"));
    let m = materialize(&fixture_dir, &dir.path().join("machine"))
        .unwrap_or_else(|e| panic!("materializing {fixture}: {e}"));
    let data = dir.path().join("bootstrap.data");
    fs::write(&data, bootstrap_data(cp, false)).unwrap();
    let mut cmd = common::caph_command(
        &p.registry.url,
        TOKEN,
        &data,
        name,
        devices,
        &m.root,
        &dir.path().join("output.json"),
        &dir.path().join("events.jsonl"),
        &p.stack.public,
    );
    // The harness's check unit runs at every boot (module docs).
    cmd.args(["--kernel-arg", CHECK_ARG]);
    if cp {
        cmd.args(["--kernel-arg", NESTED_ARG]);
    }
    common::caph_write_for_boot(cmd, fixture);
    let image = m.images[node.disks[0]].clone();
    let parts = partitions(&image);
    let cmdline = match p.secure_boot {
        None => esp_cmdline(&image, &parts),
        Some(_) => {
            let descriptor = &ingot_testkit::layout::read(&p.stack.layout).descriptor;
            descriptor["uki"]["cmdline"].as_str().unwrap().to_string()
        }
    };
    let output: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.path().join("output.json")).unwrap()).unwrap();
    let layers: Vec<String> = output["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("no layers in the writer's status file: {output}"))
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    assert_eq!(layers, node.layers, "{name}: the selected layers");
    Written {
        dir,
        images: m.images,
        image,
        parts,
        cmdline,
        hostname: name.to_string(),
        may_fail: node.may_fail,
    }
}

/// Boots the selected disk under OVMF ([`boot_with`]).
fn boot(w: &Written, what: &str) -> String {
    boot_with(w, qemu::Firmware::Uefi, what)
}

/// Boots the selected disk alone (q35, `firmware`, TCG, virtio disk, no network device) until
/// qemu exits (the check unit powers off; a panic reboots, which -no-reboot turns into an exit).
/// Returns the console.
fn boot_with(w: &Written, firmware: qemu::Firmware, what: &str) -> String {
    boot_image(w, &w.image, firmware, what)
}

/// [`boot_with`] for disk `image` of the machine, selected or not.
fn boot_image(w: &Written, image: &Path, firmware: qemu::Firmware, what: &str) -> String {
    let work = w.dir.path().join(format!("vm-{what}"));
    fs::create_dir_all(&work).unwrap();
    let log = work.join("serial.log");
    let mut m = qemu::machine(firmware, 1, 2048, &work);
    // No network device: `-nodefaults` leaves none and the machine adds none.
    m.disks = qemu::virtio(&[image]);
    m.serial = Serial::File(log.clone());
    let console = qemu::run_qemu_watched(
        m.command(),
        &log,
        &work.join("qemu.err"),
        what,
        &[],
        BOOT_TIMEOUT,
        Some(SILENCE),
    );
    for l in console.lines().filter(|l| {
        l.contains(CHECK) || l.starts_with("ingot") || l.contains("device-mapper: verity")
    }) {
        eprintln!("{what}| {l}");
    }
    console
}
/// The check unit's lines, keyed by their first word (repeated keys keep every value, in order).
fn checks(console: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in console.lines() {
        if let Some(i) = l.find(CHECK) {
            let rest = l[i + CHECK.len()..].trim_end();
            let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
            m.entry(k.to_string()).or_default().push(v.to_string());
        }
    }
    m
}

fn one<'a>(c: &'a BTreeMap<String, Vec<String>>, key: &str, console: &str) -> &'a str {
    match c.get(key).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("want one INGOT-CHECK {key} line, got {other:?}:\n{console}"),
    }
}

fn debugfs(fs_image: &Path, request: &str) -> String {
    let out = run_ok(Command::new("debugfs").arg("-R").arg(request).arg(fs_image));
    String::from_utf8(out.stdout).unwrap()
}

/// The sealed identity: machine-id and the sshd host keys' SHA256 fingerprints.
fn sealed_identity(w: &Written) -> (String, Vec<String>) {
    let node = w.extract("ingot-node");
    let machine_id = debugfs(&node, "cat /etc/machine-id").trim().to_string();
    let mut fps = Vec::new();
    for k in ["ed25519", "rsa"] {
        let pub_key = w.dir.path().join(format!("{k}.pub"));
        fs::write(
            &pub_key,
            debugfs(&node, &format!("cat /etc/ssh/ssh_host_{k}_key.pub")),
        )
        .unwrap();
        let out = run_ok(Command::new("ssh-keygen").arg("-lf").arg(&pub_key));
        let line = String::from_utf8(out.stdout).unwrap();
        fps.push(line.split_whitespace().nth(1).unwrap().to_string());
    }
    fs::remove_file(node).unwrap();
    fps.sort();
    (machine_id, fps)
}

/// What every good boot shows.
fn assert_node_up(p: &Published, w: &Written, console: &str, c: &BTreeMap<String, Vec<String>>) {
    let timeouts: Vec<&String> = c
        .get("timeout")
        .into_iter()
        .flatten()
        .filter(|t| *t != FORCED_HANG)
        .collect();
    assert!(
        timeouts.is_empty(),
        "{}: the check's bounded commands timed out: {timeouts:?}",
        w.hostname
    );
    assert_eq!(one(c, "done", console), "", "{console}");
    assert_eq!(one(c, "multi-user", console), "active", "{console}");
    let failed = c.get("failed-unit").cloned().unwrap_or_default();
    if w.may_fail.is_empty() {
        assert_eq!(one(c, "state", console), "running", "{console}");
        assert!(failed.is_empty(), "failed units: {failed:?}");
    } else {
        // Only the named units may fail, and then only they make the state `degraded`.
        let unexpected: Vec<&String> = failed
            .iter()
            .filter(|u| !w.may_fail.contains(&u.as_str()))
            .collect();
        assert!(
            unexpected.is_empty(),
            "{}: failed units {failed:?}",
            w.hostname
        );
        let state = if failed.is_empty() {
            "running"
        } else {
            "degraded"
        };
        assert_eq!(one(c, "state", console), state, "{console}");
        eprintln!("{}: failed units (need a GPU): {failed:?}", w.hostname);
    }
    for d in [
        "/etc/kubernetes",
        "/etc/cni/net.d",
        "/opt/cni/bin",
        "/var/lib/kubelet",
    ] {
        assert!(
            c["write"].contains(&format!("{d} ok")),
            "{d}: {:?}",
            c["write"]
        );
    }
    for d in ["/usr", "/usr/bin", "/sbin", "/lib", "/opt"] {
        let refused = c["write"]
            .iter()
            .find(|l| l.starts_with(&format!("{d} ")))
            .unwrap_or_else(|| panic!("no write {d}: {:?}", c["write"]));
        assert!(
            refused.starts_with(&format!("{d} refused: "))
                && refused.contains("Read-only file system"),
            "{refused}"
        );
    }
    // Contract v3: var (and the state bound from it) nosuid,nodev; /etc and the CNI plugins
    // directory too (nothing there is a setuid program or a device).
    for m in ["/var", "/etc", "/etc/kubernetes", "/opt/cni/bin"] {
        let opts = c["mount"]
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{m} ")))
            .unwrap_or_else(|| panic!("no mount {m}: {:?}", c["mount"]));
        let opts: Vec<&str> = opts.split(',').collect();
        for want in ["rw", "nosuid", "nodev"] {
            assert!(opts.contains(&want), "{m} mounted {opts:?}, not {want}");
        }
    }
    assert_eq!(one(c, "hostname", console), w.hostname);
    let (machine_id, fps) = sealed_identity(w);
    assert_eq!(one(c, "machine-id", console), machine_id);
    let mut seen = c.get("sshd-key").cloned().unwrap_or_default();
    seen.sort();
    assert_eq!(seen, fps, "sshd serves the sealed host keys");
    assert_eq!(
        one(c, "uname", console),
        p.kver,
        "the booted kernel is the base's"
    );
    assert_runtimes(p, c, console);
    eprintln!(
        "{}: mdadm's units: {}",
        w.hostname,
        one(c, "md-units", console).trim_end()
    );
    eprintln!("{}: boot time: {}", w.hostname, one(c, "analyze", console));
}

/// The first boot: kubeadm ran once with the rendered config; on the control plane the preload
/// is imported (by reference and digest, pinned) and a container runs from it with no network.
fn assert_first_boot(p: &Published, w: &Written, console: &str, cp: bool) -> String {
    let c = checks(console);
    assert_node_up(p, w, console, &c);
    let runs = &c["kubeadm"];
    assert_eq!(runs.len(), 1, "kubeadm ran once: {runs:?}");
    let rendered = kubeadm_config(cp).replace("{{ ds.meta_data.hostname }}", &w.hostname);
    let (verb, path, kind) = if cp {
        ("init", "/run/kubeadm/kubeadm.yaml", "InitConfiguration")
    } else {
        (
            "join",
            "/run/kubeadm/kubeadm-join-config.yaml",
            "JoinConfiguration",
        )
    };
    let want = format!(
        "args={verb} --config {path} kind={kind} name='{}' sha256={}",
        w.hostname,
        sha256_hex(rendered.as_bytes())
    );
    assert_eq!(runs[0], want, "{console}");
    assert!(
        c["condition"].contains(&"ingot-bootstrap yes active".to_string()),
        "{:?}",
        c["condition"]
    );
    let images = c.get("image").cloned().unwrap_or_default();
    let listed = images.iter().find(|l| l.starts_with(IMAGE_REF));
    if cp {
        assert!(
            c["condition"].contains(&"ingot-preload yes active".to_string()),
            "{:?}",
            c["condition"]
        );
        let l = listed.unwrap_or_else(|| panic!("{IMAGE_REF} not listed: {images:?}"));
        assert!(l.contains(&p.digest), "{l}");
        assert!(l.contains("io.cri-containerd.pinned=pinned"), "{l}");
        assert_eq!(c["container"], ["hello-from-preload", "lo"], "{console}");
        assert!(console.contains(&format!("ingot-preload: imported and pinned {IMAGE_REF}")));
    } else {
        assert!(listed.is_none(), "a worker has no preload: {images:?}");
        assert!(
            c["condition"].contains(&"ingot-preload no inactive".to_string()),
            "{:?}",
            c["condition"]
        );
    }
    let boot_id = one(&c, "boot-id", console).to_string();
    assert_eq!(one(&c, "persist-etc", console), boot_id);
    assert_eq!(one(&c, "persist-var", console), boot_id);
    // The first boot's own writes, as root, all landed (so their absence later means something).
    for (f, content) in [
        ("/etc/ingot-probe", "probe"),
        ("/etc/systemd/system/ingot-probe.service", "[Unit]"),
        ("/opt/cni/bin/ingot-probe", "plugin"),
        ("/etc/kubernetes/ingot-probe", "kube"),
    ] {
        assert!(
            c["probe"].contains(&format!("{f} present {content}")),
            "{f}: {:?}",
            c["probe"]
        );
    }
    assert_eq!(one(&c, "probe-enabled", console), "enabled");
    assert_eq!(
        c["probe-ran"],
        std::slice::from_ref(&boot_id),
        "the probe unit ran once"
    );
    for f in ["admin.conf", "pki/ca.crt", "manifests/ingot-test.yaml"] {
        assert!(
            c["kube-state"]
                .iter()
                .any(|l| l.starts_with(&format!("{f} stand-in ")) && l.ends_with(&boot_id)),
            "kubeadm wrote {f}: {:?}",
            c["kube-state"]
        );
    }
    boot_id
}

/// The second boot of the same disk: nothing of the first boot runs again, its writes persist.
fn assert_second_boot(p: &Published, w: &Written, console: &str, first_boot: &str, cp: bool) {
    let c = checks(console);
    assert_node_up(p, w, console, &c);
    assert_eq!(
        c["kubeadm"].len(),
        1,
        "kubeadm did not run again: {:?}",
        c["kubeadm"]
    );
    assert!(
        c["condition"].contains(&"ingot-bootstrap no inactive".to_string()),
        "{:?}",
        c["condition"]
    );
    assert!(
        c["condition"].contains(&"ingot-preload no inactive".to_string()),
        "{:?}",
        c["condition"]
    );
    assert!(!console.contains("ingot-preload: imported"), "{console}");
    let boot_id = one(&c, "boot-id", console);
    assert_ne!(boot_id, first_boot);
    // Contract v3 (this check said "kept" under v2): /etc's changes vanish at reboot, so the
    // check script's first-boot marker in /etc is gone and made anew.
    assert_eq!(
        one(&c, "persist-etc", console),
        boot_id,
        "/etc dropped the first boot's change"
    );
    for f in [
        "/etc/ingot-probe",
        "/etc/systemd/system/ingot-probe.service",
        "/opt/cni/bin/ingot-probe",
    ] {
        assert!(
            c["probe"].contains(&format!("{f} absent")),
            "{f} survived the reboot: {:?}",
            c["probe"]
        );
    }
    assert!(
        one(&c, "probe-enabled", console).contains("No such file"),
        "{console}"
    );
    assert_eq!(
        c["probe-ran"],
        [first_boot.to_string()],
        "the unit written at run time did not run again"
    );
    assert!(
        c["probe"].contains(&"/etc/kubernetes/ingot-probe present kube".to_string()),
        "/etc/kubernetes is named state: {:?}",
        c["probe"]
    );
    for f in ["admin.conf", "pki/ca.crt", "manifests/ingot-test.yaml"] {
        assert!(
            c["kube-state"]
                .iter()
                .any(|l| l.starts_with(&format!("{f} stand-in ")) && l.ends_with(first_boot)),
            "kubeadm's {f} survived: {:?}",
            c["kube-state"]
        );
    }
    assert_eq!(
        one(&c, "persist-var", console),
        first_boot,
        "/var kept its change"
    );
    if cp {
        assert_eq!(c["container"], ["hello-from-preload", "lo"], "{console}");
    }
    assert!(!console.contains("formatting it (first boot)"), "{console}");
}

/// The binary a tampered base carries a flipped byte in: systemd, the first program the node runs
/// from the base after the initrd (so the failed boot costs seconds of a core, not a whole boot).
const TAMPERED: &str = "/usr/lib/systemd/systemd";

/// One flipped byte in [`TAMPERED`]'s first block in the base partition: the kernel reports the
/// corrupted block and the node does not come up; nothing runs it unverified.
fn assert_tampered_base_stops(w: &Written, firmware: qemu::Firmware) {
    let base = w.extract("ingot-base");
    let block: u64 = debugfs(&base, &format!("bmap {TAMPERED} 0"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("a block of {TAMPERED}: {e}"));
    fs::remove_file(base).unwrap();
    let (_, start, _) = w
        .parts
        .iter()
        .find(|p| p.0 == "ingot-base")
        .unwrap()
        .clone();
    let offset = start + block * 4096 + 99;
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&w.image)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&[b[0] ^ 0xff]).unwrap();
    f.sync_all().unwrap();
    let console = boot_with(w, firmware, &format!("{}-tampered", w.hostname));
    let kernel = format!("data block {block} is corrupted");
    assert!(
        console
            .lines()
            .any(|l| l.contains("device-mapper: verity:") && l.contains(&kernel)),
        "missing the kernel's verity message for block {block}:\n{console}"
    );
    // ingot.corruption=panic (the default): the kernel stops the node at the first bad block.
    assert!(
        console.contains("Kernel panic - not syncing: dm-verity device corrupted"),
        "the kernel did not panic on the corrupted block:\n{console}"
    );
    assert!(!console.contains(CHECK), "the node came up:\n{console}");
}

/// The control plane (KVM and UEFI: the kata layer too) boots twice: the nested guest runs on the
/// first boot and is forced to hang on the second ([`Nested`]).
fn control_plane(p: &Published) {
    let node = Node::uefi(
        "kvm-control-plane",
        "sda",
        "cp-1",
        true,
        &["base", "kata", "control-plane"],
    );
    let w = write_machine(p, &node);
    let console = boot_nested(&w, "cp-1");
    assert!(console.contains("formatting it (first boot)"), "{console}");
    let first = assert_first_boot(p, &w, &console, true);
    assert_kata(p, &checks(&console), &console, Nested::Runs);
    let again = boot_nested(&w, "cp-1-again");
    assert_second_boot(p, &w, &again, &first, true);
    assert_kata(p, &checks(&again), &again, Nested::ForcedHang);
}

/// [`boot`] for the machine that runs the nested guest, which TCG (QEMU 7.2) now and then
/// freezes whole while that guest boots even with [`NESTED_ARG`] (2 of the last 4 full runs:
/// the node's console stopped 16 s after `l2-start` and printed nothing for 600 s). That freeze
/// is the emulator's, not the node's, so a boot that failed inside the nested window (its
/// console's last check line `l2-start`, no `l2-exit`) is booted once more from the disk as it
/// was before, and says so; a failure anywhere else, or a second one, fails the test as before.
fn boot_nested(w: &Written, what: &str) -> String {
    let before = w.dir.path().join(format!("{what}.before.img"));
    copy_sparse(&w.image, &before);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| boot(w, what)));
    let payload = match first {
        Ok(console) => {
            fs::remove_file(&before).unwrap();
            return console;
        }
        Err(payload) => payload,
    };
    let log = w.dir.path().join(format!("vm-{what}")).join("serial.log");
    let console = ingot_testkit::console::clean(&fs::read(&log).unwrap_or_default());
    if !froze_in_nested_window(&console) {
        std::panic::resume_unwind(payload);
    }
    eprintln!(
        "{what}: froze while its nested guest booted (TCG's defect, see boot_nested); \
         booting it once more from its disk as it was before that boot"
    );
    copy_sparse(&before, &w.image);
    fs::remove_file(&before).unwrap();
    boot(w, &format!("{what}-retry"))
}

/// Where [`boot_nested`] boots again: the check unit's last line is `l2-start` (the nested
/// guest was booting, and nothing after it was printed). The console alone decides: the
/// watcher's panic may arrive re-raised by a scoped thread, without its text.
fn froze_in_nested_window(console: &str) -> bool {
    let last = console.lines().rfind(|l| l.contains(CHECK));
    last.is_some_and(|l| l.contains(&format!("{CHECK}l2-start ")))
}

/// A copy of a sparse disk image that stays sparse (the 4 GiB disk holds about 1.5 GiB).
fn copy_sparse(from: &Path, to: &Path) {
    run_ok(Command::new("cp").arg("--sparse=always").arg(from).arg(to));
}

/// A Hetzner cloud VM (CAPH's hcloud call: `sda`, no UEFI): the writer adds the BIOS boot
/// partition and GRUB from the stack's `[boot] bios`, and SeaBIOS alone (no OVMF) boots the node
/// to multi-user.target, as a first boot.
fn bios_machine(p: &Published) {
    let node = Node {
        fixture: "cpu-worker",
        devices: "sda",
        name: "hcloud-worker-1",
        cp: false,
        disks: &["sda"],
        bios: true,
        layers: &["base"],
        may_fail: &[],
    };
    let w = write_machine(p, &node);
    assert_eq!(
        w.parts.last().map(|p| p.0.as_str()),
        Some("bios-boot"),
        "{:?}",
        w.parts
    );
    let console = boot_with(&w, qemu::Firmware::Bios, "hcloud-seabios");
    assert!(console.contains("formatting it (first boot)"), "{console}");
    assert_first_boot(p, &w, &console, false);
    assert_tampered_base_stops(&w, qemu::Firmware::Bios);
}

/// A GPU worker as a developer boots one: `ingot vm` writes the release from the registry onto
/// a VM with an NVIDIA GPU (no KVM) with the test's bootstrap data and `--ssh-key`, and boots it
/// on QEMU's user network with SSH forwarded; `ingot vm ssh -- systemctl is-system-running`
/// answers while the node is up. The writer gives it the nvidia layer and not the kata one.
/// Booted under OVMF with no GPU, the layer's module is for the base's kernel, the kernel loads
/// it and it gives up only for want of a GPU, the CUDA library is in ld.so's cache, nvidia-smi
/// runs and cannot reach a driver. The units that need a GPU may fail: systemd-modules-load (the
/// layer's modules-load.d asks for nvidia-drm) and nvidia-persistenced.
fn gpu_machine(p: &Published) {
    let name = "gpu-worker-1";
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let state = dir.path().join("vm");
    let data = dir.path().join("bootstrap.data");
    fs::write(&data, bootstrap_data(false, true)).unwrap();
    let key = dir.path().join("id_ed25519");
    run_ok(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "ingot-test", "-f"])
            .arg(&key),
    );
    let port = ingot_testkit::registry::free_port().to_string();
    let public = key.with_extension("pub");
    let mut args = common::vm::stack_args(&p.registry.url, &p.stack.public, &state);
    args.extend([
        std::ffi::OsStr::new("--bootstrap"),
        data.as_os_str(),
        "--ssh-key".as_ref(),
        public.as_os_str(),
        "--net".as_ref(),
        "user".as_ref(),
        "--ssh-port".as_ref(),
        port.as_ref(),
    ]);
    let kernel_args: Vec<String> = qemu::KERNEL_ARGS
        .iter()
        .chain(&[CHECK_ARG])
        .map(|a| format!("--kernel-arg={a}"))
        .collect();
    args.extend(kernel_args.iter().map(std::ffi::OsStr::new));
    let size = format!("{DISK_MIB}M");
    args.extend(
        [
            "--gpu",
            "nvidia",
            "--name",
            name,
            "--disk-size",
            &size,
            "--cpus",
            "1",
            "--memory",
            "2048",
        ]
        .map(std::ffi::OsStr::new),
    );
    let running = common::vm::spawn(&args, &[("OCI_REGISTRY_AUTH_TOKEN", TOKEN)]);
    let answer = system_state_over_ssh(&state);
    let out = running.finish(BOOT_TIMEOUT);
    let console = common::vm::text(&out);
    for l in console.lines().filter(|l| {
        l.contains(CHECK) || l.starts_with("ingot") || l.contains("device-mapper: verity")
    }) {
        eprintln!("gpu-worker| {l}");
    }
    assert_eq!(out.status.code(), Some(0), "{console}");
    let answer = answer.unwrap_or_else(|e| panic!("{e}\n{console}"));
    let w = vm_written(
        &state,
        name,
        &["base", "nvidia"],
        dir,
        None,
        &[
            "systemd-modules-load.service",
            "nvidia-persistenced.service",
        ],
    );
    let c = checks(&console);
    assert_eq!(one(&c, "ssh-login", &console), answer, "{console}");
    // The boot is over: running, or degraded by the units that need a GPU.
    assert!(answer == "running" || answer == "degraded", "{answer:?}");
    assert!(console.contains("formatting it (first boot)"), "{console}");
    assert_first_boot(p, &w, &console, false);
    assert_nvidia(p, &c, &console);
}

/// Logs into the `ingot vm` in `state` with `ingot vm ssh -- systemctl is-system-running` until
/// the boot is over (the answer is neither `initializing` nor `starting`), then tells the node's
/// check what it saw; the answer. Every try is bounded; the whole within [`BOOT_TIMEOUT`].
fn system_state_over_ssh(state: &Path) -> Result<String, String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < BOOT_TIMEOUT {
        std::thread::sleep(Duration::from_secs(5));
        if !state.join("ssh-port").exists() {
            continue;
        }
        let out = common::vm::ssh(state, "systemctl is-system-running");
        // ssh's 255: no connection yet; any other status is systemctl's.
        if out.status.code() == Some(255) {
            last = String::from_utf8_lossy(&out.stderr).trim().to_string();
            continue;
        }
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if answer == "initializing" || answer == "starting" {
            continue;
        }
        eprintln!(
            "gpu-worker: `ingot vm ssh -- systemctl is-system-running` answered {answer:?} after {:.1?}",
            started.elapsed()
        );
        let told = common::vm::ssh(state, &format!("echo {answer} >/run/ingot-test-ssh"));
        if !told.status.success() {
            return Err(format!("telling the check: {told:?}"));
        }
        return Ok(answer);
    }
    Err(format!(
        "no answer over ssh within {BOOT_TIMEOUT:?}; last: {last}"
    ))
}

/// The disks `ingot vm` wrote and booted in `state` as a [`Written`] (its first disk selected);
/// the writer selected `layers`. `signed`: a Secure Boot release's signed command line (else the
/// ESP's loader entry has it); `may_fail`: the units that need hardware the VM lacks.
fn vm_written(
    state: &Path,
    name: &str,
    layers: &[&str],
    dir: tempfile::TempDir,
    signed: Option<String>,
    may_fail: &'static [&'static str],
) -> Written {
    let output: serde_json::Value =
        serde_json::from_slice(&fs::read(state.join("output.json")).unwrap()).unwrap();
    let selected: Vec<&str> = output["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("no layers in the writer's status file: {output}"))
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(selected, layers, "{name}: the selected layers");
    let image = state.join("disk0.img");
    let parts = partitions(&image);
    let images = ["sda", "sdb", "sdc", "sdd"]
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), state.join(format!("disk{i}.img"))))
        .filter(|(_, d)| d.exists())
        .collect();
    Written {
        cmdline: signed.unwrap_or_else(|| esp_cmdline(&image, &parts)),
        images,
        image,
        parts,
        hostname: name.to_string(),
        may_fail,
        dir,
    }
}

/// What the nvidia layer shows on a machine without a GPU ([`gpu_machine`]).
fn assert_nvidia(p: &Published, c: &BTreeMap<String, Vec<String>>, console: &str) {
    let vermagic = one(c, "nv-vermagic", console);
    assert_eq!(
        vermagic.split_whitespace().next(),
        Some(p.kver.as_str()),
        "nvidia-current's vermagic: {vermagic}"
    );
    let modprobe = one(c, "nv-modprobe", console);
    assert!(
        modprobe.starts_with("rc=1 ") && modprobe.contains("No such device"),
        "modprobe nvidia-current: {modprobe}"
    );
    let kernel = &c["nv-kernel"];
    assert!(
        kernel
            .iter()
            .any(|l| l.contains("NVRM: No NVIDIA GPU found")),
        "{kernel:?}"
    );
    // Unsigned (no signing key given) and loaded anyway: no Secure Boot here.
    assert!(
        kernel
            .iter()
            .any(|l| l.contains("module verification failed")),
        "{kernel:?}"
    );
    let libs = &c["nv-ldconfig"];
    assert!(
        libs.iter().any(|l| l.starts_with("libcuda.so.1 /")),
        "ldconfig -p: {libs:?}"
    );
    assert!(
        libs.iter().any(|l| l.starts_with("libnvidia-ml.so.1 /")),
        "ldconfig -p: {libs:?}"
    );
    // The default names lead straight to the driver's files, not through /etc/alternatives.
    for l in &c["nv-link"] {
        let (path, target) = l.split_once(' ').unwrap();
        assert!(
            target.starts_with("/usr/lib/") && target.contains("nvidia/current/"),
            "{path} -> {target}"
        );
    }
    let smi = one(c, "nv-smi", console);
    assert!(
        !smi.starts_with("rc=0 ") && smi.contains("couldn't communicate with the NVIDIA driver"),
        "nvidia-smi: {smi}"
    );
    assert_eq!(
        one(c, "nv-user", console),
        "nvpd:/usr/sbin/nologin",
        "systemd-sysusers made nvidia-persistenced's user"
    );
}

/// What a boot of the control plane shows of the nested guest ([`CHECK_SCRIPT`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nested {
    /// Not asked for: the modules and /dev/kvm only.
    None,
    /// The first boot: the guest boots to its marker and powers off.
    Runs,
    /// The second boot: the guest's init never powers off, and the check's bound stops it.
    ForcedHang,
}

/// The check line of the forced hang's bound ([`Nested::ForcedHang`]).
const FORCED_HANG: &str = "l2-qemu after 30s";

/// What the kata layer shows on a machine with KVM (`-cpu max`: TCG offers AMD SVM): kvm_amd
/// and the vhost modules are loaded, /dev/kvm is there, and (`nested`) the layer's QEMU boots a
/// guest with `-accel kvm` to its init, which prints its marker, or hangs and is stopped by the
/// check's bound, which names it.
fn assert_kata(p: &Published, c: &BTreeMap<String, Vec<String>>, console: &str, nested: Nested) {
    let modules = one(c, "kvm-modules", console);
    for m in ["kvm", "kvm_amd", "vhost_net", "vhost_vsock"] {
        assert!(
            modules.split_whitespace().any(|x| x == m),
            "{m} not loaded: {modules}"
        );
    }
    assert_eq!(one(c, "kvm-device", console), "character special file");
    let marker = c.get("l2").cloned().unwrap_or_default();
    let want = format!("ingot-l2 alive {}", p.kver);
    let timeouts = c.get("timeout").cloned().unwrap_or_default();
    match nested {
        Nested::None => assert!(c.get("l2-start").is_none(), "{console}"),
        Nested::Runs => {
            assert_eq!(one(c, "l2-start", console), "limit 300s");
            assert!(
                marker.contains(&want),
                "the guest under KVM did not print its marker: {marker:?} {:?} {:?} {timeouts:?}",
                c.get("l2-exit"),
                c.get("l2-error")
            );
            assert_eq!(one(c, "l2-exit", console), "0", "qemu's exit status");
        }
        Nested::ForcedHang => {
            assert_eq!(one(c, "l2-start", console), "limit 30s");
            assert_eq!(timeouts, [FORCED_HANG], "the bound named the hung guest");
            assert_eq!(one(c, "l2-exit", console), "124", "timeout's exit status");
        }
    }
}

/// A dedicated server with two disks (CAPH names both WWNs): `var` is mirrored across them, and
/// each disk boots alone (a VM given only that disk, as if the other were pulled) with `var`
/// degraded, assembled by the base's own mdadm in its initrd, as a first boot (each member's
/// half was never synced). The two boots run side by side, each on its own disk file.
fn raid_machine(p: &Published) {
    let node = Node {
        fixture: "two-disk",
        devices: "0x5002538e40a1b2c3 0x5002538e40a1b2c4",
        name: "raid-worker-1",
        cp: false,
        disks: &["sda", "sdb"],
        bios: false,
        layers: &["base", "kata"],
        may_fail: &[],
    };
    let mut w = write_machine(p, &node);
    let members = var_members(&w.cmdline);
    assert_eq!(members.len(), 2, "{}", w.cmdline);
    let consoles: Vec<String> = std::thread::scope(|s| {
        let w = &w;
        let boots: Vec<_> = ["sda", "sdb"]
            .map(|disk| {
                s.spawn(move || {
                    let what = format!("raid-{disk}-alone");
                    boot_image(w, &w.images[disk], qemu::Firmware::Uefi, &what)
                })
            })
            .into_iter()
            .collect();
        boots.into_iter().map(|b| b.join().unwrap()).collect()
    });
    for ((disk, missing), console) in [("sda", &members[1]), ("sdb", &members[0])]
        .into_iter()
        .zip(&consoles)
    {
        w.select(disk);
        assert_first_boot(p, &w, console, false);
        assert_kata(p, &checks(console), console, Nested::None);
        let gone = format!("ingot: var: member PARTUUID {missing} missing, going on without it\n");
        assert!(
            console.contains(&gone),
            "{disk}: missing {gone:?}:\n{console}"
        );
        assert_var_mirror(console, 1, 2, "degraded");
    }
}

/// A control plane of the Secure Boot release, made as a developer makes one: `ingot vm
/// --firmware secure-boot` on two disks (var mirrored) enrolls the test's PK, KEK and db,
/// starts the machine's own swtpm,
/// runs the writer with it (it seals every secret it stages to that TPM under the release's
/// signed PCR 11 policy) and boots the disk on the same TPM state. Its bootstrap data carries
/// the test's CA keys for /etc/kubernetes/pki and a kubeadm config with a bootstrap token. The
/// firmware checks the UKI, the kernel runs locked down with the signed command line, every
/// layer is opened against a root hash inside the signed image, and the node comes up as every
/// control plane does, as a first boot: its secrets opened by the TPM ([`assert_sealed`]), var
/// LUKS2 under the key the writer sealed ([`assert_var_luks2`]). Then the same disk boots through
/// a UKI of the release rebuilt with another PCR key, and with its own UKI on a cleared TPM (a
/// fresh state): nothing is opened, nothing of the node starts, the console says why.
fn secure_machine(p: &Published) {
    let key = p.secure_boot.as_ref().expect("the Secure Boot release");
    let name = "sb-control-plane-1";
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let state = dir.path().join("vm");
    let secrets = ca_keys(dir.path());
    let data = dir.path().join("bootstrap.data");
    fs::write(&data, bootstrap_data_with(true, false, &secrets)).unwrap();
    let keys = key.cert.parent().unwrap();
    let size = format!("{DISK_MIB}M");
    let mut args = common::vm::stack_args(&p.registry.url, &p.stack.public, &state);
    args.extend([
        std::ffi::OsStr::new("--firmware"),
        "secure-boot".as_ref(),
        "--secure-boot-keys".as_ref(),
        keys.as_os_str(),
        "--bootstrap".as_ref(),
        data.as_os_str(),
        "--name".as_ref(),
        name.as_ref(),
        "--disks".as_ref(),
        "2".as_ref(),
        "--disk-size".as_ref(),
        size.as_ref(),
        "--cpus".as_ref(),
        "1".as_ref(),
        "--memory".as_ref(),
        "2048".as_ref(),
    ]);
    let console = vm_boot(&args, name, Some(0));
    let descriptor = &ingot_testkit::layout::read(&p.stack.layout).descriptor;
    let cmdline = descriptor["uki"]["cmdline"].as_str().unwrap().to_string();
    for want in [
        "secureboot: Secure boot enabled".to_string(),
        "Kernel is locked down from EFI Secure Boot".to_string(),
        format!("Kernel command line: {cmdline}"),
        "ingot: signed UKI: node layer and var from the stub's credentials".to_string(),
    ] {
        assert!(console.contains(&want), "no {want:?}:\n{console}");
    }
    let base = cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix("ingot.layers=base:"))
        .and_then(|l| l.split(',').next())
        .unwrap();
    let verified = format!("ingot: layer base verified root hash {base}\n");
    assert!(console.contains(&verified), "no {verified:?}:\n{console}");
    assert!(console.contains("formatting it (first boot)"), "{console}");
    let w = vm_written(
        &state,
        name,
        &["base", "control-plane"],
        dir,
        Some(cmdline),
        &[],
    );
    assert_first_boot(p, &w, &console, true);
    assert_sealed(&state, &secrets, &console);
    assert_var_luks2(&w, &console);

    // The same disk with a UKI of the release built with another PCR key (db-signed: the
    // firmware boots it), on the same TPM; then its own UKI on a cleared TPM (a fresh state).
    let again: Vec<&std::ffi::OsStr> = vec!["--state".as_ref(), state.as_os_str()];
    let other = p
        .other_pcr_key
        .as_ref()
        .expect("the other PCR key's release");
    let own = w.dir.path().join("own-uki.efi");
    w.esp_copy("::/EFI/BOOT/BOOTX64.EFI", &own);
    w.esp_put(&uki_of(&other.layout), "::/EFI/BOOT/BOOTX64.EFI");
    assert_tpm_refused(&vm_boot(&again, "sb-other-pcr-key", Some(3)));
    w.esp_put(&own, "::/EFI/BOOT/BOOTX64.EFI");
    fs::remove_dir_all(state.join("tpm")).unwrap();
    assert_tpm_refused(&vm_boot(&again, "sb-cleared-tpm", Some(3)));
}

/// The UKI blob of the stack in `layout`.
fn uki_of(layout: &Path) -> PathBuf {
    let descriptor = &ingot_testkit::layout::read(layout).descriptor;
    let digest = descriptor["uki"]["digest"].as_str().expect("a UKI");
    let hex = digest.strip_prefix("sha256:").unwrap();
    layout.join("blobs/sha256").join(hex)
}

/// Runs `ingot vm` with `args` until the VM ends, echoes the node's own lines, and checks its
/// status (`want`: 0 booted, 3 the boot failed); the console.
fn vm_boot(args: &[&std::ffi::OsStr], what: &str, want: Option<i32>) -> String {
    let out = common::vm::run(args, &[("OCI_REGISTRY_AUTH_TOKEN", TOKEN)], BOOT_TIMEOUT);
    let console = common::vm::text(&out);
    for l in console.lines().filter(|l| {
        l.contains(CHECK)
            || l.starts_with("ingot")
            || l.contains("INGOT-SECRETS-SEALED")
            || l.contains("device-mapper: verity")
    }) {
        eprintln!("{what}| {l}");
    }
    assert_eq!(out.status.code(), want, "{what}:\n{console}");
    console
}

/// The test's cluster CA keys as CABPK stages them (path on the node, PEM): the cluster CA's and
/// the service-account signing key, fresh for each run.
fn ca_keys(dir: &Path) -> Vec<(String, String)> {
    ["ca", "sa"]
        .iter()
        .map(|k| {
            let file = dir.join(format!("{k}.key"));
            run_ok(
                Command::new("openssl")
                    .args(["genpkey", "-algorithm", "EC", "-pkeyopt"])
                    .arg("ec_paramgen_curve:P-256")
                    .arg("-out")
                    .arg(&file),
            );
            let pem = fs::read_to_string(&file).unwrap();
            (format!("/etc/kubernetes/pki/{k}.key"), pem)
        })
        .collect()
}

/// The writer sealed the node's secrets to the VM's TPM and they are nowhere on its disk; the node
/// opened every one of them, sshd served the sealed host keys (the writer's reported
/// fingerprints), and the first-boot bootstrap read the CA keys it was given.
fn assert_sealed(state: &Path, ca: &[(String, String)], console: &str) {
    let report: serde_json::Value =
        serde_json::from_slice(&fs::read(state.join("output.json")).unwrap()).unwrap();
    let secrets = &report["details"]["secrets"];
    assert_eq!(secrets["sealed"], true, "{secrets}");
    assert_eq!(secrets["var_encrypted"], true, "{secrets}");
    let entries = secrets["secrets"].as_array().unwrap();
    let paths: Vec<&str> = entries
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    // The kubeadm config is staged in the node layer's /etc/ingot/run (copied to /run at first
    // boot, as the symlink).
    for want in ca
        .iter()
        .map(|(p, _)| p.as_str())
        .chain(["/etc/ingot/run/kubeadm/kubeadm.yaml"])
    {
        assert!(paths.contains(&want), "{want} not sealed: {paths:?}");
    }
    for e in entries {
        let (path, name) = (
            e["path"].as_str().unwrap(),
            e["credential"].as_str().unwrap(),
        );
        let opened = format!("ingot-unseal: opened {name} for {path}");
        assert!(console.contains(&opened), "no {opened:?}:\n{console}");
    }
    let mut reported: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["ssh_fingerprint"].as_str())
        .collect();
    reported.sort_unstable();
    let c = checks(console);
    let mut served = c["sshd-key"].clone();
    served.sort();
    assert_eq!(
        served, reported,
        "sshd serves the host keys the writer reported"
    );
    for (path, pem) in ca {
        let want = format!("{path} {}", sha256_hex(pem.as_bytes()));
        assert!(
            c["bootstrap-pki"].contains(&want),
            "{want}: {:?}",
            c["bootstrap-pki"]
        );
    }
    // Every partition of both disks, as they are after the first boot: no CA key's bytes, no
    // token, no host key's. Each PEM's base64 lines are searched, not the file whole.
    let mut needles: Vec<String> = ca
        .iter()
        .flat_map(|(_, pem)| {
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .map(str::to_string)
        })
        .collect();
    needles.push(CP_TOKEN.to_string());
    // sshd's own binaries carry the OpenSSH key header: the keys' own lines, as the node read them.
    let host_keys = &c["host-key-line"];
    assert_eq!(host_keys.len(), 2, "{host_keys:?}");
    needles.extend(
        host_keys
            .iter()
            .map(|l| l.split_whitespace().nth(1).unwrap().to_string()),
    );
    let patterns = state.join("needles");
    fs::write(&patterns, needles.join("\n") + "\n").unwrap();
    for disk in [state.join("disk0.img"), state.join("disk1.img")] {
        let found = Command::new("grep")
            .args(["-a", "-o", "-F", "-f"])
            .arg(&patterns)
            .arg(&disk)
            .output()
            .unwrap();
        assert_eq!(
            found.status.code(),
            Some(1),
            "secrets in the clear on {}: {}",
            disk.display(),
            String::from_utf8_lossy(&found.stdout)
        );
    }
}

/// var is LUKS2 over its md mirror (the header's magic and version in each member's data
/// area), made on the first boot by the initramfs with the key the writer sealed, and opened
/// without a prompt.
fn assert_var_luks2(w: &Written, console: &str) {
    for want in [
        "is empty: making it LUKS2 with the key sealed to this machine's TPM (first boot)",
        "is LUKS2, opened with its TPM-sealed key as /dev/mapper/ingot-var",
        "var /dev/mapper/ingot-var mounted read-write",
    ] {
        assert!(console.contains(want), "no {want:?}:\n{console}");
    }
    // On each disk: var's member of the md mirror, whose data area (after the md superblock and
    // its data offset) starts with the LUKS2 header.
    for (name, image) in &w.images {
        let parts = partitions(image);
        let (_, start, _) = parts
            .iter()
            .find(|p| p.0 == "var")
            .expect("a var partition");
        let mut head = vec![0u8; 8 << 20];
        let mut disk = fs::File::open(image).unwrap();
        disk.seek(SeekFrom::Start(*start)).unwrap();
        disk.read_exact(&mut head).unwrap();
        let luks = head
            .chunks(4096)
            .position(|b| b.starts_with(b"LUKS\xba\xbe\0\x02"))
            .unwrap_or_else(|| panic!("{name}: no LUKS2 header in var's first 8 MiB"));
        eprintln!(
            "{name}: var's LUKS2 header at {} KiB into the partition",
            luks * 4
        );
    }
}

/// The same disk booted through a UKI whose PCR policy is not the release's, or on a cleared
/// TPM: var's key is refused in the initramfs with the line that says why, and the boot stops
/// there (powered off, no shell: a signed boot's PCR 11 would open the rest): no secret is
/// opened, nothing of the node starts, `ingot vm` reports the boot failed.
fn assert_tpm_refused(console: &str) {
    let refused = "INGOT-BOOT-FAILED: var: the TPM refused var's key (another boot chain, another \
                   machine or a cleared TPM); nothing joins";
    assert!(console.contains(refused), "no {refused:?}:\n{console}");
    assert!(!console.contains("ingot-unseal: opened"), "{console}");
    assert!(!console.contains("/dev/mapper/ingot-var"), "{console}");
    assert!(
        !console.contains(CHECK),
        "the node's userspace ran:\n{console}"
    );
    assert!(
        !console.contains("(initramfs)"),
        "a shell was offered:\n{console}"
    );
}

/// containerd, as the booted node's binary reads its config (`containerd config dump`), has
/// every runtime the stack's layers may provide, and the running daemon's CRI plugin started
/// with them (its log line); each RuntimeClass the base ships names one of them.
fn assert_runtimes(p: &Published, c: &BTreeMap<String, Vec<String>>, console: &str) {
    let dump = c
        .get("ctr-dump")
        .unwrap_or_else(|| panic!("no containerd config dump:\n{console}"))
        .join("\n");
    let dump: toml::Table = toml::from_str(&dump).unwrap_or_else(|e| panic!("{e}:\n{dump}"));
    let runtimes = &dump["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    let get = |rt: &str, path: &[&str]| -> toml::Value {
        let mut v = &runtimes[rt];
        for k in path {
            v = v
                .get(k)
                .unwrap_or_else(|| panic!("runtime {rt} has no {path:?}: {runtimes}"));
        }
        v.clone()
    };
    let s = |v: &str| toml::Value::String(v.to_string());
    assert_eq!(get("runc", &["runtime_type"]), s("io.containerd.runc.v2"));
    assert_eq!(
        get("runc", &["options", "SystemdCgroup"]),
        toml::Value::Boolean(true)
    );
    assert_eq!(get("nvidia", &["runtime_type"]), s("io.containerd.runc.v2"));
    assert_eq!(
        get("nvidia", &["options", "BinaryName"]),
        s("/usr/bin/nvidia-container-runtime")
    );
    assert_eq!(get("kata", &["runtime_type"]), s("io.containerd.kata.v2"));
    assert_eq!(
        get("kata", &["runtime_path"]),
        s("/usr/bin/containerd-shim-kata-v2")
    );
    // The daemon's own view: its CRI plugin logs the configuration it started with.
    let cri = one(c, "cri-config", console);
    for want in [
        "runc:{Type:io.containerd.runc.v2 ",
        "nvidia:{Type:io.containerd.runc.v2 ",
        "BinaryName:/usr/bin/nvidia-container-runtime",
        "kata:{Type:io.containerd.kata.v2 Path:/usr/bin/containerd-shim-kata-v2 ",
    ] {
        assert!(
            cri.contains(want),
            "the CRI plugin started without {want:?}: {cri}"
        );
    }
    for class in &p.runtime_classes {
        assert!(
            runtimes.get(class).is_some(),
            "RuntimeClass handler {class}: {runtimes}"
        );
    }
}

/// One machine of the test: written, booted and checked from a published release.
type Machine = fn(&Published);

#[test]
fn debian_node_boots_read_only_and_runs_its_first_boot_once() {
    if !usable(ingot_testkit::test_name!()) {
        return;
    }
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let Releases { plain, secure } = publish(work.path());
    // INGOT_TEST_DEBIAN_ONLY=NAME[,NAME...] boots only those machines (control-plane, bios,
    // gpu, raid, secure): a developer's shortcut beside INGOT_TEST_DEBIAN_TREES. CI boots all.
    let only = std::env::var("INGOT_TEST_DEBIAN_ONLY").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let machines: [(&str, Machine); 5] = [
        ("control-plane", control_plane),
        ("bios", bios_machine),
        ("gpu", gpu_machine),
        ("raid", raid_machine),
        ("secure", secure_machine),
    ];
    // Each TCG guest uses about one core: the machines boot side by side.
    let started = Instant::now();
    std::thread::scope(|s| {
        for (name, machine) in machines.into_iter().filter(|(n, _)| wanted(n)) {
            let p = if name == "secure" { &secure } else { &plain };
            s.spawn(move || machine(p));
        }
    });
    eprintln!("the machines: {:.1?}", started.elapsed());
    eprintln!(
        "where the boots' time went (one guest per host core at once):\n{}",
        qemu::runs_table()
    );
}

/// Only a failure inside the nested window is booted again: one after `l2-exit`, or one before the
/// nested guest started, still fails the test.
#[test]
fn only_a_freeze_inside_the_nested_window_is_booted_again() {
    let booting = "[ 223.4] check[642]: INGOT-CHECK kvm-device character special file\n\
                   [ 223.5] check[642]: INGOT-CHECK l2-start limit 300s\n\
                   [ 239.6] kvm [839]: vcpu0 Unhandled WRMSR(0xc0010007) = 0xffff\n";
    assert!(froze_in_nested_window(booting));
    let after = format!("{booting}[ 250.1] check[642]: INGOT-CHECK l2-exit 0\n");
    assert!(!froze_in_nested_window(&after));
    let before = "[ 223.4] check[642]: INGOT-CHECK kvm-device character special file\n";
    assert!(!froze_in_nested_window(before));
}
