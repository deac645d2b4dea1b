#!/usr/bin/env bash
# ci/bench-provision.sh (ci/bench provision): writing a stack from a registry over a slow link.
#
# A Debian bookworm tree of about 1.3 GiB (mmdebstrap from Debian's archive, cached in
# $BENCH_CACHE, default /var/cache/ingot-bench) becomes a one-layer signed stack, published to a
# local docker-registry and served through ingot-testproxy at each rate in $BENCH_RATES
# (default "40M 117M" bytes/s: CAPH's expected 40 MB/s, and a 1 Gbit/s link). At each rate, onto
# the same loop device, one run each:
#   ingot  ingot-writer oci://PROXY/... --target LOOP: streams the layer from the registry,
#          writes it, reads it back and checks every block, writes the ESP and the table;
#   peer   CAPH's download-from-oci.sh way: curl the (zstd) blob to a file, sha256sum it, then
#          zstd -d | dd oflag=direct conv=fsync onto the disk (no read-back, no ESP).
# Printed: wall times, their ratio to the pure transfer time (the bytes ingot fetches / rate),
# peak RSS (the largest process), bytes of temporary files (polled), and ingot's time per
# pipeline stage. Needs root (a loop device), mmdebstrap, docker-registry, curl, zstd.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
bin=${CARGO_TARGET_DIR:-$root/target}/release
cargo build --release --locked -q -p ingot -p ingot-writer -p ingot-testproxy \
    --manifest-path "$root/Cargo.toml"
CACHE=${BENCH_CACHE:-/var/cache/ingot-bench}
RATES=${BENCH_RATES:-40M 117M}
PACKAGES=linux-image-amd64,build-essential,python3,gdb,git,vim,clang,llvm,perl,locales
[ "$(id -u)" = 0 ] || { echo "ci/bench provision needs root (loop devices)" >&2; exit 1; }

# The tree, once: Debian's packages, plus the demo's boot files (the stack's ESP needs an EFI
# binary; Debian's kernel and initrd stay in the tree as content).
tree=$CACHE/debian-bookworm
if [ ! -d "$tree" ]; then
    mkdir -p "$CACHE"
    rm -rf "$tree.partial"
    mmdebstrap --quiet --variant=apt --include=$PACKAGES bookworm "$tree.partial"
    cp -a "$root/tests/fixtures/demo/base/boot/." "$tree.partial/boot/"
    mv "$tree.partial" "$tree"
