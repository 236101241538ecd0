#!/usr/bin/env bash
# Packs what the device check needs onto a lent GPU machine that can reach nothing
# (docs/performance.md, "On a lent GPU machine"). Run here, from the repository root, after
# `make setup binaries`:
#
#   bash bench/device_bundle.sh        # or: make device-bundle
#
# Writes .device/ (git-ignored):
#   wheels/              the project's runtime dependencies, at the versions in .venv, as
#                        wheels for CPython 3.12 on x86-64 Linux (the lent machine's python3)
#   cache.tar.xz.NN      the cached binaries bench.handoff runs (the v1.37.2 control plane with
#                        kubectl and etcd, the simulated-node harness), as one xz tarball cut in
#                        parts of at most PART_MIB MiB, so that each device call carries less
#                        than its 64 MiB with the working tree
#   SHA256SUMS           every part's and wheel's checksum, which device_check.sh verifies
# and prints the device calls that carry them, in order.
set -euo pipefail
cd "$(dirname "$0")/.."

PART_MIB="${PART_MIB:-54}"
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "device bundle: $PY is missing; run \`make setup binaries\` first" >&2
  exit 2
fi
CACHE="$("$PY" -c 'from devcluster.binaries import cache_root; print(cache_root())')"
mapfile -t ENTRIES < <("$PY" - <<'EOF'
from devcluster.binaries import KUBERNETES_VERSION, cache_root, ensure_control_plane
from devcluster.binaries import ensure_simkubelet

root = cache_root()
ensure_control_plane(build=False)  # raises, naming what is missing, when not built
print((root / "k8s" / KUBERNETES_VERSION).relative_to(root))
print(ensure_simkubelet(build=False).parent.relative_to(root))
EOF
)

rm -rf .device
mkdir -p .device/wheels
"$PY" - > .device/requirements.txt <<'EOF'
import re
from importlib import metadata

for req in metadata.requires("nodelock") or []:
    if "extra ==" not in req:
        name = re.split(r"[<>=!~; \[]", req, maxsplit=1)[0]
        print(f"{name}=={metadata.version(name)}")
EOF
echo "==> wheels for CPython 3.12, x86-64 Linux: $(tr '\n' ' ' < .device/requirements.txt)"
platforms=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 \
         manylinux_2_5 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${platforms[@]}" --platform any \
  --dest .device/wheels --requirement .device/requirements.txt

echo "==> binaries from $CACHE: ${ENTRIES[*]}"
tar -C "$CACHE" -cf - "${ENTRIES[@]}" | xz -6 -T0 \
  | split -b "${PART_MIB}M" -d - .device/cache.tar.xz.
(cd .device && sha256sum cache.tar.xz.* wheels/*.whl > SHA256SUMS)
# the commit the bundle was made at (the lent machine's copy of the tree has no .git)
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
echo "$commit" > .device/COMMIT

parts=(.device/cache.tar.xz.*)
echo
echo "device bundle: $(du -sh .device | cut -f1) in .device/ (${#parts[@]} binary parts," \
     "wheels $(du -sh .device/wheels | cut -f1))"
echo "Carry it in this order, one device call each, the machine still warm between them:"
n=${#parts[@]}
for ((i = 0; i < n; i++)); do
  if ((i < n - 1)); then
    echo "  run carry=[\"${parts[i]}\"] command=\"ls -l ${parts[i]}\""
  else
    echo "  run carry=[\"${parts[i]}\", \".device/wheels\", \".device/SHA256SUMS\"," \
         "\".device/COMMIT\"] command=\"bash bench/device_check.sh\""
  fi
done
