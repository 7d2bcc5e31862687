"""Which Jobs the orphan sweep deletes: only those Airflow says no try will watch again."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEPLOYMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ORPHANED_AT_ANNOTATION,
    TASK_INSTANCE_ANNOTATION,
)
from airflow_volcano.ownership.orphans import ORPHAN_GRACE, TaskInstanceId, candidates, orphans, sweep_orphans

OWN = TaskInstanceId("train", "fit", "scheduled__2026-11-27T00:00:00+00:00")
OLD = TaskInstanceId("train", "fit", "scheduled__2026-11-26T00:00:00+00:00")


def job(name: str, ti: TaskInstanceId | None, *, on_kill: str = "delete_job", phase: str = "Running",
        checked: bool = False, deleting: bool = False, managed: bool = True,
        deployment: str = "prod") -> dict[str, Any]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, DEPLOYMENT_LABEL: deployment} if managed else {}
    if checked:
        labels[CHECKED_LABEL] = "true"
    metadata: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels,
                                "annotations": {TASK_INSTANCE_ANNOTATION: ti.annotation(on_kill)} if ti else {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return {"metadata": metadata, "status": {"state": {"phase": phase}}}


def found(jobs: list[dict], states: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return [orphan.name for orphan in orphans(candidates(jobs, OWN), states)]


@pytest.mark.parametrize("state", ["failed", "success", "upstream_failed", "skipped", "removed"])
def test_a_job_whose_task_instance_airflow_reports_finished_is_an_orphan(state):
    assert found([job("left", OLD)], {("train", OLD.run_id): {"fit": state}}) == ["left"]


@pytest.mark.parametrize("state", ["running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule",
                                   "restarting", None])
def test_a_job_a_try_may_still_watch_is_left(state):
    """Running, deferred, or a later try coming (which reattaches), or cleared (no state yet)."""
    assert found([job("busy", OLD)], {("train", OLD.run_id): {"fit": state}}) == []


def test_what_airflow_does_not_know_is_left():
    """Another Airflow's task instance, or one deleted from this one's database: not sure, so not touched."""
    assert found([job("unknown", OLD)], {}) == []
    assert found([job("unknown", OLD)], {("train", OLD.run_id): {"other_task": "failed"}}) == []


def test_jobs_kept_on_purpose_or_not_the_providers_are_left():
    finished = {("train", OLD.run_id): {"fit": "failed"}}
    assert found([job("reported", OLD, checked=True, phase="Failed")], finished) == []  # kept by on_finish_action
    assert found([job("kept", OLD, on_kill="keep_job")], finished) == []
    assert found([job("going", OLD, deleting=True)], finished) == []
    assert found([job("users", OLD, managed=False)], finished) == []
    assert found([job("older-provider", None)], finished) == []  # made before Jobs named their task instance


def test_the_sweeping_task_instances_own_job_is_never_an_orphan():
    assert found([job("mine", OWN)], {("train", OWN.run_id): {"fit": "failed"}}) == []


def test_a_mapped_task_instance_is_looked_up_by_its_index():
    mapped = TaskInstanceId("train", "fit", OLD.run_id, map_index=3)
    states = {("train", OLD.run_id): {"fit_3": "failed", "fit_4": "running"}}
    assert found([job("three", mapped), job("four", TaskInstanceId("train", "fit", OLD.run_id, 4))], states) == [
        "three"]


def test_the_annotation_names_the_task_instance_exactly():
    odd = TaskInstanceId("dag with spaces", "tâche", "manual__2026-11-27T00:00:00+00:00", 7)
    assert TaskInstanceId.from_job(job("x", odd, on_kill="keep_job")) == (odd, "keep_job")
    broken = job("x", None)
    broken["metadata"]["annotations"][TASK_INSTANCE_ANNOTATION] = '{"dag_id": "d"}'
    assert TaskInstanceId.from_job(broken) is None
    broken["metadata"]["annotations"][TASK_INSTANCE_ANNOTATION] = "null"
    assert TaskInstanceId.from_job(broken) is None


class Hook:
    """A namespace's Jobs, as the sweep reads, marks and deletes them."""

    def __init__(self, *jobs: dict) -> None:
        self.jobs = {job["metadata"]["name"]: job for job in jobs}
        self.deleted: list[str] = []
        self.listed: list[dict] | None = None  # what a list answers, if older than the Jobs are now

    def list_jobs(self, namespace: str, label_selector: str) -> list[dict]:
        """As the apiserver selects by labels (`key=value,...`)."""
        wanted = dict(part.split("=", 1) for part in label_selector.split(","))
        jobs = self.listed if self.listed is not None else copy.deepcopy(list(self.jobs.values()))
        return [job for job in jobs if wanted.items() <= (job["metadata"].get("labels") or {}).items()]

    def get_job(self, name: str, namespace: str) -> dict | None:
        return copy.deepcopy(self.jobs.get(name))

    def annotate_job(self, name: str, namespace: str, annotations: dict) -> bool:
        self.jobs[name]["metadata"]["annotations"].update(annotations)
        return True

    def delete_job(self, name: str, namespace: str, *, uid: str | None = None) -> bool:
        assert uid == self.jobs[name]["metadata"]["uid"]
        self.deleted.append(name)
        return self.jobs.pop(name, None) is not None

    def delete_script_configmap(self, name: str, namespace: str, job_uid: str | None) -> bool:
        assert job_uid, "only the ConfigMap the orphan owns"
        return True


