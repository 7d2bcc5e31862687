# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export AIRFLOW_HOME ?= $(CURDIR)/.airflow-home

.PHONY: venv test unit lint shellcheck demo cluster-up cluster-down clean lowest-constraints \
	test-compat soak docs

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv

# uv writes no bytecode unless asked, and with PYTHONDONTWRITEBYTECODE set neither does Python: every
# process would compile Airflow from source as it imports it (3.3 s of a core for `import airflow.models`
# on 3.1, 1.5 s from bytecode), and the suite starts hundreds of them (triggerers, workers, API calls).
UV_INSTALL := $(BIN)/uv pip install -q --compile-bytecode

# Pinned by constraints.txt, so a fresh machine gets the versions the tests passed with.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/uv
	$(UV_INSTALL) --python $(BIN)/python -c constraints.txt -e . --group test --group docs
	touch $@

# Airflow's constraints files, with which the official images and most users install it, are made as of
# a release's day; so are the two venvs below (uv --exclude-newer, no package excepted: the floors are
# older than the oldest supported release). The cut-off: the end of the day the release reached PyPI.
AIRFLOW_LOWEST_RELEASED := 2026-02-05T00:00:00Z
AIRFLOW_3.2_RELEASED := 2026-05-30T00:00:00Z
AIRFLOW_3.3_RELEASED := 2026-09-18T00:00:00Z

# A second venv with the lowest resolution of pyproject's floors as of Airflow 3.1.7's release day
# (Airflow 3.1.7, cncf-kubernetes 10.12.0, kubernetes 32.0.0, kubernetes-asyncio 32.0.0, aiohttp 3.9.0,
# urllib3 2.1.0, ...; everything else as it was that day): the triggerer tests run the same scenario on
# it, so the floors are tested, and so is Airflow before 3.3 (no trigger on_kill, no task state store).
# This venv and the two below also hold the `unit` group (pytest): scripts/test-suite runs the unit tests
# in each.
# constraints-lowest.txt is `make lowest-constraints`'s output.
VENV_LOWEST := .venv-lowest
$(VENV_LOWEST)/.installed: pyproject.toml constraints-lowest.txt | $(BIN)/uv
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(VENV_LOWEST)
	$(UV_INSTALL) --python $(VENV_LOWEST)/bin/python -c constraints-lowest.txt -e . --group unit
	touch $@

# One more for each newer minor's latest release (3.2.2, 3.3.2), resolved as a user installing it on its
# release day would (the official image's constraints are made so). The triggerer test runs on each (with
# today's versions of its unpinned dependencies, svcs 26, ..., 3.2.2's task API fails). Into each of
# these sets the provider's wheel must install changing nothing (tests/unit/test_release_day_install.py).
# `make airflow-3.3-constraints` remakes constraints-airflow-3.3.txt.
AIRFLOW_RELEASE_DAY := 3.2 3.3
AIRFLOW_3.2_RELEASE := 3.2.2
AIRFLOW_3.3_RELEASE := 3.3.2
VENVS_RELEASE_DAY := $(foreach minor,$(AIRFLOW_RELEASE_DAY),.venv-airflow-$(minor))
.venv-airflow-%/.installed: pyproject.toml constraints-airflow-%.txt | $(BIN)/uv
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python .venv-airflow-$*
	$(UV_INSTALL) --python .venv-airflow-$*/bin/python -c constraints-airflow-$*.txt -e . --group unit
	touch $@

airflow-%-constraints: | $(BIN)/uv
	echo "apache-airflow==$(AIRFLOW_$*_RELEASE)" > .airflow-$*-pin.txt
	$(BIN)/uv pip compile -q --python-version 3.11 --no-header --exclude-newer $(AIRFLOW_$*_RELEASED) \
		pyproject.toml -c .airflow-$*-pin.txt \
		| sed '1i # pyproject.toml with apache-airflow==$(AIRFLOW_$*_RELEASE) as of its release day (make airflow-$*-constraints).' \
		> constraints-airflow-$*.txt
	rm -f .airflow-$*-pin.txt

