"""Test-wide settings: an Airflow home of the test run's own, set before Airflow is imported."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-volcano-test-"))
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
