"""`make demo`: run seed 000's PyTorch job end to end through Airflow on the local Volcano cluster.

The cluster is real (kube-apiserver, Volcano's controllers, scheduler and webhook) but its nodes
are kwok's: pods are scheduled, get Volcano's environment and run their lifecycle, yet no
container runs. So the master's log is the seed's recorded output, served by kwok through the
apiserver's real pods/log path. Everything else is what a DAG author gets on a real cluster.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "volcano-demo"
SEED_MASTER_LOG = """\
============================================================
开始 PyTorch 分布式训练（Volcano 版本）
============================================================
[初始化] RANK=0, WORLD_SIZE=3
[初始化] MASTER_ADDR=pytorch-job-with-configmap-master-0.pytorch-job-with-configmap
[初始化] MASTER_PORT=23456
[初始化完成] 成功初始化分布式进程组
[Rank 0] 开始训练，共 5 个 epoch
------------------------------------------------------------
Epoch [1/5], Average Loss: 0.0234
Epoch [2/5], Average Loss: 0.0189
Epoch [3/5], Average Loss: 0.0156
Epoch [4/5], Average Loss: 0.0128
Epoch [5/5], Average Loss: 0.0103
------------------------------------------------------------
[Rank 0] 训练完成！"""


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> None:
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", *args], input=stdin, text=True, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "kubeconfig"], capture_output=True,
                                text=True, check=True).stdout.strip()
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-home"))
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}}
    )

    # The simulated master log, in the CRI format kubelet writes, for every pod of the namespace.
    log_file = Path(tempfile.gettempdir()) / "airflow-volcano-demo-master.log"
    now = datetime.datetime.now(datetime.UTC)
    log_file.write_text("".join(
        f"{(now + datetime.timedelta(milliseconds=i)).strftime('%Y-%m-%dT%H:%M:%S.%fZ')} stdout F {line}\n"
        for i, line in enumerate(SEED_MASTER_LOG.splitlines())
    ))
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": "volcano-demo"},
             "spec": {"selector": {"matchNamespaces": [NAMESPACE]},
                      "logs": [{"containers": ["master"], "logsFile": str(log_file), "follow": True}]}},
        ]}))

    from airflow.utils.cli import get_bagged_dag
    from airflow.utils.db import initdb

    initdb()
    dag = get_bagged_dag(None, "volcano_pytorch_seed_demo")
    started = time.monotonic()
    run = dag.test(run_conf={"namespace": NAMESPACE})
    ti = run.get_task_instance("train")
    print(f"\nDAG run {run.run_id}: task 'train' {ti.state} in {time.monotonic() - started:.1f}s")
    return 0 if str(ti.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
