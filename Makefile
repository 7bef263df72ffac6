# The two set-up commands of the README: `make demo` and `make test`. Each creates .venv
# when it is missing and installs what it needs, so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_DEV := $(VENV)/.stamp-dev
STAMP_BENCH := $(VENV)/.stamp-bench
STAMP_DOCS := $(VENV)/.stamp-docs

.PHONY: demo test test-slow test-all bench docs docs-serve lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP_DEV): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

$(STAMP_BENCH): pyproject.toml $(STAMP_DEV)
	$(PY) -m pip install -q -e ".[dev,bench]"
	touch $@

$(STAMP_DOCS): pyproject.toml $(STAMP_DEV)
	$(PY) -m pip install -q -e ".[dev,docs]"
	touch $@

demo: $(STAMP_DEV)
	$(VENV)/bin/neurojax run coba --plot coba.png

# The default suite leaves out the tests marked slow (long reference and statistics runs);
# CI (`.ci/run`) runs both. Tests run on TEST_WORKERS processes (pytest-xdist; one per core
# of the 2-core reference machine): the default suite has taken 10-17 minutes there (the
# shared hosts vary). `make test TEST_WORKERS=0` runs them in this process.
TEST_WORKERS ?= 2

test: $(STAMP_DEV)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

test-slow: $(STAMP_DEV)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS)

test-all: $(STAMP_DEV)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

bench: $(STAMP_BENCH)
	$(PY) -m benchmarks.run_all

# The documentation site (mkdocs-material + mkdocstrings); --strict turns every warning
# (a broken link, a missing API object) into a failure. CI runs it.
docs: $(STAMP_DOCS)
	$(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP_DOCS)
	$(VENV)/bin/mkdocs serve

lint: $(STAMP_DEV)
	$(VENV)/bin/ruff check neurojax tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
