"""A hung distributed training, on the real node: real processes stuck in a real gloo all_reduce,
their Python stacks asked for through the pods' annotations and printed by faulthandler, the Job
failed or restarted by the operator (stall_timeout, stall_action); a quiet script kept alive by
its heartbeat."""

from __future__ import annotations

import re
import time

import pytest

from .test_real_pods import real_operator, script

HANGS = """
    import os, pathlib, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    marker = pathlib.Path("/state/hung-once")
    print(f"rank {rank} of {dist.get_world_size()} starts", flush=True)
    hang_once = os.environ.get("HANG_ONCE")  # then only the first attempt hangs
    if rank == 1 and not (hang_once and marker.exists()):
        if hang_once:
            marker.touch()
        time.sleep(3600)  # rank 1 never reaches the all_reduce
    dist.all_reduce(torch.ones(1))
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
"""
# Line numbers in the shipped file (script() keeps the leading empty line).
SLEEP_LINE, REDUCE_LINE = (next(number for number, line in enumerate(HANGS.splitlines(), 1) if code in line)
                           for code in ("time.sleep(3600)", "dist.all_reduce"))


def state_volume(tmp_path) -> dict:
    state = tmp_path / "state"
    state.mkdir()
    return {"volumes": [{"name": "state", "hostPath": {"path": str(state), "type": "Directory"}}],
            "volume_mounts": [{"name": "state", "mountPath": "/state"}]}


def wait_for_no_pods(cluster, job: str, seconds: float = 90) -> list[str]:
    deadline = time.monotonic() + seconds
    while (pods := [pod.metadata.name for pod in cluster.pods(job)]) and time.monotonic() < deadline:
        time.sleep(1)
    return pods


@pytest.mark.parametrize(("launcher", "deferrable"), [("python", False), ("python", True), ("torchrun", True)],
                         ids=["python-worker", "python-deferred", "torchrun-deferred"])
def test_a_hang_is_caught_with_every_ranks_stack_and_the_job_deleted(cluster, operator_kubeconfig, run_task,
                                                                      real_node, tmp_path, launcher, deferrable):
    """Rank 1 sleeps before all_reduce while the others wait in it: no output for stall_timeout (1
    minute). The task log shows each process's stack under its pod (the others in all_reduce, rank 1
    at its sleep), the task fails saying it stalled, and nothing is left running."""
    torchrun = {"launcher": "torchrun", "nproc_per_node": 2} if launcher == "torchrun" else {}
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "hang", training_script=script(tmp_path, HANGS),
                                         stall_timeout=1, job_timeout=240, deferrable=deferrable,
                                         **torchrun, **state_volume(tmp_path)))

    assert run.state == "failed", run.log
    assert f"Volcano Job {cluster.namespace}/hang stalled: no output for 1 minute; where each process was: " in run.log
    assert "job_timeout" not in run.log.split("stalled: no output")[0][-300:], "caught by the stall, not the timeout"
    ranks = 6 if torchrun else 3
    # Each rank's main thread, under its pod: rank 1 at the script's sleep, every other in all_reduce.
    where = dict(re.findall(r"(hang-\w+-\d \(pid \d+, RANK=\d+(?: LOCAL_RANK=\d)?)\) in ([^;\n]*)", run.log))
    by_rank = {int(re.search(r"RANK=(\d+)(?: LOCAL_RANK=\d)", who).group(1)) if torchrun else
               int(re.search(r"RANK=(\d+)", who).group(1)): (who, text)
               for who, text in where.items() if not torchrun or "LOCAL_RANK" in who}
    assert sorted(by_rank) == list(range(ranks)), run.log
    assert by_rank[1][1] == f"<module> (train.py:{SLEEP_LINE})", by_rank[1]
    for rank in set(by_rank) - {1}:
        who, text = by_rank[rank]
        assert "all_reduce" in text and text.endswith(f"from train.py:{REDUCE_LINE} in <module>"), (who, text)
    # The stacks themselves, every thread, each line under its pod.
    assert re.search(r"\[hang-master-0\] process \d+, RANK=0", run.log), run.log
    assert re.search(rf'\[hang-worker-0\]     File "/[^"]*train.py", line {SLEEP_LINE} in <module>', run.log) or \
        torchrun, run.log
    assert "[airflow-volcano] stacks " not in run.log, "the raw lines are shown once, in the report"
    assert wait_for_no_pods(cluster, "hang") == [], "the stalled Job's pods are gone"


