"""The two drivers of the wait engine, against a scripted cluster (no apiserver): the worker's blocking
loop (wait_worker) and the trigger's asyncio one carry out the same actions with the same programs
(wait_steps), so the same scenario ends the same way in both."""

from __future__ import annotations

import asyncio
import time
import unittest.mock
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.calls import Program, Sleep
from airflow_volcano.job_ref import JobRef
from airflow_volcano.waiting.events import Verdict
from airflow_volcano.waiting.wait_engine import OutputClock, WaitLimits

from .test_status import job

REF = JobRef(name="train", namespace="ml", uid="job-uid", created_at=1000.0)


def lost_pod(name: str, uid: str) -> dict:
    """A Running pod of the Job, marked not ready by the node controller (its node stopped answering), and
    being evicted by the cluster."""
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": "5", "ownerReferences": [{"uid": "job-uid"}],
                         "labels": {"volcano.sh/task-spec": "worker"},
                         # The taint manager's eviction (its toleration ran out), which the silent kubelet
                         # cannot finish.
                         "deletionTimestamp": "2026-11-24T17:26:06Z"},
            "spec": {"nodeName": "gpu-7", "containers": [{"name": "worker"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                                                           "lastTransitionTime": "2026-11-24T17:21:06Z"}],
                       "containerStatuses": [{"name": "worker", "ready": True, "state": {"running": {}}}]}}


class Cluster:
    """What the scripted apiserver holds and answers, and every call it was asked (by its words)."""

    def __init__(self, jobs: list[dict], pods: list[dict]) -> None:
        self.jobs, self.pods, self.asked = list(jobs), pods, []
        self.clock = 1000.0
        self.refuse_deletes = False
        self.podgroups: list[dict] = []
        self.queues: dict[str, dict] = {}
        self.unserved = 0  # this many reads of the Job meet a resource the apiserver does not serve
        self.read_after: dict | None = None  # what a read of the Job returns once it is served again

    def answer(self, call: calls.Call[Any]) -> Any:
        self.asked.append(call.what)
        if call.what == "read the apiserver's clock":
            return "Thu, 01 Jan 1970 00:16:40 GMT"  # epoch 1000
        if call.what.startswith("get Job"):
            if self.unserved:
                self.unserved -= 1
                raise VolcanoApiError(call.what, 404, "Not Found", "the server could not find the requested resource",
                                      not_served=True)
            return self.read_after or self.jobs[0]
        if call.what.startswith("list pods of Job"):
            return self.pods
        if call.what.startswith("delete pod"):
            if self.refuse_deletes:
                raise VolcanoApiError(call.what, 403, "Forbidden", "pods is forbidden")
            return True
        if call.what.startswith("get PodGroup"):
            return self.podgroups[0] if self.podgroups else None
        if call.what.startswith("list PodGroups"):
            return self.podgroups
        if call.what.startswith("get Queue"):
            return self.queues.get(call.args[-1])
        if call.what.startswith("list PriorityClasses"):
            return []
        if call.what.startswith("list events"):
            return []
        raise AssertionError(f"unexpected call: {call.what}")

    def drive(self, program: Program[Any]) -> Any:
        answer, error = None, None
        while True:
            try:
                step = program.throw(error) if error is not None else program.send(answer)
            except StopIteration as finished:
                return finished.value
            answer, error = None, None
            if isinstance(step, Sleep):
                self.clock += step.seconds
                continue
            try:
                answer = self.answer(step)
            except Exception as failure:  # noqa: BLE001
                error = failure

    def next_job(self) -> dict:
        if len(self.jobs) > 1:
            self.jobs.pop(0)
        return self.jobs[0]


