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
