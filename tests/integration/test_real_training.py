"""Training that succeeds, on the real node (real containers, real processes): seed 000's script
across master + 2 workers with gloo, seed 002's extra task that does not join the world, and the
example DAGs that train (the master's metrics gating promotion, @task.volcano_pytorch, the torchrun
example with Volcano's wait-for-master init container, the generic VolcanoJobOperator example); the
Job succeeds when the master does, and workers still running are stopped. Nothing is simulated: the
losses are computed, DNS names come from the EndpointSlices of Volcano's headless Service.
"""

from __future__ import annotations

import re

import pytest

from .real_node import SMALL, example_dag_on_the_real_node, losses, real_operator, return_value, script


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
