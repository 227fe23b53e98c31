# Plinth: `make run` boots a node in QEMU, `make test` runs everything CI runs.
# Every target that needs host tools depends on `deps`, which installs what is
# missing, so a fresh Debian machine needs nothing done by hand.

SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c
OUT     ?= out
BOARD   ?= qemu-x86_64
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# The release number the images are signed as: nodes refuse an update to
# an older release. The commit count grows with every commit; image-next
# is RELEASE+1 (the newer release the update tests install).
RELEASE ?= $(shell git rev-list --count HEAD 2>/dev/null || echo 1)
NEXT_RELEASE = $(shell echo $$(( $(RELEASE) + 1 )))
IMAGE   := $(OUT)/image/$(BOARD)
RELEASE_KEY := $(OUT)/release.key
CACHE   := $(OUT)/cache
BIN     := $(OUT)/bin
GO_SRC  := $(shell find . -name '*.go' -not -path './$(OUT)/*' 2>/dev/null) go.mod go.sum
GO_MOD  := go.mod go.sum

# Everything the tests need to find, whatever package directory they run in.
export PLINTH_IMAGE          := $(abspath $(IMAGE))
export PLINTH_INIT           := $(abspath $(BIN)/init)
export PLINTH_KERNEL_PACKAGE_DIR := $(abspath $(CACHE))
export PLINTH_VMTEST_DIR     := $(abspath $(OUT)/vmtest)
export PLINTH_KUBECTL        := $(abspath $(BIN)/kubectl)
export PLINTH_KUBE           := $(abspath $(BIN)/kube)
export PLINTH_TESTPOD        := $(abspath $(BIN)/testpod)
export PLINTH_PLINTHCTL      := $(abspath $(BIN)/plinthctl)
export PLINTH_RELEASE_KEY    := $(abspath $(RELEASE_KEY))

.PHONY: all help deps tools kube-bins image image-generic image-next run test unit race fuzz vmtest repro bench generate cli-docs lint clean e2e image-conformance conformance

all: image

help:
	@echo "make run       build the default image if needed and boot a node in QEMU with swtpm"
	@echo "make test      everything CI runs: unit, race and fuzz tests, reproducibility, VM tests"
	@echo "make image     build the image for BOARD=$(BOARD) into $(IMAGE)"
	@echo "make image-generic  build the generic-x86_64 board's image (real machines)"
	@echo "make kube-bins build kube, containerd, its shim and crun, CNI plugins, testpod and kubectl into $(BIN)"
	@echo "make unit      unit tests (no VM)"
	@echo "make lint      gofmt, go vet and staticcheck $(STATICCHECK_VERSION), with each package's build flags"
	@echo "make race      consensus, supervisor, event and logtree tests under the race detector"
	@echo "make fuzz      run every fuzz target briefly (FUZZTIME=$(FUZZTIME))"
	@echo "make vmtest    VM tests against the built image"
	@echo "make repro     build the image once more and compare every byte with make image's"
	@echo "make bench     benchmarks, written to $(OUT)/bench.json"
	@echo "make generate  regenerate generated code"
	@echo "make cli-docs  regenerate the plinthctl reference (docs/reference/cli.md) from the command tree"
	@echo "make e2e       build the upstream end-to-end suite (e2e.test), ginkgo and the conformance images' programs (not in make test)"
	@echo "make conformance  run the upstream conformance tests on a two-node cluster (FOCUS=, SKIP=, NAMES=, CONFORMANCE=quick, serial or certify)"
	@echo "make deps      install missing host packages"

deps:
	@scripts/install-deps

# Every Go binary is built by scripts/gobuild, which replaces the file only
# when the link gives new bytes, so the image is rebuilt for real changes
# only. A stamp per binary (in $(STAMP)) records that the build ran: without
# it an unchanged binary would stay older than its sources and be linked
# again by every make (GNU make re-reads a binary's time after its stamp's
# recipe ran, so the image does not see a rebuild that changed nothing).
# A missing binary makes its stamp out of date.
STAMP := $(OUT)/stamp
missing = $(if $(wildcard $(1)),,FORCE)
FORCE:
.SECONDEXPANSION:

