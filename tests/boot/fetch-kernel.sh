#!/usr/bin/env bash
# Unpacks Debian's current amd64 kernel package into DIR (DIR/boot/vmlinuz-KVER,
# DIR/lib/modules/KVER with modules.dep) and prints KVER:
#
#   KVER=$(tests/boot/fetch-kernel.sh DIR)
#
# The package is linux-image-amd64's current linux-image-VERSION dependency, fetched with
# `apt-get download` into INGOT_BOOT_CACHE (default /var/tmp/ingot-boot-cache) once and reused.
# Shared by tests/boot/build-stack.sh (the node's kernel) and tests/rescue/build-rescue.sh (the
# rescue system's). Needs apt-get, dpkg, depmod.
set -euo pipefail

DIR=${1:?usage: fetch-kernel.sh DIR}
CACHE=${INGOT_BOOT_CACHE:-/var/tmp/ingot-boot-cache}
die() { echo "fetch-kernel.sh: $*" >&2; exit 1; }
for tool in apt-cache apt-get dpkg depmod; do
  command -v "$tool" >/dev/null || die "missing $tool"
done

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
mkdir -p "$DIR"
dpkg -x "$DEB" "$DIR"
KVER=$(ls "$DIR/lib/modules" | head -1)
depmod -b "$DIR" "$KVER"          # the .deb ships no modules.dep (its postinst makes it)
echo "$KVER"
