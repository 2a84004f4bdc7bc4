# Two entry points for a fresh machine: `make demo` and `make test` (both create .venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := demo-data

.PHONY: venv demo test test-slow check lint bench clean

$(VENV)/.installed: pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	rm -rf $(DEMO)
	$(PY) -m pipeline random $(DEMO)/a.zarr --shape 3000x2000 --chunks 1000x700 --seed 1
	$(PY) -m pipeline random $(DEMO)/b.zarr --shape 2000x2500 --chunks 600x1000 --seed 2
	$(PY) -m pipeline multiply $(DEMO)/a.zarr $(DEMO)/b.zarr $(DEMO)/c.zarr --verify
	$(PY) -m pipeline verify $(DEMO)/a.zarr $(DEMO)/b.zarr $(DEMO)/c.zarr

test: venv
	$(PY) -m pytest

test-slow: venv
	$(PY) -m pytest -m slow

lint: venv
	$(PY) -m ruff check pipeline kernels cluster tests benchmarks
	$(PY) -m ruff format --check pipeline kernels cluster tests benchmarks
	$(PY) -m mypy

check: lint test

bench: venv
	$(PY) -m benchmarks.cpu_peers

clean:
	rm -rf $(VENV) $(DEMO)
