"""Real containers: the Jobs of these tests run on the cluster's real node (kubelet, containerd, runc,
CNI bridge, CoreDNS) with the local training image (Debian's CPU PyTorch). Nothing here is
simulated: the losses are computed, exit codes and OOM kills come from the kernel and the kubelet,
DNS names come from the EndpointSlices of Volcano's headless Service.
"""

from __future__ import annotations

import datetime
import importlib.util
import re
import signal
import textwrap
from pathlib import Path

import pytest

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
from airflow_volcano.sensors.job import VolcanoJobSensor

from .test_kill_and_reattach import start_worker, write_dag

REPO = Path(__file__).resolve().parents[2]
SEED_SCRIPT = REPO / "dags" / "scripts" / "pytorch_demo.py"
# Small requests so that a gang fits the 2-core node; no CPU limit, so torch is not throttled.
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
EPOCH_LOSS = re.compile(r"Epoch \[(\d)/5\], Average Loss: (\d+\.\d+)")


def real_operator(real_node: dict, namespace: str, name: str, **overrides) -> VolcanoPyTorchJobOperator:
    kwargs = dict(task_id="train", name=name, namespace=namespace, worker_replicas=2,
                  container_resources=SMALL, training_script=str(SEED_SCRIPT), startup_timeout=120,
                  job_timeout=300, poll_interval=1, deferrable=False, **real_node)
    kwargs.update(overrides)
    return VolcanoPyTorchJobOperator(**kwargs)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def example_dag_on_the_real_node(filename: str, real_node: dict, task_ids: tuple[str, ...] = ("train",)) -> object:
    """An example DAG from dags/, its Volcano tasks moved to the real node as `make demo` does
    (local image, node selector and toleration, small requests), synced to the metadata DB."""
    from .dag_runner import sync_to_db

    spec = importlib.util.spec_from_file_location(f"example_{Path(filename).stem}", REPO / "dags" / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    for task_id in task_ids:
        train = dag.get_task(task_id)
        train.image, train.image_pull_policy = real_node["image"], real_node["image_pull_policy"]
        train.node_selector, train.tolerations = real_node["node_selector"], real_node["tolerations"]
        train.container_resources = SMALL
    sync_to_db(dag)
    return dag


def return_value(dag: object, run: object, task_id: str) -> object:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag.dag_id, run_id=run.run_id, task_id=task_id,
                                                 key="return_value").one()
        return XComModel.deserialize_value(row)


def losses(log: str, pod: str) -> list[float]:
    return [float(loss) for _epoch, loss in re.findall(rf"\[{pod}\] " + EPOCH_LOSS.pattern, log)]


def test_seed_000_trains_across_three_real_pods(cluster, operator_kubeconfig, run_task, real_node):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "seed", on_finish_action="keep_job"))

    assert run.state == "success", run.log
    # The master's own output, computed by three processes that formed one gloo group.
    assert "[seed-master-0] [初始化] RANK=0, WORLD_SIZE=3" in run.log
    assert "[seed-master-0] [初始化] MASTER_ADDR=seed-master-0.seed" in run.log
    assert "[seed-master-0] [初始化完成] 成功初始化分布式进程组" in run.log
    computed = losses(run.log, "seed-master-0")
    assert len(computed) == 5, run.log
    assert "[seed-master-0] [Rank 0] 进程组已销毁" in run.log
    assert run.log.count("Epoch [5/5], Average Loss") == 1, "each log line once"
    # A successful run says nothing a user would read as a failure (no XCom-not-found for unset link
    # templates, no 404 for pods Volcano removed).
    alarming = re.findall(r".*\[(?:warning|error)\s*\].*", run.log)
    assert not alarming, alarming
    # Progress in the task log: each phase once.
    assert run.log.count(f"Volcano Job {cluster.namespace}/seed is Running: 3/3 pods running") == 1
    assert run.log.count(f"Volcano Job {cluster.namespace}/seed is Pending:") <= 1
    # DDP's all-reduce needs every rank: five losses mean the workers trained too. Once the master
    # has finished, Volcano completes the Job and removes workers still shutting down, so only
    # the workers still there are checked.
    pods = {pod.metadata.name: pod for pod in cluster.pods("seed")}
    assert "seed-master-0" in pods and pods["seed-master-0"].status.phase == "Succeeded"
    for name, pod in pods.items():
        assert pod.spec.node_name == "real-node"
        # The script came from the ConfigMap the operator created, mounted into the pod.
        assert any(v.config_map and v.config_map.name == "seed-script" for v in pod.spec.volumes)
        if name.startswith("seed-worker-") and pod.status.phase == "Succeeded" and not pod.metadata.deletion_timestamp:
            rank = int(name.rsplit("-", 1)[1]) + 1
            assert f"[初始化] RANK={rank}, WORLD_SIZE=3" in cluster.pod_log(name)


