# nodelock: `make demo` runs the main job on a local GPU cluster, `make test` runs every test.
# Both set everything up from nothing: a virtualenv in .venv and the Kubernetes binaries,
# built from their Go modules into ~/.cache/nodelock (reused on later runs).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup bytecode system-deps runtime-deps images test lint go-check unit demo bench device-bundle binaries binaries-oldest proto generate generated-files clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $@

# Every devcluster component is a fresh Python process; compiled bytecode saves each one
# compiling the project's modules again (~0.2 s of CPU per start, hundreds of starts in the
# suite), also where PYTHONDONTWRITEBYTECODE keeps Python from writing it by itself.
PACKAGES := kube lockd handoff scheduler_ext deviceplugin devcluster nodelock proto bench tests
bytecode: setup
	@$(BIN)/python -m compileall -q $(PACKAGES) >/dev/null

# Debian packages some tests run for real: libfaketime (clock-skew e2e test) and prometheus
# (dashboards and alert rules evaluated by a real Prometheus), and what the containerd nodes of
# `devcluster up --runtime containerd` run and build their images with (RUNTIME_PKGS: runc, the
# CNI plugins, kube-proxy's iptables and conntrack, mmdebstrap and buildah).  Installed when
# missing.  containerd itself is Debian trixie's 1.7 (CDI), which `make images` fetches into the
# cache (devcluster/containerd.py) without adding trixie to the machine's apt sources.
RUNTIME_PKGS := runc containernetworking-plugins iptables conntrack mmdebstrap buildah
SYSTEM_PKGS := libfaketime prometheus $(RUNTIME_PKGS)

runtime-deps: PKGS = $(RUNTIME_PKGS)
system-deps: PKGS = $(SYSTEM_PKGS)
system-deps runtime-deps:
	@missing=""; for p in $(PKGS); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages the tests use:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Every Go binary the tests and the demo run on the default release (control plane, kubelet,
# kube-proxy, the simulated-node harness, helm), built from the Go modules it fetches; a complete
# cache builds nothing.
binaries: setup
	$(BIN)/nodelock devcluster build

# The oldest supported Kubernetes release, which the `core` tests run on again (docs/support.md).
# `make test` builds it beside the suite rather than before it: the suite's cluster tests leave
# a core idle most of the time, and a first run's build of a second release is minutes of it.
binaries-oldest: setup
	$(BIN)/nodelock devcluster build --kubernetes-version oldest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy --strict .
	$(BIN)/lint-imports

unit: setup
	$(BIN)/pytest -m unit

# The Go harness (the simulated kubelet in devcluster/gomod) keeps Go's habits: gofmt, go vet, and
# its own tests, with the flags the binaries are built with, so the build cache they left is
# reused.  It depends on `binaries`, the step that fetches the Go modules: on a new machine (empty
# module cache) `go vet` can only type-check the harness once that step has run, in any order
# make picks, also with -j (tests/unit/test_makefile.py keeps it so).
GO_ENV := GOFLAGS=-mod=readonly
go-check: binaries
	@out=$$(cd devcluster/gomod && gofmt -l .); \
	  if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi; \
	  echo "gofmt -l devcluster/gomod: clean"
	cd devcluster/gomod && $(GO_ENV) go vet -trimpath ./...
	cd devcluster/gomod && $(GO_ENV) go test -trimpath -count=1 ./...

# The images the containerd nodes of tests/shipped run (nodelock's from deploy/Containerfile, its
# base, the pod sandbox, kube-scheduler): built with the Debian packages system-deps installs,
# cached by content; it prints each one's build time and size.
images: binaries system-deps
	$(BIN)/nodelock devcluster build --images

# Three pytest runs side by side, each with clusters of its own: the unit tests (pure code: one
# core's work for minutes, the handoff model most of it); the integration, e2e and shipped
# tests on the default Kubernetes release, most of whose time is spent waiting on a cluster;
# and, once the oldest supported release is built (`binaries-oldest`, from a first run's empty
# cache in that run), the tests marked `core` (the handoff's end-to-end core, the kubelet
# behaviours, the chart's install and the shipped slice) on it (docs/support.md).  The cluster
# suite prints its report as it runs, the other two after it; the target fails if any fails.
CORE_OLDEST := -m core --kubernetes-version oldest tests/integration tests/e2e tests/shipped
test: lint go-check binaries system-deps images bytecode
	@oldest=$$(mktemp /tmp/nodelock-core-oldest.XXXXXX); unit=$$(mktemp /tmp/nodelock-unit.XXXXXX); \
	{ $(BIN)/nodelock devcluster build --kubernetes-version oldest && \
	  $(BIN)/pytest -p no:cacheprovider $(CORE_OLDEST); } >"$$oldest" 2>&1 & opid=$$!; \
	$(BIN)/pytest -p no:cacheprovider tests/unit >"$$unit" 2>&1 & upid=$$!; \
	$(BIN)/pytest --ignore=tests/unit; suite=$$?; \
	wait $$upid; units=$$?; wait $$opid; core=$$?; \
	echo "=== pytest tests/unit"; cat "$$unit"; \
	echo "=== nodelock devcluster build --kubernetes-version oldest; pytest $(CORE_OLDEST)"; \
	cat "$$oldest"; rm -f "$$oldest" "$$unit"; \
	echo "=== the cluster suite: exit $$suite; the unit tests: exit $$units; the core tests on the oldest release: exit $$core"; \
	test $$suite -eq 0 && test $$units -eq 0 && test $$core -eq 0

# The demo builds what it runs itself (the default release's control plane and the simulated-node
# harness; kubelet and the fake runtime with --kubelet real): nothing of the oldest release.
demo: setup bytecode
	$(BIN)/nodelock demo

bench: setup binaries bytecode
	$(BIN)/python -m bench

# What the device check needs on a lent GPU machine, which reaches no package index: wheels and
# the cached binaries in .device/ (bench/device_bundle.sh prints the device calls that carry it).
device-bundle: setup binaries
	bash bench/device_bundle.sh

proto: setup
	$(BIN)/python -m proto.generate

# Everything generated and committed: the gRPC stubs, the Grafana dashboards, the chart's alert
# rules and the plain manifests rendered from the chart (with devcluster's copy of its admission
# policies).  tests/integration/test_generated_files.py fails when a committed file differs.
generate: setup
	$(MAKE) --no-print-directory generated-files

generated-files:
	$(BIN)/python -m proto.generate
	$(BIN)/python -m dashboards.build
	$(BIN)/python -m devcluster.helm manifests
	$(BIN)/python -m nodelock.reference
	$(BIN)/python -m tests.support

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The handoff model's deep profile (docs/model.md): 10,000 seeded examples, one summary line.
# MODEL_ARGS passes options, e.g. MODEL_ARGS="--seed 5" or MODEL_ARGS="--hole double-bind".
model: setup
	$(BIN)/python -m tests.model $(MODEL_ARGS)

# The fault campaign (docs/reliability.md): GPU workload churn under seeded faults on a devcluster,
# its whole history checked; results in bench/results/soak.json.  SOAK_ARGS passes options, e.g.
# SOAK_ARGS="--minutes 3 --seed 7" for the short campaign CI runs.
SOAK_ARGS ?= --minutes 30 --seed 7
.PHONY: soak
soak: setup binaries system-deps bytecode
	$(BIN)/python -m bench.soak $(SOAK_ARGS)
