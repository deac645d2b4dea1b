#!/usr/bin/env bash
# Builds a small rescue system, a stand-in for Hetzner's rescue, booted under QEMU by the
# writer's rescue VM tests (writer/tests/rescue_vm.rs, tests/rescue/README.md):
#
#   tests/rescue/build-rescue.sh OUTDIR [BINARY...]
#
# OUTDIR/vmlinuz      Debian's kernel (tests/boot/fetch-kernel.sh)
# OUTDIR/initrd.img   busybox, systemd-udevd with the storage, md and dm rules, mdadm, lvm2, dmsetup,
#                     smartctl, sgdisk, sfdisk, wipefs, blkid, iproute2's ip, nohup, the modules for
#                     virtio-scsi disks, virtio-net, 9p, md RAID1 and device-mapper, the shared
#                     libraries of every tool and of each BINARY (the binary itself comes in
#                     through the job share), and tests/rescue/init as /init.
#
# Runs as any user. Needs what tests/boot/fetch-kernel.sh needs, plus busybox-static, mdadm,
# lvm2, smartmontools, gdisk, fdisk, util-linux, iproute2, udev, kmod, gzip, ca-certificates.
set -euo pipefail

OUT=${1:?usage: build-rescue.sh OUTDIR [BINARY...]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
BUSYBOX=/bin/busybox
# The modules /init loads, with their dependencies (modprobe resolves them, softdeps included).
MODULES=(virtio_pci virtio_scsi sd_mod virtio_net 9pnet_virtio 9p raid1 dm-mod)
# Dynamic tools of the rescue system: the ones the writer runs or a rescue shell offers.
TOOLS=(mdadm lvm dmsetup smartctl sgdisk sfdisk wipefs blkid ip udevadm nohup)
# udev rules that give disks their by-id links and assemble md arrays as a rescue system boot does,
# and 95-dm-notify, which completes the udev cookie dmsetup waits for (without it `dmsetup remove`
# of an LVM volume hangs).
RULES=(50-udev-default.rules 60-persistent-storage.rules 55-dm.rules 60-persistent-storage-dm.rules
  63-md-raid-arrays.rules 64-md-raid-assembly.rules 95-dm-notify.rules)

die() { echo "build-rescue.sh: $*" >&2; exit 1; }
for tool in modprobe gzip ldd "${TOOLS[@]}"; do
  PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null || die "missing $tool"
done
[ -x "$BUSYBOX" ] && "$BUSYBOX" --list | grep -x cpio >/dev/null || die "missing busybox-static ($BUSYBOX)"
[ -x /lib/udev/scsi_id ] || die "missing /lib/udev/scsi_id (udev)"
[ -f /etc/ssl/certs/ca-certificates.crt ] || die "missing /etc/ssl/certs/ca-certificates.crt (ca-certificates)"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-rescue.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
KVER=$("$HERE/../boot/fetch-kernel.sh" "$WORK/kpkg")

I="$WORK/initrd"
mkdir -p "$I"/{bin,sbin,dev,proc,sys,run,tmp,root,mnt/job,etc/udev,lib/udev/rules.d,lib/modules,lib64}
cp "$BUSYBOX" "$I/bin/busybox"
for a in $("$I/bin/busybox" --list); do
  [ -e "$I/bin/$a" ] || ln -s busybox "$I/bin/$a"
done
# Copies a file with its shared libraries (and the loader) to the same paths in the initramfs.
with_libs() {
  local bin=$1 dest=${2:-}
  [ -n "$dest" ] && { rm -f "$I/bin/$(basename "$dest")"; cp -L "$bin" "$I$dest"; }
  for lib in $(ldd "$bin" 2>/dev/null | grep -o '/[^ ]*'); do
    mkdir -p "$I$(dirname "$lib")"
    [ -e "$I$lib" ] || cp -L "$lib" "$I$lib"
  done
}
for t in "${TOOLS[@]}"; do
  with_libs "$(PATH=$PATH:/usr/sbin:/sbin command -v "$t")" "/sbin/$t"
done
for l in pvcreate pvs pvscan pvremove vgcreate vgchange vgs vgremove lvcreate lvs lvremove; do
  ln -s lvm "$I/sbin/$l"
done
ln -s ../sbin/udevadm "$I/bin/udevadm"
mkdir -p "$I/lib/systemd"
ln -s /sbin/udevadm "$I/lib/systemd/systemd-udevd"    # udevadm runs as the daemon by this name
with_libs /lib/udev/scsi_id /lib/udev/scsi_id
for r in "${RULES[@]}"; do cp "/lib/udev/rules.d/$r" "$I/lib/udev/rules.d/"; done
# lvm without lvmetad or systemd: scan devices directly, never wait for udev.
mkdir -p "$I/etc/lvm"
printf 'activation {\n  udev_sync = 0\n  udev_rules = 0\n}\n' >"$I/etc/lvm/lvm.conf"
for bin in "$@"; do with_libs "$bin"; done

: >"$I/etc/modules.order"
for m in "${MODULES[@]}"; do
  modprobe -d "$WORK/kpkg" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  b=$(basename "$ko")
  cp "$ko" "$I/lib/modules/$b"
  echo "$b" >>"$I/etc/modules.order"
done
# The system trust store, as the rescue system has it (the writer's HTTP client loads it even for
# a plain-HTTP registry).
mkdir -p "$I/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$I/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$I/etc/passwd"
printf 'root:x:0:\n' >"$I/etc/group"
echo rescue >"$I/etc/hostname"
cp "$HERE/init" "$I/init"
chmod 0755 "$I/init"

cp "$WORK/kpkg/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
(cd "$I" && find . | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -n -1 >"$OUT/initrd.img"
echo "build-rescue.sh: $OUT (kernel $KVER, initramfs $(stat -c %s "$OUT/initrd.img") bytes)"
