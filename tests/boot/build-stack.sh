#!/usr/bin/env bash
# Builds the bootable fixture stack's layer trees and its manifest into OUTDIR:
#
#   tests/boot/build-stack.sh OUTDIR        # then: ingot build OUTDIR/stack.toml --out LAYOUT
#
# OUTDIR/base          kernel (/boot/vmlinuz), initramfs (/boot/initrd.img), systemd-boot
#                      (/boot/efi/EFI/BOOT/BOOTX64.EFI), busybox, /sbin/init (tests/boot/final-init)
# OUTDIR/control-plane, nvidia, kata   one marker file each (/etc/ingot/layers/NAME)
# OUTDIR/stack.toml    tests/boot/stack.toml
#
# The kernel comes from Debian's linux-image-amd64 (its current linux-image-VERSION dependency),
# fetched with `apt-get download` into INGOT_BOOT_CACHE (default /var/tmp/ingot-boot-cache) and
# unpacked with `dpkg -x` into a temporary directory; only the kernel image and the few modules
# the initramfs loads are kept. The initramfs holds busybox-static, veritysetup, util-linux blkid
# and mke2fs with their shared libraries, those modules, tests/boot/initramfs-init as /init and
# boot/initramfs-tools/scripts/ingot (the boot contract itself) as /scripts/ingot.
#
# Needs: apt-get, dpkg, depmod/modprobe (kmod), busybox-static, cryptsetup-bin, util-linux,
# e2fsprogs, systemd-boot-efi, gzip. Runs as any user.
set -euo pipefail

OUT=${1:?usage: build-stack.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
FIXTURES=$(cd "$HERE/../fixtures" && pwd)
CACHE=${INGOT_BOOT_CACHE:-/var/tmp/ingot-boot-cache}
BUSYBOX=/bin/busybox
SDBOOT=/usr/lib/systemd/boot/efi/systemd-bootx64.efi
# The modules /init loads, with their dependencies (modprobe resolves them, softdeps included).
MODULES=(virtio_pci virtio_blk dm-verity ext4 crc32c_generic overlay)

die() { echo "build-stack.sh: $*" >&2; exit 1; }
for tool in apt-cache apt-get dpkg depmod modprobe gzip veritysetup blkid mke2fs ldd; do
  command -v "$tool" >/dev/null || die "missing $tool"
done
[ -x "$BUSYBOX" ] && "$BUSYBOX" --list | grep -qx cpio || die "missing busybox-static ($BUSYBOX)"
[ -f "$SDBOOT" ] || die "missing $SDBOOT (systemd-boot-efi)"

# ---- the kernel package -----------------------------------------------------------------------
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$KPKG" ] || die "cannot resolve linux-image-amd64 (apt-get update?)"
mkdir -p "$CACHE"
DEB=$(ls "$CACHE/${KPKG}"_*.deb 2>/dev/null | head -1 || true)
if [ -z "$DEB" ]; then
  # Into a directory of its own, then renamed: a concurrent build never sees half a package.
  DL=$(mktemp -d "$CACHE/download.XXXXXX")
  ( cd "$DL" && { apt-get download "$KPKG" >/dev/null 2>&1 || { apt-get update -qq && apt-get download "$KPKG" >/dev/null; }; } ) \
    || { rm -rf "$DL"; die "apt-get download $KPKG failed"; }
  for f in "$DL"/*.deb; do mv "$f" "$CACHE/"; done
  rm -rf "$DL"
  DEB=$(ls "$CACHE/${KPKG}"_*.deb | head -1)
fi

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-boot-kpkg.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
dpkg -x "$DEB" "$WORK/kpkg"
KVER=$(ls "$WORK/kpkg/lib/modules" | head -1)
depmod -b "$WORK/kpkg" "$KVER"          # the .deb ships no modules.dep (its postinst makes it)

# ---- the initramfs ----------------------------------------------------------------------------
I="$WORK/initrd"
mkdir -p "$I"/{bin,sbin,dev,proc,sys,run,newroot,etc,lib/modules,lib64}
cp "$BUSYBOX" "$I/bin/busybox"
for a in $("$I/bin/busybox" --list); do
  [ -e "$I/bin/$a" ] || ln -s busybox "$I/bin/$a"
done
# Dynamic tools, each with its shared libraries (and the loader) at the same paths.
for bin in "$(command -v veritysetup)" "$(command -v blkid)" "$(command -v mke2fs)"; do
  name=$(basename "$bin")
  rm -f "$I/bin/$name"                  # busybox's applet of the same name, if any
  cp -L "$bin" "$I/sbin/$name"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    mkdir -p "$I$(dirname "$lib")"
    [ -e "$I$lib" ] || cp -L "$lib" "$I$lib"
  done
done
ln -s mke2fs "$I/sbin/mkfs.ext4"
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$I/etc/"
: >"$I/etc/modules.order"
for m in "${MODULES[@]}"; do
  modprobe -d "$WORK/kpkg" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  b=$(basename "$ko")
  cp "$ko" "$I/lib/modules/$b"
  echo "$b" >>"$I/etc/modules.order"
done
cp "$HERE/initramfs-init" "$I/init"
mkdir -p "$I/scripts"
cp "$HERE/../../boot/initramfs-tools/scripts/ingot" "$I/scripts/ingot"
chmod 0755 "$I/init"

# ---- the base layer ---------------------------------------------------------------------------
B="$OUT/base"
mkdir -p "$B"/{bin,sbin,etc/ingot/layers,boot/efi/EFI/BOOT,proc,sys,dev,run,tmp,var,opt,root}
chmod 0700 "$B/root"
chmod 1777 "$B/tmp"
cp "$BUSYBOX" "$B/bin/busybox"
for a in sh cat echo ls poweroff sync sleep mount umount uname head tr; do ln -s busybox "$B/bin/$a"; done
cp "$HERE/final-init" "$B/sbin/init"
chmod 0755 "$B/sbin/init"
cp "$FIXTURES/demo/base/etc/passwd" "$FIXTURES/demo/base/etc/group" "$B/etc/"
printf 'PRETTY_NAME="ingot boot fixture"\nID=ingot-boot\n' >"$B/etc/os-release"
echo "base" >"$B/etc/ingot/layers/base"
cp "$WORK/kpkg/boot/vmlinuz-$KVER" "$B/boot/vmlinuz"
(cd "$I" && find . | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -n -6 >"$B/boot/initrd.img"
cp "$SDBOOT" "$B/boot/efi/EFI/BOOT/BOOTX64.EFI"

# ---- the other layers: a marker file each -----------------------------------------------------
for l in control-plane nvidia kata; do
  mkdir -p "$OUT/$l/etc/ingot/layers"
  echo "$l" >"$OUT/$l/etc/ingot/layers/$l"
done
cp "$HERE/stack.toml" "$OUT/stack.toml"
echo "build-stack.sh: $OUT (kernel $KVER, initramfs $(stat -c %s "$B/boot/initrd.img") bytes)"
