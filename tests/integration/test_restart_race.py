"""Which failure decides whether the gang restarts (real node, real gloo ranks). When one rank is killed
(137: the OOM killer, a preemption) its peers die a second later of the broken connection (exit code 1),
and Volcano acts on whichever pod event it handles first: about one time in three the Job used to end
instead of restarting. The signal-forwarding shell holds a non-retryable exit back for a few seconds
(forward-signals.sh, AIRFLOW_VOLCANO_HOLD_EXIT), so the first failure decides.

RACE_TRIALS (default 2) and RACE_BUG_TRIALS (default 1) repeat the cases; benchmarks/restart_race.py runs
each 20 times on a release.
"""

from __future__ import annotations

import os

import pytest

from .real_node import real_operator, script
from .test_stalls import state_volume

TRIALS = int(os.environ.get("RACE_TRIALS", "2"))
BUG_TRIALS = int(os.environ.get("RACE_BUG_TRIALS", "1"))

ONE_RANK_DIES = """
    import os, pathlib, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first = not pathlib.Path("/state/died").exists()
    dist.barrier()
    if rank == 2 and first:  # worker-1, on the first attempt only
        pathlib.Path("/state/died").touch()
        time.sleep(1)  # its peers are waiting in the all_reduce by now
        print(f"rank 2 exits {os.environ['FIRST_EXIT']}", flush=True)
        os._exit(int(os.environ["FIRST_EXIT"]))
    dist.all_reduce(torch.ones(1))
    print(f"rank {rank} done", flush=True)
    # Out at once: after a restart gloo's teardown once held rank 0 until job_timeout (with
    # destroy_process_group) or aborted it (exit 134, without): neither is what this test is about.
    os._exit(0)
"""


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_killed_while_its_peers_wait_in_a_collective_restarts_the_gang(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, trial):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "race", training_script=script(
        tmp_path, ONE_RANK_DIES), env={"FIRST_EXIT": "137"}, max_retry=3, job_timeout=300, **state_volume(tmp_path)))

    assert run.state == "success", run.log
    assert "[race-master-0] rank 0 done" in run.log
    assert run.xcom["return_value"]["retry_count"] >= 1, "the gang restarted"


@pytest.mark.parametrize("trial", range(BUG_TRIALS))
def test_a_rank_failing_first_with_a_bug_still_ends_the_job_without_a_restart(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, trial):
    """The hold delays the end (docs/failures.md "Which failure decides"); it does not turn a bug into a restart."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "bug", training_script=script(
        tmp_path, ONE_RANK_DIES), env={"FIRST_EXIT": "1"}, max_retry=3, job_timeout=300, **state_volume(tmp_path)))

    assert run.state == "failed", run.log
    assert "pod bug-worker-1 failed first (exit code 1" in run.log, run.log
    assert "the Job was ended without a restart" in run.log
    assert "Restarting" not in run.log, run.log
