# The README's two commands are `make serve` and `make test`.
CARGO ?= cargo

.PHONY: serve test test-rust test-python lint build

## Start `vak serve` on the embedded offline model (loopback, port 8901).
serve:
	$(CARGO) run --release -- serve

## Every test: Rust unit and end-to-end tests, then the Python client smoke test.
test: lint test-rust test-python

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

test-rust:
	$(CARGO) test --all-targets

test-python: build
	clients/python/run-smoke.sh

build:
	$(CARGO) build
