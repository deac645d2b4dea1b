#!/usr/bin/env bash
# Builds the bootable fixture stack's layer trees and its manifest into OUTDIR:
#
#   tests/boot/build-stack.sh OUTDIR        # then: ingot build OUTDIR/stack.toml --out LAYOUT
#
# OUTDIR/base          kernel (/boot/vmlinuz), initramfs (/boot/initrd.img), systemd-boot
#                      (/boot/efi/EFI/BOOT/BOOTX64.EFI), systemd-stub (for a signed UKI,
#                      /usr/lib/systemd/boot/efi/linuxx64.efi.stub), GRUB's BIOS boot.img and core.img
#                      (/boot/grub/i386-pc), busybox, /sbin/init (tests/boot/final-init)
# OUTDIR/control-plane, nvidia, kata   one marker file each (/etc/ingot/layers/NAME)
# OUTDIR/stack.toml    tests/boot/stack.toml
#
# The kernel comes from Debian's linux-image-amd64 (tests/boot/fetch-kernel.sh: `apt-get download`
# into INGOT_BOOT_CACHE, unpacked with `dpkg -x` into a temporary directory); only the kernel image and the few modules
# the initramfs loads are kept. The initramfs holds busybox-static, veritysetup, util-linux blkid,
# mke2fs, mdadm (var's RAID1 mirror on a node written to several disks), cryptsetup and
# systemd-creds with the TSS2 libraries it loads (var as LUKS2 under a TPM-sealed key) with their
# shared libraries, those modules, tests/boot/initramfs-init as /init and
# boot/initramfs-tools/scripts/ingot (the boot contract itself) as /scripts/ingot.
#
# Needs: apt-get, dpkg, depmod/modprobe (kmod), busybox-static, cryptsetup-bin, systemd (252's
# systemd-creds) with libtss2, util-linux, e2fsprogs, mdadm, systemd-boot-efi, grub-pc-bin, gzip.
# Runs as any user.
set -euo pipefail

OUT=${1:?usage: build-stack.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
FIXTURES=$(cd "$HERE/../fixtures" && pwd)
BUSYBOX=/bin/busybox
SDBOOT=/usr/lib/systemd/boot/efi/systemd-bootx64.efi
# systemd-stub, where a Debian base has it: `ingot build --secure-boot-key` makes the UKI with it.
STUB=/usr/lib/systemd/boot/efi/linuxx64.efi.stub
GRUB_PC=/usr/lib/grub/i386-pc
# GRUB modules built into core.img, so BIOS boot needs nothing from the ESP but grub/grub.cfg.
GRUB_MODULES=(biosdisk part_gpt fat normal linux echo test)
# The modules /init loads, with their dependencies (modprobe resolves them, softdeps included):
# virtio-blk disks (the boot tests), SCSI disks on virtio-scsi (`ingot vm`, WWNs as on a server).
# dm-crypt and xts: var as LUKS2 when the writer sealed its key to the TPM (`ingot vm`'s Secure Boot
# machine).
MODULES=(virtio_pci virtio_blk virtio_scsi sd_mod dm-verity dm-crypt xts ext4 crc32c_generic overlay raid1)
# What systemd-creds loads with dlopen (ldd cannot see it): the TPM libraries of systemd 252.
TSS2_LIBS=(libtss2-esys.so.0 libtss2-rc.so.0 libtss2-mu.so.0 libtss2-tcti-device.so.0)
LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)

die() { echo "build-stack.sh: $*" >&2; exit 1; }
for tool in modprobe gzip veritysetup cryptsetup systemd-creds blkid mke2fs mdadm ldd grub-mkimage; do
  command -v "$tool" >/dev/null || die "missing $tool"
done
[ -x "$BUSYBOX" ] && "$BUSYBOX" --list | grep -x cpio >/dev/null || die "missing busybox-static ($BUSYBOX)"
[ -f "$SDBOOT" ] || die "missing $SDBOOT (systemd-boot-efi)"
[ -f "$STUB" ] || die "missing $STUB (systemd-boot-efi)"
[ -f "$GRUB_PC/boot.img" ] || die "missing $GRUB_PC/boot.img (grub-pc-bin)"

