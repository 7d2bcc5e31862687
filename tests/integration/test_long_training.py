"""What real clusters do to long training, done for real on the real node: shared memory, SIGTERM
when a Job is deleted, checkpoints across Volcano's restarts and Airflow's retries, a node whose
kubelet stops answering (the real kubelet killed; its containers keep running under containerd, as
in a network partition, and the real node lifecycle controller marks the node and its pods)."""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

from .real_node import REPO, SMALL, real_operator, script
from .test_kill_and_reattach import start_worker, write_dag

RESUMABLE = str(REPO / "dags" / "scripts" / "train_resumable.py")
CLUSTER = str(REPO / "scripts" / "volcano-cluster")

DATALOADER = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Batches(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            return torch.full((100 * 2**20 // 4,), float(index))  # 100 MiB of float32

    moved = 0
    for batch in DataLoader(Batches(), batch_size=None, num_workers=2):
        moved += batch.numel() * batch.element_size()
    print(f"moved {moved // 2**20} MiB in 6 batches from 2 DataLoader workers", flush=True)
"""

NO_HANDLER = """
    import os, time
    print(f"rank {os.environ['RANK']} started", flush=True)
    time.sleep(3600)
"""


def checkpoints(tmp_path: Path) -> tuple[Path, dict]:
    """A directory every pod of the Job mounts (a hostPath: the node is this machine), as
    operator arguments with checkpoint_dir."""
    shared = tmp_path / "checkpoints"
    shared.mkdir(mode=0o777)
    return shared, {"volumes": [{"name": "ckpt", "hostPath": {"path": str(shared), "type": "Directory"}}],
                    "volume_mounts": [{"name": "ckpt", "mountPath": "/checkpoints"}],
                    "checkpoint_dir": "/checkpoints"}


def latest(shared: Path) -> dict:
    """The newest checkpoint record train_resumable.py wrote, wherever CHECKPOINT_DIR put it."""
    found = sorted(shared.rglob("latest.json"))
    return json.loads(found[0].read_text()) if found else {}


def wait_until_gone(cluster, containerd, name: str, timeout: float = 180) -> float:
    """Wait until the Job and every container of its pods are gone from the node; returns when (epoch
    seconds, at most the poll interval late)."""
    cluster.wait_for("no container of the Job left running in containerd",
                     lambda: cluster.job(name) is None and not containerd.running_containers(cluster.namespace),
                     timeout=timeout)
    return time.time()


def deleted_at(log: str, namespace: str, name: str) -> float:
    """When the task deleted the Job, from the timestamp of its task log line."""
    line = next(line for line in log.splitlines() if f"Deleted Volcano Job {namespace}/{name}" in line)
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_dataloader_moves_100_mib_batches_through_the_default_shm_and_without_it_the_task_says_why(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, deferrable):
    train = script(tmp_path, DATALOADER)
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "shm", training_script=train,
                                         worker_replicas=0, deferrable=deferrable))
    assert run.state == "success", run.log
    assert "[shm-master-0] moved 600 MiB in 6 batches from 2 DataLoader workers" in run.log

    run = run_task(lambda: real_operator(real_node, cluster.namespace, "noshm", training_script=train,
                                         worker_replicas=0, shm_size=None, deferrable=deferrable))
    assert run.state == "failed", run.log
    assert ("The training ran out of shared memory (/dev/shm): PyTorch's DataLoader workers pass batches through "
            "it; raise shm_size") in run.log, run.log


@pytest.mark.parametrize(("launcher", "deferrable"), [("python", False), ("torchrun", False), ("deepspeed", False),
                                                     ("python", True)],
                         ids=["python", "torchrun", "deepspeed", "python-deferred"])
def test_job_timeout_sends_sigterm_the_script_saves_and_the_pods_go_within_the_grace_period(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path, launcher, deferrable):
    """Whatever launches the ranks: python as the command, a torchrun agent, or DeepSpeed's runner on
    the master starting the ranks over ssh in the workers' sshd sessions. What rank 0 prints as it saves
    on SIGTERM reaches the task log before the failure, in both modes (it used to be lost: the task
    failed at once after the delete)."""
    shared, volume = checkpoints(tmp_path)
    common = dict(task_id="train", name="sigterm", namespace=cluster.namespace, training_script=RESUMABLE,
                  container_resources=SMALL, startup_timeout=120, poll_interval=1, deferrable=deferrable,
                  job_timeout=70,  # the ranks must be training when it passes, on a loaded machine too
                  termination_grace_period=20, env={"EPOCHS": "1000", "EPOCH_SECONDS": "2"}, **volume, **real_node)
    if launcher == "deepspeed":
        run = run_task(lambda: VolcanoDeepSpeedJobOperator(worker_replicas=1, **common))
    else:
        run = run_task(lambda: VolcanoPyTorchJobOperator(worker_replicas=1, launcher=launcher, **common))
    gone_after = wait_until_gone(cluster, containerd, "sigterm") - deleted_at(run.log, cluster.namespace, "sigterm")

    assert run.state == "failed" and "job_timeout of 70s passed" in run.log, run.log
    saved = latest(shared)
    assert saved.get("epoch", 0) >= 1 and saved.get("reason") == "SIGTERM", f"rank 0 saved on SIGTERM: {saved}"
    assert gone_after < 20 + 5, f"gone {gone_after:.1f}s after the Job was deleted: within the grace period"
    if launcher != "deepspeed":  # (there rank 0 runs on a worker, whose launcher is being stopped too)
        last_words = re.search(r"\[sigterm-master-0\] (SIGTERM: saved checkpoint|rank 0: SIGTERM, stopping)", run.log)
        assert last_words, run.log
        assert last_words.start() < run.log.index("Task failed with exception"), "before the failure"
    print(f"MEASURED job_timeout, {launcher}, script with a SIGTERM handler: pods gone {gone_after:.1f}s after "
          "the delete")


INTERRUPTED = """
    import time
    print("waiting for a signal", flush=True)
    try:
        time.sleep(300)
    except KeyboardInterrupt:
        print("KeyboardInterrupt reached the script", flush=True)
"""


def test_sigint_reaches_the_script_as_it_would_without_the_signal_forwarding_shell(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path):
    """SIGINT to the container (as `ctr tasks kill` delivers it to its PID 1, the provider's shell):
    the script gets KeyboardInterrupt. It used to be ignored in the whole command tree (`"$@" &`)."""
    def interrupt() -> None:
        cluster.wait_for("the script to wait", lambda: cluster.log_shows("sigint-master-0", "waiting for a signal"),
                         timeout=120)
        container = cluster.wait_for("its container", lambda: containerd.running_containers(
            cluster.namespace, "sigint-master-0", sandboxes=False), timeout=30)[0]
        containerd.kill(container, "SIGINT")

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "sigint", worker_replicas=0,
                                         training_script=script(tmp_path, INTERRUPTED), job_timeout=200))
    interrupter.join()

    assert run.state == "success", run.log
    assert "[sigint-master-0] KeyboardInterrupt reached the script" in run.log


def test_a_script_without_a_sigterm_handler_is_gone_in_seconds_not_the_grace_period(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "nohandler", worker_replicas=1,
                                         training_script=script(tmp_path, NO_HANDLER), job_timeout=20))
    gone_after = wait_until_gone(cluster, containerd, "nohandler") - deleted_at(run.log, cluster.namespace,
                                                                                   "nohandler")

    assert run.state == "failed" and "[nohandler-master-0] rank 0 started" in run.log, run.log
    # Python as PID 1 would ignore SIGTERM and be SIGKILLed after Kubernetes' default 30 s.
    assert gone_after < 15, f"gone {gone_after:.1f}s after the Job was deleted"
    print(f"MEASURED job_timeout, script without a handler: pods gone {gone_after:.1f}s after the delete")


def test_killing_the_task_lets_the_script_save_before_its_pods_go(cluster, operator_kubeconfig, airflow_db,
                                                                    real_node, containerd, tmp_path):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dag_id = "real_kill_saves"
    shared, volume = checkpoints(tmp_path)
    train = tmp_path / "train_resumable.py"  # beside the DAG file: files are read from the DAG's folder
    train.write_text(Path(RESUMABLE).read_text())
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killsave", training_script=str(train),
                         container_resources=SMALL, termination_grace_period=20,
                         env={"EPOCHS": "1000", "EPOCH_SECONDS": "2"}, **volume, **real_node)
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), tmp_path / "worker.log")
    cluster.wait_for("a first checkpoint", lambda: latest(shared).get("epoch", 0) >= 2, timeout=180)

    with create_session() as session:  # "Mark failed" in the UI: the state changes, then the task gets SIGTERM
        session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
    killed_at = time.time()
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    gone_after = wait_until_gone(cluster, containerd, "killsave") - killed_at

    assert latest(shared).get("reason") == "SIGTERM", latest(shared)
    assert gone_after < 20 + 5, f"gone {gone_after:.1f}s after the kill"
    print(f"MEASURED kill of the task, script with a SIGTERM handler: pods gone {gone_after:.1f}s after the kill")


def test_a_rank_killed_after_epoch_3_restarts_the_gang_which_resumes_from_the_epoch_3_checkpoint(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    shared, volume = checkpoints(tmp_path)
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, "resume", training_script=RESUMABLE, worker_replicas=1,
        env={"EPOCHS": "6", "EPOCH_SECONDS": "5", "CRASH_AT_EPOCH": "3", "CRASH_EXIT_CODE": "137"}, **volume))

    assert run.state == "success", run.log
    assert f"Volcano Job {cluster.namespace}/resume is Restarting (" in run.log, run.log
    result = run.xcom["return_value"]
    assert result["retry_count"] == 1 and result["resumed_from"].endswith("/epoch-3.pt"), result
    assert result["resumed_from"].startswith("/checkpoints/test_"), "the task instance's own directory"
    assert f"[resume-master-0] [airflow-volcano] resumed from {result['resumed_from']}" in run.log
    assert "[resume-master-0] rank 0/2 starts at epoch 4 of 6 (VOLCANO_RESTART_COUNT=1, AIRFLOW_TRY_NUMBER=1)" \
        in run.log, run.log
    assert f"The training resumed from checkpoint {result['resumed_from']}" in run.log
    assert latest(shared)["epoch"] == 6


def test_progress_with_eta_and_where_the_time_went_across_a_restart_that_resumes_from_an_older_checkpoint(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    """4 epochs of 10 steps, a checkpoint every 2 epochs; a rank killed after epoch 3 (step 30): the gang
    restarts and resumes from epoch 2 (step 20), so 10 steps are done again."""
    shared, volume = checkpoints(tmp_path)
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, "prog", training_script=RESUMABLE, worker_replicas=1, on_finish_action="keep_job",
        env={"EPOCHS": "4", "STEPS_PER_EPOCH": "10", "EPOCH_SECONDS": "4", "CHECKPOINT_EVERY": "2",
             "CRASH_AT_EPOCH": "3", "CRASH_EXIT_CODE": "137"}, **volume))

    assert run.state == "success", run.log
    result = run.xcom["return_value"]
    assert result["retry_count"] == 1 and result["resumed_from"].endswith("/epoch-2.pt"), result
    shown = re.findall(r"\[prog-master-0\] (progress \d+/40 steps [^\[]*?) \[airflow\.task", run.log)
    eta = r"progress \d+/40 steps \(\d+\.\d%\), [\d.]+ steps/s, ETA (\d+m)?\d+s \(\d\d:\d\d:\d\d UTC\)"
    assert any(re.fullmatch(eta, line) for line in shown), shown
    assert "progress 20/40 steps (50.0%); resumed 1 time(s), 10 steps redone" in shown, shown
    assert shown[-1].startswith("progress 40/40 steps (100.0%)"), shown
    printed = 31 + 21  # 0..30 in the first run, 20..40 in the second
    assert len(shown) <= printed * 0.6, f"at most one a minute or per 5 %, not all {printed}: {shown}"
    progress = result["progress"]
    assert (progress["done"], progress["total"], progress["resumes"], progress["redone"]) == (40, 40, 1, 10), progress
    spent = result["goodput"]
    buckets = sum(spent[f"{bucket}_seconds"] for bucket in ("queued", "starting", "running", "restarting",
                                                            "preempted", "stalled", "redone"))
    assert abs(buckets - spent["wall_seconds"]) <= 0.02 * spent["wall_seconds"], spent
    # The restart as the task log told it (the wait saw Restarting, then Running again): the Job's own
    # conditions cannot say it on Volcano v1.15, which keeps only the latest condition of each phase.
    logged = [(datetime.datetime.fromisoformat(at), phase) for at, phase in re.findall(
        rf"^(\S+) \[info +\] Volcano Job {cluster.namespace}/prog is (Restarting|Running)\b", run.log, re.M)]
    restarted = next(at for at, phase in logged if phase == "Restarting")
    running_again = next(at for at, phase in logged if phase == "Running" and at > restarted)
    restart = (running_again - restarted).total_seconds()
    assert restart > 0 and abs(spent["restarting_seconds"] - restart) <= 3, (spent, restart)
    assert spent["redone_seconds"] > 0 and spent["running_seconds"] > spent["redone_seconds"], spent
    assert f"Where the time went (Volcano Job {cluster.namespace}/prog, " in run.log
    assert re.search(r"  restarting +\d+s +\d+\.\d%", run.log), run.log
    print("MEASURED", spent)


def test_a_failed_try_resumes_on_the_next_try_from_the_same_checkpoint_dir(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path):
    shared, volume = checkpoints(tmp_path)
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, None, training_script=RESUMABLE, worker_replicas=1, deferrable=True,
        retries=1, retry_delay=datetime.timedelta(0),
        env={"EPOCHS": "6", "EPOCH_SECONDS": "2", "CRASH_AT_EPOCH": "4", "CRASH_EXIT_CODE": "1"}, **volume))

    assert run.state == "success", run.log
    result = run.xcom["return_value"]
    assert result["resumed_from"].endswith("/epoch-4.pt") and result["retry_count"] == 0, result
    assert "rank 0/2 starts at epoch 5 of 6 (VOLCANO_RESTART_COUNT=0, AIRFLOW_TRY_NUMBER=2)" in run.log, run.log
    assert len(list(shared.rglob("latest.json"))) == 1, "both tries used one CHECKPOINT_DIR"
    # Deferred, the trigger's copies show the progress too; the second try's starts where the first stopped.
    assert re.search(r"\[[\w-]+-master-0\] progress 4/6 steps \(66\.7%\)", run.log), run.log
    assert result["progress"]["done"] == result["progress"]["total"] == 6, result


def kubelet(action: str) -> None:
    subprocess.run([CLUSTER, action, "kubelet"], check=True, capture_output=True)


def tolerating_a_lost_node_for(real_node: dict, seconds: int) -> list[dict]:
    """The real node's tolerations, and how long the pods stay on a node that stopped answering before
    the cluster evicts them (300 s unless a pod says otherwise)."""
    return [*real_node["tolerations"], {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                        "effect": "NoExecute", "tolerationSeconds": seconds}]


def logged_at(log: str, text: str) -> datetime.datetime:
    line = next(line for line in log.splitlines() if text in line)
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))


@pytest.mark.disruptive
@pytest.mark.node_outage
def test_a_lost_node_is_named_and_its_pods_restart_once_it_is_back(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path):
    """The kubelet stops in epoch 2 (the node cut off from the apiserver: its containers run on); after the
    node lifecycle controller's grace period (20 s in the local cluster) it marks the pods not ready and taints
    the node. node_lost_timeout (10 s) passes, but the pods are deleted only once the cluster's own eviction
    has begun (their toleration of the taint, 30 s, ran out): never before Kubernetes would give them up.
    Volcano restarts the gang, whose pods start once the kubelet is back, and the training resumes from its
    checkpoint."""
    shared, volume = checkpoints(tmp_path)
    events: list[str] = []

    def partition() -> None:
        try:
            cluster.wait_for("epoch 2", lambda: latest(shared).get("epoch", 0) >= 2, timeout=240)
            kubelet("stop")
            events.append("stopped")
            cluster.wait_for("the Job to restart", lambda: ((cluster.job("lost") or {}).get("status") or {}).get(
                "retryCount", 0) >= 1, timeout=240)
            events.append("restarted")
        finally:
            kubelet("restart")

    partitioner = threading.Thread(target=partition, daemon=True)
    partitioner.start()
    try:
        run = run_task(lambda: real_operator(
            real_node, cluster.namespace, "lost", training_script=RESUMABLE, worker_replicas=1, job_timeout=600,
            node_lost_timeout=10, env={"EPOCHS": "40", "EPOCH_SECONDS": "3"},
            tolerations=tolerating_a_lost_node_for(real_node, 30), **volume))
    finally:
        partitioner.join(timeout=300)
        if partitioner.is_alive():  # still waiting for the restart: bring the kubelet back for the next tests
            kubelet("restart")

    assert events == ["stopped", "restarted"], (events, run.log)
    assert run.state == "success", run.log
    lost = "Node real-node stopped answering: its pod(s) lost-master-0, lost-worker-0 of Volcano Job "
    assert lost in run.log and "toleration of its unreachable taint (30s)" in run.log, run.log
    deleting = "Node real-node has not come back within node_lost_timeout (10s) and the cluster is evicting its pod(s) "
    assert deleting + "lost-master-0" in run.log, run.log
    # The node controller marks the pods not ready and taints the node at once; the taint manager evicts them
    # 30 s later. node_lost_timeout alone deleted them 10 s after the waiter saw them (at most 10 s late).
    seen = logged_at(run.log, lost)
    marked = re.search(r"were marked not ready at (\d\d:\d\d:\d\d) UTC", run.log)
    assert marked, run.log
    not_ready = datetime.datetime.combine(seen.date(), datetime.time.fromisoformat(marked[1]), tzinfo=datetime.UTC)
    waited = (logged_at(run.log, deleting) - not_ready).total_seconds()
    assert waited >= 28, f"deleted {waited:.0f}s after the pods were marked not ready: before the eviction (30s)"
    assert run.xcom["return_value"]["retry_count"] == 1 and run.xcom["return_value"]["resumed_from"], run.log
    wait_until_gone(cluster, containerd, "lost")  # no container left behind


@pytest.mark.disruptive
@pytest.mark.node_outage
def test_a_lost_node_with_the_retry_budget_spent_fails_the_task_naming_the_node(
        cluster, operator_kubeconfig, run_task, real_node, containerd, tmp_path):
    shared, volume = checkpoints(tmp_path)

    def partition() -> None:
        cluster.wait_for("epoch 1", lambda: latest(shared).get("epoch", 0) >= 1, timeout=240)
        kubelet("stop")

    partitioner = threading.Thread(target=partition, daemon=True)
    partitioner.start()
    try:
        run = run_task(lambda: real_operator(
            real_node, cluster.namespace, "lostfail", training_script=RESUMABLE, worker_replicas=1, max_retry=1,
            job_timeout=600, node_lost_timeout=15, deferrable=True, env={"EPOCHS": "100", "EPOCH_SECONDS": "3"},
            tolerations=tolerating_a_lost_node_for(real_node, 5), **volume))
    finally:
        partitioner.join(timeout=300)
        kubelet("restart")

    assert run.state == "failed", run.log
    assert "Node real-node stopped answering" in run.log, run.log
    assert ("was restarted 1 time(s) after a failure, an eviction, a lost node or a stall: the retry budget is "
            "exhausted (max_retry 1") in run.log, run.log
    assert ("; node real-node stopped answering, and its pods were deleted after node_lost_timeout (handled like an "
            "eviction)") in run.log, run.log
    # Back, the kubelet stops the containers of the pods deleted while it was away.
    cluster.wait_for("no pod or container of the Job left", lambda: not cluster.pods("lostfail")
                     and not containerd.running_containers(cluster.namespace), timeout=180)


def test_the_resumable_example_dag_resumes_after_a_rank_is_killed(cluster, operator_kubeconfig, airflow_db,
                                                                   real_node, tmp_path, capfd):
    """dags/volcano_resumable_training.py as written, on the real node: a hostPath for its
    PersistentVolumeClaim; a worker exits 137 after epoch 1 (CRASH_AT_EPOCH) on the first attempt."""
    from .real_node import example_dag_on_the_real_node, return_value

    dag = example_dag_on_the_real_node("volcano_resumable_training.py", real_node)
    train = dag.get_task("train")
    shared = tmp_path / "checkpoints"
    shared.mkdir()
    train.volumes = [{"name": "checkpoints", "hostPath": {"path": str(shared), "type": "Directory"}}]
    train.env = {**train.env, "EPOCHS": "3", "EPOCH_SECONDS": "5", "CRASH_AT_EPOCH": "1"}
    capfd.readouterr()

    run = dag.test(run_conf={"namespace": cluster.namespace})

    log = "".join(capfd.readouterr())
    assert str(run.get_task_instance("train").state) == "success", log
    result = return_value(dag, run, "train")
    assert result["retry_count"] == 1 and result["resumed_from"].endswith("/epoch-1.pt"), result
    assert "rank 0/3 starts at epoch 2 of 3 (VOLCANO_RESTART_COUNT=1, AIRFLOW_TRY_NUMBER=1)" in log, log
