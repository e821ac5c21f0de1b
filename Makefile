# ftd — every target creates .venv (and installs ftd into it) when missing.
VENV   ?= .venv
PY     := $(VENV)/bin/python
FTD    := $(VENV)/bin/ftd
STAMP  := $(VENV)/.ftd-installed
# The exact versions the suite is tested with (the extras themselves take ranges).
CONSTRAINTS := constraints/test.txt
PYTEST_ARGS ?=

.PHONY: demo test check bench real-parts clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[dev,torch,k8s,lightning,hf]'
	touch $(STAMP)

demo: $(STAMP)
	$(FTD) demo

real-parts:
	bash scripts/install-real-parts.sh

test: $(STAMP) real-parts
	$(PY) -m pytest $(PYTEST_ARGS)

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
