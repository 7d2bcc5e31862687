"""`make demo`: seed 000's PyTorch job, trained for real through Airflow on the local Volcano cluster.

The DAG is `dags/volcano_pytorch_seed_demo.py` as a user would write it for a real cluster (the
seed's image, one CPU and 2 GiB per pod). Here it runs on the local cluster's real node, so the
demo changes three things on the task, and says so: the local training image (Debian's CPU
PyTorch, built by `scripts/volcano-cluster`), the node selector and toleration of the real node,
and requests small enough for a 2-core machine. The master's log in the task log is the output of
three real processes training together with gloo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "volcano-demo"
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}


def cluster(*args: str) -> str:
    return subprocess.run([str(REPO / "scripts" / "volcano-cluster"), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> int:
    kubeconfig = cluster("kubeconfig")
    placement = json.loads(cluster("real-node"))
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-home"))
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}}
    )
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "create", "namespace", NAMESPACE],
                   capture_output=True)  # already there on a second run: fine

    from airflow.utils.cli import get_bagged_dag
    from airflow.utils.db import initdb

    # Deprecation notices about Airflow's own dependencies (pathspec, starlette's test client that
    # dag.test() uses) are nothing a user of the demo can act on: a successful run prints no warning.
    # (After importing Airflow, whose configuration shows its modules' deprecations.)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")

    initdb()
    dag = get_bagged_dag(None, "volcano_pytorch_seed_demo")
    train = dag.get_task("train")
    print(f"Running on the local cluster's real node: image {placement['image']} instead of {train.image}, "
          f"node selector {placement['node_selector']}, requests {SMALL['requests']}", flush=True)
    train.image = placement["image"]
    train.image_pull_policy = placement["image_pull_policy"]
    train.node_selector = placement["node_selector"]
    train.tolerations = placement["tolerations"]
    train.container_resources = SMALL
    started = time.monotonic()
    run = dag.test(run_conf={"namespace": NAMESPACE})
    ti = run.get_task_instance("train")
    print(f"\nDAG run {run.run_id}: task 'train' {ti.state} in {time.monotonic() - started:.1f}s")
    return 0 if str(ti.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