class SyncHook:
    """The worker's hook, scripted: each watch delivers the next state of the Job."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def get_job(self, name: str, namespace: str) -> dict:
        return self.cluster.answer(calls.get_job(name, namespace))

    def list_job_pods(self, name: str, namespace: str) -> list[dict]:
        return self.cluster.answer(calls.list_job_pods(name, namespace))

    def drive(self, program: Program[Any]) -> Any:
        return self.cluster.drive(program)

    def run(self, call: calls.Call[Any]) -> Any:
        return self.cluster.answer(call)

    def watch_job(self, name: str, namespace: str, **kwargs: Any) -> Iterator[tuple[str, dict]]:
        def changes() -> Iterator[tuple[str, dict]]:
            yield "MODIFIED", self.cluster.next_job()

        return changes()


class AsyncHook:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def run(self, call: calls.Call[Any]) -> Any:
        return self.cluster.answer(call)

    async def drive(self, program: Program[Any]) -> Any:
        return self.cluster.drive(program)


def worker_wait(cluster: Cluster, limits: WaitLimits) -> Any:
    from airflow_volcano.waiting import wait_worker

    clock = iter(range(1000, 100000, 10))
    return wait_worker._drive(SyncHook(cluster), REF, limits, lambda: float(next(clock)), lambda line: None,
                              OutputClock(), ())


def trigger_wait(cluster: Cluster, limits: WaitLimits) -> Any:
    from airflow_volcano.observability.masking import JobSecrets
    from airflow_volcano.triggers.job import VolcanoJobTrigger
    from airflow_volcano.triggers.job_watch import Changes, JobPods

    trigger = VolcanoJobTrigger(REF.to_dict(), "kubernetes_default", limits=limits.to_dict())
    trigger._secrets = JobSecrets()
    hook = AsyncHook(cluster)

    async def scenario() -> Any:
        changes = Changes()
        for state in cluster.jobs[1:]:
            changes.put(state)
        pods = JobPods(Changes(), lambda: hook.run(calls.list_job_pods(REF.name, REF.namespace)))
        return await trigger._drive(hook, REF, cluster.jobs[0], changes, pods, OutputClock(), [])

    async def one_change(engine: Any, changes: Any, seconds: float) -> Any:
        """Each watch delivers the next state of the Job, then ends (as SyncHook.watch_job)."""
        if changes.ready() and (action := engine.job_changed(changes.get_nowait(), time.monotonic())) is not None:
            return action
        return engine.watch_ended(time.monotonic())

    # The trigger's clock (time.monotonic), ten seconds a look, as the worker's above.
    clock = iter(range(1000, 100000, 10))
    with unittest.mock.patch("airflow_volcano.triggers.job.time.monotonic", lambda: float(next(clock))), \
            unittest.mock.patch("airflow_volcano.triggers.job._follow", one_change):
        return asyncio.run(scenario())


@pytest.mark.parametrize("wait", [worker_wait, trigger_wait], ids=["worker", "trigger"])
def test_both_drivers_follow_a_job_to_its_end(wait):
    cluster = Cluster([job("Running", running=3), job("Completed", succeeded=3)], [])
    outcome = wait(cluster, WaitLimits(node_lost_timeout=None))
    assert outcome.verdict is Verdict.FINISHED and outcome.phase == "Completed"


@pytest.mark.parametrize("wait", [worker_wait, trigger_wait], ids=["worker", "trigger"])
def test_both_drivers_delete_a_lost_nodes_pods_exactly_as_they_were_seen(wait, monkeypatch):
    """node_lost_timeout passes: each driver runs the same program, a delete with the pod's uid as
    precondition and no grace period."""
    monkeypatch.setattr("airflow_volcano.status.parse_time", lambda value: None)
    pods = [lost_pod("train-worker-0", "uid-0")]
    cluster = Cluster([job("Running", running=1)] * 40 + [job("Failed", failed=1)], pods)
    outcome = wait(cluster, WaitLimits(node_lost_timeout=10))
    assert "delete pod ml/train-worker-0" in cluster.asked
    assert outcome.verdict is Verdict.FINISHED and outcome.lost_nodes == ("gpu-7",)


@pytest.mark.parametrize("wait", [worker_wait, trigger_wait], ids=["worker", "trigger"])
def test_both_drivers_read_a_waiting_jobs_queue_and_end_a_wait_that_can_never_start(wait, monkeypatch):
    """The worker reads the queue with its calls; the trigger from its shared caches (scripted here by the
    same program): either way the engine learns the gang needs more than the queue's capability."""
    from airflow_volcano.triggers.job_watch import JobQueueView

    async def snapshot(self: Any, queue: str, namespace: str, hook: Any) -> Any:
        return await hook.drive(calls.queue_snapshot(queue, namespace))

    async def podgroup(self: Any, job: dict) -> None:
        return None  # the cache cannot tell: the trigger reads it as the worker does

    monkeypatch.setattr(JobQueueView, "snapshot", snapshot)
    monkeypatch.setattr(JobQueueView, "podgroup", podgroup)
    pending = job("Pending", pending=2)
    pending["metadata"]["uid"] = "job-uid"
    cluster = Cluster([pending] * 5, [])
    cluster.podgroups = [{"metadata": {"name": "train-job-uid", "namespace": "ml", "uid": "pg-uid",
                                       "ownerReferences": [{"uid": "job-uid", "name": "train"}]},
                          "spec": {"queue": "small", "minResources": {"nvidia.com/gpu": "8"}},
                          "status": {"phase": "Pending"}}]
    cluster.queues = {"small": {"metadata": {"name": "small"}, "spec": {"capability": {"nvidia.com/gpu": "4"}},
                                "status": {"state": "Open"}}}
    outcome = wait(cluster, WaitLimits(poll_interval=5))
    assert outcome.verdict is Verdict.CANNOT_START
    assert outcome.message == ("Volcano Job ml/train can never start: it needs 8 nvidia.com/gpu; queue `small` can "
                               "never give it: its capability is 4 nvidia.com/gpu")


