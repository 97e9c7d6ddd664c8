# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv from the lock when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-gang test bench lint clean venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24" "setuptools>=77" wheel
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m airflow_spot.demo

# a 4-rank gang (real JAX ranks) preempted twice, falling back to on-demand; its model checked
demo-gang: $(STAMP)
	$(PY) -m airflow_spot.demo_gang

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check airflow_spot tests benchmarks
	$(VENV)/bin/ruff format --check airflow_spot tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .demo build *.egg-info
