"""Training that fails, on the real node (real containers): the report names the rank that failed
first before the peers that died of it, a worker's Python exception with its exit code and traceback,
a container over its memory limit (OOMKilled, from the kernel and the kubelet), and a worker SIGKILLed
from the node restarting the gang within max_retry (image pulls: test_image_pulls.py).
"""

from __future__ import annotations

import re

import pytest

from .real_node import real_operator, script

CASCADE = """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # gloo connects every pair of ranks here
    if dist.get_rank() == 1:
        raise ValueError("shard 1 is corrupt: 17 rows have NaN labels")
    print(f"rank {dist.get_rank()} waits in all_reduce", flush=True)
    dist.all_reduce(torch.ones(1))  # rank 1 never comes: its exit closes the connections
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_the_rank_that_failed_first_heads_the_report_not_its_peers(cluster, operator_kubeconfig, run_task, real_node,
                                                                   tmp_path, deferrable):
    """A distributed failure cascades: rank 1 raises, ranks 0 and 2 die in all_reduce of the closed
    connection a moment later. The report names rank 1's pod first and shows its traceback
    before the others' errors, in both modes."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "casc", deferrable=deferrable,
                                         training_script=script(tmp_path, CASCADE)))

    assert run.state == "failed", run.log
    report = run.log[run.log.index(f"Volcano Job {cluster.namespace}/casc ended in phase"):]
    assert re.match(rf"Volcano Job {cluster.namespace}/casc ended in phase \w+: pod casc-worker-0 failed first "
                    r"\(exit code 1 at \d\d:\d\d:\d\d UTC\); 2 pod\(s\) failed after it\n", report), report
    peer_lost = re.search(r"Connection (closed|reset) by peer", report)
    assert peer_lost and report.index("ValueError: shard 1 is corrupt") < peer_lost.start(), report
    order = re.findall(r"^  - pod (casc-\w+-\d) \(task", report, re.MULTILINE)
    assert order[0] == "casc-worker-0" and sorted(order[1:]) == ["casc-master-0", "casc-worker-1"], report
    assert re.search(r"- pod casc-master-0 .*; its last line: .*Connection (closed|reset) by peer", report), report


def test_a_python_exception_in_a_worker_fails_the_task_with_pod_exit_code_and_traceback(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    train = script(tmp_path, """
        import os, time

        def load_shard(rank):
            raise ValueError(f"shard {rank} is corrupt: 17 rows have NaN labels")

        if os.environ["RANK"] == "1":
            load_shard(os.environ["RANK"])
        time.sleep(600)
    """)
    # Default policies: exit code 1 is not retryable, so the gang is not restarted.
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, "boom", training_script=train, worker_replicas=1))

    assert run.state == "failed", run.log
    # (The master, still running, is then killed by Volcano: a failure after it, if seen before it was removed.)
    assert re.search(rf"Volcano Job {cluster.namespace}/boom ended in phase Terminated: pod boom-worker-0 failed "
                     r"(first )?\(exit code 1 at \d\d:\d\d:\d\d UTC\)", run.log), "no restart"
    assert "pod boom-worker-0 (task worker) Failed, container worker, exit code 1, reason Error" in run.log
    assert ("Exit code 1 of pod boom-worker-0 is not one of retryable_exit_codes (130, 137, 138, 143): the Job was "
            "ended without a restart.") in run.log
    assert "Last" in run.log and "log lines of boom-worker-0" in run.log
    assert "| Traceback (most recent call last):" in run.log
    assert "| ValueError: shard 1 is corrupt: 17 rows have NaN labels" in run.log


def test_a_container_over_its_memory_limit_is_reported_as_oomkilled(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    train = script(tmp_path, """
        chunks = []
        while True:
            chunks.append(b"x" * (16 << 20))  # written, so the pages count against the limit
    """)
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, "hungry", training_script=train, worker_replicas=0, max_retry=1,
        container_resources={"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "96Mi"}},
        policies=[{"event": "PodFailed", "action": "AbortJob"}]))

    assert run.state == "failed", run.log
    assert "pod hungry-master-0 (task master) Failed, container master, exit code 137, reason OOMKilled" in run.log


WAITS_TO_BE_KILLED = """
    import os, pathlib, signal, sys, time
    # PID 1 ignores SIGTERM unless it has a handler: without one a restart waits out the grace period.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.environ["RANK"] == "1":
        marker = pathlib.Path("/state/attempts")
        attempts = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(attempts + 1))
        if attempts < int(os.environ["KILLS"]):
            print("waiting to be killed", flush=True)
            time.sleep(300)
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} all_reduce {total.item():.0f}", flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(("kills", "max_retry"), [(1, 3), (9, 2)], ids=["restarted", "budget-exhausted"])
def test_a_worker_killed_by_sigkill_restarts_the_gang_within_max_retry(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path, kills, max_retry):
    """SIGKILL from the node (exit code 137, as an OOM kill or a preemption gives) is retryable: the
    gang restarts and trains; when every attempt is killed, max_retry ends it and the task says so."""
    import threading
    import time

    state = tmp_path / "state"
    state.mkdir()
    done = threading.Event()

    def kill_each_attempt() -> None:
        killed = 0
        while not done.is_set() and killed < kills:
            attempts = int((state / "attempts").read_text() or 0) if (state / "attempts").exists() else 0
            running = containerd.running_containers(cluster.namespace, "kill9-worker-0", sandboxes=False)
            if attempts > killed and running:
                containerd.kill(running[0])
                killed = attempts
            time.sleep(0.5)

    killer = threading.Thread(target=kill_each_attempt, daemon=True)
    killer.start()
    try:
        run = run_task(lambda: real_operator(
            real_node, cluster.namespace, "kill9", training_script=script(tmp_path, WAITS_TO_BE_KILLED),
            worker_replicas=1, max_retry=max_retry, env={"KILLS": str(kills)},
            volumes=[{"name": "state", "hostPath": {"path": str(state), "type": "Directory"}}],
            volume_mounts=[{"name": "state", "mountPath": "/state"}]))
    finally:
        done.set()
        killer.join(timeout=10)

    assert "is Restarting (" in run.log, run.log
    if kills < max_retry:
        assert run.state == "success", run.log
        assert run.xcom["return_value"]["retry_count"] == 1
        assert "[kill9-master-0] rank 0 all_reduce 2" in run.log
        assert (state / "attempts").read_text() == "2"
    else:
        assert run.state == "failed", run.log
        # As Volcano counts, the restart that finds the budget spent ends it: max_retry=2 is one real restart.
        # The waiter counts it (Volcano's maxRetry has room for preemptions beside it) and deletes the Job.
        assert (f"Volcano Job {cluster.namespace}/kill9 was restarted 2 time(s) after a failure, an eviction, a lost "
                "node or a stall: the retry budget is exhausted (max_retry 2: Volcano counts the restart that finds "
                "it spent); its 0 preemption(s) did not spend it; the Job was deleted") in run.log, run.log
        # The restart that spent it has begun when the waiter tells its cause (two reads of the events, 5 s
        # apart): a third attempt may have started, and is deleted with the Job.
        assert (state / "attempts").read_text() in ("2", "3")
        # The killed worker is named with its code; as the third attempt's (killed too) it may be read before
        # the kubelet has marked its pod Failed ("Running, …, exit code 137 …: waiting to be killed").
        assert re.search(r"^  - pod kill9-worker-0 \(task worker\) \w+, container worker, exit code 137", run.log,
                         re.M), run.log
