# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv if missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-schedule demo-compress test test-fast venv docs docs-serve clean

# pyproject.toml declares the ranges geotrain supports; constraints.txt pins this repository's tested
# environment (torch 2.13.0 CPU, transformers 5.24.0, torchft 0.2.0, ...), so demo and test are reproducible.
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) torch
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[test,hf,ft,docs,tensorboard]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/geotrain demo schedule
	$(BIN)/geotrain demo compress

# Three workers on two cores (whole files each: module fixtures are shared): the tests mostly wait on the
# processes they launch and on emulated links (at two workers the cores were about half busy: 1,066 CPU
# seconds in 995 s), then the tests that time wall clock or bandwidth alone; the second run still happens
# when the first fails, and both must pass.
test: $(STAMP)
	status=0; $(BIN)/python -m pytest -q -n 3 --dist loadfile -m "not serial" --durations=15 || status=$$?; \
	$(BIN)/python -m pytest -q -m serial || status=$$?; exit $$status

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests/unit

# The docs site into site/ (mkdocs.yml; the reference pages are generated from the code at build time).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache site
