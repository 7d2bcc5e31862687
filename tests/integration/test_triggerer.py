"""A deferred task in a real `airflow triggerer` process: restarted, then killed from the REST API.

The worker is dag.test() leaving the trigger to the triggerer (dag_runner.py --external-triggerer);
the triggerer is `airflow triggerer`; "Mark failed" is a PATCH through Airflow's public REST API.
All three share a fresh metadata DB. The scenario runs on the suite's Airflow (3.3+: the triggerer
calls the trigger's on_kill) and on Airflow 3.1 (no on_kill: the trigger tells a user's kill from
a triggerer shutdown by the task's state), from the venv `make venv` builds for it.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ..conftest import airflow_lane
from . import warm_worker
from .airflow_api_client import api_call
from .airflow_db import migrate
from .conftest import REPO
from .test_kill_and_reattach import SIM, write_dag

AIRFLOWS = {
    "suite-airflow": Path(sys.executable),
    # pyproject's floors: Airflow 3.1.7 and the lowest of every direct dependency.
    "lowest": REPO / ".venv-lowest" / "bin" / "python",
    # The newest Airflow 3.2 (constraints-airflow-3.2.txt).
    "airflow-3.2": REPO / ".venv-airflow-3.2" / "bin" / "python",
    # The newest, 3.3.2, with its release-day set (constraints-airflow-3.3.txt), as its official image and
    # constraints file install it; suite-airflow is 3.3.2 with today's packages.
    "airflow-3.3": REPO / ".venv-airflow-3.3" / "bin" / "python",
}


def airflow_env(home: Path, dags: Path) -> dict[str, str]:
    """Worker and triggerer alike: the cluster's connection (the triggerer resolves it by id)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1", AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW_CONN_KUBERNETES_DEFAULT=os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"], PYTHONUNBUFFERED="1",
    )
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def trigger_log(home: Path) -> str:
    """What the trigger wrote: the triggerer files it with the task instance's logs. Files only: a
    downstream DAG's asset-triggered runs have directories named `run_id=asset_triggered__…`."""
    return "".join(path.read_text(errors="replace") for path in sorted((home / "logs").rglob("*trigger*"))
                   if path.is_file())


def task_instance(python: Path, env: dict[str, str], dag_id: str) -> str:
    """The task instance as the REST API returns it to anyone who may read task instances."""
    code, output = api_call(python, env, "state", dag_id, "train")
    assert code == 0, output
    return output


def task_state(python: Path, env: dict[str, str], dag_id: str) -> str:
    return task_instance(python, env, dag_id).split("TASK-STATE ")[-1].strip()


def kubeconfig_secrets(path: Path) -> list[str]:
    """The token, keys and certificates of a kubeconfig (JSON or YAML)."""
    config = yaml.safe_load(path.read_text())
    entries = [entry.get("user") or {} for entry in config.get("users") or []]
    entries += [entry.get("cluster") or {} for entry in config.get("clusters") or []]
    fields = ("token", "client-key-data", "client-certificate-data", "certificate-authority-data")
    return [entry[field] for entry in entries for field in fields if entry.get(field)]


@pytest.fixture
def in_an_airflow_lane(request: pytest.FixtureRequest) -> Iterator[None]:
    """At most AIRFLOW_LANES of the tests that run Airflow itself at a time: each starts a metadata
    database, a worker and a triggerer, and three at once starved the two cores (the pre-3.3 kill path
    then timed out). tests/conftest.py deals them into lanes, which `--dist loadgroup` keeps each on one
    test worker (scripts/test-suite), so no other worker waits here; a lane's lock holds for a run that
    does not group them."""
    lane = airflow_lane(request.node)
    with open(f"{tempfile.gettempdir()}/airflow-volcano-{lane}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.parametrize("airflow", list(AIRFLOWS))
def test_deferred_task_outlives_a_triggerer_restart_and_a_user_kill_deletes_everything(
    in_an_airflow_lane, cluster, operator_kubeconfig, tmp_path, airflow
):
    python = AIRFLOWS[airflow]
    assert python.exists(), f"{python} is missing: `make venv` builds it"
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    worker_env = airflow_env(home, dags)
    triggerer_env = airflow_env(home, dags)
    migrate(python, worker_env)

    script = dags / "train.py"
    script.write_text("print('training')\n")
    dag_id = "deferred_kill"
    # A secret-looking env value that the master prints: the triggerer copies the line masked.
    secret = "hf_tr1gger_0123456789"
    cluster.write_log("dkill-master-0", [f"loaded token {secret}", "training"])
    dag_file = write_dag(dags, dag_id, cluster.namespace, name="dkill", deferrable=True, env={"HF_TOKEN": secret},
                         training_script=str(script), annotations={SIM + "outcome": "run-forever"})
    worker_log, triggerer_log = tmp_path / "worker.log", tmp_path / "triggerer.log"
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    worker = warm_worker.start([str(dag_file), dag_id, logical_date, "--external-triggerer"], worker_env, worker_log,
                               python=python)

    def start_triggerer() -> subprocess.Popen:
        return subprocess.Popen([str(python), "-m", "airflow", "triggerer"], env=triggerer_env,
                                stdout=triggerer_log.open("ab"), stderr=subprocess.STDOUT)

    def watches(count: int) -> None:
        cluster.wait_for(f"the triggerer to run the trigger (start {count})",
                         lambda: trigger_log(home).count("Waiting for Volcano Job") >= count, timeout=180)

    triggerer = start_triggerer()
    try:
        job = cluster.wait_phase("dkill", {"Running"}, timeout=180)  # a worker's start, on a loaded machine
        watches(1)
        deferred = task_instance(python, worker_env, dag_id)
        assert '"state":"deferred"' in deferred, deferred
        secrets = kubeconfig_secrets(operator_kubeconfig)
        assert secrets and not [secret for secret in secrets if secret in deferred], (
            "a deferred task instance's REST API response must hold no credential")
        if airflow == "lowest":  # Airflow 3.1 returns the trigger's arguments: these are what is checked
            assert '"kwargs":"{' in deferred and "kubernetes_conn_id" in deferred, deferred
        cluster.wait_for("the trigger to copy the master's log", lambda: "[dkill-master-0] training" in
                         trigger_log(home), timeout=60)
        assert "[dkill-master-0] loaded token ***" in trigger_log(home) and secret not in trigger_log(home)

        # A triggerer shutdown (a deploy, a restart) cancels the trigger: the training must go on.
        triggerer.send_signal(signal.SIGTERM)
        triggerer.wait(timeout=60)
        assert cluster.job("dkill")["metadata"]["uid"] == job["metadata"]["uid"], (
            "a triggerer shutdown must not delete the Job\n" + trigger_log(home)[-3000:])
        assert task_state(python, worker_env, dag_id) == "deferred"

        triggerer = start_triggerer()
        watches(2)
        code, output = api_call(python, worker_env, "mark-failed", dag_id, "train")
        assert code == 0, output

        cluster.wait_for("the Job, its pods and its script ConfigMap to be deleted",
                         lambda: cluster.job("dkill") is None and not cluster.pods("dkill")
                         and "dkill-script" not in cluster.configmap_names(), timeout=90)
        # Logged once the delete has returned, which may be just after the test sees the Job gone.
        cluster.wait_for("the trigger to log the kill", lambda: "Task killed: deleted Volcano Job" in trigger_log(home),
                         timeout=30)
        assert worker.wait(timeout=120) == 1, worker_log.read_text()[-3000:]  # the DAG run failed
    finally:
        for process in (worker, triggerer):
            if process.poll() is None:
                process.terminate()  # the triggerer then stops the log server it started
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