lowest-constraints: | $(BIN)/uv
	$(BIN)/uv pip compile -q --resolution lowest-direct --python-version 3.11 --no-header \
		--exclude-newer $(AIRFLOW_LOWEST_RELEASED) pyproject.toml \
		| sed '1i # The lowest resolution of pyproject.toml (uv --resolution lowest-direct) as of the Airflow 3.1.7 release day (make lowest-constraints): the floors, tested.' \
		> constraints-lowest.txt

venv: $(VENV)/.installed $(VENV_LOWEST)/.installed $(foreach venv,$(VENVS_RELEASE_DAY),$(venv)/.installed)

cluster-up:
	scripts/volcano-cluster up

# Both clusters: make test's second, simulated-only one too (scripts/test-suite stops it unless killed).
cluster-down:
	scripts/volcano-cluster down
	VOLCANO_CLUSTER_SIMULATED=1 scripts/volcano-cluster down

# The shell the pods run. shellcheck, and busybox and strace for the unit tests that run that shell
# under busybox sh and inject signals (tests/unit/test_forward_signals.py), and chromium for the docs'
# screenshots (tests/unit/test_docs.py), are Debian packages: installed here when missing, as
# scripts/volcano-cluster installs its host tools (sudo when not root).
SHELL_SCRIPTS := $(wildcard airflow_volcano/shell/*.sh cluster/images/*.sh)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
HOST_TOOLS := shellcheck busybox strace chromium
shellcheck:
	@missing=$$(for tool in $(HOST_TOOLS); do command -v $$tool >/dev/null || echo $$tool; done); \
	if [ -n "$$missing" ]; then echo "installing Debian packages" $$missing; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
	shellcheck $(SHELL_SCRIPTS)

# ruff, shellcheck, and mypy over the provider (pyproject.toml [tool.mypy]).
lint: venv shellcheck
	$(BIN)/ruff check .
	$(BIN)/mypy

unit: venv shellcheck
	$(BIN)/python -m pytest -q tests/unit

# Everything: the integration tests against the local Volcano cluster (built and started on first use;
# see scripts/volcano-cluster), most of them concurrently and the disruptive ones alone, with the lint and
# the unit tests beside those (scripts/test-suite, which prints the 20 slowest tests; the unit tests build
# the docs site as `make docs` does), and the compatibility subset on the oldest Volcano and Kubernetes as
# soon as the disruptive ones have ended (--oldest).
# PostgreSQL, curl and a CJK font for the tests that run docker-compose.yaml's services (tests/compose_stack.py)
# are installed first, when missing: not inside the first tests that need them, two at once.
test: venv shellcheck cluster-up
	$(BIN)/python -c 'from tests.compose_stack import ensure_debian_packages; ensure_debian_packages()'
	scripts/test-suite --oldest

# The compatibility subset on every Volcano x Kubernetes combination the local cluster can build
# (docs/versions.md); make test runs the oldest corner (scripts/test-suite --oldest).
test-compat: venv
	scripts/test-compat

# The chaos soak (benchmarks/chaos_soak.py, docs/performance.md "Chaos soak"): 320 task instances under seeded faults,
# about an hour, alone on the machine. SOAK_SIZE=small is the one make test runs; SOAK_SEED=N replays a seed.
# Then the integration tests marked `soak` (long waits: a deferred wait past a pod token's expiry, about 13 min).
SOAK_SIZE ?= full
soak: venv cluster-up
	$(BIN)/python benchmarks/chaos_soak.py --size $(SOAK_SIZE) $(if $(SOAK_SEED),--seed $(SOAK_SEED))
	$(BIN)/python -m pytest -q -p no:cacheprovider -m soak tests/integration

# The docs site (docs/, Sphinx): warnings are errors (-W), every cross-reference must resolve (-n, nitpicky),
# and a generated argument table fails on an argument without a :param line (docs/_ext/argument_tables.py).
# No network: links to other sites are not checked. Open docs/_build/html/index.html.
DOCS_BUILD := docs/_build
docs: $(VENV)/.installed
	rm -rf docs/_api
	$(BIN)/python -m sphinx -W --keep-going -n -q -b html docs $(DOCS_BUILD)/html
	@echo "docs: $(DOCS_BUILD)/html/index.html"

demo: venv cluster-up
	$(BIN)/python scripts/demo.py

clean: cluster-down
	rm -rf docs/_build docs/_api $(VENV) $(VENV_LOWEST) $(VENVS_RELEASE_DAY) $(AIRFLOW_HOME)
