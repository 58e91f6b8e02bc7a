# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-schedule demo-compress test test-fast venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,hf,ft]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/geotrain demo schedule
	$(BIN)/geotrain demo compress

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