def test_the_programs_a_driver_runs_carry_the_uid_precondition():
    from airflow_volcano.waiting import wait_steps
    from airflow_volcano.waiting.wait_engine import PodRef

    program = wait_steps.delete_lost_pods("ml", [PodRef("train-worker-0", "uid-0")], lambda line: None)
    call = next(program)
    assert call.what == "delete pod ml/train-worker-0"
    assert call.kwargs["body"] == {"preconditions": {"uid": "uid-0"}, "gracePeriodSeconds": 0}


def test_a_restart_nobody_may_do_is_refused_with_the_apiservers_words():
    from airflow_volcano.waiting import wait_steps
    from airflow_volcano.waiting.wait_engine import PodRef

    cluster = Cluster([job("Running", running=1)], [])
    cluster.refuse_deletes = True
    refused = cluster.drive(wait_steps.restart_gang("ml", [PodRef("train-master-0", "u1")]))
    assert refused == "delete pod ml/train-master-0 failed: HTTP 403 Forbidden: pods is forbidden" + (
        ". The Airflow connection's identity lacks this permission: grant it (deploy/rbac.yaml lists every "
        "permission the provider needs)")
    cluster.refuse_deletes = False
    assert cluster.drive(wait_steps.restart_gang("ml", [PodRef("train-master-0", "u1")])) is None