def test_an_orphan_is_marked_at_first_sight_and_deleted_only_a_grace_later_if_its_task_instance_is_still_finished():
    """A task instance just marked failed may still have a process settling its Job (a kill's delete
    retries for two minutes): the sweep waits ORPHAN_GRACE after it first found it."""
    hook = Hook(job("left", OLD), job("busy", TaskInstanceId("train", "fit", "other-run")))
    states = {OLD.run_id: {"fit": "failed"}, "other-run": {"fit": "running"}}
    first = sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0, deployment="prod")
    assert [orphan.name for orphan in first] == ["left"] and hook.deleted == []
    assert hook.jobs["left"]["metadata"]["annotations"][ORPHANED_AT_ANNOTATION] == "1000"
    assert ORPHANED_AT_ANNOTATION not in hook.jobs["busy"]["metadata"]["annotations"]
    sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0 + ORPHAN_GRACE - 1,
                  deployment="prod")
    assert hook.deleted == []
    states[OLD.run_id]["fit"] = "running"  # cleared meanwhile: watched again
    sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0 + ORPHAN_GRACE,
                  deployment="prod")
    assert hook.deleted == []
    states[OLD.run_id]["fit"] = "failed"
    sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0 + ORPHAN_GRACE,
                  deployment="prod")
    assert hook.deleted == ["left"] and list(hook.jobs) == ["busy"]


@pytest.mark.parametrize("since", ["reported", "deleted"])
def test_a_job_listed_before_its_try_ended_is_read_again_before_it_is_marked(since):
    """Found by the chaos soak: the list showed a Job Running; its try then ended (deleting it, or labelling
    it reported when kept) and its task instance turned success before Airflow was asked. The Job is read
    again after Airflow's answer: it is no orphan."""
    ended = job("ended", OLD)
    hook = Hook(ended)
    hook.listed = [copy.deepcopy(ended)]
    if since == "reported":
        hook.jobs["ended"]["metadata"]["labels"][CHECKED_LABEL] = "true"
    else:
        del hook.jobs["ended"]
    states = {OLD.run_id: {"fit": "success"}}
    assert sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0, deployment="prod") == []
    assert all(ORPHANED_AT_ANNOTATION not in j["metadata"]["annotations"] for j in hook.jobs.values())


def test_another_deployments_job_of_the_same_task_instance_is_never_marked_nor_deleted():
    """Issue 42: staging and prod share a namespace and run the same DAG for the same dates; staging's copy
    of a task instance failed while prod's runs. Staging's sweep asks its own Airflow only about its own
    deployment's Jobs: prod's Job is not even listed."""
    hook = Hook(job("prods", OLD, deployment="prod"), job("stagings", OLD, deployment="staging"))
    states = {OLD.run_id: {"fit": "failed"}}  # what staging's Airflow says of the task instance
    for now in (1000.0, 1000.0 + ORPHAN_GRACE):
        sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=now, deployment="staging")
    assert hook.deleted == ["stagings"]
    assert ORPHANED_AT_ANNOTATION not in hook.jobs["prods"]["metadata"]["annotations"]


