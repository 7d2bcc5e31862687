"""Test-wide settings: an Airflow home of the test run's own, set before Airflow is imported."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Each pytest-xdist worker gets its own home (its own SQLite metadata database): workers inherit the
# controller's environment, and two of them creating one database collide.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER or "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=f"airflow-volcano-test-{_WORKER or 'main'}-")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")


# The tests marked xdist_group(AIRFLOW_RUNS) each start Airflow itself (a metadata database, a worker, a
# triggerer, an API server): three at once starved the two cores. scripts/test-suite's `--dist loadgroup`
# keeps each lane's tests on one worker, one after the other; tests/integration's `in_an_airflow_lane`
# holds a lane's lock for a run that does not group them.
AIRFLOW_RUNS = "airflow-releases"
AIRFLOW_LANES = 2


# A file that exists while the tests marked node_outage stop the real node's kubelet (scripts/test-suite
# runs them first, beside the concurrent tests): a test that uses the real node waits until it is gone
# (tests/integration/conftest.py), and in such a run those tests come after the ones that do not.
REAL_NODE_GATE = "REAL_NODE_GATE"

# A directory where each test process appends, per test, when it started and ended and on which worker
# (scripts/test-suite sets it; benchmarks/suite_cpu.py lines it up with the machine's busy cores).
TEST_TIMELINE = "TEST_TIMELINE"


def uses_real_node(item: pytest.Item) -> bool:
    """Whether a test puts pods on the real node or reads its containers (its fixtures say so)."""
    return not {"real_node", "containerd"}.isdisjoint(getattr(item, "fixturenames", ()))


def last_run_key(item: pytest.Item) -> str:
    """An item's key in the durations files (scripts/test-suite writes junit's names without the `@group`
    suffix pytest-xdist adds to a grouped test's id)."""
    module = getattr(item, "module", None)
    return f"{module.__name__}::{item.name}" if module else item.nodeid


def airflow_lane(item: pytest.Item) -> str:
    """The lane (an xdist group) a test that runs Airflow itself was dealt into."""
    names = [str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args]
    return next((name for name in names if name.startswith(f"{AIRFLOW_RUNS}-")), AIRFLOW_RUNS)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns the group marks into node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (the disruptive tests shortest first, see below), so that concurrent workers
    (scripts/test-suite) do not end on one long test while the others idle: the integration tests by
    their time in the last whole run (which scripts/test-suite writes to .artifacts/test-durations.json),
    on a fresh clone by tests/durations.json (the times committed with the tests, `scripts/test-suite
    --save-durations`), else as collected; the unit tests, which take seconds, last. In a run beside the
    real node's outage (REAL_NODE_GATE set) the tests that use the real node come after those that do not.
    The tests that run Airflow itself are dealt, longest first, into AIRFLOW_LANES lanes of about equal
    time. Every xdist worker reads the same file and environment, so all collect the same order and lanes."""

    last_run: dict[str, float] = {}
    for durations in (REPO / ".artifacts" / "test-durations.json", REPO / "tests" / "durations.json"):
        try:
            last_run = json.loads(durations.read_text())
            break
        except (OSError, ValueError):
            continue

    real_node_later = bool(os.environ.get(REAL_NODE_GATE))

    def order(item: pytest.Item) -> tuple[bool, bool, float]:
        seconds = float(last_run.get(last_run_key(item), 0.0))
        # The disruptive tests run one at a time, so their order leaves their total alone; shortest first
        # puts the chaos soak, the heaviest on the CPU, after the control plane's tests on the simulated
        # cluster (scripts/test-suite) have ended, instead of beside them.
        shortest_first = bool(item.get_closest_marker("disruptive")) and not item.get_closest_marker("control_plane")
        return ("/unit/" in f"/{item.nodeid}", real_node_later and uses_real_node(item),
                seconds if shortest_first else -seconds)

    items.sort(key=order)  # stable: ties keep their collected order
    lanes = [0.0] * AIRFLOW_LANES
    for item in items:
        if any(mark.args[:1] == (AIRFLOW_RUNS,) for mark in item.iter_markers("xdist_group")):
            lane = lanes.index(min(lanes))
            # One minute for a test not in the last run: the lanes stay about even.
            lanes[lane] += last_run.get(last_run_key(item), 60.0)
            item.add_marker(pytest.mark.xdist_group(f"{AIRFLOW_RUNS}-{lane}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    timeline = os.environ.get(TEST_TIMELINE)
    started = time.time()
    yield
    if timeline:
        record = {"test": item.nodeid, "worker": _WORKER or "main", "start": round(started, 1),
                  "end": round(time.time(), 1)}
        with (Path(timeline) / f"{os.getpid()}.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