def test_seed_002_an_extra_task_does_not_join_the_world(cluster, operator_kubeconfig, run_task, real_node, tmp_path,
                                                       volcano_release):
    """With WORLD_SIZE counting the evaluator (the seed 002 bug, Volcano before 1.12), the gloo group
    would wait for a fourth rank that never comes, and the Job would hang until job_timeout. On such
    a release the operator gives the ranks the right WORLD_SIZE itself (make test-compat)."""
    evaluator_pod = {"nodeSelector": real_node["node_selector"], "tolerations": real_node["tolerations"],
                     "restartPolicy": "Never", "containers": [{
                         "name": "evaluator", "image": real_node["image"], "imagePullPolicy": "IfNotPresent",
                         "command": ["python", "-c", "import os; print('evaluator sees', {k: os.environ.get(k) "
                                     "for k in ('WORLD_SIZE', 'RANK', 'MASTER_ADDR')})"],
                         "resources": SMALL}]}
    template = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {},
                "spec": {"minAvailable": 4, "tasks": [
                    {"name": "master", "replicas": 1, "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                     "template": {"spec": {"containers": [{"name": "master"}], "restartPolicy": "Never"}}},
                    {"name": "worker", "replicas": 2,
                     "template": {"spec": {"containers": [{"name": "worker"}], "restartPolicy": "Never"}}},
                    {"name": "evaluator", "replicas": 1, "template": {"spec": evaluator_pod}},
                ], "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": []}}}

    run = run_task(lambda: real_operator(real_node, cluster.namespace, "extra", job_template=template,
                                         worker_replicas=None, job_timeout=240, on_finish_action="keep_job"))

    assert run.state == "success", run.log
    assert "[extra-master-0] [初始化] RANK=0, WORLD_SIZE=3" in run.log
    assert len(losses(run.log, "extra-master-0")) == 5, run.log
    # The evaluator is no rank: it keeps what Volcano gives it (every task counted before 1.12).
    evaluator_log = cluster.pod_log("extra-evaluator-0")
    volcanos_count = "3" if volcano_release >= (1, 12) else "4"
    assert f"'WORLD_SIZE': '{volcanos_count}'" in evaluator_log and "'RANK': None" in evaluator_log
    adapted = "the ranks of tasks master and worker get WORLD_SIZE=3 from the operator instead"
    assert (adapted in run.log) is (volcano_release < (1, 12))


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


def test_an_image_missing_on_the_node_fails_at_once_with_the_kubelets_reason(
        cluster, operator_kubeconfig, run_task, real_node):
    run = run_task(lambda: real_operator(real_node | {"image": "localhost/airflow-volcano/absent:dev"},
                                         cluster.namespace, "noimage", worker_replicas=1, startup_timeout=600))

    assert run.state == "failed", run.log
    assert "cannot start" in run.log and "localhost/airflow-volcano/absent:dev" in run.log
    assert re.search(r"reason (ErrImagePull|ImagePullBackOff)", run.log), run.log
    assert "did not start within startup_timeout" not in run.log, "an image pull error must not wait it out"
    cluster.wait_for("the Job that cannot start to be deleted", lambda: cluster.job("noimage") is None)