# /init and plinthctl: rebuilt when any Go source changes. Both with CGO
# off, as are the tests that need no cgo (NOCGO): cgo changes package net,
# so with it every package that imports net (grpc, etcd's client, most of
# Plinth: ~200) would be compiled twice on a cold cache.
NOCGO := CGO_ENABLED=0
$(STAMP)/plinthctl: $(GO_SRC) $(call missing,$(BIN)/plinthctl)
	@$(NOCGO) scripts/gobuild $(BIN)/plinthctl ./cmd/plinthctl -ldflags "-X main.version=$(VERSION)"
	@mkdir -p $(@D) && touch $@

$(STAMP)/init: $(GO_SRC) $(call missing,$(BIN)/init)
	@$(NOCGO) scripts/gobuild $(BIN)/init ./init -ldflags "-s -w -X main.version=$(VERSION)"
	@mkdir -p $(@D) && touch $@

tools: $(BIN)/plinthctl $(BIN)/init

# What the node runs for Kubernetes, built from the modules go.mod pins
# (k8s.io/kubernetes in require, the runtime as tool directives), so one
# go.mod change moves them all. They import nothing from this repository
# but their own cmd/ directory, so only go.mod/go.sum (and that directory)
# trigger a rebuild.
#
# The Kubernetes version is go.mod's k8s.io/kubernetes version.
KUBE_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" && $$2 ~ /^v/ { print $$2; exit }' go.mod)
CONTAINERD_VERSION := $(shell awk '$$1 == "github.com/containerd/containerd/v2" && $$2 ~ /^v/ { print $$2; exit }' go.mod)
KUBE_MAJOR := $(word 1,$(subst ., ,$(KUBE_VERSION:v%=%)))
KUBE_MINOR := $(word 2,$(subst ., ,$(KUBE_VERSION:v%=%)))
# kube and kubectl: these tags and -trimpath are what the Go build cache
# holds the Kubernetes packages compiled with (any other tag, or CGO off,
# recompiles ~2500 packages: ~11 minutes on 2 cores). cgo stays on (the
# default) for the same reason; only the standard library's net, os/user
# and plugin use it, and the binary is linked statically all the same.
# The version variables are the ones Kubernetes' own build sets.
KUBE_TAGS := selinux,notest,grpcnotrace
KUBE_VERSION_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(p).gitVersion=$(KUBE_VERSION) -X $(p).gitMajor=$(KUBE_MAJOR) -X $(p).gitMinor=$(KUBE_MINOR) -X $(p).gitTreeState=clean)
KUBE_LDFLAGS := -s -w $(KUBE_VERSION_LDFLAGS) -linkmode external -extldflags -static
# containerd: the static build's tags, minus snapshotters a node never uses.
CONTAINERD_PKG := github.com/containerd/containerd/v2
CONTAINERD_TAGS := urfave_cli_no_docs osusergo netgo static_build no_devmapper no_zfs
CONTAINERD_LDFLAGS := -s -w -X $(CONTAINERD_PKG)/version.Version=$(CONTAINERD_VERSION) -X $(CONTAINERD_PKG)/version.Package=$(CONTAINERD_PKG)
CNI_PLUGINS := github.com/containernetworking/plugins/plugins/main/ptp \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/meta/portmap
KUBE_BINS := $(BIN)/kube $(BIN)/containerd $(BIN)/containerd-shim-runc-v2 $(BIN)/crun \
	$(foreach p,$(CNI_PLUGINS),$(BIN)/cni/$(notdir $(p))) $(BIN)/testpod
CNI_STAMPS := $(foreach p,$(CNI_PLUGINS),$(STAMP)/cni/$(notdir $(p)))

