# Everything CI runs, one target each; `make ci` is the whole pipeline.
CARGO ?= cargo

.PHONY: ci clients fmt-check clippy test check-config deploy-check fuzz docs-check bench run

ci: clients fmt-check clippy test check-config deploy-check fuzz docs-check

# The third-party gRPC clients of tests/it/clients.rs: Python grpcio and envoy-data-plane in a
# venv under target/,
# Node grpc-js from tests/clients/package-lock.json.
clients:
	python3 -m venv target/clients/python
	target/clients/python/bin/pip install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
	npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --all-targets --locked -- -D warnings

test:
	$(CARGO) test --all-targets --locked

check-config:
	$(CARGO) run --quiet --locked -- check-config config

# Renders and validates every manifest offline; checks the example rules with the binary.
deploy-check:
	$(CARGO) build --quiet --locked
	bash deploy/validate.sh target/debug/floodgate

# Every fuzz target for FUZZ_SECONDS each (skipped, with a message, without nightly).
FUZZ_SECONDS ?= 45
fuzz:
	CARGO=$(CARGO) bash fuzz/run.sh $(FUZZ_SECONDS)

# Every relative link and #anchor in README.md and docs/ resolves; README.md under 300 lines.
docs-check:
	python3 scripts/check-docs.py

bench:
	$(CARGO) bench --locked

run:
	$(CARGO) run --release --locked -- serve --config config
