"""Which Jobs the orphan sweep deletes: only those Airflow says no try will watch again."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_volcano.constants import CHECKED_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE, TASK_INSTANCE_ANNOTATION
from airflow_volcano.orphans import TaskInstanceId, candidates, orphans

OWN = TaskInstanceId("train", "fit", "scheduled__2026-11-27T00:00:00+00:00")
OLD = TaskInstanceId("train", "fit", "scheduled__2026-11-26T00:00:00+00:00")


def job(name: str, ti: TaskInstanceId | None, *, on_kill: str = "delete_job", phase: str = "Running",
        checked: bool = False, deleting: bool = False, managed: bool = True) -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE} if managed else {}
    if checked:
        labels[CHECKED_LABEL] = "true"
    metadata: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels,
                                "annotations": {TASK_INSTANCE_ANNOTATION: ti.annotation(on_kill)} if ti else {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return {"metadata": metadata, "status": {"state": {"phase": phase}}}


def swept(jobs: list[dict], states: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return [orphan.name for orphan in orphans(candidates(jobs, OWN), states)]


@pytest.mark.parametrize("state", ["failed", "success", "upstream_failed", "skipped", "removed"])
def test_a_job_whose_task_instance_airflow_reports_finished_is_an_orphan(state):
    assert swept([job("left", OLD)], {("train", OLD.run_id): {"fit": state}}) == ["left"]


@pytest.mark.parametrize("state", ["running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule",
                                   "restarting", None])
def test_a_job_a_try_may_still_watch_is_left(state):
    """Running, deferred, or a later try coming (which reattaches), or cleared (no state yet)."""
    assert swept([job("busy", OLD)], {("train", OLD.run_id): {"fit": state}}) == []


def test_what_airflow_does_not_know_is_left():
    """Another Airflow's task instance, or one deleted from this one's database: not sure, so not touched."""
    assert swept([job("unknown", OLD)], {}) == []
    assert swept([job("unknown", OLD)], {("train", OLD.run_id): {"other_task": "failed"}}) == []


def test_jobs_kept_on_purpose_or_not_the_providers_are_left():
    finished = {("train", OLD.run_id): {"fit": "failed"}}
    assert swept([job("reported", OLD, checked=True, phase="Failed")], finished) == []  # kept by on_finish_action
    assert swept([job("kept", OLD, on_kill="keep_job")], finished) == []
    assert swept([job("going", OLD, deleting=True)], finished) == []
    assert swept([job("users", OLD, managed=False)], finished) == []
    assert swept([job("older-provider", None)], finished) == []  # made before Jobs named their task instance


def test_the_sweeping_task_instances_own_job_is_never_an_orphan():
    assert swept([job("mine", OWN)], {("train", OWN.run_id): {"fit": "failed"}}) == []


def test_a_mapped_task_instance_is_looked_up_by_its_index():
    mapped = TaskInstanceId("train", "fit", OLD.run_id, map_index=3)
    states = {("train", OLD.run_id): {"fit_3": "failed", "fit_4": "running"}}
    assert swept([job("three", mapped), job("four", TaskInstanceId("train", "fit", OLD.run_id, 4))], states) == [
        "three"]


def test_the_annotation_names_the_task_instance_exactly():
    odd = TaskInstanceId("dag with spaces", "tâche", "manual__2026-11-27T00:00:00+00:00", 7)
    assert TaskInstanceId.from_job(job("x", odd, on_kill="keep_job")) == (odd, "keep_job")
    broken = job("x", None)
    broken["metadata"]["annotations"][TASK_INSTANCE_ANNOTATION] = '{"dag_id": "d"}'
    assert TaskInstanceId.from_job(broken) is None
    broken["metadata"]["annotations"][TASK_INSTANCE_ANNOTATION] = "null"
    assert TaskInstanceId.from_job(broken) is None
