# The two commands: `make demo` (bring the environment up and show it working) and
# `make test` (every test). Everything else here serves those two.

PODS ?= 3
ENV_DIR ?= target/env
ENV_NET ?= 0
TEST_ENV_DIR ?= target/test-env
TEST_ENV_NET ?= 1
PYTHON ?= python3
ENVCTL = $(PYTHON) tests/env/envctl.py

# `make soak`: the tests whose length scales with HAPTIC_SOAK (the issue-sized runs), on their own environment.
.PHONY: demo test soak conformance env-install env-up env-down env-status test-unit test-env-scripts test-integration build lint fuzz image

## Bring up the local environment and show a request routed through HAProxy to a backend.
demo: build
	$(ENVCTL) up --state-dir $(ENV_DIR) --net $(ENV_NET) --pods $(PODS)
	$(PYTHON) tests/env/demo.py --state-dir $(ENV_DIR)
	HAPTIC_ENV_DIR=$(abspath $(ENV_DIR)) cargo test --quiet --test demo -- --nocapture

## Every test: formatting, unit tests, the environment scripts' tests, integration tests on real components.
test: lint test-unit test-env-scripts test-integration

build:
	cargo build --all-targets

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets --quiet -- -D warnings

# The fuzz targets (src/fuzz.rs) run here for their default budget of a few seconds each.
test-unit:
	cargo test --lib --bins

## The fuzz targets for FUZZ_SECONDS each (default 600), one after the other.
FUZZ_SECONDS ?= 600
fuzz:
	HAPTIC_FUZZ_SECONDS=$(FUZZ_SECONDS) cargo test --lib fuzz:: -- --nocapture --test-threads=1

test-env-scripts:
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/env/test_envctl.py tests/env/test_kubelet.py

# The integration tests share one environment, started here and always stopped afterwards.
# Every part is real and must start (the Dataplane API is built from its upstream source):
# when one cannot, `envctl.py up` fails and says why, and so does `make test`.
# The image is built first: tests/cluster/image.rs checks it and runs its binary. It is built with the
# `image-test` profile: the release image's code without whole-program optimisation, which only
# makes the binary smaller and faster and costs minutes of build. Only the integration tests
# run here (tests/run-integration: the pods' and the cluster's side by side, then the two that
# run alone); the unit tests ran in test-unit.
test-integration: IMAGE_PROFILE = image-test
test-integration: build env-install image
	@$(ENVCTL) up --quiet --state-dir $(TEST_ENV_DIR) --net $(TEST_ENV_NET) --pods $(PODS); \
	status=$$?; \
	if [ $$status -eq 0 ]; then \
		HAPTIC_IMAGE_DIR=$(abspath $(IMAGE_DIR)) HAPTIC_ENV_DIR=$(abspath $(TEST_ENV_DIR)) tests/run-integration; \
		status=$$?; \
	fi; \
	$(ENVCTL) down --quiet --state-dir $(TEST_ENV_DIR); \
	exit $$status

## Soak-sized runs of the live tests that take HAPTIC_SOAK: the issue-sized repetitions that
## `make test` runs fewer of (60 s of changes every 300 ms, 140 random runtime changes, twenty
## scale steps under a 60 s answer, five election rounds, 100 sticky requests a pod).
SOAK_TESTS ?= reload_pace:: runtime:: deploy:: election:: annotations::
soak: build env-install
	@$(ENVCTL) up --quiet --state-dir $(TEST_ENV_DIR) --net $(TEST_ENV_NET) --pods $(PODS); \
	status=$$?; \
	if [ $$status -eq 0 ]; then \
		HAPTIC_SOAK=1 HAPTIC_ENV_DIR=$(abspath $(TEST_ENV_DIR)) cargo test --test pods -- --nocapture $(SOAK_TESTS); \
		status=$$?; \
	fi; \
	$(ENVCTL) down --quiet --state-dir $(TEST_ENV_DIR); \
	exit $$status

## The official Gateway API conformance suite, unmodified, against haptic (tests/conformance/):
## the profiles named here with the features haptic publishes on its GatewayClass (or
## CONFORMANCE_FEATURES, when given), the suite's report in CONFORMANCE_REPORT. Its own
## environment in cluster mode (Pods run by tests/env/kubelet.py), in network namespace
## hptconf-7. `make test` runs the GATEWAY-HTTP core tests the same way.
CONFORMANCE_PROFILES ?= GATEWAY-HTTP,GATEWAY-TLS,GATEWAY-GRPC
CONFORMANCE_FEATURES ?=
CONFORMANCE_REPORT ?= docs/conformance/haptic.yaml
conformance: build env-install
	mkdir -p $(dir $(CONFORMANCE_REPORT))
	HAPTIC_CONFORMANCE=full HAPTIC_CONFORMANCE_PROFILES=$(CONFORMANCE_PROFILES) \
		$(if $(CONFORMANCE_FEATURES),HAPTIC_CONFORMANCE_FEATURES=$(CONFORMANCE_FEATURES)) HAPTIC_CONFORMANCE_REPORT=$(abspath $(CONFORMANCE_REPORT)) \
		tests/conformance/run

env-install:
	$(ENVCTL) install

MUSL_TARGET = x86_64-unknown-linux-musl
IMAGE_DIR ?= target/image
IMAGE_REPOSITORY ?= ghcr.io/haptic-dev/haptic
IMAGE_PROFILE ?= release
RELEASE_BINARY = $(or $(CARGO_TARGET_DIR),target)/$(MUSL_TARGET)/$(IMAGE_PROFILE)/haptic

## The container image without Docker or a registry: the static (musl) binary in an OCI image
## layout, $(IMAGE_DIR)/oci, and an archive of it beside (docs/image.md). Needs musl-gcc (Debian: musl-tools).
image:
	@command -v musl-gcc >/dev/null || { echo "make image: musl-gcc is missing (Debian: apt-get install musl-tools)" >&2; exit 1; }
	@rustup target list --installed | grep -qx $(MUSL_TARGET) || rustup target add $(MUSL_TARGET)
	cargo build --profile $(IMAGE_PROFILE) --locked --target $(MUSL_TARGET) --bin haptic
	$(PYTHON) .ci/oci-image.py --binary $(RELEASE_BINARY) --out $(IMAGE_DIR) --repository $(IMAGE_REPOSITORY)

env-up:
	$(ENVCTL) up --state-dir $(ENV_DIR) --net $(ENV_NET) --pods $(PODS)

env-down:
	$(ENVCTL) down --state-dir $(ENV_DIR)

env-status:
	$(ENVCTL) status --state-dir $(ENV_DIR)
