VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pocserve-installed

.PHONY: run test setup compose-test

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

run: $(STAMP)
	VENV=$(VENV) bash scripts/run.sh

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest tests -q -m "not gpu" --durations=30

# The compose stacks against a real Docker engine (installed and started where missing; skipped with one line
# where none can be): scripts/compose_test.sh, README "Docker compose".
compose-test: $(STAMP)
	VENV=$(VENV) bash scripts/compose_test.sh
