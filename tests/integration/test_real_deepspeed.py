"""DeepSpeed and MPI over ssh from a hostfile (seed 003), on the real node (real containers): the
DeepSpeed example DAG (`deepspeed --hostfile` and `mpirun`, a real DeepSpeed engine on CPU), a
failing rank's traceback with no restart, and DeepSpeed's debug mode with the launcher run by hand.
"""

from __future__ import annotations

import re

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

from .real_node import REPO, SMALL, example_dag_on_the_real_node, return_value, script


def test_the_deepspeed_example_trains_every_rank_over_ssh_with_deepspeed_and_with_mpirun(
        cluster, operator_kubeconfig, airflow_db, real_node, capfd):
    """dags/volcano_deepspeed_training.py: the master waits for both workers' sshd, then
    `deepspeed --hostfile` starts 2 x 2 ranks over ssh (pdsh) and a real DeepSpeed engine trains on
    CPU; the second task does the same with OpenMPI's mpirun (2 x 1 ranks, found through mpi4py).
    Every rank is in one process group, the loss falls, rank 0's result is the task's XCom."""
    dag = example_dag_on_the_real_node("volcano_deepspeed_training.py", real_node,
                                       task_ids=("train_deepspeed", "train_mpirun"))
    capfd.readouterr()

    run = dag.test(run_conf={"namespace": cluster.namespace, "steps": 40})

    log = "".join(capfd.readouterr())
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"train_deepspeed": "success", "train_mpirun": "success"}, log
    for task_id, workers, slots in (("train_deepspeed", 2, 2), ("train_mpirun", 2, 1)):
        result = return_value(dag, run, task_id)["result"]
        assert result["world_size"] == workers * slots, (task_id, result)
        assert result["final_loss"] < result["first_loss"] / 2, (task_id, result)
    for worker in (0, 1):
        assert re.search(rf"airflow-volcano: [a-z0-9-]+-worker-{worker}\.[a-z0-9-]+ accepts ssh", log), log
    # One process group with every rank: rank r ran on worker r // slots (the hostfile's order).
    assert re.search(r"process group of 4 ranks: rank 0 on [a-z0-9-]+-worker-0, rank 1 on [a-z0-9-]+-worker-0, "
                     r"rank 2 on [a-z0-9-]+-worker-1, rank 3 on [a-z0-9-]+-worker-1", log), log
    assert re.search(r"process group of 2 ranks: rank 0 on [a-z0-9-]+-worker-0, rank 1 on [a-z0-9-]+-worker-1",
                     log), log
    assert "2 workers x 2 slots = 4 ranks" in log and "2 workers x 1 slots = 2 ranks" in log


# The ranks say what they see on stderr: pdsh passes a session's stdout on later than its stderr, and
# drops what it holds when the failure of another session makes it end (-S), as rank 0's stdout once was.
RANK_FAILS = """
    import os, sys
    import deepspeed, torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo")
    print(f"rank {dist.get_rank()} sees RUN_TAG={os.environ.get('RUN_TAG')} "
          f"DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')} on {os.environ.get('HOSTNAME')}", file=sys.stderr,
          flush=True)
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("rank 1 found a bad batch")
    dist.barrier()
"""


def test_a_failing_rank_fails_the_task_with_its_traceback_and_no_restart(cluster, operator_kubeconfig, run_task,
                                                                         real_node, tmp_path):
    """A rank on a worker raises: the launcher (on the master) exits non-zero, which is not a
    retryable exit code, so the Job ends at once; the rank's traceback is in the task log. The
    ranks see the pod's environment (env=, the image's) in their ssh sessions."""
    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name="dsfail", namespace=cluster.namespace, worker_replicas=2,
        training_script=script(tmp_path, RANK_FAILS), env={"RUN_TAG": "nightly 7"}, container_resources=SMALL,
        startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=False, **real_node))

    assert run.state == "failed", run.log
    for rank, worker in ((0, 0), (1, 1)):
        assert f"rank {rank} sees RUN_TAG=nightly 7 DS_ACCELERATOR=cpu on dsfail-worker-{worker}" in run.log
    assert "ValueError: rank 1 found a bad batch" in run.log
    assert re.search(r"dsfail-master-0.* exit code [1-9]", run.log), run.log
    assert "is not one of retryable_exit_codes" in run.log
    assert "Restarting" not in run.log and "restarted" not in run.log.lower(), run.log


def test_deepspeed_debug_mode_lets_a_user_run_the_launcher_by_hand(cluster, operator_kubeconfig, run_task,
                                                                   real_node, kubeconfig):
    """Debug mode of a DeepSpeed Job: the master sleeps, the workers keep their sshd, so the command
    the task log prints, run by hand in `kubectl exec`, trains across the workers."""
    import subprocess
    import threading

    shell: dict[str, subprocess.CompletedProcess] = {}

    def launch_by_hand() -> None:
        cluster.wait_for("the Job's pods to run", lambda: sum(
            pod.status.phase == "Running" for pod in cluster.pods("dsdbg")) == 3, timeout=120)
        shell["master"] = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", cluster.namespace, "dsdbg-master-0", "-c",
             "master", "--", "/bin/sh", "/opt/airflow-volcano/script/airflow-volcano-launch.sh",
             "/opt/airflow-volcano/script/train_deepspeed.py"],  # the ranks' arguments are the workers' own
            capture_output=True, text=True, timeout=240)
        # The user ends the session by deleting the Job (or by marking the task).
        cluster.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cluster.namespace, "jobs",
                                                       "dsdbg")

    helper = threading.Thread(target=launch_by_hand, daemon=True)
    helper.start()
    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name="dsdbg", namespace=cluster.namespace, worker_replicas=2,
        training_script=str(REPO / "dags" / "scripts" / "train_deepspeed.py"), args=["--steps", "20"],
        container_resources=SMALL, debug=True, debug_timeout=600, startup_timeout=120, poll_interval=1,
        deferrable=False, **real_node))
    helper.join(timeout=120)

    assert run.state == "success", run.log
    # The hint is the command the helper ran, nothing after it: the workers hold the script's arguments.
    assert re.search(re.escape(f"kubectl exec -it -n {cluster.namespace} dsdbg-master-0 -c master -- bash   # then: "
                               "/bin/sh /opt/airflow-volcano/script/airflow-volcano-launch.sh "
                               "/opt/airflow-volcano/script/train_deepspeed.py") + r"\s+\[", run.log), run.log
    assert "dsdbg-worker-1 runs its command as usual" in run.log
    assert shell["master"].returncode == 0, shell["master"]
    assert re.search(r"DeepSpeed trained 2 ranks: loss \d+\.\d+ -> \d+\.\d+", shell["master"].stdout), shell["master"]
    assert "step 20 loss" in shell["master"].stdout and "step 30" not in shell["master"].stdout, "--steps 20 held"
    assert f"Volcano Job {cluster.namespace}/dsdbg was deleted: debug session over" in run.log