SLEEPER = """
    import os, time
    print(f"rank {os.environ['RANK']} started", flush=True)
    time.sleep(3600)
"""


def test_job_timeout_stops_the_real_processes(cluster, operator_kubeconfig, run_task, real_node, containerd,
                                              tmp_path):
    train = script(tmp_path, SLEEPER)
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "forever", training_script=train,
                                         worker_replicas=1, job_timeout=25))

    assert run.state == "failed", run.log
    assert "job_timeout of 25s passed" in run.log
    assert "[forever-master-0] rank 0 started" in run.log
    cluster.wait_for("no container of the Job left running in containerd",
                     lambda: cluster.job("forever") is None and not containerd.running_containers(cluster.namespace),
                     timeout=90)


def test_killing_the_task_stops_the_real_processes(cluster, operator_kubeconfig, airflow_db, real_node, containerd,
                                                    tmp_path):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    dag_id = "real_kill"
    train = script(tmp_path, SLEEPER)
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killme", training_script=train,
                         container_resources=SMALL, **real_node)
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), tmp_path / "worker.log")
    cluster.wait_for("both ranks to be running", lambda: len(containerd.running_containers(cluster.namespace)) >= 4
                     and all(p.status.phase == "Running" for p in cluster.pods("killme")), timeout=120)

    # What "Mark failed" in the UI does: the server's state changes, then the task gets SIGTERM.
    with create_session() as session:
        session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)

    cluster.wait_for("no container of the Job left running in containerd",
                     lambda: cluster.job("killme") is None and not containerd.running_containers(cluster.namespace),
                     timeout=90)


def test_deferrable_mode_on_a_real_job(cluster, operator_kubeconfig, run_task, real_node):
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "dfr", worker_replicas=1, deferrable=True))

    assert run.state == "success", run.log
    assert "Deferring: the triggerer waits for Volcano Job" in run.log
    # The trigger reports progress too, into the same task log.
    assert run.log.count(f"Volcano Job {cluster.namespace}/dfr is Running: 2/2 pods running") == 1
    assert "[dfr-master-0] [初始化] RANK=0, WORLD_SIZE=2" in run.log
    assert len(losses(run.log, "dfr-master-0")) == 5, run.log
    assert run.log.count("Epoch [5/5], Average Loss") == 1