fi
# A layer ships nothing under /var (the node mounts its var partition there; ingot build refuses
# it): apt's and dpkg's state stays out of the benchmark's layer, as ingot build's Debian trees do.
find "$tree/var" -mindepth 1 -delete

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-bench-provision.XXXXXX")
reg_pid= proxy_pid= loopdev=
cleanup() {
    [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null
    [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null
    wait 2>/dev/null
    [ -n "$loopdev" ] && losetup -d "$loopdev" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# The signed layout is kept for the next run of the same ingot binary (building it takes
# minutes and is not what this bench measures).
# Keyed by the sources that decide the layout's bytes (the binary itself changes with every
# commit, as its version names the commit).
key=$( (cd "$root" && git rev-parse HEAD:layers HEAD:registry HEAD:artifact HEAD:builder HEAD:verity \
    && git diff HEAD -- layers registry artifact builder verity) 2>/dev/null | sha256sum | cut -c1-16)
built=$CACHE/provision-layout-$key
if [ ! -f "$built/done" ]; then
    rm -rf "$CACHE"/provision-layout-*
    mkdir -p "$built"
    "$bin/ingot" key generate -s "$built/k" -p "$built/k.pub" >/dev/null
    cat >"$built/bench.toml" <<TOML
name = "bench"
version = "1"
source_date_epoch = 1700000000
[boot]
kernel = "/boot/vmlinuz"
initrd = "/boot/initrd.img"
efi = "/boot/efi/EFI/BOOT/BOOTX64.EFI"
[[layer]]
name = "base"
kind = "base"
source = { dir = "$tree" }
TOML
    "$bin/ingot" build "$built/bench.toml" --out "$built/layout" --sign-key "$built/k" --quiet >/dev/null
    touch "$built/done"
fi
cp "$built/k.pub" "$work/k.pub"
ln -s "$built/layout" "$work/layout"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/registry.yml" <<YML
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
YML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
reg_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
"$bin/ingot" publish "$work/layout" "oci://127.0.0.1:$port/bench/stack:1" --quiet >/dev/null

# image size, data blob digest and size, and every byte ingot fetches (manifest and blobs).
read -r image digest blob fetched < <(python3 - "$work/layout" <<'PY'
import json, os, sys
layout = sys.argv[1]
path = lambda d: f"{layout}/blobs/sha256/{d.split(':')[1]}"
index = json.load(open(f"{layout}/index.json"))
m = index["manifests"][0]
manifest = json.load(open(path(m["digest"])))
desc = json.load(open(path(manifest["config"]["digest"])))
size = desc["layers"][0]["size"]
data = manifest["layers"][0]
total = m["size"] + manifest["config"]["size"] + sum(l["size"] for l in manifest["layers"])
print(size, data["digest"], data["size"], total)
PY
)
truncate -s $((image + (1536 << 20))) "$work/disk.img"
loopdev=$(losetup --find --show "$work/disk.img")

# max_du DIR PID: the largest size DIR reached while PID ran (polled every 0.1 s).
max_du() {
    local max=0 n
    while kill -0 "$2" 2>/dev/null; do
        n=$(du -sb "$1" 2>/dev/null | cut -f1)
        ((n > max)) && max=$n
        sleep 0.1
    done
    echo "$max"
}

printf '== provision: Debian bookworm tree, image %d MiB, %d MiB fetched (data blob %d MiB), %d cores, one run each\n' \
    $((image >> 20)) $((fetched >> 20)) $((blob >> 20)) "$(nproc)"
for rate in $RATES; do
    bytes_per_s=$(python3 -c "
u={'':1,'K':10**3,'M':10**6,'G':10**9}; import re,sys
n,s=re.fullmatch(r'(\d+)([KMG]?)','$rate').groups(); print(int(n)*u[s])")
    "$bin/ingot-testproxy" --upstream "127.0.0.1:$port" --rate "$rate" >"$work/proxy.out" &
    proxy_pid=$!
    for _ in $(seq 100); do grep -q listening "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
    host=$(awk '/listening on/{print $3}' "$work/proxy.out")
    transfer=$(python3 -c "print($fetched / $bytes_per_s)")

    # ingot
    mkdir -p "$work/tmp-ingot"
    sync
    rm -f "$work/events.jsonl"
    t0=$EPOCHREALTIME
    t0_ingot=$t0
    TMPDIR=$work/tmp-ingot /usr/bin/time -f '%M' -o "$work/ingot.rss" \
        "$bin/ingot-writer" "oci://$host/bench/stack:1" --target "$loopdev" \
        --trust-key "$work/k.pub" --report "$work/report.json" --events "$work/events.jsonl" \
        >/dev/null 2>"$work/ingot.err" &
    pid=$!
    ingot_tmp=$(max_du "$work/tmp-ingot" $pid)
    wait $pid || { cat "$work/ingot.err" >&2; exit 1; }
    t_ingot=$(python3 -c "print($EPOCHREALTIME - $t0)")

    # peer: curl, sha256sum, zstd -d | dd
    mkdir -p "$work/tmp-peer"
    rm -f "$work/tmp-peer/blob" "$work/peer.rss"
    sync
    t0=$EPOCHREALTIME
    (
        T="/usr/bin/time -f %M -a -o $work/peer.rss"
        $T curl -sSf --retry 5 --retry-connrefused --continue-at - -o "$work/tmp-peer/blob" \
            "http://$host/v2/bench/stack/blobs/$digest"
        python3 -c "print($EPOCHREALTIME - $t0)" >"$work/curl.time"
        echo "${digest#sha256:}  $work/tmp-peer/blob" | $T sha256sum -c --quiet
        $T zstd -dcq "$work/tmp-peer/blob" | $T dd of="$loopdev" bs=4M oflag=direct conv=fsync status=none
    ) &
    pid=$!
    peer_tmp=$(max_du "$work/tmp-peer" $pid)
    wait $pid
    t_peer=$(python3 -c "print($EPOCHREALTIME - $t0)")
    t_curl=$(cat "$work/curl.time")
    kill "$proxy_pid"
    wait "$proxy_pid" 2>/dev/null || true
    proxy_pid=

    python3 - "$rate" "$transfer" "$t_ingot" "$t_peer" "$(cat "$work/ingot.rss")" \
        "$(sort -n "$work/peer.rss" | tail -1)" "$ingot_tmp" "$peer_tmp" "$work/report.json" \
        "$t0_ingot" "$work/events.jsonl" "$t_curl" "$blob" "$bytes_per_s" <<'PY'
import json, sys
rate, transfer, ti, tp = sys.argv[1], *map(float, sys.argv[2:5])
rss_i, rss_p, tmp_i, tmp_p = (int(x) for x in sys.argv[5:9])
print(f"rate {rate}B/s: pure transfer {transfer:6.2f} s")
print(f"  ingot-writer {ti:6.2f} s = {ti/transfer:4.2f}x transfer   peak RSS {rss_i/1024:5.0f} MiB   temp files {tmp_i/2**20:6.1f} MiB")
print(f"  peer         {tp:6.2f} s = {tp/transfer:4.2f}x transfer   peak RSS {rss_p/1024:5.0f} MiB   temp files {tmp_p/2**20:6.1f} MiB")
print(f"  peer / ingot {tp/ti:4.2f}x")
print(f"  the link delivered the peer's blob in {float(sys.argv[12]):6.2f} s (the pure transfer of that blob: {int(sys.argv[13]) / float(sys.argv[14]):6.2f} s)")
d = json.load(open(sys.argv[9])).get("details", {}).get("pipeline-base")
if d:
    print("  ingot pipeline (busy s, stages overlap): " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in d.items()))
t0, starts = float(sys.argv[10]), {}
for line in open(sys.argv[11]):
    e = json.loads(line)
    if e["event"] == "start":
        starts.setdefault(e["stage"], e["time"] - t0)
print("  ingot stages start at (s): " + ", ".join(f"{k} {v:.2f}" for k, v in starts.items()))
PY
done
