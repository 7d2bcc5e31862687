"""Kill safety and reattach: a worker process killed mid-job, a retry, a user killing the task.

The task runs in a separate process (dag_runner.py, a real dag.test()), so the test can SIGTERM
or kill -9 it exactly as a worker shutdown or crash would.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SIM = "sim.airflow-volcano.io/"
RUNNER = Path(__file__).with_name("dag_runner.py")


def write_dag(tmp_path: Path, dag_id: str, namespace: str, **operator_kwargs) -> Path:
    kwargs = {"task_id": "train", "namespace": namespace, "image": "img:1", "worker_replicas": 1,
              "startup_timeout": 60, "poll_interval": 1, "deferrable": False, **operator_kwargs}
    path = tmp_path / f"{dag_id}.py"
    path.write_text(textwrap.dedent(f"""
        import datetime
        from airflow.sdk import DAG
        from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
        with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
            VolcanoPyTorchJobOperator(**{kwargs!r})
    """))
    return path


def start_worker(dag_file: Path, dag_id: str, logical_date: str, log: Path) -> subprocess.Popen:
    out = log.open("ab")
    return subprocess.Popen([sys.executable, str(RUNNER), str(dag_file), dag_id, logical_date],
                            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def our_jobs(cluster) -> list[dict]:
    return [job for job in cluster.jobs()
            if job["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "airflow-volcano"]


@pytest.mark.parametrize("kill_signal", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_worker_dies_mid_job_and_the_retry_reattaches_without_a_duplicate(
    cluster, operator_kubeconfig, airflow_db, tmp_path, kill_signal
):
    dag_id = f"reattach_{kill_signal.name.lower()}"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, annotations={SIM + "run-for": "25s"})
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"

    first = start_worker(dag_file, dag_id, logical_date, log)
    job = cluster.wait_for("the Job to run", lambda: (jobs := our_jobs(cluster)) and
                           (jobs[0].get("status") or {}).get("state", {}).get("phase") == "Running" and jobs[0],
                           timeout=60)
    first.send_signal(kill_signal)
    if kill_signal == signal.SIGTERM:
        # A worker shutdown: Airflow's supervisor forwards SIGTERM (the task's on_kill runs), then
        # SIGKILLs what is left after its grace period.
        time.sleep(3)
        first.kill()
    first.wait(timeout=60)
    assert [j["metadata"]["uid"] for j in our_jobs(cluster)] == [job["metadata"]["uid"]], (
        "the worker going away must not delete the Job its retry will reattach to")

    second = start_worker(dag_file, dag_id, logical_date, log)
    assert second.wait(timeout=120) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert "Reattaching to Volcano Job" in text
    jobs = our_jobs(cluster)
    assert len(jobs) <= 1 and all(j["metadata"]["uid"] == job["metadata"]["uid"] for j in jobs), "no duplicate Job"


def test_user_killing_the_task_deletes_job_pods_and_configmap(cluster, operator_kubeconfig, airflow_db, tmp_path):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "user_kill"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killme", training_script=str(script),
                         annotations={SIM + "outcome": "run-forever"})
    log = tmp_path / "worker.log"
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), log)
    cluster.wait_phase("killme", {"Running"}, timeout=60)
    assert "killme-script" in cluster.configmap_names()

    # What "Mark failed" in the UI does: the server's state changes, then the task gets SIGTERM.
    with create_session() as session:
        session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)

    cluster.wait_for("Job, pods and ConfigMap to be gone", lambda: cluster.job("killme") is None
                     and not cluster.pods("killme") and "killme-script" not in cluster.configmap_names(), timeout=60)