def test_other_dags_orphans_are_counted_in_the_task_log_never_named(monkeypatch):
    from airflow_volcano.ownership import orphans as module

    said: list[str] = []

    class Log:
        def info(self, message: str, *args: object) -> None:
            said.append(message % args)

        warning = info

    monkeypatch.setattr(module, "log", Log())
    other = TaskInstanceId("finance-secret-dag", "fit", OLD.run_id)
    hook = Hook(job("mine-left", OLD), job("theirs-left", other))
    states = {OLD.run_id: {"fit": "failed"}}
    sweep_orphans(hook, "ml", OWN, lambda dag_id, task_ids, run_ids: states, now=1000.0, deployment="prod")
    assert any("mine-left" in line for line in said)
    assert not any("finance-secret-dag" in line or "theirs-left" in line for line in said), said
    assert any("other DAGs' task instances in ml: 1 found and marked" in line for line in said), said


# -- the one read of a task instance's state (ownership.state_in), shared with the operator and the trigger --


def test_a_task_instances_state_is_read_the_same_for_the_operator_the_trigger_and_the_sweep():
    from airflow.utils.state import TaskInstanceState

    from airflow_volcano.ownership import ask_task_state, state_in

    run = {"train": TaskInstanceState.FAILED, "train_3": "success", "cleared": None}
    assert state_in(run, "train", -1) == state_in(run, "train", None) == "failed"
    assert state_in(run, "train", 3) == "success", "a mapped task instance carries its index"
    assert state_in(run, "cleared", -1) == state_in(run, "absent", -1) == state_in(None, "train", -1) == "none"

    class TaskInstance:
        dag_id, task_id, run_id, map_index = "d", "train", "r", 3

    asked: list[dict] = []

    def get_task_states(**question):
        asked.append(question)
        return {"r": run}

    assert ask_task_state(get_task_states, TaskInstance()) == "success"
    assert asked == [{"dag_id": "d", "task_ids": ["train"], "run_ids": ["r"], "map_index": 3}]


def test_the_kill_rules_of_the_operator_and_the_trigger_are_ownerships():
    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.ownership import cancellation_ends_job, ended_on_server, nothing_to_stop

    # About to defer: any known state but running was a user's (Airflow would refuse the deferral).
    assert [ended_on_server(state) for state in (None, "running", "failed", "none", "queued")] == \
        [False, False, True, True, True]
    # A cancelled trigger before Airflow 3.3: only the states a user leaves a task in end the Job.
    assert [cancellation_ends_job(state) for state in ("none", "failed", "success", "running", "scheduled")] == \
        [True, True, True, False, False]

    ref = JobRef(name="train", namespace="ml", uid="u1", script_configmap=None)

    def job(uid: str = "u1", phase: str = "Running", labels: dict | None = None) -> dict:
        return {"metadata": {"name": "train", "uid": uid, "labels": labels or {}},
                "status": {"state": {"phase": phase}}}

    assert nothing_to_stop(job(), ref) is None
    assert nothing_to_stop(None, ref) == nothing_to_stop(job(uid="u2"), ref) == "gone"
    assert nothing_to_stop(job(phase="Completed"), ref) == "ended"
    assert nothing_to_stop(job(labels={"airflow-volcano.io/checked": "true"}), ref) == "ended"


def test_a_task_instances_state_is_asked_through_its_own_reader_and_unknown_is_said():
    from airflow_volcano.ownership import state_on_server, task_state

    class TaskInstance:
        dag_id, task_id, run_id, map_index = "d", "train", "r", -1

        def __init__(self, answer: object) -> None:
            self.answer = answer

        def get_task_states(self, **_: object) -> dict:
            if isinstance(self.answer, Exception):
                raise self.answer
            return {"r": {"train": self.answer}}

    class Log:
        def __init__(self) -> None:
            self.said: list[str] = []

        def warning(self, message: str, *args: object) -> None:
            self.said.append(message % args)

    assert task_state(TaskInstance("running")) == state_on_server(TaskInstance("running"), Log()) == "running"
    log = Log()
    assert state_on_server(TaskInstance(TimeoutError("read timed out")), log) is None
    assert state_on_server(None, log) is None
    assert log.said == ["Could not read the task instance's state: read timed out"]
