# ftd — every target creates .venv (and installs ftd into it) when missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
FTD    := $(VENV)/bin/ftd
STAMP  := $(VENV)/.ftd-installed
# The exact versions the suite is tested with (the extras themselves take ranges).
CONSTRAINTS := constraints/test.txt
PYTEST_ARGS ?=

.PHONY: demo test unit check bench real-parts clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[dev,torch,k8s,lightning,hf]'
	touch $(STAMP)

demo: $(STAMP)
	$(FTD) demo

real-parts:
	bash scripts/install-real-parts.sh

# Everything, property tests at their full example counts (the ci Hypothesis profile, tests/properties.py).
test: $(STAMP) real-parts
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: tests/unit only, no real parts installed, property tests with fewer examples (the dev
# profile, unless CI or HYPOTHESIS_PROFILE says otherwise). E.g. PYTEST_ARGS='-m "not property"', '--lf'.
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

bench: $(STAMP) real-parts
	$(FTD) bench e2e --json
	$(FTD) bench kmsg --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
