#!/usr/bin/env bash
# ci/bench-fleet.sh (ci/bench fleet): many writers at once, through a pull-through cache or
# straight to the origin, over one bandwidth-limited link.
#
# A signed stack (the demo's base tree plus $BENCH_FLEET_MIB MiB of random data, default 128) is
# published to a local docker-registry, the origin, which the world reaches only through
# ingot-testproxy --rate $BENCH_FLEET_RATE (default 40M bytes/s: the site's uplink, one link
# shared by every connection). A second docker-registry with proxy.remoteurl pointing at the
# link is the site's pull-through cache; writers reach it without a limit (the site's LAN). For
# each N in $BENCH_FLEET_COUNTS (default "1 5 10"), N ingot-writers start at once, each onto its
# own disk image file (--target FILE, never a device), three ways:
#   direct  every writer fetches from the origin over the link;
#   cold    through a fresh, empty cache (a registries.conf mirror): the cache fetches from the
#           origin while it serves (distribution 2.8 fetches a cold blob once per client that asks
#           during the fetch, and once more);
#   warm    through the same cache again, now holding every blob.
# Printed per run: wall time (the slowest writer), the bytes the origin sent (the sum of its
# access log's response sizes), that against one stack's bytes, and the ratios direct / cache.
# Every writer must succeed, and every disk's layer partition must match the first's.
# Needs docker-registry, python3, sfdisk.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
# BENCH_BIN: a directory holding ingot, ingot-writer and ingot-testproxy already built (else a
# release build).
if [ -n "${BENCH_BIN:-}" ]; then
    bin=$BENCH_BIN
else
    bin=${CARGO_TARGET_DIR:-$root/target}/release
    cargo build --release --locked -q -p ingot -p ingot-writer -p ingot-testproxy \
        --manifest-path "$root/Cargo.toml"
fi
MIB=${BENCH_FLEET_MIB:-128}
RATE=${BENCH_FLEET_RATE:-40M}
COUNTS=${BENCH_FLEET_COUNTS:-1 5 10}
for tool in docker-registry python3 sfdisk; do
    command -v "$tool" >/dev/null || { echo "bench-fleet: $tool is not installed" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/var/tmp}/ingot-bench-fleet.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The stack, signed.
mkdir -p "$work/tree"
cp -a "$root/tests/fixtures/demo/base/." "$work/tree/"
head -c "$((MIB << 20))" /dev/urandom >"$work/tree/usr/random.bin"
cat >"$work/fleet.toml" <<TOML
name = "fleet"
version = "1"
source_date_epoch = 1700000000
[boot]
kernel = "/boot/vmlinuz"
initrd = "/boot/initrd.img"
efi = "/boot/efi/EFI/BOOT/BOOTX64.EFI"
[[layer]]
name = "base"
kind = "base"
source = { dir = "$work/tree" }
TOML
"$bin/ingot" key generate -s "$work/k" -p "$work/k.pub" >/dev/null
"$bin/ingot" build "$work/fleet.toml" --out "$work/layout" --sign-key "$work/k" --quiet >/dev/null
rm -rf "$work/tree"
read -r stack_bytes image < <(python3 - "$work/layout" <<'PY'
import json, sys
layout = sys.argv[1]
path = lambda d: f"{layout}/blobs/sha256/{d.split(':')[1]}"
m = json.load(open(f"{layout}/index.json"))["manifests"][0]
manifest = json.load(open(path(m["digest"])))
desc = json.load(open(path(manifest["config"]["digest"])))
total = m["size"] + manifest["config"]["size"] + sum(l["size"] for l in manifest["layers"])
print(total, sum(l["size"] for l in desc["layers"]))
PY
)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }

# registry DIR PORT [EXTRA]: a docker-registry storing into DIR, its access log in DIR/log.
registry() {
    mkdir -p "$1/data"
    cat >"$1/config.yml" <<YML
version: 0.1
log:
  level: error
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $1/data
http:
  addr: 127.0.0.1:$2
${3:-}
YML
    docker-registry serve "$1/config.yml" >"$1/log" 2>&1 &
    pids+=($!)
    wait_port "$2"
}

origin_port=$(free_port)
registry "$work/origin" "$origin_port"
"$bin/ingot" publish "$work/layout" "oci://127.0.0.1:$origin_port/bench/fleet:1" --quiet >/dev/null 2>&1
"$bin/ingot-testproxy" --upstream "127.0.0.1:$origin_port" --rate "$RATE" >"$work/link.out" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$work/link.out" 2>/dev/null && break; sleep 0.05; done
link=$(awk '/listening on/{print $3}' "$work/link.out")
url="oci://$link/bench/fleet:1"

# origin_bytes: the response bytes in the origin's access log so far (combined log format: the
# size follows the status).
origin_bytes() {
    python3 - "$work/origin/log" <<'PY'
import re, sys
n = 0
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r'" \d{3} (\d+) "', line)
    if m:
        n += int(m.group(1))
print(n)
PY
}

