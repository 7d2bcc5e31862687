"""Airflow names that moved between 3.1 (the oldest supported) and 3.3 (what the suite runs)."""

from __future__ import annotations

try:
    from airflow.sdk import conf
except ImportError:  # Airflow < 3.2
    from airflow.configuration import conf  # type: ignore[assignment]

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Airflow < 3.2
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow < 3.2
    from airflow.exceptions import TaskDeferred  # type: ignore[no-redef]

__all__ = ["AirflowFailException", "TaskDeferred", "conf"]
