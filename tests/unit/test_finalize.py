"""finalize: the end of every wait (docs/deferrable.md "Cleanup guarantees"), against a scripted hook: what becomes of
the Job for each verdict, what the task returns or raises."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from airflow_volcano.constants import OnFinishAction
from airflow_volcano.exceptions import VolcanoJobError
from airflow_volcano.job_ref import JobRef
from airflow_volcano.observability.logs import LogCursor
from airflow_volcano.observability.pod_logs import PodLogCopy
from airflow_volcano.ownership.finalize import finalize
from airflow_volcano.waiting.events import Verdict, WaitOutcome

from .test_status import job

REF = JobRef(name="train", namespace="ml", uid="u1", script_configmap="train-script")


class Hook:
    """A VolcanoHook whose cluster holds one Job and its master pod; every change is recorded."""

    def __init__(self, pod_log: bytes = b"") -> None:
        self.done: list[str] = []
        self.pod_log = pod_log
        self.job = {"metadata": {"name": "train", "namespace": "ml", "uid": "u1", "resourceVersion": "9",
                                 "labels": {"airflow-volcano.io/try-number": "1"}}}
        self.master = {"metadata": {"name": "train-master-0"}, "spec": {"terminationGracePeriodSeconds": 1},
                       "status": {"phase": "Succeeded", "containerStatuses": [{"name": "master", "state": {
                           "terminated": {"exitCode": 0, "message": '{"eval_loss": 0.25}'}}}]}}

    def drive(self, program: Any) -> Any:
        """The calls a program (hooks.calls) makes, against this Job."""
        answer = None
        while True:
            try:
                step = program.send(answer)
            except StopIteration as finished:
                return finished.value
            if step.what.startswith("get Job"):
                answer = self.job
            elif step.what.startswith("delete Job"):
                assert step.kwargs["body"]["preconditions"]["uid"] == REF.uid, "only the Job this try owns"
                self.done.append(step.what)
                answer = True
            else:
                raise AssertionError(f"unexpected call: {step.what}")

    def delete_script_configmap(self, name: str, namespace: str, job_uid: str | None) -> bool:
        assert job_uid == REF.uid, "only the ConfigMap the Job owns"
        self.done.append(f"delete ConfigMap {namespace}/{name}")
        return True

    def label_job(self, name: str, namespace: str, labels: dict[str, str]) -> bool:
        self.done.append(f"label Job {namespace}/{name} {labels}")
        return True

    def get_pod(self, name: str, namespace: str) -> dict | None:
        return self.master

    def list_job_pods(self, name: str, namespace: str) -> list[dict]:
        return []

    def get_podgroup(self, job: dict) -> dict | None:
        return None

    def list_events(self, namespace: str, names: set[str]) -> list[dict]:
        return []

    def pod_log_chunks(self, name: str, namespace: str, **kwargs: Any) -> Any:
        yield self.pod_log


def ended(verdict: Verdict, phase: str = "Running", message: str | None = None) -> WaitOutcome:
    return WaitOutcome(verdict, message=message, phase=phase, job=job(phase))


def test_a_succeeded_job_returns_the_masters_result_and_is_deleted_by_default():
    hook = Hook()
    summary = finalize(hook, REF, ended(Verdict.FINISHED, "Completed"),
                       on_finish_action=OnFinishAction.DELETE_SUCCEEDED_JOB)
    assert summary["result"] == {"eval_loss": 0.25} and summary["main_pod"] == "train-master-0"
    assert hook.done == ["delete Job ml/train", "delete ConfigMap ml/train-script"]


def test_a_failed_job_is_kept_for_debugging_and_labelled_reported():
    hook = Hook()
    with pytest.raises(VolcanoJobError, match="ended in phase Failed"):
        finalize(hook, REF, ended(Verdict.FINISHED, "Failed"), on_finish_action=OnFinishAction.DELETE_SUCCEEDED_JOB)
    assert hook.done == ["label Job ml/train {'airflow-volcano.io/checked': 'true'}"]


@pytest.mark.parametrize("verdict", [Verdict.JOB_TIMEOUT, Verdict.CANNOT_START, Verdict.STALLED])
def test_job_timeout_a_job_that_cannot_start_and_a_stall_delete_it_whatever_on_finish_action_says(verdict):
    hook = Hook(pod_log=b"2026-11-24T10:00:00Z saved checkpoint epoch-3.pt on SIGTERM\n")
    shown: list[str] = []
    main = PodLogCopy("train-master-0", "master", lambda line, at: shown.append(line), LogCursor())
    with pytest.raises(VolcanoJobError, match="the Job was deleted"):
        finalize(hook, REF, ended(verdict, message="x"), on_finish_action=OnFinishAction.KEEP_JOB, main_log=main)
    assert hook.done == ["delete Job ml/train", "delete ConfigMap ml/train-script"]
    assert shown == ["saved checkpoint epoch-3.pt on SIGTERM"], "the main pod's last lines, before the failure"


@pytest.mark.parametrize(("verdict", "says"), [
    (Verdict.DEADLINE, "the task's execution_timeout passed while the task was deferred"),
    (Verdict.WAIT_FAILED, "Waiting for Volcano Job ml/train failed: x"),
    (Verdict.DELETED, "x while the task waited"),
])
def test_a_wait_that_failed_leaves_the_job_to_the_caller(verdict, says):
    """What becomes of the Job then depends on the task instance (a later try reattaches, else the
    Job is deleted if it still runs): the operator settles it, not finalize."""
    hook = Hook()
    message = "the task's execution_timeout passed" if verdict is Verdict.DEADLINE else "x"
    with pytest.raises(VolcanoJobError, match=says):
        finalize(hook, REF, ended(verdict, message=message), on_finish_action=OnFinishAction.DELETE_JOB)
    assert hook.done == []


def test_a_job_the_task_does_not_own_is_never_deleted_nor_labelled():
    """The sensor waits on anyone's Job."""
    hook = Hook()
    theirs = JobRef(name="train", namespace="ml", owned=False)
    finalize(hook, theirs, ended(Verdict.FINISHED, "Completed"), on_finish_action=OnFinishAction.DELETE_JOB)
    with pytest.raises(VolcanoJobError):
        finalize(hook, theirs, ended(Verdict.CANNOT_START, message="x"), on_finish_action=OnFinishAction.KEEP_JOB)
    assert hook.done == []