def test_sensor_on_real_jobs_submitted_outside_airflow(cluster, operator_kubeconfig, run_task, real_node):
    pod = {"nodeSelector": real_node["node_selector"], "tolerations": real_node["tolerations"],
           "restartPolicy": "Never", "containers": [{
               "name": "master", "image": real_node["image"], "imagePullPolicy": "IfNotPresent",
               "command": ["python", "-c", "import torch, time; time.sleep(8); "
                           "print('outside job: torch', torch.__version__, 'sum', int(torch.arange(10).sum()))"]}]}

    for mode in ("poke", "deferrable"):
        name = f"outside-{mode}"
        cluster.create_job({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
                            "spec": {"schedulerName": "volcano", "minAvailable": 1, "tasks": [
                                {"name": "master", "replicas": 1, "template": {"spec": pod},
                                 "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}]}]}})
        run = run_task(lambda name=name, mode=mode: VolcanoJobSensor(
            task_id="wait", job_name=name, namespace=cluster.namespace, poke_interval=1, timeout=180,
            get_logs=True, deferrable=mode == "deferrable"))

        assert run.state == "success", run.log
        if mode == "deferrable":
            assert f"Deferring: the triggerer waits for Volcano Job {cluster.namespace}/{name}" in run.log
        assert "outside job: torch 2.6" in run.log and "sum 45" in run.log
        assert run.xcom["return_value"]["phase"] == "Completed"
        assert cluster.job(name)["status"]["state"]["phase"] == "Completed", "the sensor keeps Jobs not its own"


@pytest.mark.parametrize(("max_eval_loss", "ran", "skipped"), [
    (1.0, "promote", "report_rejected"),
    (0.0, "report_rejected", "promote"),
])
def test_the_masters_metrics_gate_promotion_in_the_example_dag(cluster, operator_kubeconfig, airflow_db, real_node,
                                                               max_eval_loss, ran, skipped):
    """dags/volcano_train_evaluate_promote.py: rank 0 writes its metrics to /dev/termination-log,
    the operator returns them as `result`, and a branch promotes the model only if they are good."""
    dag = example_dag_on_the_real_node("volcano_train_evaluate_promote.py", real_node)

    run = dag.test(run_conf={"namespace": cluster.namespace, "max_eval_loss": max_eval_loss})

    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert (states["train"], states["quality_gate"], states[ran], states[skipped]) == (
        "success", "success", "success", "skipped"), states
    result = return_value(dag, run, "train")["result"]
    assert result["world_size"] == 3 and result["model_uri"].startswith("s3://models/linear/")
    assert 0 <= result["eval_loss"] < 1.0


def test_taskflow_function_trains_on_every_rank_and_returns_rank_0s_value(cluster, operator_kubeconfig, airflow_db,
                                                                           real_node):
    """dags/volcano_taskflow_training.py: @task.volcano_pytorch with its argument from an upstream task."""
    dag = example_dag_on_the_real_node("volcano_taskflow_training.py", real_node)

    run = dag.test(run_conf={"namespace": cluster.namespace})

    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"hyperparameters": "success", "train": "success", "report": "success"}, states
    result = return_value(dag, run, "train")["result"]
    report = return_value(dag, run, "report")
    assert (result["world_size"], result["rank_sum"]) == (3, 3), result
    assert abs(result["weight"] - 3) < 0.5 and result["final_loss"] < 1.0, result
    assert report.startswith("trained on 3 ranks: loss ")


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
    assert len(losses(run.log, "trun-master-0")) == 5, "rank 0 trained all five epochs with the five others"


def test_elastic_torchrun_trains_with_the_pods_that_fit(cluster, operator_kubeconfig, run_task, real_node):
    """min_available=2 of 3 pods with torchrun: Volcano starts the Job once 2 pods fit (the node has
    2 CPUs, each pod requests 0.9), torchrun's c10d rendezvous forms a world of 2, and the
    third pod, never scheduled, is removed when the master's completion ends the Job."""
    fits_two = {"requests": {"cpu": "900m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "elastic", launcher="torchrun",
                                         min_available=2, container_resources=fits_two, log_tasks=["worker"],
                                         torchrun_options=["--rdzv_conf=last_call_timeout=5"]))

    assert run.state == "success", run.log
    for rank in (0, 1):
        assert re.search(rf"\[elastic-(master|worker)-\d\] \[初始化\] RANK={rank}, WORLD_SIZE=2 ", run.log), run.log
    assert "WORLD_SIZE=3" not in run.log
    assert run.log.count("Epoch [5/5], Average Loss") == 1, run.log
    assert f"Volcano Job {cluster.namespace}/elastic is Running: 2/3 pods running" in run.log


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
        # Volcano counts the restart that finds the budget spent: max_retry=2 is one real restart.
        assert (f"Volcano Job {cluster.namespace}/kill9 ended in phase Failed after 2 restart(s): the retry budget is "
                "exhausted (max_retry 2)") in run.log, run.log
        assert (state / "attempts").read_text() == "2"
        assert "  - pod kill9-worker-0 (task worker) Failed, container worker, exit code " in run.log


def test_debug_mode_keeps_the_pods_up_for_a_shell_then_deletes_the_job(cluster, operator_kubeconfig, run_task,
                                                                         real_node, kubeconfig):
    """T9k's debug mode: the same pods (env, script, ranks) come up sleeping; `kubectl exec` runs a
    command in one; after debug_timeout the Job is deleted and the task succeeds."""
    import subprocess
    import threading

    shell: dict[str, subprocess.CompletedProcess] = {}

    def exec_in_the_master() -> None:
        cluster.wait_for("the master pod to run", lambda: any(
            pod.metadata.name == "dbg-master-0" and pod.status.phase == "Running" for pod in cluster.pods("dbg")),
            timeout=120)
        shell["master"] = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", cluster.namespace, "dbg-master-0", "-c", "master",
             "--", "python", "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
             "os.path.isfile('/opt/airflow-volcano/script/pytorch_demo.py'))"], capture_output=True, text=True,
            timeout=60)

    helper = threading.Thread(target=exec_in_the_master, daemon=True)
    helper.start()
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "dbg", debug=True, debug_timeout=20))
    helper.join(timeout=60)

    assert run.state == "success", run.log
    assert shell["master"].stdout.strip() == "rank 0 of 3 True", shell["master"]
    assert "Debug mode: 3 pod(s) of Volcano Job" in run.log
    assert (f"kubectl exec -it -n {cluster.namespace} dbg-worker-1 -c worker -- bash   # then: python "
            "/opt/airflow-volcano/script/pytorch_demo.py") in run.log
    assert "Epoch [1/5]" not in run.log, "nothing trained"
    assert cluster.job("dbg") is None, "the Job is deleted when the debug session ends"


