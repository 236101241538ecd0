#!/usr/bin/env bash
# The prepared device check (docs/performance.md, "On a lent GPU machine"): on a machine with an
# NVIDIA GPU, what the device plugin's NVML backend sees there, and the handoff benchmark with
# the whole machine's cores. Run from the repository root:
#
#   bash bench/device_check.sh                  # on a GPU machine: NVML, then bench.handoff
#   bash bench/device_check.sh --dry            # anywhere: skips NVML, runs a small bench.handoff
#   bash bench/device_check.sh --dry --bundle   # the same from .device/, as a lent machine does
#
# Writes everything under $OUT (default: a new folder under /tmp) and prints where:
#   machine.txt         cores, memory, nvidia-smi's view (when there is one)
#   nvml-inventory.txt  python -m deviceplugin.print_inventory: GPUs, memory, NUMA, link matrix
#   nvml-check.txt      python -m deviceplugin.nvml --watch 5: inventory, device nodes, health
#   handoff.json        bench.handoff's results (also under results/, named by scenario)
#   handoff.txt         its printed table
# Exits non-zero when a step fails (after running the others); the summary says which.
#
# It downloads nothing. It runs from .venv and the binaries `make setup binaries` leaves in
# ${NODELOCK_CACHE:-~/.cache/nodelock}; where there is no .venv (a lent machine, which reaches
# no package index) it sets itself up from .device/, which `bash bench/device_bundle.sh` packs
# here: the wheels go into a new folder on PYTHONPATH for $PYTHON (default python3, which must
# be CPython 3.12 like the wheels) and the binaries into $NODELOCK_CACHE (default
# /tmp/nodelock-cache). --bundle does that even where .venv exists.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
BUNDLE=0
for arg in "$@"; do
  case "$arg" in
    --dry) DRY=1 ;;
    --bundle) BUNDLE=1 ;;
    *) echo "usage: bash bench/device_check.sh [--dry] [--bundle]" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$(mktemp -d /tmp/nodelock-device-check.XXXXXX)}"
mkdir -p "$OUT"
# what $OUT does not need (a lent machine sends back at most 8 files): checks' errors, the
# benchmark's own results folder
WORK="$(mktemp -d /tmp/nodelock-device-work.XXXXXX)"
PY=.venv/bin/python
failed=()

# Set up from .device/ (bench/device_bundle.sh): check every part arrived, install the wheels
# into a new folder, unpack the binaries into the cache.
from_bundle() {
  local python="${PYTHON:-python3}"
  if [ ! -d .device ]; then
    echo "device check: no .venv and no .device/ bundle here; run \`make setup binaries\`, or" \
         "\`bash bench/device_bundle.sh\` where the package index and the binaries are and carry" \
         ".device/ here (docs/performance.md)" >&2
    return 2
  fi
  if [ ! -f .device/SHA256SUMS ]; then
    echo "device check: the bundle in .device/ is incomplete: .device/SHA256SUMS, carried with" \
         "the last part and the wheels, is not here (found: $(ls .device | tr '\n' ' '))" >&2
    return 2
  fi
  if ! (cd .device && sha256sum --check --quiet SHA256SUMS) >"$WORK/bundle.err" 2>&1; then
    echo "device check: the bundle in .device/ is incomplete (a part not carried yet, or the" \
         "machine given back between the calls that carried them):" >&2
    cat "$WORK/bundle.err" >&2
    return 2
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "device check: the bundle's wheels are for CPython 3.12; $python is" \
         "$("$python" -V 2>&1) (set PYTHON)" >&2
    return 2
  fi
  local site
  site="$(mktemp -d /tmp/nodelock-site.XXXXXX)"
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --root-user-action=ignore \
    --disable-pip-version-check --target "$site" \
    .device/wheels/*.whl || return 2
  export NODELOCK_CACHE="${NODELOCK_CACHE:-/tmp/nodelock-cache}"
  mkdir -p "$NODELOCK_CACHE"
  cat .device/cache.tar.xz.* | "$python" -c 'import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1], filter="tar")' \
    "$NODELOCK_CACHE" || return 2
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  PY="$python"
  "$PY" -m compileall -q kube lockd handoff scheduler_ext deviceplugin devcluster nodelock proto \
    bench >/dev/null
  echo "set up from .device/: $("$PY" -V), packages in $site, binaries in $NODELOCK_CACHE"
}

step() {  # step NAME FILE COMMAND...: run COMMAND, its output to FILE and the terminal
  local name=$1 file=$2; shift 2
  echo "==> $name: $*"
  if "$@" 2>&1 | tee "$OUT/$file"; then echo "    ok"; else echo "    FAILED"; failed+=("$name"); fi
}

if [ "$BUNDLE" = 1 ] || [ ! -x "$PY" ]; then
  from_bundle || exit 2
fi
if ! "$PY" -c 'from devcluster.binaries import ensure_control_plane, ensure_simkubelet
ensure_control_plane(build=False); ensure_simkubelet(build=False)' 2>"$WORK/binaries.err"; then
  echo "device check: the Kubernetes binaries are not built here:" >&2
  cat "$WORK/binaries.err" >&2
  echo "run \`make binaries\` on a machine with the Go module proxy, with NODELOCK_CACHE" \
       "pointing where this machine can read it" >&2
  exit 2
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores: $(nproc)"
  grep -E '^(MemTotal)' /proc/meminfo
  commit="$(git rev-parse --short HEAD 2>/dev/null || cat .device/COMMIT 2>/dev/null)"
  echo "commit: ${commit:-unknown}"
  if command -v nvidia-smi >/dev/null; then nvidia-smi -L; else echo "nvidia-smi: not found"; fi
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ "$DRY" = 1 ]; then
  echo "==> NVML: skipped (--dry)"
  pods=16 nodes=4 gpus=4 rounds=1
else
  step "NVML inventory" nvml-inventory.txt "$PY" -m deviceplugin.print_inventory
  step "NVML check" nvml-check.txt "$PY" -m deviceplugin.nvml --watch 5
  pods=64 nodes=8 gpus=8 rounds=3
fi

# nodelock against the stock GPU path and the default binder, as docs/performance.md reports
# them: the results JSON has the headline figures (nodelock_vs_stock, own_cpu_ms_per_pod,
# apiserver_extra_cpu_ms_per_pod) and the API server's cost per request kind
step "bench.handoff" handoff.txt "$PY" -m bench.handoff --pods "$pods" --nodes "$nodes" \
  --gpus "$gpus" --rounds "$rounds" --phases nodelock,stock-gpu,default-binder \
  --results-dir "$WORK/results"
# the one results file this run wrote (bench.handoff names it by scenario)
for f in "$WORK"/results/handoff*.json; do [ -e "$f" ] && cp "$f" "$OUT/handoff.json"; done

echo
echo "device check results: $OUT"
ls -1 "$OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
echo "all steps passed"
