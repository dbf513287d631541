# One entry point for people and CI. `make run` / `make test` create .venv on first use:
# the CPU build of torch is installed first (a bare `torch` requirement would pull CUDA).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml setup.py $(wildcard rlpipe/native/*.pyx rlpipe/native/*.pxd rlpipe/native/*.h)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	touch $@

.PHONY: install run lint test test-slow test-package bench
install: $(VENV)/.installed

run: $(VENV)/.installed      ## the main job on its embedded defaults
	$(PY) -m rlpipe

lint: $(VENV)/.installed     ## ruff's checks and its formatting, as configured in pyproject.toml
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Three pytest-xdist workers on 2 cores: with two, the cores were about 70 % busy (the rest is
# tests waiting on heartbeat timeouts, SIGSTOP periods and run durations), and a third worker
# fills that wait (4:34 against 5:58 on this tree, one run each: docs/benchmarks.md). loadgroup
# keeps the tests that read one shared run on one worker, so the run is made once
# (tests/conftest.py, SHARED_RUNS). A plain `pytest` runs in one process, as does test-slow:
# its soak-sized runs and figures are not to share the CPUs.
test: $(VENV)/.installed     ## the default (fast) test suite; the ten slowest tests close its output
	$(PY) -m pytest -q --durations=10 -n 3 --dist loadgroup

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

# The package a user installs: sdist and wheel built from the checkout's files, the wheel
# installed in a fresh venv with only the CPU torch, `python -m rlpipe` and rlpipe.vector run
# from outside the checkout (tests/test_package.py; several minutes, most of them pip's).
test-package: $(VENV)/.installed
	$(PY) -m pytest -q -m slow tests/test_package.py

bench: $(VENV)/.installed
	$(PY) benchmarks/engine_sps.py
