"""Helpers of the tests on the cluster's real node (kubelet, containerd, runc, CNI bridge, CoreDNS)
with the local training image (Debian's CPU PyTorch): the operator with small requests and seed 000's
script, a training script of the test's own, an example DAG from dags/ moved to the real node, a
task's XCom, the losses in a task log, a pod writing a log. Not a test file: the test_real_*.py files
and the other tests on the real node import from here.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

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
    """The epoch losses the pod printed. Anywhere in its lines: when two processes share the pod's
    stdout (torchrun's ranks), print() writes text and newline apart, so another rank's text (its
    "-----" at the end of training) may come first on the line of an epoch's loss."""
    return [float(loss) for line in re.findall(rf"\[{pod}\] (.*)", log) for _epoch, loss in EPOCH_LOSS.findall(line)]


SLEEPER = """
    import os, time
    print(f"rank {os.environ['RANK']} started", flush=True)
    time.sleep(3600)
"""


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