def test_stall_action_restart_restarts_the_gang_and_the_second_attempt_trains(cluster, operator_kubeconfig, run_task,
                                                                               real_node, tmp_path):
    """A hang only on the first attempt (a marker on a hostPath): the stall restarts the gang
    (Volcano's RestartJob, one of max_retry), and the task succeeds."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "once", training_script=script(tmp_path, HANGS),
                                         stall_timeout=1, stall_action="restart", job_timeout=300,
                                         env={"HANG_ONCE": "1"}, **state_volume(tmp_path)))

    assert run.state == "success", run.log
    assert "stalled: no output for 1 minute; restarting the gang (stall_action='restart')" in run.log
    assert re.search(r"\[once-worker-0\] process \d+, RANK=1", run.log), "the stacks came first"
    assert run.log.count("restarting the gang") == 1, "one stall, one restart"
    # Volcano counts the RestartJob, and may count once more the exit code 143 of the pods it kills
    # for it (a retryable code): a stall's restart takes one or two of max_retry.
    assert run.xcom["return_value"]["retry_count"] in (1, 2), run.xcom["return_value"]
    assert run.log.count("[once-master-0] rank 0 done") == 1


QUIET = """
    import os, pathlib, time
    print("loading a large dataset quietly", flush=True)
    for _ in range(9):  # 3 minutes without a line, touching the heartbeat every 20 s
        time.sleep(20)
        pathlib.Path(os.environ["HEARTBEAT_FILE"]).touch()
    print("done", flush=True)
"""


def test_a_quiet_script_that_keeps_its_heartbeat_is_not_a_stall(cluster, operator_kubeconfig, run_task, real_node,
                                                                  tmp_path):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "quiet", training_script=script(tmp_path, QUIET),
                                         worker_replicas=0, stall_timeout=1, job_timeout=300))

    assert run.state == "success", run.log
    assert "[quiet-master-0] done" in run.log
    assert "stall" not in run.log.lower().replace("stall_timeout", ""), run.log
    assert "heartbeat" not in run.log, "heartbeats count as output but are not shown"


# A rank that only redraws a progress bar (`\r`, never a newline) for 50 s: pdsh and the runtime pass
# on no line of it. Its bytes go through its worker's output relay (the ssh session's), which touches
# that worker's heartbeat file, and the worker's shell prints a heartbeat line every 10 s.
PROGRESS_ONLY = """
    import os, sys, time
    begun = time.monotonic()
    while time.monotonic() - begun < 50:
        sys.stderr.write(f"\\r{time.monotonic() - begun:5.1f} s {'#' * int(time.monotonic() - begun)}")
        sys.stderr.flush()
        time.sleep(0.5)
    print(f"rank {os.environ.get('RANK')} done", flush=True)
"""


def test_a_deepspeed_ranks_progress_bar_makes_heartbeats_on_its_worker(cluster, operator_kubeconfig, run_task,
                                                                       real_node, tmp_path):
    """The worker pod's own log (its sshd's container), read while it runs, gets a heartbeat line every
    10 s while its rank writes nothing but `\\r`-redrawn progress. (sshd's own login messages, at the
    start, make one or two: the rank's 50 s of progress make at least four.)"""
    import threading

    from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

    seen: dict[str, str] = {}
    done = threading.Event()

    def read_the_workers_log() -> None:
        while not done.wait(2):
            try:
                seen["log"] = cluster.pod_log("prog-worker-0")
            except Exception as error:  # noqa: BLE001 - not started yet, or gone
                seen["error"] = repr(error)

    reader = threading.Thread(target=read_the_workers_log, daemon=True)
    reader.start()
    try:
        run = run_task(lambda: VolcanoDeepSpeedJobOperator(
            task_id="train", name="prog", namespace=cluster.namespace, worker_replicas=1,
            training_script=script(tmp_path, PROGRESS_ONLY), stall_timeout=10, container_resources={
                "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=False, **real_node))
    finally:
        done.set()
        reader.join(timeout=30)

    assert run.state == "success", run.log
    assert "rank 0 done" in run.log, run.log
    assert seen.get("log", "").count("[airflow-volcano] heartbeat") >= 4, seen