def test_the_torchrun_example_dag_trains_six_ranks_with_tensorboard_and_waiting_workers(
        cluster, operator_kubeconfig, airflow_db, real_node, tmp_path, capfd):
    """dags/volcano_torchrun_training.py as written, on the real node: a hostPath for its
    PersistentVolumeClaim, the local image for Volcano's wait-for-master init container."""
    dag = example_dag_on_the_real_node("volcano_torchrun_training.py", real_node)
    train = dag.get_task("train")
    logs = tmp_path / "logs"
    logs.mkdir()
    train.volumes = [{"name": "logs", "hostPath": {"path": str(logs), "type": "Directory"}}]
    train.wait_for_master = real_node["image"]  # Volcano's default, busybox, is not on this offline node
    train.env = {**train.env, "STEPS": "20"}
    seen = InitContainerWatch(cluster)
    capfd.readouterr()

    run = dag.test(run_conf={"namespace": cluster.namespace})
    seen.stop()

    log = "".join(capfd.readouterr())
    assert str(run.get_task_instance("train").state) == "success", log
    result = return_value(dag, run, "train")["result"]
    assert result["world_size"] == 6 and result["loss"] < 1.0, result
    for rank in range(6):
        assert re.search(rf"\] rank {rank} of 6 \(local rank {rank % 2}, pod ", log), log
    assert list(logs.glob("tb/*/events.out.tfevents.*")), "rank 0's TensorBoard events on the shared volume"
    # Each worker ran Volcano's wait-for-master init container, which let it start once the master answered.
    assert set(seen.ready) == {"worker-0", "worker-1"}, seen.ready


class InitContainerWatch:
    """Follows the workers' wait-for-master init containers while the Job runs (Volcano removes
    workers still shutting down when the master's completion ends it, so afterwards is too late)."""

    def __init__(self, cluster) -> None:
        import threading

        self.cluster, self.ready = cluster, {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        while not self.done.is_set():
            for pod in self.cluster.pods():
                name = pod.metadata.name
                role = name.rsplit("-", 2)[-2] + "-" + name.rsplit("-", 1)[-1]
                statuses = pod.status.init_container_statuses or []
                if not role.startswith("worker-") or role in self.ready or not statuses:
                    continue
                terminated = statuses[0].state.terminated
                if statuses[0].name == "wait-for-master" and terminated is not None and terminated.exit_code == 0:
                    try:
                        text = self.cluster.core.read_namespaced_pod_log(name, self.cluster.namespace,
                                                                         container="wait-for-master")
                    except Exception:  # noqa: BLE001 - the pod went away between two reads: look again
                        continue
                    if "Master node is ready!" in text:
                        self.ready[role] = text
            self.done.wait(0.5)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)


