#!/usr/bin/env bash
# Layer build speed: `ingot layer build --verity` against `mkfs.ext4 -d` + `veritysetup format`
# on a tree of ~20,000 files totalling ~1 GiB. Prints both times and the ratio (mkfs / ingot).
# Usage: ci/bench-ext4.sh [path/to/ingot]   (default: target/release/ingot, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
INGOT=${1:-${CARGO_TARGET_DIR:-target}/release/ingot}
[ -x "$INGOT" ] || cargo build --release --locked -p ingot
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-ext4.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# 20,000 files in 200 directories; sizes cycle 4 KiB..100 KiB (mean ~52 KiB, ~1 GiB total).
python3 - "$WORK/src" <<'PY'
import os, sys
root = sys.argv[1]
block = os.urandom(1 << 20)
for d in range(200):
    p = os.path.join(root, "d%03d" % d)
    os.makedirs(p)
    for f in range(100):
        i = d * 100 + f
        n = 4096 * (1 + (i * 7919) % 25)
        off = (i * 4099) % ((1 << 20) - n)
        with open(os.path.join(p, "f%05d" % i), "wb") as fh:
            fh.write(block[off:off + n])
PY
BYTES=$(du -sb "$WORK/src" | cut -f1)
# mkfs.ext4 needs a size: the data plus a quarter for metadata and slack.
SIZE=$(( (BYTES + BYTES / 4) / 1024 ))k
echo "tree: $(find "$WORK/src" -type f | wc -l) files, $BYTES bytes; mkfs size $SIZE"
sync

ING="$INGOT layer build $WORK/src $WORK/out.img --verity $WORK/out.hash --seed bench"
MKFS="mkfs.ext4 -q -F -d $WORK/src -b 4096 -O ^has_journal $WORK/out2.img $SIZE && veritysetup format $WORK/out2.img $WORK/out2.hash >/dev/null"
PREP="rm -f $WORK/out.img $WORK/out.hash $WORK/out2.img $WORK/out2.hash"

if command -v hyperfine >/dev/null; then
  hyperfine --runs 3 --warmup 1 --prepare "$PREP" --export-json "$WORK/h.json" \
    -n ingot "$ING" -n mkfs+veritysetup "$MKFS"
  read -r T1 T2 < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print(r[0]["mean"], r[1]["mean"])' "$WORK/h.json")
else
  avg() { local t=0 s e; for _ in 1 2 3; do eval "$PREP"; s=$(date +%s.%N); eval "$1" >/dev/null; e=$(date +%s.%N); t=$(echo "$t + $e - $s" | bc -l); done; echo "$t / 3" | bc -l; }
  T1=$(avg "$ING"); T2=$(avg "$MKFS")
fi
printf 'ingot layer build --verity:          %.3f s\n' "$T1"
printf 'mkfs.ext4 -d + veritysetup format:   %.3f s\n' "$T2"
printf 'ratio (mkfs+veritysetup / ingot):    %.2fx\n' "$(echo "$T2 / $T1" | bc -l)"