def test_a_kill_leaves_a_job_a_later_try_reattached_to_and_deletes_one_its_try_still_owns():
    """Issue 41: a cleared deferred task's on_kill delete, retried for seconds, landed on the Job the next
    try had just reattached to. A try deletes its Job only while it owns it (the try-number label a
    reattaching try sets), compared and deleted as one (uid and resourceVersion)."""
    from airflow_volcano.ownership import delete_job_and_script

    hook = Hook()
    mine = dataclasses.replace(REF, owner_try=1)
    hook.job["metadata"]["labels"]["airflow-volcano.io/try-number"] = "2"  # try 2 reattached
    delete_job_and_script(hook, mine)
    assert hook.done == [], "neither the Job nor its script: try 2's now"
    hook.job["metadata"]["labels"]["airflow-volcano.io/try-number"] = "1"
    delete_job_and_script(hook, mine)
    assert hook.done == ["delete Job ml/train", "delete ConfigMap ml/train-script"]


def test_a_kill_by_an_identity_that_may_delete_jobs_but_not_read_them_deletes_by_uid():
    """A Role cut down to `delete` on Jobs (test_cleanup: the wait lost its read permission, no try left):
    the ownership check cannot read the Job, so the delete carries its uid alone."""
    from airflow_volcano.exceptions import VolcanoApiError
    from airflow_volcano.hooks import calls

    program = calls.delete_owned_job("train", "ml", "u1", 1)
    step = next(program)
    assert step.what == "get Job ml/train"
    step = program.throw(VolcanoApiError(step.what, 403, "Forbidden", "cannot get resource jobs"))
    assert step.what == "delete Job ml/train" and step.kwargs["body"] == {"preconditions": {"uid": "u1"}}
    with pytest.raises(StopIteration) as done:
        program.send(True)
    assert done.value.value == "deleted"