def test_the_generic_job_example_runs_a_template_of_its_own_shape(cluster, operator_kubeconfig, airflow_db,
                                                                    real_node, capfd):
    """dags/volcano_generic_job.py: VolcanoJobOperator with a Job that is not PyTorch (a report
    task and three shard tasks, env + svc plugins): the shards find their index, the report pod
    reaches each by DNS, its termination message is the result, every shard's log is copied."""
    dag = example_dag_on_the_real_node("volcano_generic_job.py", real_node)
    capfd.readouterr()

    run = dag.test(run_conf={"namespace": cluster.namespace})

    log = "".join(capfd.readouterr())
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"train": "success", "report_accuracy": "success"}, log
    assert return_value(dag, run, "train")["result"] == {"accuracy": 0.857, "rows": 1000, "shards": 3}
    assert return_value(dag, run, "report_accuracy") == 0.857
    for index, correct, rows in ((0, 286, 334), (1, 285, 333), (2, 286, 333)):
        assert re.search(rf"\[[a-z0-9-]+-shard-{index}\] shard {index}: {correct}/{rows} correct", log), log
    assert re.search(r"\[[a-z0-9-]+-report-0\] accuracy over 3 shards: 857/1000 = 0\.8570", log), log


OUTLIVES_THE_MASTER = """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # PID 1: exit on Volcano's kill, not after 30 s
    if os.environ["RANK"] == "0":
        print("master: done", flush=True)
        with open("/dev/termination-log", "w") as out:
            out.write('{"ok": true}')
    else:
        print("worker: still busy", flush=True)
        time.sleep(600)
"""


def test_success_follows_the_master_and_workers_still_running_are_stopped(cluster, operator_kubeconfig, run_task,
                                                                           real_node, tmp_path, containerd):
    """T9k: the Job succeeds when the master does, whatever workers still run (the master task's
    TaskCompleted -> CompleteJob); Volcano stops those workers, so nothing keeps running."""
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "lead", training_script=script(
        tmp_path, OUTLIVES_THE_MASTER), on_finish_action="keep_job", job_timeout=120))

    assert run.state == "success", run.log
    assert run.xcom["return_value"]["result"] == {"ok": True}
    assert f"Volcano Job {cluster.namespace}/lead is Completed" in run.log
    cluster.wait_for("the workers to stop", lambda: not containerd.running_containers(cluster.namespace), timeout=60)
    assert cluster.job("lead") is not None, "keep_job: the Job stays, finished"
    # T9k's "Unfinished" cleanup is what Volcano's end does: running pods gone, finished ones kept for their logs.
    assert "master: done" in cluster.pod_log("lead-master-0")


# -- DeepSpeed and MPI over ssh from a hostfile (seed 003) ------------------------------------------------


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


RANK_FAILS = """
    import os
    import deepspeed, torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo")
    print(f"rank {dist.get_rank()} sees RUN_TAG={os.environ.get('RUN_TAG')} "
          f"DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')} on {os.environ.get('HOSTNAME')}", flush=True)
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
             "/opt/airflow-volcano/script/train_deepspeed.py", "--steps", "20"],
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
    assert (f"kubectl exec -it -n {cluster.namespace} dsdbg-master-0 -c master -- bash   # then: /bin/sh "
            "/opt/airflow-volcano/script/airflow-volcano-launch.sh /opt/airflow-volcano/script/train_deepspeed.py "
            "--steps 20") in run.log
    assert "dsdbg-worker-1 runs its command as usual" in run.log
    assert shell["master"].returncode == 0, shell["master"]
    assert re.search(r"DeepSpeed trained 2 ranks: loss \d+\.\d+ -> \d+\.\d+", shell["master"].stdout), shell["master"]
    assert f"Volcano Job {cluster.namespace}/dsdbg was deleted: debug session over" in run.log


def run_writer_pod(cluster, real_node: dict, name: str, program: str) -> None:
    """A pod on the real node (container `master`) that runs a Python program writing its log, to its end."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"restartPolicy": "Never", "schedulerName": "volcano", "nodeSelector": real_node["node_selector"],
                    "tolerations": real_node["tolerations"],
                    "containers": [{"name": "master", "image": real_node["image"], "imagePullPolicy": "IfNotPresent",
                                    "command": ["python3", "-c", program]}]}}
    cluster.core.create_namespaced_pod(cluster.namespace, pod)
    cluster.wait_for("the writer to finish", lambda: cluster.core.read_namespaced_pod(
        name, cluster.namespace).status.phase == "Succeeded", 120)


