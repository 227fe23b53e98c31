# Plinth: `make run` boots a node in QEMU, `make test` runs everything CI runs.
# Every target that needs host tools depends on `deps`, which installs what is
# missing, so a fresh Debian machine needs nothing done by hand.

SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c
OUT     ?= out
BOARD   ?= qemu-x86_64
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
IMAGE   := $(OUT)/image/$(BOARD)
CACHE   := $(OUT)/cache
BIN     := $(OUT)/bin
GO_SRC  := $(shell find . -name '*.go' -not -path './$(OUT)/*' 2>/dev/null) go.mod go.sum

# Everything the tests need to find, whatever package directory they run in.
export PLINTH_IMAGE          := $(abspath $(IMAGE))
export PLINTH_INIT           := $(abspath $(BIN)/init)
export PLINTH_KERNEL_PACKAGE_DIR := $(abspath $(CACHE))
export PLINTH_VMTEST_DIR     := $(abspath $(OUT)/vmtest)

.PHONY: all help deps tools image run test unit race fuzz vmtest repro bench generate clean

all: image

help:
	@echo "make run       build the default image if needed and boot a node in QEMU with swtpm"
	@echo "make test      everything CI runs: unit tests, reproducibility, VM tests"
	@echo "make image     build the image for BOARD=$(BOARD) into $(IMAGE)"
	@echo "make unit      unit tests (no VM)"
	@echo "make race      consensus, supervisor, event and logtree tests under the race detector"
	@echo "make fuzz      run every fuzz target briefly (FUZZTIME=$(FUZZTIME))"
	@echo "make vmtest    VM tests against the built image"
	@echo "make repro     build the image twice and compare every byte"
	@echo "make bench     benchmarks, written to $(OUT)/bench.json"
	@echo "make generate  regenerate generated code"
	@echo "make deps      install missing host packages"

deps:
	@scripts/install-deps

# The binaries are rebuilt when any Go source changes; gobuild keeps the old
# file (and its timestamp) when the result is identical.
$(BIN)/plinthctl: $(GO_SRC)
	@scripts/gobuild $@ ./cmd/plinthctl

$(BIN)/init: $(GO_SRC)
	@CGO_ENABLED=0 scripts/gobuild $@ ./init -ldflags "-s -w -X main.version=$(VERSION)"

tools: $(BIN)/plinthctl $(BIN)/init

$(IMAGE)/manifest.json: $(BIN)/init $(BIN)/plinthctl | deps
	$(BIN)/plinthctl build -board $(BOARD) -init $(BIN)/init -cache $(CACHE) -out $(IMAGE) -version $(VERSION)

image: deps $(IMAGE)/manifest.json

run: image
	$(BIN)/plinthctl run -image $(IMAGE) -state $(OUT)/run/$(BOARD)

unit: deps tools
	@$(BIN)/plinthctl fetch-kernel -board $(BOARD) -cache $(CACHE) >/dev/null
	go test -count=1 $$(go list ./... | grep -v -e '/vmtest$$' -e '/roleserver')

# Concurrent packages run under the race detector (consensus runs only here).
RACE_PKGS := ./roleserver/... ./platform/supervisor/... ./platform/event/... ./platform/logtree/...
race:
	go test -count=1 -race $(RACE_PKGS)

repro: deps $(BIN)/init $(BIN)/plinthctl
	scripts/repro $(BOARD) $(BIN) $(CACHE) $(OUT)/repro

vmtest: image
	go test -count=1 -timeout 30m -v ./vmtest/ 2>&1 | scripts/testsummary

# Each fuzz target runs briefly (a count, not a duration: a duration can
# end mid-baseline with "context deadline exceeded"); FUZZTIME=10m digs deeper.
FUZZTIME ?= 50000x
FUZZ_TARGETS := roleserver/parameters:FuzzDecode platform/storage:FuzzDecodeHeader \
	platform/storage:FuzzReadHeader platform/tpm:FuzzParseBlob platform/gpt:FuzzRead
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=./$${t%%:*}; fn=$${t##*:}; echo "fuzz: $$fn in $$pkg for $(FUZZTIME)"; \
	  if ! go test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg > $(OUT)/fuzz.log 2>&1; then \
	    cat $(OUT)/fuzz.log; exit 1; fi; tail -n 2 $(OUT)/fuzz.log; \
	done

test: unit race fuzz repro vmtest
	@echo "make test: all passed"

bench: image
	go run ./cmd/plinthbench -image $(IMAGE) -init $(BIN)/init -cache $(CACHE) -out $(OUT)/bench.json

generate:
	@OUT=$(OUT) scripts/generate

clean:
	rm -rf $(OUT)
