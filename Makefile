# Everything CI runs, one target each; `make ci` is the whole pipeline.
CARGO ?= cargo

.PHONY: ci fmt-check clippy test check-config bench run

ci: fmt-check clippy test check-config

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --all-targets --locked -- -D warnings

test:
	$(CARGO) test --all-targets --locked

check-config:
	$(CARGO) run --quiet --locked -- check-config config

bench:
	$(CARGO) bench --locked

run:
	$(CARGO) run --release --locked -- serve --config config
