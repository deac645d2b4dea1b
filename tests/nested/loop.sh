#!/usr/bin/env bash
# Boots a nested KVM guest again and again inside a TCG guest, as the Debian node test's control
# plane does once a run (writer/tests/debian_node.rs), and counts the boots that froze:
#
#   tests/nested/loop.sh [--boots N] [--guests G] [--l1-arg ARG]... [--silence SECONDS]
#
# L1: Debian's kernel (tests/boot/fetch-kernel.sh) under `qemu-system-x86_64 -accel tcg -cpu max
# -smp 1` (TCG offers AMD SVM), with kvm_amd and the host's QEMU in a busybox initramfs. L2: the
# same kernel under `-accel kvm -cpu host`, a busybox init that prints a marker and powers off,
# each boot bounded inside L1 (300 s, then KILL). G such L1 guests run side by side (default 2,
# one per core). An L1 whose console prints nothing for SECONDS (default 300) has frozen whole (no
# bound inside it can fire) and is stopped. Prints each L1's boots and freezes, then the sums.
# Exit 0 when no boot froze or failed.
#
# Found with it (QEMU 7.2, Debian 12, on an AMD EPYC host): without `--l1-arg idle=poll` one L1
# froze at its 20th nested boot, its vCPU halted for ever (the vCPU thread in
# qemu_wait_io_event, 0% CPU); with it, 60 of 60 boots ran. Runs as any user; needs qemu-system-x86,
# busybox-static, kmod, apt-get (fetch-kernel.sh).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
boots=20 guests=2 silence=300 l1_args=()
while (($#)); do
  case $1 in
    --boots) boots=$2; shift 2 ;;
    --guests) guests=$2; shift 2 ;;
    --silence) silence=$2; shift 2 ;;
    --l1-arg) l1_args+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--boots N] [--guests G] [--l1-arg ARG]... [--silence SECONDS]" >&2; exit 2 ;;
  esac
done
die() { echo "loop.sh: $*" >&2; exit 1; }
for t in qemu-system-x86_64 busybox modprobe ldd gzip; do
  PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null || die "missing $t"
done

W=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-nested.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
KVER=$("$HERE/../boot/fetch-kernel.sh" "$W/kpkg")
I=$W/initrd
mkdir -p "$I"/{usr/bin,bin,dev,proc,sys,tmp,usr/share/qemu}
cp /bin/busybox "$I/bin/busybox"
for a in $("$I/bin/busybox" --list); do [ -e "$I/bin/$a" ] || ln -s busybox "$I/bin/$a"; done
# QEMU finds its firmware relative to its own path: it must be /usr/bin/qemu-system-x86_64.
cp -L /usr/bin/qemu-system-x86_64 "$I/usr/bin/"
for lib in $(ldd /usr/bin/qemu-system-x86_64 | grep -o '/[^ ]*'); do
  mkdir -p "$I$(dirname "$lib")"; cp -L "$lib" "$I$lib"
done
cp -aL /usr/share/qemu/. /usr/share/seabios/. "$I/usr/share/qemu/" 2>/dev/null || true
modprobe -d "$W/kpkg" -S "$KVER" --show-depends kvm_amd | awk '$1=="insmod"{print $2}' >"$W/mods"
while read -r ko; do
  rel=${ko#"$W/kpkg"}; mkdir -p "$I$(dirname "$rel")"; cp "$ko" "$I$rel"; echo "$rel" >>"$I/modlist"
done <"$W/mods"
cp "$W/kpkg/boot/vmlinuz-$KVER" "$I/vmlinuz"
L=$W/l2; mkdir -p "$L/bin"; cp /bin/busybox "$L/bin/"
printf '#!/bin/busybox sh\n/bin/busybox echo "ingot-l2 alive"\n/bin/busybox poweroff -f\n' >"$L/init"
chmod 755 "$L/init"
(cd "$L" && find . | busybox cpio -o -H newc --quiet) >"$I/l2.initrd"
cat >"$I/init" <<'INIT'
#!/bin/busybox sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modlist); do insmod "$m"; done
n=$(sed -n 's/.*nested.boots=\([0-9]*\).*/\1/p' /proc/cmdline)
i=0
while [ "$i" -lt "$n" ]; do
  i=$((i + 1)); t0=$(cut -d. -f1 /proc/uptime)
  timeout -s KILL 300 /usr/bin/qemu-system-x86_64 -accel kvm -cpu host -m 256 -nodefaults \
    -display none -serial stdio -no-reboot -kernel /vmlinuz -initrd /l2.initrd \
    -append 'console=ttyS0 panic=-1 quiet' </dev/null >/tmp/out 2>&1
  rc=$?
  echo "NESTED-BOOT $i rc=$rc secs=$(($(cut -d. -f1 /proc/uptime) - t0)) marker=$(grep -ac 'ingot-l2 alive' /tmp/out)"
done
echo NESTED-DONE
poweroff -f
INIT
chmod 755 "$I/init"
(cd "$I" && find . | busybox cpio -o -H newc --quiet | gzip -1) >"$W/initrd.gz"

run_l1() {
  local log=$W/l1-$1.log
  qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp 1 -m 2048 -display none -monitor none \
    -nodefaults -no-reboot -serial "file:$log" -kernel "$I/vmlinuz" -initrd "$W/initrd.gz" \
    -append "console=ttyS0 panic=-1 no_timer_check nested.boots=$boots ${l1_args[*]}" &
  local pid=$! size=-1 quiet=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    local now; now=$(stat -c %s "$log" 2>/dev/null || echo 0)
    if [ "$now" = "$size" ]; then quiet=$((quiet + 5)); else size=$now quiet=0; fi
    if [ "$quiet" -ge "$silence" ]; then
      kill "$pid"; echo "FROZEN" >>"$log"
    fi
  done
  local ok; ok=$(tr -d '\r' <"$log" | grep -c 'NESTED-BOOT .* rc=0 .* marker=1' || true)
  local frozen; frozen=$(grep -c FROZEN "$log" || true)
  echo "L1 $1: $ok of $boots nested boots ran, frozen=$frozen"
  tr -d '\r' <"$log" | grep NESTED-BOOT | grep -v 'rc=0 .* marker=1' | sed "s/^/L1 $1: /" || true
}
for g in $(seq "$guests"); do run_l1 "$g" >"$W/result-$g" & done
wait
cat "$W"/result-*
total=$(cat "$W"/result-* | awk '/nested boots ran/ {s += $3} END {print s}')
echo "in all: $total of $((boots * guests)) nested boots ran (L1 arguments: ${l1_args[*]:-none})"
[ "$total" = $((boots * guests)) ]
