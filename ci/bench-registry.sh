#!/usr/bin/env bash
# ci/bench-registry.sh — publish and pull a stack of about 1 GiB (BENCH_REGISTRY_MIB) to a local
# Debian docker-registry with ingot, beside skopeo copying the same OCI layout to and from the
# same registry, in one run; prints the times and the ratios (skopeo time / ingot time: > 1 means
# ingot is faster). Needs docker-registry and skopeo (apt-get install docker-registry skopeo).
set -euo pipefail

mib=${BENCH_REGISTRY_MIB:-1024}
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in docker-registry skopeo python3; do
    command -v "$tool" >/dev/null || { echo "bench-registry: $tool is not installed" >&2; exit 1; }
done
cargo build --release --quiet -p ingot --manifest-path "$root/Cargo.toml"
ingot=${CARGO_TARGET_DIR:-$root/target}/release/ingot

work=$(mktemp -d "${TMPDIR:-/tmp}/ingot-bench-registry.XXXXXX")
reg_pid=
cleanup() { [[ -n $reg_pid ]] && kill "$reg_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# A stack: the demo's layers plus one layer holding $mib MiB of random (incompressible) bytes.
mkdir -p "$work/bulk/opt"
head -c "$((mib << 20))" /dev/urandom >"$work/bulk/opt/bulk.bin"
sed "s|\.\./tests/fixtures|$root/tests/fixtures|g" "$root/manifests/demo.toml" >"$work/bench.toml"
printf '\n[[layer]]\nname = "bulk"\nkind = "bulk"\nwhen = "virt"\nsource = { dir = "%s" }\n' \
    "$work/bulk" >>"$work/bench.toml"
"$ingot" build "$work/bench.toml" --out "$work/layout" --quiet --revision bench
rm -rf "$work/bulk"
bytes=$(du -sb "$work/layout/blobs" | cut -f1)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$work/registry"
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
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
host=127.0.0.1:$port

now() { echo "$EPOCHREALTIME"; }
elapsed() { python3 -c "print(f'{$2 - $1:.2f}')"; }
timed() { local t0 t1; t0=$(now); "$@" >/dev/null 2>"$work/last.err" || { cat "$work/last.err" >&2; exit 1; }; t1=$(now); elapsed "$t0" "$t1"; }

# Each tool pushes into its own repository (so neither finds the other's blobs there).
sync
t_ingot_push=$(timed "$ingot" publish "$work/layout" "oci://$host/bench/ingot:1.0.0" --quiet)
t_skopeo_push=$(timed skopeo copy --dest-tls-verify=false "oci:$work/layout:1.0.0" "docker://$host/bench/skopeo:1.0.0")
t_ingot_pull=$(timed "$ingot" pull "oci://$host/bench/ingot:1.0.0" "$work/ingot-pull" --quiet)
t_skopeo_pull=$(timed skopeo copy --src-tls-verify=false "docker://$host/bench/ingot:1.0.0" "oci:$work/skopeo-pull:1.0.0")
RUST_LOG=error "$ingot" verify "$work/ingot-pull" --allow-unsigned >/dev/null

python3 - "$bytes" "$t_ingot_push" "$t_skopeo_push" "$t_ingot_pull" "$t_skopeo_pull" <<'PY'
import sys
b = int(sys.argv[1]); ip, sp, il, sl = map(float, sys.argv[2:])
mib = b / (1 << 20)
print(f"registry bench: {mib:.0f} MiB of blobs, local docker-registry")
print(f"  push  ingot publish {ip:6.2f} s ({mib/ip:6.0f} MiB/s)   skopeo copy {sp:6.2f} s ({mib/sp:6.0f} MiB/s)   ratio skopeo/ingot {sp/ip:.2f}")
print(f"  pull  ingot pull    {il:6.2f} s ({mib/il:6.0f} MiB/s)   skopeo copy {sl:6.2f} s ({mib/sl:6.0f} MiB/s)   ratio skopeo/ingot {sl/il:.2f}")
PY
