# The README's commands. Every target that runs code first makes sure .venv exists and is
# up to date with pyproject.toml and constraints.txt (the stamp file makes `make venv` idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hexad-installed
EXTRAS ?= test,exp,docs
PYTEST_ARGS ?=

.PHONY: venv demo test test-slow bench gpu-check docs lint format clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: venv
	$(PY) -m experiments.demo

# The suite and the library's docstring examples in one run (`--doctest-modules` also imports
# each test module as a doctest module; they hold no examples, so nothing more runs).
TEST_PATHS ?= tests lib/hexad experiments/_runner.py

test: venv
	OPENBLAS_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --doctest-modules \
	  $(PYTEST_ARGS) $(TEST_PATHS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests collected: not a failure"; exit 0; fi; exit $$rc

test-slow: venv
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

bench: venv
	$(PY) -m kernels --quick

# On a machine with an NVIDIA GPU: the gpu extra, the gpu-marked and lowering tests, and the
# full benchmarks as JSON rows (runs/gpu-check/); fails at once where no GPU is visible.
gpu-check: venv
	PY=$(PY) .ci/gpu-check

# The documentation site: API reference, tutorials executed as notebooks, the reproduction
# pages rendered from results/. Offline; any Sphinx warning fails the build.
docs: venv
	OPENBLAS_NUM_THREADS=1 $(PY) docs/render_results.py
	$(PY) -m sphinx -W --keep-going -b html -j 1 docs docs/_build/html

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache docs/_build docs/jupyter_execute
