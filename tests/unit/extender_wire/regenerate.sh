#!/usr/bin/env bash
# Regenerate the extender protocol fixtures from the real Go types (k8s.io/kube-scheduler
# extender/v1 and k8s.io/api core/v1 at devcluster's Kubernetes version), offline, from the Go
# module cache that devcluster's build fills.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/gen/main.go" "$work/"
sed 's#^module .*#module nodelock.dev/extenderwire#' "$root/devcluster/gomod/go.mod" >"$work/go.mod"
cp "$root/devcluster/gomod/go.sum" "$work/"
cd "$work"
GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local go run . "$here"
echo "wrote fixtures to $here"
