# maas-kubevirt: `make` renders the bundle into build/, `make test` runs every test tier.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BUILD ?= build
VALUES ?=
CLI = $(BIN)/maas-kubevirt $(if $(VALUES),--values $(VALUES))

.PHONY: all render venv test-venv deps kyverno test bench mutate deb clean diagrams

all: render

render: venv
	$(CLI) render --output $(BUILD)

# render needs only the runtime dependencies; the test extras come with `make test`.
venv: $(VENV)/.installed
test-venv: $(VENV)/.test-installed

$(VENV)/.installed: pyproject.toml setup.cfg
	@$(PYTHON) -m venv $(VENV) || { echo "cannot create a virtualenv: install python3-venv (apt-get install python3-venv)" >&2; exit 2; }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	@touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

# System tools for the QEMU, Debian-package and Kyverno tiers; installed with apt when root.
deps:
	@tools/install-deps

# The Kyverno CLI, then the control plane's binaries (which reuse its compiled packages), then
# Traefik and the Gateway API CRDs for the traffic tier, from Go module sources; then MAAS's region
# of each release in upstream.lock.yaml's maas-proven, from its source (MAAS_SOURCE, default the
# upstream repository) with its template database. All cached under ~/.cache/maas-kubevirt/
# (docs/development.md says what each costs cold). A release whose region did not build skips
# its real-MAAS cases (fails under CI=true, unless MAAS's source is what is missing).
# MAAS's regions build beside the Go builds: pip's downloads and MAAS's migrations leave the cores
# the Go compiler wants. Then the tests: on TEST_WORKERS pytest-xdist workers (one MAAS release to a
# worker, tests/conftest.py), then those marked `timing` with the machine to themselves.
TEST_WORKERS ?= 2
test: deps test-venv
	@regions=$$(mktemp); ($(MAAS_REGIONS)) >"$$regions" & regions_built=$$!; \
	kyverno=$$(tools/build-kyverno) || { echo "Kyverno CLI not built: its tests will skip (or fail under CI=true)" >&2; kyverno=""; }; \
	controlplane=$$(tools/build-controlplane) || { echo "control plane not built: its tier will skip (or fail under CI=true)" >&2; controlplane=""; }; \
	traefik=$$(tools/build-traefik) || { echo "Traefik not built: the traffic tier will skip (or fail under CI=true)" >&2; traefik=""; }; \
	wait $$regions_built; maas=$$(cat "$$regions"); rm -f "$$regions"; \
	export KYVERNO="$$kyverno" CONTROLPLANE_BIN="$$controlplane" TRAEFIK="$$traefik" REAL_MAAS="$$maas"; \
	export HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-$$( [ "$$CI" = true ] && echo ci || echo default )}; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not timing" $(PYTEST_ARGS); parallel=$$?; \
	$(BIN)/pytest -m timing $(PYTEST_ARGS); alone=$$?; \
	for status in $$parallel $$alone; do case $$status in 0|5) ;; *) exit $$status ;; esac; done; \
	[ "$$parallel$$alone" != 55 ] || { echo "no test matched PYTEST_ARGS" >&2; exit 5; }

# Builds MAAS's region of each of MAAS_RELEASES (default: every proven release) and prints the built
# cache directories, one a line (REAL_MAAS for the real-MAAS tier and the bench); a release that
# did not build is named on stderr.
MAAS_RELEASES ?= $(shell sed -n 's/^maas-proven:[[:space:]]*//p' upstream.lock.yaml)
MAAS_REGIONS = for release in $(MAAS_RELEASES); do \
		MAAS_SOURCE="$(MAAS_SOURCE)" tools/build-maas $$release \
		|| echo "MAAS $$release's region not built: its real-MAAS cases will skip (or fail under CI=true unless MAAS's source is what is missing)" >&2; \
	done

# The reconciler's cost to MAAS against the double, then on MAAS's own region of each proven
# release: the idle cycle and the writes per VM, and a fleet at MAAS's pace with its rack stand-in
# (BENCH_REAL_N VMs, BENCH_REAL_T s per power-on; tools/bench-real-maas says the defaults); then a
# warm pool filled from empty (BENCH_POOL_N machines, BENCH_POOL_T s; tools/bench-pools). Both run on
# the same regions whatever the first says; either one's goal not met fails the target.
bench: test-venv
	$(BIN)/python tools/bench.py
	regions="$$($(MAAS_REGIONS))"; \
	REAL_MAAS="$$regions" $(BIN)/python tools/bench-real-maas; fleet=$$?; \
	REAL_MAAS="$$regions" $(BIN)/python tools/bench-pools && exit $$fleet

# Mutation testing of the core modules against the fast tests (slow: not part of `make test`).
# MODULES picks some of: identity values render reconcile maas script.
mutate: $(VENV)/.mutate-installed
	nice $(BIN)/python tools/mutate $(MODULES)

$(VENV)/.mutate-installed: $(VENV)/.test-installed
	$(BIN)/pip install --quiet -e '.[test,mutate]'
	@touch $@

deb:
	tools/build-deb $(BUILD)/deb

# The pictures of the docs, from their Graphviz sources: every docs/diagrams/*.dot to the .svg beside
# it, which is committed so that GitHub shows it. Every source is rendered each time (a clone's
# file times say nothing of which is newer); tests/test_diagrams.py fails when an SVG is stale.
DIAGRAMS := $(wildcard docs/diagrams/*.dot)
diagrams:
	@command -v dot >/dev/null || { echo "dot not found: install Graphviz (apt-get install graphviz)" >&2; exit 2; }
	@for source in $(DIAGRAMS); do dot -Tsvg "$$source" -o "$${source%.dot}.svg" && echo "rendered $${source%.dot}.svg"; done

# The generated seed is the site secret every BMC password derives from: clean keeps it.
clean:
	@if [ -f $(BUILD)/seed ]; then \
		find $(BUILD) -mindepth 1 ! -path '$(BUILD)/seed' -delete; \
		echo "kept $(BUILD)/seed: every BMC password derives from it (remove it by hand to re-key them all)"; \
	else rm -rf $(BUILD); fi
	rm -rf $(VENV) .pytest_cache .hypothesis src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
