"""The triggerer's shared watch of pods: starting Jobs see their pods change without listing them
at every check, on the real apiserver with kwok's simulated pods."""

from __future__ import annotations

import asyncio
from collections import Counter

from airflow_volcano.hooks import calls
from airflow_volcano.job_ref import JobRef
from airflow_volcano.triggers.job import VolcanoJobTrigger
from airflow_volcano.triggers.job_watch import JobPods, shared_job_watch, shared_pod_watch
from airflow_volcano.waiting.wait_engine import WaitLimits

from .jobs import pytorch_job


def test_pods_created_after_the_first_list_arrive_through_the_watch(cluster, operator_kubeconfig):
    """Listed once while the Job does not exist yet (no pods); its pods then appear, run and are
    seen Running through the watch alone."""
    connection = "kubernetes_default"
    seen: dict[str, object] = {}

    async def follow() -> None:
        jobs = shared_job_watch(connection, cluster.namespace)
        lists = 0

        async def list_pods() -> list[dict]:
            nonlocal lists
            lists += 1
            return await jobs.hook.run(calls.list_job_pods("late", cluster.namespace))

        async with jobs.subscribe("late"), shared_pod_watch(connection, cluster.namespace).subscribe("late") as changes:
            pods = JobPods(changes, list_pods)
            seen["first"] = await pods.current()
            await asyncio.to_thread(cluster.create_job, pytorch_job("late", workers=2, master_sim={"run-for": "60s"},
                                                                    worker_sim={"run-for": "60s"}))
            for _ in range(300):
                phases = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in await pods.current()}
                if len(phases) == 3 and set(phases.values()) == {"Running"}:
                    break
                await asyncio.sleep(0.2)
            seen["phases"], seen["lists"] = phases, lists
        seen["left"] = len(shared_pod_watch(connection, cluster.namespace).subscribers)

    asyncio.run(asyncio.wait_for(follow(), timeout=120))
    assert seen["first"] == []
    assert seen["phases"] == {"late-master-0": "Running", "late-worker-0": "Running", "late-worker-1": "Running"}
    assert seen["lists"] == 1, "the pods came through the watch, not through more lists"
    assert seen["left"] == 0


def test_deferred_jobs_that_cannot_pull_share_one_pod_watch(cluster, operator_kubeconfig, monkeypatch):
    """Twelve deferred Jobs whose pods cannot pull their image: each trigger reports the pull error
    (seen through the shared pod watch), lists its pods once, and the pod watch closes."""
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

    count = 12
    lists: Counter[str] = Counter()
    run = AsyncVolcanoHook.run

    async def counted(self: AsyncVolcanoHook, call: calls.Call) -> object:
        if call.what.startswith("list pods of Job "):
            lists[call.what.rpartition("/")[2]] += 1
        return await run(self, call)

    monkeypatch.setattr(AsyncVolcanoHook, "run", counted)
    connection = "kubernetes_default"
    names = [f"nopull-{i}" for i in range(count)]
    refs = []
    for name in names:
        body = pytorch_job(name, workers=0, master_sim={"outcome": "image-pull-error"})
        body["spec"]["tasks"] = body["spec"]["tasks"][:1]  # the master alone
        body["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["image"] = "registry.invalid/nope:1"
        refs.append(JobRef.from_job(cluster.create_job(body), "master").to_dict())

    async def wait_all() -> tuple[list, dict]:
        triggers = [VolcanoJobTrigger(ref, connection, get_logs=False,
                                      limits=WaitLimits(poll_interval=1, startup_timeout=120).to_dict())
                    for ref in refs]
        tasks = [asyncio.create_task(anext(trigger.run())) for trigger in triggers]
        await asyncio.sleep(0.5)
        pods = shared_pod_watch(connection, cluster.namespace)
        events = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        return [event.payload for event in events], {"watch_requests": pods.watch_requests,
                                                     "left": len(pods.subscribers)}

    payloads, seen = asyncio.run(wait_all())
    for name, payload in zip(names, payloads, strict=True):
        assert payload["verdict"] == "cannot_start", payload
        assert f"{name} cannot start" in payload["message"] and "registry.invalid/nope:1" in payload["message"]
        assert "ImagePullBackOff" in payload["message"], payload
    assert seen == {"watch_requests": 1, "left": 0}, seen
    assert lists == dict.fromkeys(names, 1), lists