def test_the_trigger_copies_a_real_containers_log_whole_in_one_streamed_read(
        cluster, operator_kubeconfig, real_node, monkeypatch):
    """The triggerer's log copy on a container the kubelet ran: 3,000 lines of Chinese (more than
    one 64 KiB chunk, so chunks end inside characters) and one of invalid UTF-8, each shown once."""
    import asyncio

    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.logs import LOG_CHUNK_BYTES, LogCursor
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    write = ("import sys\n"
             "for i in range(3000):\n"
             "    line = f'{i:04d} ' + '训练' * 10 + '\\n'\n"
             "    sys.stdout.buffer.write(line.encode() if i != 1500 else b'1500 bad \\xff\\xfe\\n')\n")
    run_writer_pod(cluster, real_node, "tlog-master-0", write)
    shown: list[str] = []

    class TaskLog:
        def info(self, message: str, *args: object, **fields: object) -> None:
            shown.append(message % args)

        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(VolcanoJobTrigger, "log", TaskLog())
    ref = JobRef(name="tlog", namespace=cluster.namespace, main_container="master")
    trigger = VolcanoJobTrigger(ref.to_dict(), "kubernetes_default")

    async def copy() -> None:
        await trigger._copy_new_log_lines(await trigger._hook(), ref, LogCursor())

    asyncio.run(copy())
    assert 3000 * len(("0000 " + "训练" * 10 + "\n").encode()) > LOG_CHUNK_BYTES, "more than one chunk"
    lines = [line.removeprefix("[tlog-master-0] ") for line in shown]
    assert [line[:4] for line in lines] == [f"{i:04d}" for i in range(3000)], "every line once, in order"
    assert lines[2999] == "2999 " + "训练" * 10
    assert lines[1500] == "1500 bad \ufffd\ufffd"


HOSTILE_WRITER = ("import sys\n"
                  "w = sys.stdout.buffer.write\n"
                  "w(b'before\\n')\n"
                  "w(b'x\\r2999-01-01T00:00:00Z forged\\n')\n"  # a carriage return, then a fake timestamp
                  "w(b'\\x1b[31mred\\x1b[0m 10%\\r 20%\\r\\n')\n"  # ANSI colours, tqdm's redraws
                  "for _ in range(50):\n"
                  "    w(b'y' * (1 << 20))\n"  # 50 MiB without a newline
                  "w(b'\\nafter\\n')\n")


