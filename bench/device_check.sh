#!/usr/bin/env bash
# The prepared device check (docs/performance.md, "The device check"): on a machine with an
# NVIDIA GPU, what the device plugin's NVML backend sees there, and the handoff benchmark with
# the whole machine's cores. Run from the repository root:
#
#   bash bench/device_check.sh          # on a GPU machine: NVML, then bench.handoff
#   bash bench/device_check.sh --dry    # anywhere: skips NVML, runs a small bench.handoff
#
# Writes everything under $OUT (default: a new folder under /tmp) and prints where:
#   machine.txt         cores, memory, nvidia-smi's view (when there is one)
#   nvml-inventory.txt  python -m deviceplugin.print_inventory: GPUs, memory, NUMA, link matrix
#   nvml-check.txt      python -m deviceplugin.nvml --watch 5: inventory, device nodes, health
#   handoff.json        bench.handoff's results (also under results/, named by scenario)
#   handoff.txt         its printed table
# Exits non-zero when a step fails (after running the others); the summary says which.
#
# It needs what `make setup binaries` leaves: .venv and the Kubernetes binaries in
# ${NODELOCK_CACHE:-~/.cache/nodelock}. On a machine with no network those must already be
# there (the check downloads nothing), and it says so and stops if they are not.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
case "${1:-}" in
  --dry) DRY=1 ;;
  "") ;;
  *) echo "usage: bash bench/device_check.sh [--dry]" >&2; exit 2 ;;
esac
OUT="${OUT:-$(mktemp -d /tmp/nodelock-device-check.XXXXXX)}"
mkdir -p "$OUT"
PY=.venv/bin/python
failed=()

step() {  # step NAME FILE COMMAND...: run COMMAND, its output to FILE and the terminal
  local name=$1 file=$2; shift 2
  echo "==> $name: $*"
  if "$@" 2>&1 | tee "$OUT/$file"; then echo "    ok"; else echo "    FAILED"; failed+=("$name"); fi
}

if [ ! -x "$PY" ]; then
  echo "device check: $PY is missing; run \`make setup binaries\` first (it needs PyPI and the" \
       "Go module proxy; the check itself downloads nothing)" >&2
  exit 2
fi
if ! "$PY" -c 'from devcluster.binaries import ensure_control_plane, ensure_simkubelet
ensure_control_plane(build=False); ensure_simkubelet(build=False)' 2>"$OUT/binaries.err"; then
  echo "device check: the Kubernetes binaries are not built here:" >&2
  cat "$OUT/binaries.err" >&2
  echo "run \`make binaries\` on a machine with the Go module proxy, with NODELOCK_CACHE" \
       "pointing where this machine can read it" >&2
  exit 2
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cores: $(nproc)"
  grep -E '^(MemTotal)' /proc/meminfo
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
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
  --results-dir "$OUT/results"
# the one results file this run wrote (bench.handoff names it by scenario)
for f in "$OUT"/results/handoff*.json; do [ -e "$f" ] && cp "$f" "$OUT/handoff.json"; done

echo
echo "device check results: $OUT"
ls -1 "$OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
echo "all steps passed"
