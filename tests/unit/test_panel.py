"""The Volcano Job panel's data (pure) and its cache (one read per period, however many viewers)."""

from __future__ import annotations

import asyncio
import json

from airflow_volcano.goodput import RunTimeline
from airflow_volcano.masking import JobSecrets
from airflow_volcano.panel.app import Cache
from airflow_volcano.panel.view import log_tail, panel, pod_rows, progress_from_log

from .test_goodput import T0, at, job


def failed(name: str, task: str, code: int, finished: str) -> dict:
    return {"metadata": {"name": name, "labels": {"volcano.sh/task-spec": task}},
            "spec": {"nodeName": "gpu-3"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": task, "restartCount": 0, "state": {
                "terminated": {"exitCode": code, "reason": "Error", "startedAt": at(5), "finishedAt": finished}}}]}}


def test_the_pod_that_failed_first_is_marked_and_each_pod_says_where_and_how_it_ended():
    rows = pod_rows([failed("t-master-0", "master", 1, at(60)), failed("t-worker-0", "worker", 137, at(59))],
                    "master")
    assert [(row["name"], row["first_failure"]) for row in rows] == [("t-master-0", False), ("t-worker-0", True)]
    assert rows[1] | {"first_failure": True} == {
        "name": "t-worker-0", "task": "worker", "phase": "Failed", "node": "gpu-3", "restarts": 0, "exit_code": 137,
        "reason": "Error", "started": T0 + 5, "finished": T0 + 59, "first_failure": True}


def test_a_log_tail_is_escaped_masked_and_without_the_providers_own_lines():
    secrets = JobSecrets()
    secrets.add([("HF_TOKEN", "hf_s3cr3t_value")])
    raw = (f"{at(1)[:-1]}.000000001Z loaded hf_s3cr3t_value\n"
           f"{at(2)[:-1]}.000000001Z [airflow-volcano] heartbeat\n"
           f"{at(3)[:-1]}.000000001Z \x1b[31mred\r\n").encode()
    assert log_tail("p", raw, secrets.redact) == {"pod": "p", "lines": ["loaded ***", "\\x1b[31mred"]}


def test_progress_is_read_from_the_main_pods_recent_lines():
    raw = "".join(f"{at(second)[:-1]}.000000001Z [airflow-volcano] progress {second * 2}/100 steps\n"
                  for second in range(10)).encode()
    progress = progress_from_log(raw)
    assert progress is not None and progress.done == 18 and progress.rate == 2.0
    assert progress_from_log(b"no progress here\n") is None


def test_the_panel_of_a_running_job_counts_its_time_to_now_and_is_json():
    running = job(("Pending", 0), ("Running", 30))
    running["metadata"].update(name="train", namespace="ml", uid="u1")
    shown = panel(job=running, pods=[], main_task="master", now=T0 + 90, timeline=RunTimeline(placed={"0": T0 + 20}),
                  failure="boom hf_s3cr3t_value", redact=lambda text: text.replace("hf_s3cr3t_value", "***"))
    assert shown["job"]["name"] == "train" and shown["job"]["age_seconds"] == 90
    assert [step["phase"] for step in shown["job"]["timeline"]] == ["Pending", "Running"]
    assert shown["goodput"]["wall_seconds"] == 90 and shown["goodput"]["running_seconds"] == 60
    assert shown["failure"] == "boom ***"
    json.dumps(shown)


def test_fifty_viewers_at_once_cost_one_read_per_period():
    reads = 0

    async def read() -> int:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        return reads

    async def viewers() -> list[int]:
        cache = Cache(seconds=60)
        return await asyncio.gather(*(cache.get(("conn", "ml", "train"), read) for _ in range(50)))

    assert asyncio.run(viewers()) == [1] * 50 and reads == 1


def test_the_panels_progress_is_read_from_the_newest_lines_of_a_long_log():
    """Issue 41: the panel computed progress from the log's first 256 KiB, so a long run showed its start.
    The kubelet cuts a tail at limitBytes from the tail's oldest line: a tail that fills it is read again
    shorter, so the newest lines are always read."""
    from airflow_volcano.panel.data import newest_lines
    from airflow_volcano.panel.view import progress_from_log

    lines = [f"2026-11-27T10:{step // 60:02d}:{step % 60:02d}Z {'x' * 200} [airflow-volcano] progress {step}/3000 "
             "steps" for step in range(3000)]

    class Hook:
        asked: list[int] = []

        def run(self, call):
            query = dict(call.kwargs["query_params"])
            tail, limit = int(query["tailLines"]), int(query["limitBytes"])
            self.asked.append(tail)
            return "".join(line + "\n" for line in lines[-tail:]).encode()[:limit]

    hook = Hook()
    progress = progress_from_log(newest_lines(hook, "train-master-0", "ml"))
    assert progress is not None and progress.done == 2999, progress
    assert hook.asked == [2000, 250], "the 2,000-line tail filled 256 KiB: read again, shorter"
