# The two set-up commands of the README: `make demo` and `make test`. Each creates .venv
# when it is missing and installs what it needs, so a fresh machine needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_DEV := $(VENV)/.stamp-dev
STAMP_DEMO := $(VENV)/.stamp-demo
STAMP_BENCH := $(VENV)/.stamp-bench
STAMP_DOCS := $(VENV)/.stamp-docs

.PHONY: demo test test-fast test-slow test-all bench bench-gpu gpu-wheels docs docs-serve lint lint-imports clean

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

# The demo needs neurojax and its own dependencies only (matplotlib, for --plot, is one of
# them), not the dev extra. Its C++ CPU kernels are built first, as a step of their own that
# says what it does (once per machine; `python -m neurojax.kernels`); without a C++ compiler
# the demo goes on with their pure-JAX references.
$(STAMP_DEMO): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

demo: $(STAMP_DEMO)
	-$(PY) -m neurojax.kernels
	$(VENV)/bin/neurojax run coba --plot coba.png

# The default suite leaves out the tests marked slow (long reference and statistics runs);
# CI (`.ci/run`) runs both. Tests run on TEST_WORKERS processes (pytest-xdist; one per core
# of the 2-core reference machine): the default suite has taken 10-15 minutes there (the
# shared hosts vary). `make test TEST_WORKERS=0` runs them in this process. `make test-fast`
# runs the tests marked fast, a smoke test of every module (tests/conftest.py FAST_TESTS),
# in under 3 minutes. PYTEST_FLAGS adds flags (CI: --durations=25).
TEST_WORKERS ?= 2
PYTEST_FLAGS ?=

test-fast: $(STAMP_DEV)
	$(PY) -m pytest -q -m "fast and not slow" -n $(TEST_WORKERS) $(PYTEST_FLAGS)

test: $(STAMP_DEV)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(PYTEST_FLAGS)

test-slow: $(STAMP_DEV)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) $(PYTEST_FLAGS)

test-all: $(STAMP_DEV)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_FLAGS)

# The layer order of the package (pyproject.toml's [tool.importlinter] contracts; imports
# inside functions count): a unit imports only from its own layer or below, and no two units
# import each other. PYTHONPATH makes it read this checkout's neurojax.
lint-imports: $(STAMP_DEV)
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports

bench: $(STAMP_BENCH)
	$(PY) -m benchmarks.run_all

# The GPU benchmark (benchmarks/gpu.py): every section under its own time limit, the whole
# run in at most 7 minutes on one H100, its JSON lines in $(OUT)/results.jsonl. It runs with
# the GPU machine's own Python (GPU_PYTHON), which has jax, torch and cupy; the peers that
# machine lacks come from the wheels in .whl/ (`make gpu-wheels`, on a machine with PyPI),
# installed into $(GPU_SITE). neurojax itself is imported from this checkout; its own
# dependencies (.whl/core) are installed only when that Python cannot import them.
OUT ?= benchmarks/out/gpu
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/site
GPU_FLAGS ?=
PIP_OFFLINE := -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade

bench-gpu:
	@# A failed install is reported and the run goes on: the peers then record their errors.
	@if ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) $(PIP_OFFLINE) --target $(GPU_SITE) .whl/*.whl \
		|| echo "bench-gpu: installing .whl/*.whl failed; the peers will record errors"; fi
	@if ls .whl/core/*.whl >/dev/null 2>&1 && ! $(GPU_PYTHON) -c \
		"import equinox, jaxtyping, optax, chex, tqdm" 2>/dev/null; then \
		$(GPU_PYTHON) $(PIP_OFFLINE) --target $(GPU_SITE)-core .whl/core/*.whl \
		|| echo "bench-gpu: installing .whl/core/*.whl failed"; fi
	mkdir -p $(OUT)
	PYTHONPATH=$(CURDIR):$(GPU_SITE):$(GPU_SITE)-core$${PYTHONPATH:+:$$PYTHONPATH} \
		PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m benchmarks.gpu --out $(OUT) $(GPU_FLAGS)

gpu-wheels:
	bash benchmarks/gpu_wheels.sh

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
