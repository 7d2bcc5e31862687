# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export AIRFLOW_HOME ?= $(CURDIR)/.airflow-home

.PHONY: venv test unit lint demo cluster-up cluster-down clean

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv

# Pinned by constraints.txt, so a fresh machine gets the versions the tests passed with.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/uv
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt -e . --group test
	touch $@

# A second venv with the oldest supported Airflow (3.1): the triggerer tests run the same scenario
# on it, because deferred-task kills work differently there (no trigger on_kill before 3.3).
VENV_AIRFLOW_31 := .venv-airflow-3.1
$(VENV_AIRFLOW_31)/.installed: pyproject.toml constraints-airflow-3.1.txt | $(BIN)/uv
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(VENV_AIRFLOW_31)
	$(BIN)/uv pip install -q --python $(VENV_AIRFLOW_31)/bin/python -c constraints-airflow-3.1.txt \
		'apache-airflow==3.1.8' -e .
	touch $@

venv: $(VENV)/.installed $(VENV_AIRFLOW_31)/.installed

cluster-up:
	scripts/volcano-cluster up

cluster-down:
	scripts/volcano-cluster down

lint: venv
	$(BIN)/ruff check .

unit: venv
	$(BIN)/python -m pytest -q tests/unit

# Everything: lint, unit tests, and the integration tests against the local Volcano cluster
# (built and started on first use; see scripts/volcano-cluster).
test: venv lint cluster-up
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

demo: venv cluster-up
	$(BIN)/python scripts/demo.py

clean: cluster-down
	rm -rf $(VENV) $(VENV_AIRFLOW_31) $(AIRFLOW_HOME)