# ---- the kernel package -----------------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-boot-kpkg.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
KVER=$("$HERE/fetch-kernel.sh" "$WORK/kpkg")

# ---- the initramfs ----------------------------------------------------------------------------
I="$WORK/initrd"
mkdir -p "$I"/{bin,sbin,dev,proc,sys,run,newroot,etc,lib/modules,lib64}
cp "$BUSYBOX" "$I/bin/busybox"
for a in $("$I/bin/busybox" --list); do
  [ -e "$I/bin/$a" ] || ln -s busybox "$I/bin/$a"
done
# Dynamic tools, each with its shared libraries (and the loader) at the same paths.
libs_of() { # FILE: copies FILE's shared libraries (and the loader) to the same paths
  for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
    mkdir -p "$I$(dirname "$lib")"
    [ -e "$I$lib" ] || cp -L "$lib" "$I$lib"
  done
}
for bin in "$(command -v veritysetup)" "$(command -v cryptsetup)" "$(command -v systemd-creds)" \
  "$(command -v blkid)" "$(command -v mke2fs)" "$(command -v mdadm)"; do
  name=$(basename "$bin")
  rm -f "$I/bin/$name"                  # busybox's applet of the same name, if any
  cp -L "$bin" "$I/sbin/$name"
  libs_of "$bin"
done
for lib in "${TSS2_LIBS[@]}"; do
  # awk reads to the end: an early exit would kill ldconfig with SIGPIPE, which pipefail reports.
  path=$("$LDCONFIG" -p | awk -v l="$lib" '$1 == l && !found {print $NF; found = 1}')
  [ -n "$path" ] || die "missing $lib (libtss2-esys-3.0.2-0, libtss2-rc0, libtss2-mu0, libtss2-tcti-device0)"
  mkdir -p "$I$(dirname "$path")"
  cp -L "$path" "$I$path"
  libs_of "$path"
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
mkdir -p "$B"/{bin,sbin,etc/ingot/layers,boot/efi/EFI/BOOT,proc,sys,dev,run,tmp,var,opt/cni/bin,root}
chmod 0700 "$B/root"
chmod 1777 "$B/tmp"
cp "$BUSYBOX" "$B/bin/busybox"
for a in sh cat echo ls poweroff sync sleep mount umount uname head tr grep sha256sum cut; do ln -s busybox "$B/bin/$a"; done
cp "$HERE/final-init" "$B/sbin/init"
chmod 0755 "$B/sbin/init"
cp "$FIXTURES/demo/base/etc/passwd" "$FIXTURES/demo/base/etc/group" "$B/etc/"
printf 'PRETTY_NAME="ingot boot fixture"\nID=ingot-boot\n' >"$B/etc/os-release"
echo "base" >"$B/etc/ingot/layers/base"
cp "$WORK/kpkg/boot/vmlinuz-$KVER" "$B/boot/vmlinuz"
(cd "$I" && find . | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -n -6 >"$B/boot/initrd.img"
cp "$SDBOOT" "$B/boot/efi/EFI/BOOT/BOOTX64.EFI"
mkdir -p "$B/usr/lib/systemd/boot/efi"
cp "$STUB" "$B$STUB"
# The BIOS loader (boot-contract.md): GRUB's MBR boot code and a core image whose prefix is the
# boot disk's first GPT partition (the ESP), where the writer puts grub/grub.cfg.
mkdir -p "$B/boot/grub/i386-pc"
cp "$GRUB_PC/boot.img" "$B/boot/grub/i386-pc/boot.img"
grub-mkimage -O i386-pc -o "$B/boot/grub/i386-pc/core.img" -p '(,gpt1)/grub' "${GRUB_MODULES[@]}"

# ---- the other layers: a marker file each -----------------------------------------------------
for l in control-plane nvidia kata; do
  mkdir -p "$OUT/$l/etc/ingot/layers"
  echo "$l" >"$OUT/$l/etc/ingot/layers/$l"
done
cp "$HERE/stack.toml" "$OUT/stack.toml"
echo "build-stack.sh: $OUT (kernel $KVER, initramfs $(stat -c %s "$B/boot/initrd.img") bytes)"
