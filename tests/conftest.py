"""Test-wide settings: an Airflow home of the test run's own, set before Airflow is imported."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Each pytest-xdist worker gets its own home (its own SQLite metadata database): workers inherit the
# controller's environment, and two of them creating one database collide.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER or "AIRFLOW_HOME" not in os.environ:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=f"airflow-volcano-test-{_WORKER or 'main'}-")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")


def pytest_collection_modifyitems(items: list) -> None:
    """Longest first, so that concurrent workers (scripts/test-suite) do not end on one long test while
    the others idle: the integration tests by their time in the last whole run (which scripts/test-suite
    writes to .artifacts/test-durations.json), else as collected; the unit tests, which take seconds,
    last. Every xdist worker reads the same file, so all collect the same order."""
    import json

    try:
        last_run: dict[str, float] = json.loads((REPO / ".artifacts" / "test-durations.json").read_text())
    except (OSError, ValueError):
        last_run = {}

    def order(item) -> tuple[bool, float]:
        key = f"{item.module.__name__}::{item.name}" if item.module else item.nodeid
        return "/unit/" in f"/{item.nodeid}", -float(last_run.get(key, 0.0))

    items.sort(key=order)  # stable: ties keep their collected order
