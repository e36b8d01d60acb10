# AMF build and test entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

GO        ?= go
# Debian's python3-sklearn is importable by the system interpreter only.
PYTHON    ?= /usr/bin/python3
BIN       := bin
DATA      ?= ../shared/data/tod-k8s-ood/data
STATICCHECK_VERSION := v0.8.2
LDFLAGS   := -s -w
CMDS      := amf-sidecar amf-agent amf-lab

SOAK_DURATION ?= 10m
SOAK_SEED     ?= 1

.PHONY: help demo build soak test test-short test-unit test-parity test-exporter test-train test-cgroup2 test-v2node bench-v2node model leadtime evaluate k8s containerd bench arm64 test-arm64 images lint deps clean

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/amf-sidecar, bin/amf-agent and bin/amf-lab (static)
	@mkdir -p $(BIN)
	$(foreach c,$(CMDS),CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$(c) ./cmd/$(c);)

demo: build ## the paper's experiment at 1/4 length on a real node (kubelet + containerd): one AMF run, three reactive runs, compared (root; the first time also installs the packages and builds the control plane and node, ≈13 min)
	@if [ "$$(id -u)" = 0 ] && { [ ! -x /usr/sbin/mosquitto ] || ! command -v containerd >/dev/null; }; then $(MAKE) --no-print-directory deps; fi
	@if [ "$$(id -u)" = 0 ]; then echo "demo: the Kubernetes control plane and node are built once per machine (cold ≈13 min on 2 cores; progress below, then cached)"; tools/k8s/build.sh; fi
	bin/amf-lab demo

test: build test-unit test-parity test-exporter test-train ## everything CI runs: unit + real-part tests, PromQL and model parity

# The cgroup v2 guest node (lab/vmnode) runs alone, after the rest: its qemu
# emulates two CPUs on all of this machine's, and the real-node tests beside it
# have time bounds (a failover, a restart after an OOM kill) that it would eat.
test-unit:
	$(GO) test -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/lab/vmnode$$')
	$(GO) test -count=1 -timeout 30m ./lab/vmnode/

test-parity: ## differential test of the features against the real Prometheus engine
	cd infer/promqlparity && $(GO) test -mod=mod -count=1 ./...

test-exporter: ## fresh sklearn models -> LightGBM text -> Go parity within 1e-9 (needs python3-sklearn)
	@dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	$(PYTHON) infer/train/amftrain.py test-exporter --out "$$dir" && \
	AMF_EXPORTER_PARITY_DIR="$$dir" $(GO) test -count=1 -run TestExporterParity ./infer/model/

test-train: ## Python unit tests of infer/train (dataset tests skip when the data is absent)
	$(PYTHON) -m unittest discover -s infer/train

model: ## train the P1 HGBC (seed 42) -> embedded default model + manifest + parity golden
	$(PYTHON) infer/train/amftrain.py model --data $(DATA)
	$(GO) test -count=1 -run 'TestParityP1|TestP1Model' ./infer/model/

leadtime: build ## the lead-time model, the predict-linear detector and the default, from the lab corpus recorded on the real node (lab/corpus/real-node) -> embedded leadtime + predict-linear, explanation golden, infer/train/report/leadtime.{md,json}
	$(PYTHON) infer/train/amftrain.py leadtime
	$(GO) test -count=1 -run 'TestParityEmbedded|TestEmbedded|TestEveryEmbedded|TestExplanations|TestPredictLinear' ./infer/model/
	@# bin/ embedded the models the training replaced: rebuilt, so that amftrain.py check scores the new ones
	$(MAKE) --no-print-directory build

evaluate: ## P0-P2 x HGBC/RF/LR x seeds 42-46 -> infer/train/report/evaluation.{md,json}
	$(PYTHON) infer/train/amftrain.py evaluate --data $(DATA)

test-cgroup2: ## the cgroup and sidecar tests as root on a real cgroup v2-only kernel: a qemu guest (Debian cloud kernel via apt-get download, cached in ~/.cache/amf/cgroup2vm), ≈25 s
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/amf-lab ./cmd/amf-lab
	GO=$(GO) $(BIN)/amf-lab cgroup2vm

