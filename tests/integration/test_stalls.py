"""A hung distributed training, on the real node: real processes stuck in a real gloo all_reduce,
their Python stacks asked for through the pods' annotations and printed by faulthandler, the Job
failed or restarted by the operator (stall_timeout, stall_action); a quiet script kept alive by
its heartbeat."""

from __future__ import annotations

import datetime
import re
import threading
import time

import pytest

from .real_node import real_operator, script

HANGS = """
    import os, pathlib, threading, time

    def starting():
        while not started.wait(5):
            print("starting", flush=True)

    started = threading.Event()
    threading.Thread(target=starting, daemon=True).start()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    started.set()
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
    os._exit(0)
"""
# Until the group is up (every rank started: init_process_group waits for all), a line every 5 s: the
# hang is the only silence. CI (stop 40) once missed ranks of a torchrun run's stacks, beside three
# other tests on 2 cores: the likeliest cause, a start (torchrun's agent importing torch, then each rank)
# silent for stall_timeout, so that the stall came before those ranks existed.
# os._exit after "done", no teardown: destroy_process_group() of rank 0, its peers already gone, once sat
# in gloo for over stall_timeout on every attempt (the stall watcher rightly restarted it); without it,
# the interpreter's exit aborts gloo's threads now and then (exit 134, a failed Job). Neither is the test.
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
    """Rank 1 sleeps before all_reduce while the others wait in it: no output for stall_timeout (30
    seconds). The task log shows each process's stack under its pod (the others in all_reduce, rank 1
    at its sleep), the task fails saying it stalled, and nothing is left running."""
    torchrun = {"launcher": "torchrun", "nproc_per_node": 2} if launcher == "torchrun" else {}
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "hang", training_script=script(tmp_path, HANGS),
                                         stall_timeout=30, job_timeout=240, deferrable=deferrable,
                                         **torchrun, **state_volume(tmp_path)))

    assert run.state == "failed", run.log
    assert (f"Volcano Job {cluster.namespace}/hang stalled: no output for 30 seconds; where each process was: "
            in run.log)
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
    """A hang only on the first attempt (a marker on a hostPath): the stall restarts the gang (its pods
    deleted, which the Job's PodEvicted policy answers with RestartJob, one of max_retry), and the task
    succeeds."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "once", training_script=script(tmp_path, HANGS),
                                         stall_timeout=30, stall_action="restart", job_timeout=300,
                                         env={"HANG_ONCE": "1"}, **state_volume(tmp_path)))

    assert run.state == "success", run.log
    assert "stalled: no output for 30 seconds; restarting the gang (stall_action='restart')" in run.log
    assert re.search(r"\[once-worker-0\] process \d+, RANK=1", run.log), "the stacks came first"
    assert run.log.count("restarting the gang") == 1, "one stall, one restart"
    # Volcano counts the restart, and may count once more the exit code 143 of the pods it kills for it
    # (a retryable code): a stall's restart takes one or two of max_retry.
    assert run.xcom["return_value"]["retry_count"] in (1, 2), run.xcom["return_value"]
    assert run.log.count("[once-master-0] rank 0 done") == 1


QUIET = """
    import os, pathlib, time
    print("loading a large dataset quietly", flush=True)
    for _ in range(9):  # 90 s (three times stall_timeout) without a line, touching the heartbeat every 10 s
        time.sleep(10)
        pathlib.Path(os.environ["HEARTBEAT_FILE"]).touch()
    print("done", flush=True)
