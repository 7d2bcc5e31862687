"""A real Job's life from Airflow, on the real node (real containers): job_timeout and a user's kill
leave no container running in containerd, the deferrable operator waits for a real Job in the
triggerer, and the sensor (poke and deferrable) follows real Jobs submitted outside Airflow.
"""

from __future__ import annotations

import datetime
import signal

from airflow_volcano.sensors.job import VolcanoJobSensor

from .real_node import SLEEPER, SMALL, losses, real_operator, script
from .test_kill_and_reattach import start_worker, write_dag


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
