"""Operator arguments that are refused at DAG parse, before any template is rendered."""

from __future__ import annotations

import pytest

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator


@pytest.mark.parametrize("operator", [VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator])
def test_master_worker_operators_follow_the_master_and_say_so(operator):
    with pytest.raises(TypeError, match=f"{operator.__name__}: the main task is the master; set master_task_name"):
        operator(task_id="t", main_task="worker")


@pytest.mark.parametrize("argument", ["full_job_spec", "command"])
def test_deepspeed_operator_builds_the_commands_itself(argument):
    with pytest.raises(TypeError, match=f"builds the pods' commands: {argument} cannot be given"):
        VolcanoDeepSpeedJobOperator(task_id="t", **{argument: {"kind": "Job"} if argument == "full_job_spec"
                                                    else ["deepspeed", "train.py"]})


def test_deepspeed_arguments_are_template_fields():
    fields = VolcanoDeepSpeedJobOperator.template_fields
    assert {"slots_per_worker", "launcher_options", "worker_replicas", "args", "env"} <= set(fields)
    assert "nproc_per_node" not in fields, "torchrun's arguments are the PyTorch operator's"


class _TaskInstance:
    """What on_kill reads of the running task instance: its tries and its state on the API server."""

    dag_id, task_id, run_id, map_index = "d", "train", "r", -1

    def __init__(self, try_number: int, max_tries: int, state: str | Exception) -> None:
        self.try_number, self.max_tries, self._state = try_number, max_tries, state

    def get_task_states(self, **_: object) -> dict:
        if isinstance(self._state, Exception):
            raise self._state
        return {self.run_id: {self.task_id: self._state}}


@pytest.mark.parametrize(("try_number", "max_tries", "state", "deleted"), [
    (1, 1, "running", False),                        # a worker stops, the retry reattaches
    (1, 1, "up_for_retry", False),                   # its worker pod deleted, the scheduler failed the try first
    (1, 1, "failed", True),                          # a user marked the task failed
    (1, 1, "none", True),                            # ... or cleared it
    (1, 1, TimeoutError("read timed out"), False),   # cannot tell, and a retry would reattach: not on a guess
    (2, 1, "running", True),                         # the last try: nobody would watch the Job again
    (2, 1, TimeoutError("read timed out"), True),
    (2, 1, "up_for_retry", True),
], ids=["retry-reattaches", "worker-lost-try-failed-first", "marked-failed", "cleared", "unreadable-try-left",
        "last-try", "unreadable-last-try", "last-try-up-for-retry"])
def test_on_kill_deletes_the_job_only_when_no_later_try_will_watch_it(monkeypatch, try_number, max_tries, state,
                                                                       deleted):
    from airflow_volcano.job_ref import JobRef

    from .test_finalize import Hook

    hook = Hook()
    monkeypatch.setattr(VolcanoPyTorchJobOperator, "hook", property(lambda _: hook))
    operator = VolcanoPyTorchJobOperator(task_id="train", name="train", namespace="ml")
    operator._ownership.ref = JobRef(name="train", namespace="ml", uid="u1", script_configmap=None)
    operator._ownership.ti = _TaskInstance(try_number, max_tries, state)
    operator.on_kill()
    assert ("delete Job ml/train" in hook.done) == deleted, hook.done


@pytest.mark.parametrize(("state", "stopped", "deleted"), [
    ("running", False, False),                       # the deferral goes on
    ("failed", True, True),                          # marked failed since the last heartbeat: Airflow would refuse it
    ("none", True, True),                            # cleared
    ("up_for_retry", True, False),                   # the scheduler failed this try: the next one reattaches
    (TimeoutError("read timed out"), False, False),  # unknown is no kill: the task defers
], ids=["running", "marked-failed", "cleared", "try-failed-by-the-scheduler", "unreadable"])
def test_a_task_about_to_defer_that_is_no_longer_running_settles_its_job_instead(monkeypatch, state, stopped,
                                                                                  deleted):
    from airflow_volcano.exceptions import VolcanoJobError
    from airflow_volcano.job_ref import JobRef

    from .test_finalize import Hook

    hook = Hook()
    monkeypatch.setattr(VolcanoPyTorchJobOperator, "hook", property(lambda _: hook))
    operator = VolcanoPyTorchJobOperator(task_id="train", name="train", namespace="ml", deferrable=True)
    ref = JobRef(name="train", namespace="ml", uid="u1", script_configmap=None)
    operator._ownership.ref = ref
    operator._ownership.ti = _TaskInstance(1, 1, state)
    stop = operator._ownership.stop_if_ended_on_server
    who = ("the scheduler failed this try, its worker reported lost; the next try reattaches"
           if state == "up_for_retry" else "a user marked it, or cleared it")
    if stopped:
        with pytest.raises(VolcanoJobError) as raised:
            stop(ref, operator.on_kill, operator.on_kill_action, operator.log)
        assert str(raised.value) == (f"The task instance is {state} on the server ({who}) as it was about to defer: "
                                     "Airflow would run no trigger for Volcano Job ml/train")
    else:
        stop(ref, operator.on_kill, operator.on_kill_action, operator.log)
    assert ("delete Job ml/train" in hook.done) == deleted, hook.done


def test_each_try_runs_from_a_copy_with_its_own_ownership():
    """Airflow runs each try from a shallow copy of the task (`prepare_for_execution`): in one process
    (dag.test, a retry in the same worker) the second try's copy must not inherit the first's kill, or
    it refuses to run ("killed while it was starting"; found by the execution_timeout retry test)."""
    from airflow_volcano.job_ref import JobRef

    task = VolcanoPyTorchJobOperator(task_id="train", image="img", worker_replicas=1, training_script="x.py")
    first = task.prepare_for_execution()
    first._ownership.watching(JobRef(name="train", namespace="ml"))
    first._ownership.kill_requested = True  # the first try timed out: on_kill ran
    second = task.prepare_for_execution()
    assert second._ownership is not first._ownership
    assert not second._ownership.kill_requested and second._ownership.ref is None
    second._ownership.stop_if_killed(lambda: pytest.fail("no kill to settle"))  # runs on
    with pytest.raises(Exception, match="killed while it was starting"):
        first._ownership.stop_if_killed(lambda: None)
