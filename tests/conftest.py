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
# triggerer, an API server): three at once starved the two cores. They are dealt into lanes (the numbers
# `--airflow-lanes` names: scripts/test-suite gives each of its two concurrent runs one of its own, so that
# at most two run on the machine); `--dist loadgroup` keeps each lane's tests on one worker, one after the
# other; tests/integration's `in_an_airflow_lane` holds a lane's lock for a run that does not group them.
AIRFLOW_RUNS = "airflow-releases"
AIRFLOW_LANES = "0,1"

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--real-node", choices=("only", "none"), default=None,
                     help="run only the tests that use the real node (their fixtures say so), or only those "
                          "that do not (scripts/test-suite runs these on the simulated-only cluster)")
    parser.addoption("--airflow-lanes", default=AIRFLOW_LANES, metavar="N,N",
                     help=f"the lanes the tests that start Airflow are dealt into (default {AIRFLOW_LANES})")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns the group marks into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--real-node only|none` keeps the tests that use the real node, or those that do not. Then the
    longest first, so that concurrent workers (scripts/test-suite) do not end on one long test while the
    others idle: the integration tests by their time in the last whole run (which scripts/test-suite
    writes to .artifacts/test-durations.json), on a fresh clone by tests/durations.json (the times
    committed with the tests, `scripts/test-suite --save-durations`), else as collected; the unit tests,
    which take seconds, last. The tests that run Airflow itself are dealt, longest first, into the lanes
    `--airflow-lanes` names, of about equal time. Every xdist worker reads the same file and options, so
    all collect the same tests, order and lanes."""
    real_node = config.getoption("--real-node")
    if real_node:
        kept = [item for item in items if uses_real_node(item) == (real_node == "only")]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept

    last_run: dict[str, float] = {}
    for durations in (REPO / ".artifacts" / "test-durations.json", REPO / "tests" / "durations.json"):
        try:
            last_run = json.loads(durations.read_text())
            break
        except (OSError, ValueError):
            continue

    def order(item: pytest.Item) -> tuple[bool, float]:
        return "/unit/" in f"/{item.nodeid}", -float(last_run.get(last_run_key(item), 0.0))

    items.sort(key=order)  # stable: ties keep their collected order
    lanes = {lane: 0.0 for lane in airflow_lanes(config.getoption("--airflow-lanes"))}
    for item in items:
        if any(mark.args[:1] == (AIRFLOW_RUNS,) for mark in item.iter_markers("xdist_group")):
            lane = min(lanes, key=lambda name: lanes[name])
            # One minute for a test not in the last run: the lanes stay about even.
            lanes[lane] += last_run.get(last_run_key(item), 60.0)
            item.add_marker(pytest.mark.xdist_group(f"{AIRFLOW_RUNS}-{lane}"))


def airflow_lanes(option: str) -> list[str]:
    """`--airflow-lanes`: lane numbers, comma-separated."""
    lanes = [lane.strip() for lane in option.split(",") if lane.strip()]
    if not lanes or not all(lane.isdigit() for lane in lanes):
        raise pytest.UsageError(f"--airflow-lanes={option!r}: lane numbers, comma-separated (e.g. 0,1)")
    return lanes


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
