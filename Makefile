# Two commands do all set-up on a fresh machine:
#   make demo   installs everything and runs the demo on an embedded PostgreSQL
#   make test   installs everything and runs lint, types and the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(CURDIR)/$(VENV)/bin/python
# Spark's Python workers must run in this venv, not whatever 'python3' is on PATH.
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)

# make test runs the test files on this many processes (tests/fix_xdist.py: most tests
# wait on servers, kills and timeouts): make test TEST_WORKERS=3. Default 0 (one process)
# until the metrics exporter's Ctrl-C hang beside other processes is found
TEST_WORKERS ?= 0
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: setup demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	bash scripts/ensure-java.sh
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-mariadb.sh  # the MariaDB backend's tests start their own server
	bash scripts/ensure-jdbc.sh  # the benchmarks' smoke runs measure Spark's JDBC writer too
	bash scripts/ensure-prometheus.sh  # the metrics tests scrape with a real Prometheus
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	touch $@

setup: $(VENV)/.installed

# the crash demo on an embedded PostgreSQL; ARGS="--backend mariadb": on a private mariadbd
demo: setup
	$(PY) examples/demo.py $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

bench: setup
	bash scripts/ensure-jdbc.sh
	$(PY) benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-work
