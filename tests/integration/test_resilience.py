"""The task keeps its Job through API trouble: throttling, server errors, an apiserver restart."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from .faults import FaultyProxy
from .test_operator import SIM, seed_operator

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_task_retries_through_injected_429_and_5xx(cluster, operator_kubeconfig, kubeconfig, run_task, monkeypatch,
                                                   deferrable):
    config = json.loads(operator_kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    ca_file = kubeconfig.parent / "pki" / "ca.crt"
    cluster.write_log(f"flaky{int(deferrable)}-master-0", ["epoch 1", "epoch 2"])
    with FaultyProxy(server, ca_file, every=3) as proxy:
        config["clusters"][0]["cluster"] = {"server": proxy.url}
        proxied = operator_kubeconfig.with_name("proxied-kubeconfig.json")
        proxied.write_text(json.dumps(config))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(proxied), "namespace": cluster.namespace}}))
        run = run_task(lambda: seed_operator(cluster.namespace, f"flaky{int(deferrable)}", deferrable=deferrable,
                                             annotations={SIM + "run-for": "4s"}))
    assert run.state == "success", run.log
    assert proxy.injected >= 3, "the proxy must really have failed requests"
    assert "retrying in" in run.log
    assert len([j for j in cluster.jobs() if j["metadata"]["name"].startswith("flaky")]) <= 1, "no duplicate Job"


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_apiserver_restart_while_waiting(cluster, operator_kubeconfig, run_task, deferrable):
    name = f"restart{int(deferrable)}"

    def restart_when_running() -> None:
        cluster.wait_phase(name, {"Running"}, timeout=60)
        subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "restart", "kube-apiserver"], check=True,
                       capture_output=True)

    restarter = threading.Thread(target=restart_when_running)
    restarter.start()
    run = run_task(lambda: seed_operator(cluster.namespace, name, deferrable=deferrable,
                                         annotations={SIM + "run-for": "15s"}, on_finish_action="keep_job"))
    restarter.join()
    assert run.state == "success", run.log
    assert cluster.job(name)["status"]["state"]["phase"] == "Completed"


def test_kill_loop_leaves_exactly_one_job_and_no_orphans(cluster, operator_kubeconfig, airflow_db, tmp_path):
    """kill -9 the worker again and again while one task instance's Job runs; each restart reattaches."""
    import datetime
    import signal
    import time

    from .test_kill_and_reattach import our_jobs, start_worker, write_dag

    dag_id = "kill_loop"
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, training_script=str(script),
                         annotations={SIM + "run-for": "150s"})
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"
    uids = set()
    for attempt in range(5):
        worker = start_worker(dag_file, dag_id, logical_date, log, retry=attempt > 0)
        # Kill it once it holds the Job: submitted (first) or reattached (the others).
        def reached(attempt: int = attempt) -> bool:
            text = log.read_text()
            return text.count("Submitted Volcano Job") + text.count("Reattaching to Volcano Job") > attempt

        cluster.wait_for(f"worker {attempt} to reach the Job", reached, timeout=90)
        time.sleep(1)
        assert [job["status"]["state"]["phase"] for job in our_jobs(cluster)] == ["Running"], (
            "each kill must land while the Job runs")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        uids |= {job["metadata"]["uid"] for job in our_jobs(cluster)}
    final = start_worker(dag_file, dag_id, logical_date, log, retry=True)
    assert final.wait(timeout=180) == 0, log.read_text()[-4000:]
    assert len(uids) == 1, f"one Job for one task instance, saw {len(uids)}"
    assert log.read_text().count("Submitted Volcano Job") == 1
    assert log.read_text().count("Reattaching to Volcano Job") == 5
    cluster.wait_for("no Job, pods or ConfigMap left", lambda: not our_jobs(cluster) and not [
        p for p in cluster.pods() if p.metadata.labels.get("app.kubernetes.io/managed-by") == "airflow-volcano"]
        and not [c for c in cluster.configmap_names() if c.endswith("-script")], timeout=60)
