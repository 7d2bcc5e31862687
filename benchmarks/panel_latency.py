"""How fast the Volcano Job panel's JSON answers, for a running Job of 8 pods (kwok), in the API server's
own app (in process: Airflow's `create_app`, the provider's plugin mounted as Airflow mounts it), side by
side with Airflow's own endpoint of the same task instance (`GET /api/v2/.../taskInstances/{task}`).

A deferred task (left deferred: no triggerer) submits the Job and pushes its XComs to a metadata DB of
the benchmark's own. Then, as a signed-in admin: requests within the cache's period (what most viewers
get), and requests each after the period (each reads the Job, its pods and the main pod's log).

    .venv/bin/python benchmarks/panel_latency.py [--requests 200] [--uncached 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-panel"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200, help="requests within the cache's period")
    parser.add_argument("--uncached", type=int, default=20, help="requests each after the cache's period")
    args = parser.parse_args()
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait"], capture_output=True)
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    home = Path(tempfile.mkdtemp(prefix="panel-bench-"))
    (home / "dags").mkdir()
    os.environ.update(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_KUBERNETES_DEFAULT=json.dumps({"conn_type": "kubernetes", "extra": {
            "kube_config_path": kubeconfig, "namespace": NAMESPACE}}))
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    dag = home / "dags" / "panel_bench.py"
    dag.write_text(textwrap.dedent(f"""
        import datetime
        from airflow.sdk import DAG
        from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
        with DAG("panel_bench", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
            VolcanoPyTorchJobOperator(task_id="train", name="bench", namespace={NAMESPACE!r}, image="img:1",
                                      worker_replicas=7, deferrable=True, poll_interval=1,
                                      annotations={{"sim.airflow-volcano.io/outcome": "run-forever"}})
    """))
    runner = subprocess.Popen([sys.executable, str(REPO / "tests" / "integration" / "dag_runner.py"), str(dag),
                               "panel_bench", datetime.datetime.now(datetime.UTC).isoformat(), "--external-triggerer"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_running(kubectl)
        time.sleep(5)  # the task has deferred, its XComs pushed
        measure(args)
    finally:
        runner.kill()
        subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)  # its DB, and the password the simple auth manager made


def wait_running(kubectl: list[str]) -> None:
    for _ in range(180):
        phase = subprocess.run([*kubectl, "get", "vcjob", "-n", NAMESPACE, "bench", "-o",
                                "jsonpath={.status.state.phase}"], capture_output=True, text=True).stdout
        pods = subprocess.run([*kubectl, "get", "pods", "-n", NAMESPACE, "--no-headers"], capture_output=True,
                              text=True).stdout.count("Running")
        if phase == "Running" and pods == 8:
            return
        time.sleep(1)
    raise SystemExit("the Job of 8 pods did not run")


def measure(args: argparse.Namespace) -> None:
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    from airflow_volcano.panel.app import CACHE_SECONDS

    app = create_app()
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="ADMIN"))
    client = TestClient(app, base_url="http://localhost", headers={"Authorization": f"Bearer {token}"})
    (run,) = client.get("/api/v2/dags/panel_bench/dagRuns").json()["dag_runs"]
    run_id = run["dag_run_id"]
    panel = f"/volcano-panel/api/ti/panel_bench/{run_id}/train/-1"
    airflow = f"/api/v2/dags/panel_bench/dagRuns/{run_id}/taskInstances/train"

    def timed(path: str) -> float:
        started = time.perf_counter()
        response = client.get(path)
        assert response.status_code == 200, response.text
        return (time.perf_counter() - started) * 1000

    first = client.get(panel).json()
    assert len(first["pods"]) == 8, first
    cached = [timed(panel) for _ in range(args.requests)]
    uncached = []
    for _ in range(args.uncached):
        time.sleep(CACHE_SECONDS + 0.1)
        uncached.append(timed(panel))
    theirs = [timed(airflow) for _ in range(args.requests)]
    print("panel JSON of a running Job of 8 pods, in the API server's app (ms, median / p95 of each):")
    print(f"  within the cache's period ({args.requests}): {statistics.median(cached):.1f} / {p95(cached):.1f}")
    print(f"  each after the period, reading the cluster ({args.uncached}): {statistics.median(uncached):.1f} / "
          f"{p95(uncached):.1f}")
    print(f"  Airflow's own task instance endpoint, same app ({args.requests}): {statistics.median(theirs):.1f} / "
          f"{p95(theirs):.1f}")


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


if __name__ == "__main__":
    main()