test-v2node: containerd ## the product on a node as Kubernetes ships it now: a qemu guest with cgroup v2, systemd, the kubelet at its defaults and containerd 2 (lab/vmnode; root; make k8s first; ≈ 9 min, the base image built once per machine)
	AMF_REQUIRE_K8S=1 AMF_REQUIRE_NODE=1 AMF_REQUIRE_VMNODE=1 $(GO) test -count=1 -v -timeout 30m ./lab/vmnode/

bench-v2node: containerd ## amf-lab bench signal --mode sidecar inside the cgroup v2 guest node (root; make k8s first; ≈ 5 min)
	AMF_VMNODE_BENCH=1 AMF_REQUIRE_K8S=1 AMF_REQUIRE_NODE=1 AMF_REQUIRE_VMNODE=1 $(GO) test -count=1 -v -timeout 30m -run TestSignalBenchInTheGuest ./lab/vmnode/

soak: build ## amf-lab soak: SOAK_DURATION (10m) of SOAK_SEED's (1) random faults on three lab nodes, the history checked; exit 1 on any violation (root; make deps k8s first)
	bin/amf-lab soak --duration $(SOAK_DURATION) --seed $(SOAK_SEED)

test-short: ## quick tests only (no long-running parts)
	$(GO) test -short ./...

bench: ## benchmarks of the hot paths (see README, Performance)
	$(GO) test -run '^$$' -bench . -benchmem ./...

arm64: ## static linux/arm64 binaries in bin/linux-arm64/
	@mkdir -p $(BIN)/linux-arm64
	$(foreach c,$(CMDS),GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux-arm64/$(c) ./cmd/$(c);)

images: ## multi-arch (linux/amd64+arm64) OCI image layout of amf-sidecar and amf-agent FROM scratch -> bin/images (no Docker)
	$(GO) run ./cmd/amf-images --out $(BIN)/images

# Packages that need no control plane, proven on arm64 under qemu-user. Tests that
# re-execute their binary go through AMF_TEST_EXEC_WRAPPER (no binfmt_misc here).
ARM64_TEST_PKGS := contract infer infer/model podsignal detect sidecar cgroup pause sidecar/handover mosquittodb healthcheck agent

# Size budgets of the arm64 binaries (bytes): the sidecar runs in every broker pod.
SIDECAR_ARM64_BUDGET := 15728640
AGENT_ARM64_BUDGET   := 62914560

test-arm64: arm64 ## run tests as linux/arm64 binaries under qemu-aarch64 (Debian qemu-user-static); check size budgets
	@check() { n=$$(stat -c %s $(BIN)/linux-arm64/$$1); echo "$$1 linux/arm64: $$n bytes (budget $$2)"; [ $$n -le $$2 ] || { echo "$$1 is over its size budget"; exit 1; }; }; \
	check amf-sidecar $(SIDECAR_ARM64_BUDGET); check amf-agent $(AGENT_ARM64_BUDGET)
	@mkdir -p $(BIN)/arm64-test
	@set -e; for p in $(ARM64_TEST_PKGS); do \
		t=$(CURDIR)/$(BIN)/arm64-test/$$(echo $$p | tr / _).test; \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) test -c -o $$t ./$$p; \
		echo "qemu-aarch64 $$p"; (cd $$p && AMF_TEST_EXEC_WRAPPER=qemu-aarch64-static qemu-aarch64-static $$t -test.count=1 -test.short); \
	done

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd infer/promqlparity && $(GO) vet -mod=mod ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

k8s: ## build etcd, kube-apiserver/-controller-manager/-scheduler, kubectl, kubelet, kube-proxy, kwok for tests into ~/.cache/amf/k8s/<version>/bin (once per machine and version; cold ~12 min)
	tools/k8s/build.sh

containerd: ## build containerd 2 for the lab's cgroup v2 guest node (lab/vmnode) into ~/.cache/amf/containerd/<version>/<arch>/bin (once per machine; cold ~2 min)
	tools/containerd/build.sh amd64

deps: ## install the Debian packages the tests use (root)
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-sklearn mosquitto mosquitto-clients qemu-user-static \
		containerd runc containernetworking-plugins iptables iproute2 util-linux qemu-system-x86 e2fsprogs mmdebstrap socat

clean:
	rm -rf $(BIN)