def test_a_stack_read_is_capped_and_the_report_says_so():
    """Each read of a pod's log for its stacks asks the apiserver for at most STACKS_MAX_BYTES; a read
    that brings that much is said in the report (the stacks may lie past it)."""
    from airflow_volcano.waiting import wait_steps
    from airflow_volcano.waiting.stalls import STACKS_MAX_BYTES

    running = {"metadata": {"name": "train-master-0", "uid": "u1", "labels": {}},
               "spec": {"containers": [{"name": "master"}]}, "status": {"phase": "Running"}}
    asked: list[Any] = []
    reported: list[str] = []
    program = wait_steps.collect_stacks(REF, 60.0, reported.append, 123.0)
    answer: Any = None
    while True:
        try:
            step = program.send(answer)
        except StopIteration as finished:
            where, pods, lines = finished.value
            break
        asked.append(step)
        if isinstance(step, Sleep):
            answer = None
        elif step.what.startswith("list pods"):
            answer = [running]
        elif step.what.startswith("annotate"):
            answer = True
        else:
            query = dict(step.kwargs["query_params"])
            assert query["limitBytes"] == str(STACKS_MAX_BYTES)
            assert query["sinceTime"] == calls.since_time(123.0 - wait_steps.STACKS_READ_SLACK_SECONDS), (
                "from the request, however late read")
            answer = b"2026-11-24T10:00:00Z " + b"spam " * (STACKS_MAX_BYTES // 5)
    assert any(f"passed {STACKS_MAX_BYTES // 1024} KiB, the most read for stacks" in line for line in reported)
    assert pods and where == ""
    assert lines == reported[1:], "the report's lines, as shown (after the stall's notice), for the wait's outcome"


def test_a_kill_deletes_the_job_though_the_triggerer_cancels_the_trigger_again_meanwhile(monkeypatch):
    """Found by the chaos soak: a user's "Mark failed" of a deferred task; the trigger's on_kill was
    deleting the Job (retrying a refused token) when the triggerer cancelled it again, and the Job was
    left. The deletion now runs to its end (within ON_KILL_SECONDS) whatever cancels it meanwhile."""
    import contextlib

    from airflow_volcano.triggers.job import VolcanoJobTrigger

    trigger = VolcanoJobTrigger(JobRef(name="train", namespace="ml", uid="job-uid", script_configmap="train-script")
                                .to_dict(), "kubernetes_default", limits=WaitLimits().to_dict())
    done: list[str] = []

    class SlowHook:
        async def run(self, call: calls.Call[Any]) -> Any:
            await asyncio.sleep(0.3)  # a call retrying, as against a token the apiserver refuses
            done.append(call.what)
            if call.what.startswith("get ConfigMap"):
                return {"metadata": {"name": "train-script", "uid": "cm-uid", "ownerReferences": [{"uid": "job-uid"}]}}
            return True

        async def drive(self, program: Program[Any]) -> Any:
            answer = None
            while True:
                try:
                    step = program.send(answer)
                except StopIteration as finished:
                    return finished.value
                answer = await self.run(step)

    async def slow_hook() -> SlowHook:
        return SlowHook()

    monkeypatch.setattr(trigger, "_hook", slow_hook)

    async def user_kill() -> None:
        kill = asyncio.ensure_future(trigger.on_kill())
        for _ in range(4):  # the triggerer cancelling the trigger again and again
            await asyncio.sleep(0.1)
            kill.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await kill

    asyncio.run(user_kill())
    assert done == ["delete Job ml/train", "get ConfigMap ml/train-script", "delete ConfigMap ml/train-script"]


@pytest.mark.parametrize("wait", [worker_wait, trigger_wait], ids=["worker", "trigger"])
def test_both_drivers_wait_while_the_apiserver_does_not_serve_volcano_jobs(wait):
    """Issue 41: a 404 that names no object (Volcano's CRD unserved while it is upgraded) is "cannot see",
    never "deleted": the wait reads again after a back-off and goes on."""
    cluster = Cluster([job("Running", running=1)], [])
    cluster.unserved = 2
    cluster.read_after = job("Completed", succeeded=1)
    outcome = wait(cluster, WaitLimits(node_lost_timeout=None))
    assert outcome.verdict is Verdict.FINISHED and outcome.phase == "Completed"
    assert cluster.asked.count("get Job ml/train") == 3


def test_the_worker_keeps_watching_through_the_deletion_of_an_older_job_of_the_same_name():
    from airflow_volcano.waiting import wait_worker

    mine = job("Running", running=1)
    mine["metadata"]["uid"] = "job-uid"
    older = job("Failed", failed=1)
    older["metadata"]["uid"] = "older-uid"
    completed = job("Completed", succeeded=1)
    completed["metadata"]["uid"] = "job-uid"
    cluster = Cluster([mine], [])

    class Hook(SyncHook):
        def watch_job(self, name: str, namespace: str, **kwargs: Any) -> Iterator[tuple[str, dict]]:
            yield from [("DELETED", older), ("MODIFIED", completed)]

    clock = iter(range(1000, 100000, 10))
    outcome = wait_worker._drive(Hook(cluster), REF, WaitLimits(node_lost_timeout=None), lambda: float(next(clock)),
                                 lambda line: None, OutputClock(), ())
    assert outcome.verdict is Verdict.FINISHED and outcome.phase == "Completed"


# -- the one dispatch -------------------------------------------------------------------------------------


def test_both_drivers_dispatch_every_action_from_the_one_table():
    """Each action but Done has its step in wait_steps.STEPS, and each driver does every step (not abstract)."""
    import inspect
    import typing

    from airflow_volcano.triggers import job as trigger_job
    from airflow_volcano.waiting import wait_engine, wait_steps, wait_worker

    assert set(wait_steps.STEPS) == set(typing.get_args(wait_engine.Action)) - {wait_engine.Done}
    for driver, is_async in ((wait_worker._BlockingSteps, False), (trigger_job._AsyncSteps, True)):
        assert not inspect.isabstract(driver), driver
        for method in wait_steps.STEPS.values():
            assert inspect.iscoroutinefunction(getattr(driver, method.__name__)) is is_async, (driver, method)


def test_a_driver_lacking_a_step_fails_where_it_is_defined():
    from airflow_volcano.waiting import wait_steps

    with pytest.raises(TypeError, match="HalfDriver does not do the wait steps watch, reread"):
        class HalfDriver(wait_steps.DriverSteps[Any]):
            def read_clock(self, action: Any) -> Any: ...
            def check_pods(self, action: Any) -> Any: ...
            def read_queue(self, action: Any) -> Any: ...
            def delete_pods(self, action: Any) -> Any: ...
            def probe_output(self, action: Any) -> Any: ...
            def collect_stacks(self, action: Any) -> Any: ...
            def restart_job(self, action: Any) -> Any: ...


def test_an_action_is_dispatched_to_its_drivers_step():
    from airflow_volcano.waiting import wait_steps
    from airflow_volcano.waiting.wait_engine import Reread, Watch

    def doing(name: str) -> Any:
        return lambda self, action: f"{name}({action})"

    recorder = type("Recorder", (wait_steps.DriverSteps,), {method.__name__: doing(method.__name__)
                                                            for method in wait_steps.STEPS.values()})()
    assert wait_steps.step(recorder, Watch("7", 60)) == "watch(Watch(resource_version='7', seconds=60))"
    assert wait_steps.step(recorder, Reread(2.0)) == "reread(Reread(after=2.0))"