def test_a_hostile_real_log_is_copied_escaped_and_cut_in_bounded_memory_in_both_modes(
        cluster, operator_kubeconfig, real_node, monkeypatch, caplog):
    """What a real container wrote, through the kubelet: a carriage return followed by a forged
    timestamp, ANSI escapes, and a 50 MiB line without a newline (the kubelet joins its partial
    lines into one). Both copies, the worker's final read and the trigger's streamed read, show
    each line once with control characters escaped, cut the long line and say so, hold at most a
    few MiB, and the cursor stays at the real timestamps."""
    import asyncio
    import tracemalloc

    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.logs import MAX_LINE_BYTES, LogCursor
    from airflow_volcano.pod_logs import PodLogCopy, read_remaining_log
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    run_writer_pod(cluster, real_node, "hostile-master-0", HOSTILE_WRITER)
    expected = ["before", "x\\r2999-01-01T00:00:00Z forged", "\\x1b[31mred\\x1b[0m 10%\\r 20%", "<cut>", "after"]

    def cut(lines: list[str]) -> list[str]:
        """The 50 MiB line as `<cut>` if it was cut right: its first bytes, then how many were not shown
        (the line's first MAX_LINE_BYTES include the kubelet's timestamp)."""
        found = len(lines) > 3 and re.fullmatch(r"(y+) \[\.\.\. line cut: (\d+) more bytes not shown\]", lines[3])
        if found:
            head, rest = len(found.group(1)), int(found.group(2))
            if MAX_LINE_BYTES - 40 < head < MAX_LINE_BYTES and head + rest == 50 << 20:
                return [*lines[:3], "<cut>", *lines[4:]]
        return lines

    def copied(copy: object) -> tuple[list[str], int]:
        tracemalloc.start()
        copy()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    worker_lines: list[str] = []
    worker_copy = PodLogCopy("hostile-master-0", "master", lambda line, at: worker_lines.append(line))
    worker_peak = copied(lambda: read_remaining_log(VolcanoHook(), cluster.namespace, worker_copy))
    assert "Could not read" not in caplog.text, caplog.text

    trigger_lines: list[str] = []

    class TaskLog:
        def info(self, message: str, *args: object, **fields: object) -> None:
            trigger_lines.append((message % args).removeprefix("[hostile-master-0] "))

        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(VolcanoJobTrigger, "log", TaskLog())
    ref = JobRef(name="hostile", namespace=cluster.namespace, main_container="master")
    trigger = VolcanoJobTrigger(ref.to_dict(), "kubernetes_default")
    trigger_cursor = LogCursor()

    async def trigger_copy() -> None:
        from airflow_volcano.masking import JobSecrets
        from airflow_volcano.triggers.job import _LogCopy
        from airflow_volcano.wait_engine import OutputClock

        trigger._secrets = JobSecrets()
        await trigger._copy_new_lines(await trigger._hook(), cluster.namespace,
                                      _LogCopy(ref.main_pod, "master", trigger_cursor), OutputClock())

    asyncio.run(trigger_copy())  # the clients' first import, outside the measured copy
    trigger_lines.clear()
    trigger_cursor = LogCursor()
    trigger_peak = copied(lambda: asyncio.run(trigger_copy()))

    for lines, cursor, peak in ((worker_lines, worker_copy.cursor, worker_peak),
                                (trigger_lines, trigger_cursor, trigger_peak)):
        assert cut(lines) == expected, [line[:80] + f"... ({len(line)})" for line in lines]
        assert peak < 8 << 20, f"copying held {peak >> 20} MiB"
        assert cursor.last_ns // 10**9 < datetime.datetime(2999, 1, 1, tzinfo=datetime.UTC).timestamp()


def test_debug_pods_end_by_themselves_when_the_worker_enforcing_debug_timeout_dies(
        cluster, operator_kubeconfig, airflow_db, real_node, containerd, tmp_path):
    """Debug mode's pods sleep; the task deletes the Job after debug_timeout. If the worker is
    killed (kill -9, no on_kill), each pod's own command still ends after debug_timeout and a
    minute, and the pods stop: nothing sleeps on, holding its GPUs, forever."""
    import time

    dag_id = "debug_orphan"
    train = script(tmp_path, SLEEPER)
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="dbgorphan", training_script=train,
                         container_resources=SMALL, debug=True, debug_timeout=5, **real_node)
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), tmp_path / "worker.log")
    cluster.wait_for("the debug pods to sleep in their containers", lambda: len(
        containerd.running_containers(cluster.namespace)) >= 4, timeout=120)
    started = time.monotonic()
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=60)

    cluster.wait_for("the debug pods' own command to end", lambda: not containerd.running_containers(
        cluster.namespace), timeout=150)
    assert time.monotonic() - started >= 30, "they slept, and were not stopped by anything else"
    assert "airflow-volcano debug mode: 65s are over" in cluster.pod_log("dbgorphan-master-0")