"""


def test_a_quiet_script_that_keeps_its_heartbeat_is_not_a_stall(cluster, operator_kubeconfig, run_task, real_node,
                                                                  tmp_path):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "quiet", training_script=script(tmp_path, QUIET),
                                         worker_replicas=0, stall_timeout=30, job_timeout=300))

    assert run.state == "success", run.log
    assert "[quiet-master-0] done" in run.log
    assert "stall" not in run.log.lower().replace("stall_timeout", ""), run.log
    assert "heartbeat" not in run.log, "heartbeats count as output but are not shown"


TQDM = """
    import sys, time
    # A progress bar as tqdm draws it: redrawn in place with a carriage return, never a newline, so the
    # container runtime hands the kubelet no log line (a partial line only at 16 KiB).
    for step in range(1, 91):
        sys.stderr.write(f"\\rtraining: {step:3d}/90 |{'#' * (step // 9):<10}| {step / 90:4.0%}")
        sys.stderr.flush()
        time.sleep(1)
    print("\\ndone", flush=True)
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_a_progress_bar_is_output_and_a_healthy_run_printing_only_one_is_not_a_stall(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, deferrable):
    """90 s of a carriage-return progress bar with stall_timeout of 30 s (it used to be declared stalled,
    and deleted, after the first 30): every byte the training writes is output."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "bar", training_script=script(tmp_path, TQDM),
                                         worker_replicas=0, stall_timeout=30, job_timeout=300,
                                         deferrable=deferrable))

    assert run.state == "success", run.log
    assert "stall" not in run.log.lower().replace("stall_timeout", ""), run.log
    assert "[bar-master-0] done" in run.log
    assert "90/90" in run.log, "the bar's bytes reach the task log unchanged (escaped \\r, one line)"


TICKS_THEN_HANG = """
    import time
    for tick in range(1, 13):  # 24 s of output, then a hang: nothing more, ever
        print(f"tick {tick}", flush=True)
        time.sleep(2)
    time.sleep(3600)
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_time_the_logs_cannot_be_read_is_not_silence_and_a_real_hang_is_still_caught(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, monkeypatch, kubeconfig, deferrable):
    """Every pod log read fails for 45 s (longer than stall_timeout, 30 s) while the script is healthy:
    no stall meanwhile (it used to delete the Job). The script then really hangs: caught, 30 s of
    silence after the waiter could see again, with its stack."""
    from .faults import FaultyProxy, fault_window, through, upstream_of

    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        faults, seen = fault_window(proxy.logs_fail, 45, lambda: cluster.wait_for(
            "the first ticks", lambda: cluster.log_shows("outage-master-0", "tick 2"), timeout=120))
        run = run_task(lambda: real_operator(real_node, cluster.namespace, "outage",
                                             training_script=script(tmp_path, TICKS_THEN_HANG), worker_replicas=0,
                                             stall_timeout=30, job_timeout=300, deferrable=deferrable))
        faults.join()

    assert proxy.log_reads_refused > 0, "the log reads really failed"
    assert run.state == "failed", run.log
    assert f"Volcano Job {cluster.namespace}/outage stalled: no output for 30 seconds" in run.log
    notice = next(line for line in run.log.splitlines() if "gave no output and no change for" in line)
    noticed = datetime.datetime.fromisoformat(notice.split()[0].replace("Z", "+00:00")).timestamp()
    assert noticed >= seen["to"] + 25, "no stall while the logs could not be read, nor right after"
    shown = [int(tick) for tick in re.findall(r"\[outage-master-0\] tick (\d+)", run.log)]
    assert shown == list(range(1, 13)), "what it printed during the outage is in the task log, each line once"
    assert re.search(r"\[outage-master-0\] process \d+, no RANK|\[outage-master-0\] process \d+, RANK=0", run.log)


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_a_restart_the_identity_may_not_do_fails_the_stall_once_saying_why(cluster, operator_kubeconfig, run_task,
                                                                           deferrable):
    """stall_action='restart' with a Role that may not delete pods: the restart is refused, and the stall
    ends the task with the apiserver's reason at once, instead of a dump of stacks every stall_timeout
    while the hung Job keeps its GPUs (simulated pods: a master whose log never grows)."""
    from kubernetes import client

    from .jobs import SIM
    from .test_operator import seed_operator

    rbac = client.RbacAuthorizationV1Api(cluster.api)
    role = rbac.read_namespaced_role("airflow-volcano", cluster.namespace)
    for rule in role.rules:
        if "pods" in rule.resources:
            rule.verbs = [verb for verb in rule.verbs if verb != "delete"]
    rbac.replace_namespaced_role("airflow-volcano", cluster.namespace, role)
    cluster.write_log("stuck-master-0", ["loading", "step 1"])

    run = run_task(lambda: seed_operator(cluster.namespace, "stuck", worker_replicas=0, stall_timeout=30,
                                         stall_action="restart", job_timeout=240, deferrable=deferrable,
                                         annotations={SIM + "outcome": "run-forever"}))

    assert run.state == "failed", run.log
    assert (f"Volcano Job {cluster.namespace}/stuck stalled: no output for 30 seconds; stall_action='restart' could "
            f"not restart it (delete pod {cluster.namespace}/stuck-master-0 failed: HTTP 403 Forbidden") in run.log
    assert run.log.count("(stall_timeout): asking its pods for their Python stacks") == 1, "one stall, not a loop"
    cluster.wait_for("the stalled Job to be deleted", lambda: cluster.job("stuck") is None, timeout=60)


DEEPSPEED_QUIET = """
    import os, pathlib, time
    import deepspeed, torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo")
    print(f"rank {dist.get_rank()} loads quietly", flush=True)
    for _ in range(8):  # 80 s without a line, touching the heartbeat every 10 s
        time.sleep(10)
        pathlib.Path(os.environ["HEARTBEAT_FILE"]).touch()
    dist.barrier()
    print(f"rank {dist.get_rank()} done", flush=True)
"""


def test_a_quiet_deepspeed_rank_that_keeps_its_heartbeat_is_not_a_stall(cluster, operator_kubeconfig, run_task,
                                                                         real_node, tmp_path):
    """The ranks of a DeepSpeed launch run on the workers, in ssh sessions: their heartbeat shows in
    their worker pod's log, which the wait now reads too (it used to follow the master's alone)."""
    from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

    from .real_node import SMALL

    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name="dsquiet", namespace=cluster.namespace, worker_replicas=1,
        training_script=script(tmp_path, DEEPSPEED_QUIET), container_resources=SMALL, startup_timeout=120,
        job_timeout=300, poll_interval=1, stall_timeout=30, deferrable=False, **real_node))

    assert run.state == "success", run.log
    assert "rank 0 done" in run.log
    assert "stall" not in run.log.lower().replace("stall_timeout", ""), run.log


HEARTBEAT = "[airflow-volcano] heartbeat"

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

    from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

    seen: dict[str, str] = {}
    done = threading.Event()

    def read_the_workers_log() -> None:
        # The fullest read is kept: once the pod is gone the kubelet answers with a message of its own.
        while not done.wait(2):
            try:
                log = cluster.pod_log("prog-worker-0")
            except Exception as error:  # noqa: BLE001 - not started yet, or gone
                seen["error"] = repr(error)
                continue
            if log.count(HEARTBEAT) >= seen.get("log", "").count(HEARTBEAT):
                seen["log"] = log

    reader = threading.Thread(target=read_the_workers_log, daemon=True)
    reader.start()
    try:
        run = run_task(lambda: VolcanoDeepSpeedJobOperator(
            task_id="train", name="prog", namespace=cluster.namespace, worker_replicas=1,
            training_script=script(tmp_path, PROGRESS_ONLY), stall_timeout=600, container_resources={
                "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=False, **real_node))
    finally:
        done.set()
        reader.join(timeout=30)

    assert run.state == "success", run.log
    assert "rank 0 done" in run.log, run.log
    assert seen.get("log", "").count(HEARTBEAT) >= 4, seen
