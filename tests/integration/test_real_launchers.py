"""Launchers and companions of the ranks, on the real node (real containers): torchrun (6 ranks on
3 pods), elastic torchrun (a world of the pods that fit), and TensorBoard beside the training (a pod
of the Job that is not a rank, reached by its DNS name), with log_tasks in a worker and deferred.
"""

from __future__ import annotations

import re

import pytest

from .real_node import losses, real_operator, script

TENSORBOARD_TRAINING = """
    import json, os, time, urllib.request
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    print(f"rank {rank} of {world}: all_reduce {total.item():.0f}", flush=True)
    seen = None
    # Workers end here, before the master: Volcano keeps finished pods (and their logs) when the
    # master's completion ends the Job, but removes running ones.
    if rank == 0:
        writer = SummaryWriter("/logs/tb")
        for step in range(5):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.close()
        # TensorBoard runs in its own pod of this Job: ask it, by its DNS name, what it serves.
        url = f"http://{os.environ['TB_HOST']}:6006/data/plugin/scalars/tags"
        for _attempt in range(120):
            try:
                seen = json.load(urllib.request.urlopen(url, timeout=5))
                if seen:
                    break
            except OSError as error:
                print("TensorBoard not answering yet:", error, flush=True)
            time.sleep(1)
        print("TensorBoard serves", seen, flush=True)
        # The workers left right after their all_reduce; give their pods the seconds the kubelet
        # takes to report them Succeeded, or a loaded node can still show one Running here.
        time.sleep(5)
        with open("/dev/termination-log", "w") as out:
            json.dump({"world_size": world, "tensorboard_tags": seen}, out)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["worker", "deferred"])
def test_tensorboard_serves_the_masters_event_files_and_is_not_a_rank(cluster, operator_kubeconfig, run_task,
                                                                      real_node, tmp_path, monkeypatch, deferrable):
    """Seed 004's TensorBoard: a pod of the Job reading the volume the master writes, reached by
    its DNS name; WORLD_SIZE stays 3; every worker's log is in the task log (log_tasks: followed
    live in a worker, read at the end when deferred)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setenv("AIRFLOW__VOLCANO__TENSORBOARD_URL_TEMPLATE",
                       "https://k8s.example.com/api/v1/namespaces/{namespace}/pods/{tensorboard_pod}:"
                       "{tensorboard_port}/proxy/")
    name = "tb"
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, name, training_script=script(tmp_path, TENSORBOARD_TRAINING),
        env={"TB_HOST": f"{name}-tensorboard-0.{name}"}, log_tasks=["worker"],
        volumes=[{"name": "logs", "hostPath": {"path": str(logs), "type": "Directory"}}],
        volume_mounts=[{"name": "logs", "mountPath": "/logs"}], tensorboard={"logdir": "/logs/tb"},
        deferrable=deferrable))

    assert run.state == "success", run.log
    result = run.xcom["return_value"]["result"]
    assert result["world_size"] == 3, "TensorBoard's pod is not a rank"
    assert "loss" in result["tensorboard_tags"]["."], result
    assert list((logs / "tb").glob("events.out.tfevents.*")), "the event files are on the shared volume"
    # Every rank's log, each line under its pod: the master's and, with log_tasks, each worker's.
    for rank, pod in enumerate([f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-1"]):
        assert run.log.count(f"[{pod}] rank {rank} of 3: all_reduce 6") == 1, run.log
    assert "[tb-tensorboard-0]" not in run.log, "only the tasks named in log_tasks"
    tensorboard_pod = f"{name}-tensorboard-0"
    assert (f"TensorBoard of this Job: kubectl port-forward -n {cluster.namespace} pod/{tensorboard_pod} 6006"
            in run.log)
    assert run.xcom["_link_TensorBoardLink"] == (
        f"https://k8s.example.com/api/v1/namespaces/{cluster.namespace}/pods/{tensorboard_pod}:6006/proxy/")


def test_torchrun_trains_seed_000_as_six_ranks_on_three_pods(cluster, operator_kubeconfig, run_task, real_node):
    """launcher="torchrun": one agent per pod, two processes each. torch's RANK/WORLD_SIZE count
    processes (6), Volcano's count pods (3); node ranks follow Volcano's RANK."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "trun", launcher="torchrun", nproc_per_node=2,
                                         log_tasks=["worker"]))

    assert run.state == "success", run.log
    # Two processes share a pod's stdout and the seed's print() writes text and newline apart, so
    # two ranks' lines may share one log line: ranks are read per pod, wherever they appear.
    pods_of_rank = {int(rank): pod for pod, line in re.findall(r"\[(trun-\w+-\d)\] (.*)", run.log)
                    for rank in re.findall(r"\[初始化\] RANK=(\d), WORLD_SIZE=6", line)}
    assert pods_of_rank == {0: "trun-master-0", 1: "trun-master-0", 2: "trun-worker-0", 3: "trun-worker-0",
                            4: "trun-worker-1", 5: "trun-worker-1"}, run.log
    assert len(losses(run.log, "trun-master-0")) == 5, "rank 0 trained all five epochs with the five others:\n" + \
        "\n".join(re.findall(r"\[trun-master-0\] .*", run.log))


def test_elastic_torchrun_trains_with_the_pods_that_fit(cluster, operator_kubeconfig, run_task, real_node):
    """min_available=2 of 3 pods with torchrun: Volcano starts the Job once 2 pods fit (the node has
    2 CPUs, each pod requests 0.9), torchrun's c10d rendezvous forms a world of 2, and the
    third pod, never scheduled, is removed when the master's completion ends the Job. The concurrent
    tests' pods on the node request CPU too (100m each): until two of these fit, the Job waits (CI once
    found room for one only, for over 120 s), hence a startup_timeout longer than those tests."""
    fits_two = {"requests": {"cpu": "900m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "elastic", launcher="torchrun",
                                         min_available=2, container_resources=fits_two, log_tasks=["worker"],
                                         torchrun_options=["--rdzv_conf=last_call_timeout=5"], startup_timeout=600,
                                         job_timeout=900))

    assert run.state == "success", run.log
    for rank in (0, 1):
        assert re.search(rf"\[elastic-(master|worker)-\d\] \[初始化\] RANK={rank}, WORLD_SIZE=2 ", run.log), run.log
    assert "WORLD_SIZE=3" not in run.log
    assert run.log.count("Epoch [5/5], Average Loss") == 1, run.log
    assert f"Volcano Job {cluster.namespace}/elastic is Running: 2/3 pods running" in run.log