# After kubectl (order only): the two share ~1000 Kubernetes packages,
# compiled once when the builds do not run side by side (make test's -j2).
$(STAMP)/kube: $$(shell scripts/godeps ./cmd/kube $(KUBE_TAGS)) $(GO_MOD) $(call missing,$(BIN)/kube) | $(STAMP)/kubectl
	@echo "gobuild: kube $(KUBE_VERSION) (cached: ~1 min to link; cold: ~11 min)"
	@nice -n 19 scripts/gobuild $(BIN)/kube ./cmd/kube -tags $(KUBE_TAGS) -ldflags "$(KUBE_LDFLAGS)"
	@mkdir -p $(@D) && touch $@

# kubectl is not in the image: the VM tests drive the cluster with the
# same Kubernetes version as the nodes.
$(STAMP)/kubectl: $(GO_MOD) $(call missing,$(BIN)/kubectl)
	@echo "gobuild: kubectl $(KUBE_VERSION)"
	@nice -n 19 scripts/gobuild $(BIN)/kubectl k8s.io/kubernetes/cmd/kubectl -tags $(KUBE_TAGS) -ldflags "$(KUBE_LDFLAGS)"
	@mkdir -p $(@D) && touch $@

# The upstream end-to-end suite (package conformance, build tag
# conformance), ginkgo (its parallel runner) and the programs of the
# conformance images (image/conformance.go), from the same go.mod as the
# nodes' kube binary. With the kube build's tags
# and -trimpath, most packages come from its cache (~2 min each on this
# machine when kube is built). agnhost and nnp are upstream's test image
# programs; e2etools and e2eservers are ours (conformance/toolbox); busybox is built from
# its upstream release (scripts/busybox says why not Debian's binary); the
# porter's certificate and the kitten and nautilus images' files are
# copied from the Kubernetes module.
#
# make test builds them too, for the VM tests' conformance smoke
# (vmtest/smoke_test.go), each after the kube binary (order-only: they
# share most of its packages, which two builds at once would both
# compile on a cold cache).
CONFORMANCE_BIN := $(BIN)/conformance
CONFORMANCE_INPUTS := $(CONFORMANCE_BIN)/agnhost $(CONFORMANCE_BIN)/nnp $(CONFORMANCE_BIN)/e2etools $(CONFORMANCE_BIN)/e2eservers $(CONFORMANCE_BIN)/busybox $(CONFORMANCE_BIN)/localhost.crt
export PLINTH_E2E_TEST := $(abspath $(BIN)/e2e.test)
export PLINTH_GINKGO := $(abspath $(BIN)/ginkgo)
export PLINTH_CONFORMANCE_BIN := $(abspath $(CONFORMANCE_BIN))
e2e: $(BIN)/e2e.test $(BIN)/ginkgo $(CONFORMANCE_INPUTS)
$(BIN)/e2e.test: $(wildcard conformance/*.go) $(GO_MOD) | $(STAMP)/kube
	@echo "go test -c: e2e.test $(KUBE_VERSION)"
	@nice -n 19 go test -c -trimpath -tags conformance,$(KUBE_TAGS) -ldflags "-s -w $(KUBE_VERSION_LDFLAGS)" -o $@ ./conformance
$(BIN)/ginkgo: $(GO_MOD)
	@$(NOCGO) scripts/gobuild $@ github.com/onsi/ginkgo/v2/ginkgo -ldflags "-s -w"
$(CONFORMANCE_BIN)/agnhost: $(GO_MOD) | $(STAMP)/kube
	@echo "gobuild: agnhost $(KUBE_VERSION) (static)"
	@$(NOCGO) nice -n 19 scripts/gobuild $@ k8s.io/kubernetes/test/images/agnhost -ldflags "-s -w"
$(CONFORMANCE_BIN)/nnp: $(GO_MOD)
	@$(NOCGO) scripts/gobuild $@ k8s.io/kubernetes/test/images/nonewprivs -ldflags "-s -w"
$(CONFORMANCE_BIN)/e2etools: $$(shell scripts/godeps ./conformance/toolbox) $(GO_MOD)
	@echo "gobuild: e2etools (curl, nc, dig, getent)"
	@$(NOCGO) scripts/gobuild $@ ./conformance/toolbox -ldflags "-s -w"
$(CONFORMANCE_BIN)/e2eservers: $$(shell scripts/godeps ./conformance/toolbox servers,$(KUBE_TAGS)) $(GO_MOD) | $(STAMP)/kube
	@echo "gobuild: e2eservers (etcd, sample-apiserver)"
	@nice -n 19 scripts/gobuild $@ ./conformance/toolbox -tags servers,$(KUBE_TAGS) -ldflags "$(KUBE_LDFLAGS)"
$(CONFORMANCE_BIN)/busybox: scripts/busybox scripts/debsource | deps
	@scripts/busybox $@ $(CACHE)
$(CONFORMANCE_BIN)/localhost.crt: $(GO_MOD)
	@src=$$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images; mkdir -p $(@D)/kitten $(@D)/nautilus; \
	  install -m 0644 $$src/agnhost/porter/localhost.key $(@D)/; \
	  install -m 0644 $$src/kitten/html/* $(@D)/kitten/; install -m 0644 $$src/nautilus/html/* $(@D)/nautilus/; \
	  install -m 0644 $$src/agnhost/porter/localhost.crt $@

# The image make conformance boots: make image's, plus the conformance
# images (plinthctl build --conformance-images), which only this one
# carries.
CONFORMANCE_IMAGE := $(OUT)/image-conformance/$(BOARD)
$(CONFORMANCE_IMAGE)/manifest.json: $(BIN)/init $(BIN)/plinthctl $(KUBE_BINS) $(RELEASE_KEY) $(CONFORMANCE_INPUTS) | deps
	$(BIN)/plinthctl build --board $(BOARD) --init $(BIN)/init --bin $(BIN) --cache $(CACHE) --out $(CONFORMANCE_IMAGE) --version $(VERSION)-conformance $(SIGN) --release $(RELEASE) --conformance-images $(CONFORMANCE_BIN)
image-conformance: deps $(CONFORMANCE_IMAGE)/manifest.json

# The conformance tests on a two-node cluster (conformance/run):
# FOCUS= and SKIP= select specs (default: [Conformance], not [Serial] or
# [Disruptive]), NAMES=FILE the specs named in FILE (one per line: a
# summary's failures, say); CONFORMANCE=serial runs the serial ones
# afterwards; CONFORMANCE=quick the specs of conformance/quick.txt (a
# subset of the default selection that fits 45 minutes here: the README
# says how it was chosen); SEED=N the order of the run whose summary
# printed seed N (a failure that depends on the spec before it);
# CONFORMANCE=certify every [Conformance] spec in one run, nothing
# skipped, and from a run that passes them all a certification
# submission in out/conformance/submission (conformance/run/submission.go).
conformance: e2e image-conformance $(BIN)/kubectl
	$(NOCGO) go run -trimpath ./conformance/run -image $(CONFORMANCE_IMAGE) -out $(OUT)/conformance \
	  $(if $(FOCUS),-focus '$(FOCUS)') $(if $(SKIP),-skip '$(SKIP)') $(if $(NAMES),-names '$(NAMES)') \
	  $(if $(filter quick,$(CONFORMANCE)),-names conformance/quick.txt) $(if $(filter serial,$(CONFORMANCE)),-serial) \
	  $(if $(filter certify,$(CONFORMANCE)),-certify) \
	  $(if $(SEED),-seed $(SEED))

$(STAMP)/containerd: $(GO_MOD) $(call missing,$(BIN)/containerd)
	@echo "gobuild: containerd $(CONTAINERD_VERSION)"
	@CGO_ENABLED=0 nice -n 19 scripts/gobuild $(BIN)/containerd $(CONTAINERD_PKG)/cmd/containerd -tags "$(CONTAINERD_TAGS)" -ldflags "$(CONTAINERD_LDFLAGS)"
	@mkdir -p $(@D) && touch $@

$(STAMP)/containerd-shim-runc-v2: $(GO_MOD) $(call missing,$(BIN)/containerd-shim-runc-v2)
	@echo "gobuild: containerd-shim-runc-v2 $(CONTAINERD_VERSION)"
	@CGO_ENABLED=0 nice -n 19 scripts/gobuild $(BIN)/containerd-shim-runc-v2 $(CONTAINERD_PKG)/cmd/containerd-shim-runc-v2 -tags "$(CONTAINERD_TAGS) no_grpc" -ldflags "$(CONTAINERD_LDFLAGS)"
	@mkdir -p $(@D) && touch $@

# crun, the OCI runtime, is C: built static from its upstream release
# (scripts/crun says which and why), ~20 s here.
$(STAMP)/crun: scripts/crun scripts/debsource $(call missing,$(BIN)/crun) | deps
	@scripts/crun $(BIN)/crun $(CACHE)
	@mkdir -p $(@D) && touch $@

$(CNI_STAMPS): $(STAMP)/cni/%: $(GO_MOD) $$(call missing,$(BIN)/cni/$$*)
	@echo "gobuild: CNI plugin $*"
	@CGO_ENABLED=0 nice -n 19 scripts/gobuild $(BIN)/cni/$* $(filter %/$*,$(CNI_PLUGINS)) -ldflags "-s -w"
	@mkdir -p $(@D) && touch $@

$(STAMP)/testpod: $$(shell scripts/godeps ./cmd/testpod) $(GO_MOD) $(call missing,$(BIN)/testpod)
	@CGO_ENABLED=0 scripts/gobuild $(BIN)/testpod ./cmd/testpod -ldflags "-s -w"
	@mkdir -p $(@D) && touch $@

kube-bins: $(KUBE_BINS) $(BIN)/kubectl

$(BIN)/init $(BIN)/plinthctl $(KUBE_BINS) $(BIN)/kubectl: $(BIN)/%: $(STAMP)/% ;

# The development release key every image is signed with: made once on a
# fresh machine and kept (plinthctl release key never replaces one). A
# cluster bootstrapped from an image trusts the key that signed it, so the
# images built here update each other's nodes. Real releases are signed
# with an offline key instead (plinthctl build --sign-key).
$(RELEASE_KEY): | $(BIN)/plinthctl
	$(BIN)/plinthctl release key $@

# plinthctl build --bin takes every binary above from one directory; the
# image directory is named after its board.
SIGN = --sign-key $(RELEASE_KEY)
$(OUT)/image/%/manifest.json: $(BIN)/init $(BIN)/plinthctl $(KUBE_BINS) $(RELEASE_KEY) | deps
	$(BIN)/plinthctl build --board $* --init $(BIN)/init --bin $(BIN) --cache $(CACHE) --out $(OUT)/image/$* --version $(VERSION) $(SIGN) --release $(RELEASE)

image: deps $(IMAGE)/manifest.json $(BIN)/kubectl

# The board for real machines, which the VM tests boot as a PC (SATA,
# e1000e, USB keyboard).
GENERIC_IMAGE := $(OUT)/image/generic-x86_64
export PLINTH_GENERIC_IMAGE := $(abspath $(GENERIC_IMAGE))
image-generic: deps $(GENERIC_IMAGE)/manifest.json

# The image the update test installs over make image's: the same binaries
# and board, another version (so another system image, root hash, UKIs),
# and a user's own image (plinthctl build --oci-archive), which the updated
# worker runs without a registry. The user image is the test workload
# under another reference, written by go-containerregistry's layout
# writer (internal/testutil/ocitest), not the builder's.
NEXT_IMAGE := $(OUT)/image-next/$(BOARD)
export PLINTH_NEXT_IMAGE := $(abspath $(NEXT_IMAGE))
USER_IMAGE := $(OUT)/user-image.tar
$(USER_IMAGE): $(BIN)/testpod $(wildcard internal/testutil/ocitest/*.go internal/testutil/cmd/userimage/*.go)
	$(NOCGO) go run -trimpath ./internal/testutil/cmd/userimage -testpod $(BIN)/testpod -ref example.org/plinth/user-app:v1 -o $@
$(NEXT_IMAGE)/manifest.json: $(BIN)/init $(BIN)/plinthctl $(KUBE_BINS) $(RELEASE_KEY) $(USER_IMAGE) | deps
	$(BIN)/plinthctl build --board $(BOARD) --init $(BIN)/init --bin $(BIN) --cache $(CACHE) --out $(NEXT_IMAGE) --version $(VERSION)-next $(SIGN) --release $(NEXT_RELEASE) --oci-archive $(USER_IMAGE)
image-next: deps $(NEXT_IMAGE)/manifest.json

run: image
	$(BIN)/plinthctl run --image $(IMAGE) --state $(OUT)/run/$(BOARD)

# Tests that need what make builds (an image, the kernel package, the
# kube binary, kubectl) carry the build tag built: go test ./... on a
# fresh clone runs the others, and every target here sets it.
#
# kubectl first: plinthctl's tests check their kubeconfigs with it (the
# nodes' Kubernetes version), instead of compiling client-go once more
# without the kube binary's tags and cgo (~80 packages on a cold cache).
unit: deps tools $(BIN)/kubectl
	@$(BIN)/plinthctl fetch-kernel --board $(BOARD) --cache $(CACHE) >/dev/null
	@# cmd/kube has no tests; testing it would compile Kubernetes again
	@# without the image's tags (the kube-bins target builds it).
	@# -trimpath and CGO off, as scripts/gobuild builds plinthctl and
	@# /init: the tests then reuse every package those compiled instead of
	@# compiling them again. Only the TPM simulator's users need cgo.
	$(NOCGO) go test -trimpath -count=1 -tags built $$(go list ./... | grep -v -e '/vmtest$$' -e '/conformance/toolbox$$' -e '/roleserver' -e '/cmd/kube$$' $(foreach p,$(CGO_TEST_PKGS),-e '/$(p)$$'))
	go test -trimpath -count=1 -tags built $(addprefix ./,$(CGO_TEST_PKGS))

# lint: gofmt, go vet and staticcheck, each package checked with the
# flags and tags its build uses (CGO off and -trimpath as /init and
# plinthctl; cgo for the TPM simulator's users; the kube binary's tags
# for its packages), so that checking reuses the build cache instead of
# compiling Kubernetes once more. A finding fails make test; a deliberate
# exception carries //lint:ignore CHECK with its reason.
STATICCHECK_VERSION := v0.8.2
LINT_KUBE_PKGS = ./cmd/kube $(KUBE_TEST_PKGS)
LINT_PKGS = $$(go list ./... | grep -v -e '/cmd/kube$$' -e '/roleserver/kubernetes/localvolumes$$' -e '/roleserver/kubernetes/netpol$$' $(foreach p,$(CGO_TEST_PKGS),-e '/$(p)$$'))
$(BIN)/staticcheck:
	GOBIN=$(abspath $(BIN)) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
lint: $(BIN)/staticcheck $(BIN)/kube
	@files=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$files" ]; then echo "$$files"; echo "lint: not gofmt-formatted (gofmt -w them)"; exit 1; fi
	$(NOCGO) go vet -trimpath -tags built $(LINT_PKGS)
	go vet -trimpath -tags built $(addprefix ./,$(CGO_TEST_PKGS))
	go vet -trimpath -tags $(KUBE_TAGS),built $(LINT_KUBE_PKGS)
	$(NOCGO) GOFLAGS=-trimpath $(BIN)/staticcheck -tags built $(LINT_PKGS)
	GOFLAGS=-trimpath $(BIN)/staticcheck -tags built $(addprefix ./,$(CGO_TEST_PKGS))
	GOFLAGS=-trimpath $(BIN)/staticcheck -tags $(KUBE_TAGS),built $(LINT_KUBE_PKGS)

# The packages whose tests run the TPM simulator (go-tpm-tools, cgo).
CGO_TEST_PKGS := platform/tpm platform/measure platform/eventlog platform/update

# Concurrent packages run under the race detector (consensus runs only here).
RACE_PKGS = $$(go list ./roleserver/... | grep -v -e '/localvolumes$$' -e '/netpol$$') ./platform/supervisor/... ./platform/event/... ./platform/logtree/...
# Packages of the kube binary alone (client-go): tested as the kube binary
# is built (cgo, its tags), so their dependencies are the build's cache
# entries; under -race, client-go and the API types would compile again.
KUBE_TEST_PKGS := ./roleserver/kubernetes/localvolumes ./roleserver/kubernetes/netpol
# -p 4: these packages' tests mostly wait (etcd elections, the API
# server's start, retry timers), so four at a time fill the cores that go
# test's default of GOMAXPROCS (2) leaves idle.
race: $(BIN)/kube
	go test -count=1 -race -p 4 -tags built $(RACE_PKGS)
	go test -trimpath -count=1 -tags $(KUBE_TAGS),built $(KUBE_TEST_PKGS)

repro: image
	scripts/repro $(BOARD) $(BIN) $(CACHE) $(IMAGE) $(VERSION) $(OUT)/repro $(RELEASE_KEY) $(RELEASE)

vmtest: image image-generic image-next e2e
	@# -parallel: the tests' own pool starts the longest first (vmtest/doc.go).
	$(NOCGO) go test -trimpath -count=1 -tags built -timeout 70m -parallel 100 -v ./vmtest/ 2>&1 | scripts/testsummary vmtest

# Each fuzz target runs briefly (a count, not a duration: a duration can
# end mid-baseline with "context deadline exceeded"); FUZZTIME=10m digs
# deeper. A target may name its own count (pkg:Fn:count): the confined
# etcd endpoint's inputs each go through a real etcd member, ~100 times
# slower than a parser's.
FUZZTIME ?= 50000x
FUZZ_TARGETS := roleserver/parameters:FuzzDecode platform/storage:FuzzDecodeHeader \
	platform/storage:FuzzReadHeader platform/tpm:FuzzParseBlob platform/gpt:FuzzRead \
	roleserver/consensus:FuzzKubernetesEndpoint:3000x
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  IFS=: read -r pkg fn n <<< "$$t"; pkg=./$$pkg; n=$${n:-$(FUZZTIME)}; \
	  [[ "$(FUZZTIME)" == 50000x ]] || n=$(FUZZTIME); \
	  echo "fuzz: $$fn in $$pkg for $$n"; \
	  if ! go test -run '^$$' -fuzz "^$$fn$$" -fuzztime $$n $$pkg > $(OUT)/fuzz.log 2>&1; then \
	    cat $(OUT)/fuzz.log; exit 1; fi; tail -n 2 $(OUT)/fuzz.log; \
	done

# The stages that need no Kubernetes binary (unit tests, fuzz) run beside
# the builds of the node's Kubernetes binaries, which are niced: they take
# what the tests leave idle (a test waiting, a compile's serial tail), and
# a cold kube build is most of the build time. Lines, not targets, are kept
# whole, so progress shows as it happens. The race tests (TestControlPlaneOnHost
# runs the kube binary) then run beside the image builds and the
# reproducibility build: alone, each left a core idle most of its time
# (the race tests wait on etcd and the API server; an image build is
# mostly one compressor). The VM tests run last, alone on the machine.
# Each stage prints how long it took, so a CI log shows where the time
# went.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=line kube-bins unit fuzz e2e && echo "make test: builds, unit tests and fuzz took $${SECONDS}s"
	@$(MAKE) --no-print-directory -j2 --output-sync=line race repro image-generic image-next lint && echo "make test: race tests, repro, the images and lint took $${SECONDS}s"
	@$(MAKE) --no-print-directory vmtest && echo "make test: VM tests took $${SECONDS}s"
	@echo "make test: all passed"

# The CLI reference is generated from plinthctl's command tree; the unit
# tests fail while it is not current (TestCLIReference).
cli-docs:
	$(NOCGO) go test -trimpath -count=1 -run '^TestCLIReference$$' ./cmd/plinthctl -args -update

bench: image image-next
	go run ./cmd/plinthbench -image $(IMAGE) -next $(NEXT_IMAGE) -init $(BIN)/init -bin $(BIN) -cache $(CACHE) -out $(OUT)/bench.json

generate:
	@OUT=$(OUT) scripts/generate

clean:
	rm -rf $(OUT)
