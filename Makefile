# ftd — every target creates .venv (and installs ftd into it) when missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
FTD    := $(VENV)/bin/ftd
STAMP  := $(VENV)/.ftd-installed
DEMO_STAMP := $(VENV)/.ftd-demo-installed
BUILD_STAMP := $(VENV)/.ftd-build-installed
# Where `make dist` writes the wheels and sdists (a test builds into its own directory).
DIST   ?= dist
# The exact versions the suite is tested with (the extras themselves take ranges).
CONSTRAINTS := constraints/test.txt
PYTEST_ARGS ?=

.PHONY: demo dist test unit check bench bench-tests real-parts clean

# The distribution is ftd-daemon; a venv made before the rename (or holding PyPI's unrelated `ftd`)
# loses that `ftd` first, so its package directory cannot shadow this one.
define VENV_BASE
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --yes ftd 2>/dev/null || true
endef

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(VENV_BASE)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[dev,torch,k8s,lightning,hf]'
	touch $(STAMP) $(DEMO_STAMP) $(BUILD_STAMP)

# The demo needs the daemons only: no torch, lightning or transformers (the full stamp covers it too).
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS)
	$(VENV_BASE)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[daemon]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(FTD) demo

# `make dist` needs the build tools only: build and hatchling (the ranges of the dev extra), not the
# full stamp's torch, Lightning and Transformers (1.8 GB for a wheel of under 1 MB). The full stamp
# covers it too (the dev extra has both).
$(BUILD_STAMP): pyproject.toml $(CONSTRAINTS)
	$(VENV_BASE)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) 'build>=1.0' 'hatchling>=1.21'
	touch $(BUILD_STAMP)

# The wheels and sdists of ftd-daemon and of the client alone (ftd-daemon-client, packaging/client)
# into $(DIST) (dist/), built with the venv's own hatchling (--no-isolation: no build environment is
# fetched). tests/integration/test_dist.py builds them and installs the client's wheel in a fresh venv.
dist: $(BUILD_STAMP)
	rm -rf $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) .
	$(PY) -m build --no-isolation --outdir $(DIST) packaging/client

real-parts:
	bash scripts/install-real-parts.sh

# Everything, property tests at their full example counts (the ci Hypothesis profile, tests/properties.py).
# tests/unit and tests/integration on every core (their tests share no Slurm cluster: each starts what
# it needs on free ports), then the rest (contract, e2e, chaos, security, fuzz, the plugin template) on
# REST_WORKERS processes, a whole file per process at a time (--dist loadfile: a module's fixtures stay
# in one process). Their tests share one Slurm cluster per process (the session fixture, on free ports:
# two clusters side by side are fine); they mostly wait on real processes, so two processes about halved
# the wall time of the files measured, on two cores. REST_WORKERS=0: one process, one test at a time.
PARALLEL_SUITES := tests/unit tests/integration
REST_WORKERS ?= 2
test: $(STAMP) real-parts
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} PYTHONDONTWRITEBYTECODE= $(PY) -m pytest $(PARALLEL_SUITES) -n auto $(PYTEST_ARGS)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest $(PARALLEL_SUITES:%=--ignore=%) -n $(REST_WORKERS) --dist loadfile -m "not bench" $(PYTEST_ARGS)

# The benchmark cases run as tests (marker `bench`: a slowed and a cgroup-throttled rank on the culprit
# bench's real Slurm stack, minutes each), left out of `make test` to keep CI within its time.
bench-tests: $(STAMP) real-parts
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest tests/e2e -m bench $(PYTEST_ARGS)

# The inner loop: tests/unit only (not tests/integration: real processes and wall-clock waits), no real
# parts installed, property tests with fewer examples (the dev profile, unless CI or HYPOTHESIS_PROFILE
# says otherwise). E.g. PYTEST_ARGS='-m "not property"', '--lf'.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: without the cache every run compiles
# ftd and rewrites the tests' asserts again (collection 7 s instead of 2), and so does every ftd
# subprocess a test starts.
unit: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest tests/unit -q -n auto $(PYTEST_ARGS)

# Static checks: lint, types, and the import contracts (pyproject.toml [tool.importlinter]).
check: $(STAMP)
	$(VENV)/bin/ruff check ftd tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vermin --quiet --no-tips --violations --target=3.9- ftd/client ftd/supervisor

bench: $(STAMP) real-parts
	$(FTD) bench e2e --json
	$(FTD) bench kmsg --json

clean:
	rm -rf $(VENV) $(DIST) .pytest_cache .mypy_cache .ruff_cache
