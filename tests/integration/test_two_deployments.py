"""Two Airflow deployments (staging and prod: separate metadata databases) share a namespace and run the
same DAG file for the same dates (issue 42). Before, staging's retry reattached to prod's Job (the same
task instance by its labels), and staging's orphan sweep asked staging's Airflow about prod's Job, found
its copy of the task instance failed, and marked prod's running Job for deletion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from . import warm_worker
from .airflow_api_client import api_call
from .airflow_db import migrate
from .test_kill_and_reattach import SIM, WORKER_WAIT, write_dag
from .test_triggerer import airflow_env, in_an_airflow_lane  # noqa: F401 - a fixture

PYTHON = sys.executable
DEPLOYMENT = "airflow-volcano.io/deployment"
ORPHANED_AT = "airflow-volcano.io/orphaned-at"


class Airflow:
    """One deployment: its own home and metadata database, the shared DAGs folder."""

    def __init__(self, name: str, root: Path, dags: Path) -> None:
        self.name, self.home = name, root / name
        self.env = airflow_env(self.home, dags)
        self.workers: list[subprocess.Popen] = []
        migrate(PYTHON, self.env)

    def run(self, dag_file: Path, dag_id: str, date: str) -> tuple[subprocess.Popen, Path]:
        log = self.home / f"worker-{date[:10]}.log"
        worker = warm_worker.start([str(dag_file), dag_id, date], self.env, log, python=PYTHON)
        self.workers.append(worker)
        return worker, log

    def mark_failed(self, dag_id: str) -> None:
        code, output = api_call(PYTHON, self.env, "mark-failed", dag_id, "train")
        assert code == 0, output

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


@pytest.mark.xdist_group("airflow-releases")
def test_two_airflows_sharing_a_namespace_never_reattach_nor_sweep_each_others_jobs(
        in_an_airflow_lane, cluster, operator_kubeconfig, tmp_path):  # noqa: F811
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_id = "retrain"
    dag_file = write_dag(dags, dag_id, cluster.namespace, annotations={SIM + "outcome": "run-forever"})
    staging, prod = Airflow("staging", tmp_path, dags), Airflow("prod", tmp_path, dags)
    day, next_day = "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"

    def orphan_then_submit(airflow: Airflow, worker: subprocess.Popen) -> Path:
        """The worker killed -9 and its task instance marked failed (its Job an orphan), then the next
        day's run of the task submitted: that run's log."""
        worker.kill()
        worker.wait(timeout=30)
        airflow.mark_failed(dag_id)
        _, log = airflow.run(dag_file, dag_id, next_day)
        cluster.wait_for(f"{airflow.name}'s next task to submit", lambda: "Submitted Volcano Job" in log.read_text(),
                         timeout=WORKER_WAIT)
        return log

    try:
        prod_worker, prod_log = prod.run(dag_file, dag_id, day)
        prods = cluster.wait_for("prod's Job to run", lambda: next(
            (job for job in cluster.jobs() if (job.get("status") or {}).get("state", {}).get("phase") == "Running"),
            None), timeout=WORKER_WAIT)
        # Staging runs the same task instance: it must submit a Job of its own, not take prod's.
        staging_worker, staging_log = staging.run(dag_file, dag_id, day)
        running = cluster.wait_for("both Jobs to run", lambda: len(found := [
            job for job in cluster.jobs() if (job.get("status") or {}).get("state", {}).get("phase") == "Running"]) == 2
            and found, timeout=WORKER_WAIT)
        stagings = next(job for job in running if job["metadata"]["uid"] != prods["metadata"]["uid"])
        ids = {"prod": prods["metadata"]["labels"][DEPLOYMENT], "staging": stagings["metadata"]["labels"][DEPLOYMENT]}
        assert ids["prod"] != ids["staging"], ids
        assert "Reattaching" not in staging_log.read_text(), staging_log.read_text()[-3000:]

        # Staging's worker dies, then its task instance is marked failed: staging's Job is staging's orphan.
        staging_next = orphan_then_submit(staging, staging_worker)
        # Staging's orphan by its name (staging's next Job carries the same deployment label).
        orphan = cluster.job(stagings["metadata"]["name"]) or {"metadata": {}}
        assert orphan["metadata"].get("uid") == stagings["metadata"]["uid"], "staging's orphan is still there"
        assert ORPHANED_AT in orphan["metadata"].get("annotations", {}), "staging finds its own orphan"
        assert ORPHANED_AT not in (cluster.job(prods["metadata"]["name"]) or {})["metadata"].get("annotations", {}), (
            "staging's sweep marked prod's running Job:\n" + staging_next.read_text()[-3000:])
        assert prods["metadata"]["name"] not in staging_next.read_text(), "nor named it"

        # And prod, likewise, finds its own orphan, not staging's.
        prod_next = orphan_then_submit(prod, prod_worker)
        found = f"Found Volcano Job {cluster.namespace}/{prods['metadata']['name']} (Running) of task instance"
        assert found in prod_next.read_text(), prod_next.read_text()[-3000:]
        assert stagings["metadata"]["name"] not in prod_next.read_text()
        assert prod_log.exists()
    finally:
        staging.stop()
        prod.stop()
