"""What the provider keeps of a task instance in Airflow itself: how `get_task_states` names it, and the
key under which a try records its Job in the task state store (Airflow 3.3+)."""

from __future__ import annotations

# The task state store key (Airflow 3.3+) under which a try records the Job it submitted.
STATE_STORE_KEY = "volcano_job"


def task_state_key(task_id: str, map_index: int | None) -> str:
    """How Airflow's get_task_states names a task instance: mapped ones carry their index."""
    return task_id if map_index is None or map_index < 0 else f"{task_id}_{map_index}"