# conf FILE [MIRROR]: a registries.conf for the link's host, through MIRROR when given.
conf() {
    printf '[[registry]]\nprefix = "%s"\nlocation = "%s"\n' "$link" "$link" >"$1"
    # A 127.0.0.1 mirror is plain HTTP by default (`insecure = true` would mean TLS unverified).
    [ -n "${2:-}" ] && printf '\n[[registry.mirror]]\nlocation = "%s"\n' "$2" >>"$1"
    return 0
}
conf "$work/direct.conf"

# fleet N CONF MIRROR: N writers at once onto fresh disk files; prints the wall time. Every
# writer must succeed, fetch its blobs from the mirror (MIRROR=1) or the origin (0) as asked,
# and write the same layer partitions as the first disk of the bench.
fleet() {
    local n=$1 cf=$2 mirror=$3 t0 t1 i
    local -a ws=()
    for ((i = 0; i < n; i++)); do
        rm -f "$work/disk$i.img"
        truncate -s $((image + (1024 << 20))) "$work/disk$i.img"
    done
    sync
    t0=$EPOCHREALTIME
    for ((i = 0; i < n; i++)); do
        "$bin/ingot-writer" "$url" --target "$work/disk$i.img" --trust-key "$work/k.pub" \
            --registries-conf "$cf" --report "$work/report$i.json" >/dev/null 2>"$work/writer$i.err" &
        ws+=($!)
    done
    for ((i = 0; i < n; i++)); do
        wait "${ws[$i]}" || { echo "writer $i of $n failed:" >&2; cat "$work/writer$i.err" >&2; exit 1; }
    done
    t1=$EPOCHREALTIME
    for ((i = 0; i < n; i++)); do
        python3 - "$work/disk$i.img" "$work/first.sha" "$work/report$i.json" "$mirror" <<'PY' || exit 1
import hashlib, json, os, subprocess, sys
img, first, report, mirror = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
sources = json.load(open(report))["details"]["sources"]
if not all(s["mirror"] == mirror for s in sources if s["blobs"]):
    sys.exit(f"{report}: blobs not (only) from the {'mirror' if mirror else 'origin'}: {sources}")
t = json.loads(subprocess.run(["sfdisk", "--json", img], capture_output=True, check=True).stdout)
sector = t["partitiontable"].get("sectorsize", 512)
h = hashlib.sha256()
with open(img, "rb") as f:
    for p in t["partitiontable"]["partitions"]:
        if p.get("name", "").startswith("ingot-"):
            f.seek(p["start"] * sector)
            left = p["size"] * sector
            while left:
                b = f.read(min(left, 8 << 20)); h.update(b); left -= len(b)
d = h.hexdigest()
if not os.path.exists(first):
    open(first, "w").write(d)
elif open(first).read() != d:
    sys.exit(f"{img}: the layer partitions differ from the first disk's")
PY
        rm -f "$work/disk$i.img"
    done
    python3 -c "print(f'{$t1 - $t0:.2f}')"
}

printf '== fleet: a %d MiB image, %d MiB fetched per writer, origin behind ingot-testproxy --rate %s, %d cores, load %s, one run each\n' \
    $((image >> 20)) $((stack_bytes >> 20)) "$RATE" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-3s %-7s %9s %14s %14s\n' N way wall origin-bytes "x one stack"
results=()
for n in $COUNTS; do
    for way in direct cold warm; do
        mirror=1
        case $way in
            direct) cf=$work/direct.conf mirror=0 ;;
            cold)
                cache_port=$(free_port)
                rm -rf "$work/cache"
                registry "$work/cache" "$cache_port" "proxy:
  remoteurl: http://$link"
                conf "$work/cache.conf" "127.0.0.1:$cache_port"
                cf=$work/cache.conf
                ;;
            warm) cf=$work/cache.conf ;;
        esac
        before=$(origin_bytes)
        wall=$(fleet "$n" "$cf" "$mirror")
        sent=$(($(origin_bytes) - before))
        printf '%-3s %-7s %8.2fs %14d %13.2fx\n' "$n" "$way" "$wall" "$sent" \
            "$(python3 -c "print($sent / $stack_bytes)")"
        results+=("$n $way $wall $sent")
        if [ "$way" = warm ]; then
            kill "${pids[-1]}" 2>/dev/null || true
            wait "${pids[-1]}" 2>/dev/null || true
            unset 'pids[-1]'
        fi
    done
done
python3 - "${results[@]}" <<'PY'
import sys
r = {}
for line in sys.argv[1:]:
    n, way, wall, sent = line.split()
    r[(int(n), way)] = (float(wall), int(sent))
print("ratios (direct / through the cache; origin bytes: the cache's share of direct's):")
for n in sorted({k[0] for k in r}):
    d = r[(n, "direct")]
    for way in ("cold", "warm"):
        c = r[(n, way)]
        print(f"  N={n:<2} {way}: wall {d[0] / c[0]:5.2f}x   origin bytes {100 * c[1] / d[1]:7.3f}% of direct")
PY
