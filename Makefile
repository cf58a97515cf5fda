VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pocserve-installed

.PHONY: run test setup

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $(STAMP)

run: $(STAMP)
	VENV=$(VENV) bash scripts/run.sh

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest tests -q -m "not gpu"
