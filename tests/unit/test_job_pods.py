"""A Job's pods as the trigger sees them through the shared pod watch (`JobPods`)."""

from __future__ import annotations

import asyncio

from airflow_volcano.status import describe_progress, job_state, waited_view
from airflow_volcano.triggers.job_watch import RESYNC, WATCH_BROKEN, Changes, JobPods


def pod(name: str, version: int, phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "resourceVersion": str(version)}, "status": {"phase": phase}}


def phases(pods: list[dict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"]["phase"] for p in pods}


class Lister:
    """The trigger's list of its Job's pods: counts the calls, answers what the apiserver has."""

    def __init__(self, *answers: list[dict]) -> None:
        self.answers, self.calls = list(answers), 0

    async def __call__(self) -> list[dict]:
        self.calls += 1
        return self.answers.pop(0)


def test_lists_once_then_follows_changes_without_requests():
    async def scenario() -> tuple[list[dict], list[dict], int]:
        changes = Changes()
        changes.put(RESYNC)  # what a starting pod watch sends
        lister = Lister([pod("j-master-0", 10)])
        pods = JobPods(changes, lister)
        first = await pods.current()
        changes.put(("ADDED", pod("j-worker-0", 11)))
        changes.put(("MODIFIED", pod("j-master-0", 12, "Running")))
        second = await pods.current()
        return first, second, lister.calls

    first, second, calls = asyncio.run(scenario())
    assert phases(first) == {"j-master-0": "Pending"}
    assert phases(second) == {"j-master-0": "Running", "j-worker-0": "Pending"}
    assert calls == 1


def test_a_change_older_than_the_list_does_not_undo_it():
    async def scenario() -> list[dict]:
        changes = Changes()
        pods = JobPods(changes, Lister([pod("j-master-0", 20, "Running")]))
        await pods.current()
        changes.put(("MODIFIED", pod("j-master-0", 15, "Pending")))  # sent before the list was answered
        return await pods.current()

    assert phases(asyncio.run(scenario())) == {"j-master-0": "Running"}


def test_deleted_pods_leave_and_a_resync_lists_again():
    async def scenario() -> tuple[list[dict], int]:
        changes = Changes()
        lister = Lister([pod("j-master-0", 1), pod("j-worker-0", 2)], [pod("j-master-0", 9, "Running")])
        pods = JobPods(changes, lister)
        await pods.current()
        changes.put(("DELETED", pod("j-worker-0", 3)))
        after_delete = await pods.current()
        changes.put(RESYNC)  # the watch restarted (410 Gone): changes may have been missed
        after_resync = await pods.current()
        return after_delete + [{"metadata": {"name": "-"}, "status": {"phase": "-"}}] + after_resync, lister.calls

    seen, calls = asyncio.run(scenario())
    assert [p["metadata"]["name"] for p in seen] == ["j-master-0", "-", "j-master-0"]
    assert seen[-1]["status"]["phase"] == "Running" and calls == 2


def test_a_broken_shared_watch_makes_each_check_list_the_pods_itself():
    """The shared watch failing (a token to read again, a permission taken away) fails no wait:
    the trigger lists its own pods, and its own list fails or not."""
    async def scenario() -> tuple[list[dict], int]:
        changes = Changes()
        lister = Lister([pod("j-master-0", 10)], [pod("j-master-0", 12, "Running")])
        pods = JobPods(changes, lister)
        await pods.current()
        changes.put(WATCH_BROKEN)
        return await pods.current(), lister.calls

    current, calls = asyncio.run(scenario())
    assert phases(current) == {"j-master-0": "Running"} and calls == 2


def test_changes_wakes_a_waiting_getter_in_order():
    async def scenario() -> list[object]:
        changes = Changes()
        getter = asyncio.ensure_future(changes.get())
        await asyncio.sleep(0)
        changes.put("a")
        changes.put("b")
        return [await getter, await changes.get(), changes.ready()]

    assert asyncio.run(scenario()) == ["a", "b", False]


def test_the_waited_view_keeps_what_waiting_reads_and_drops_the_rest():
    job = {
        "metadata": {"name": "j", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                     "creationTimestamp": "2026-11-23T10:00:00Z", "managedFields": [{"manager": "x"}],
                     "annotations": {"big": "x" * 1000}},
        "spec": {"maxRetry": 3, "policies": [{"event": "PodFailed", "action": "RestartJob"}],
                 "priorityClassName": "nightly", "schedulerName": "volcano",
                 "tasks": [{"name": "master", "replicas": 1, "template": {"spec": {"containers": [{}]}}},
                           {"name": "worker", "replicas": 2, "template": {}}]},
        "status": {"state": {"phase": "Running"}, "running": 3, "retryCount": 1,
                   "conditions": [{"status": "Pending"}, {"status": "Running"}]},
    }
    view = waited_view(job)
    assert view == {
        "metadata": {"name": "j", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                     "creationTimestamp": "2026-11-23T10:00:00Z"},
        "spec": {"maxRetry": 3, "policies": [{"event": "PodFailed", "action": "RestartJob"}],
                 "priorityClassName": "nightly",
                 "tasks": [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 2}]},
        "status": {"state": {"phase": "Running"}, "running": 3, "retryCount": 1},
    }
    assert job_state(view) == job_state(job) and describe_progress(view) == describe_progress(job)
    assert waited_view(None) is None


def test_a_failed_pod_is_remembered_after_volcano_removes_it():
    """Volcano deletes the pods still running when it ends a Job: the failure report needs the last
    failed state of each, seen before it went, even between two looks at the pods."""
    def failed(name: str, version: int, message: str) -> dict:
        body = pod(name, version, "Failed")
        body["status"]["containerStatuses"] = [{"name": "worker", "state": {"terminated": {
            "exitCode": 1, "reason": "Error", "message": message, "finishedAt": "2026-11-24T10:02:03Z"}}}]
        return body

    async def scenario() -> tuple[list[dict], dict[str, dict]]:
        changes = Changes()
        pods = JobPods(changes, Lister([pod("j-master-0", 1, "Running"), pod("j-worker-0", 2, "Running")]))
        await pods.current()
        changes.put(("MODIFIED", failed("j-worker-0", 3, "Traceback\nValueError: bad shard\n")))
        changes.put(("DELETED", failed("j-worker-0", 4, "Traceback\nValueError: bad shard\n")))
        return await pods.current(), pods.failed

    current, remembered = asyncio.run(scenario())
    assert phases(current) == {"j-master-0": "Running"}
    terminated = remembered["j-worker-0"]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert list(remembered) == ["j-worker-0"] and terminated["message"].endswith("ValueError: bad shard\n")
