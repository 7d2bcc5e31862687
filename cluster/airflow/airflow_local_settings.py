"""The local cluster's cluster policy (Airflow's `task_policy`, as a platform team sets one with the Helm
chart's `airflowLocalSettings`): the example DAGs name a real cluster's training image and requests; here
their Volcano tasks train on the local real node, with its image, node selector and toleration and
requests a 2-core machine can hold (what `make demo` changes on its task, and says so).

scripts/airflow-in-cluster mounts it at /opt/airflow/config/airflow_local_settings.py in every Airflow
pod and sets the placement in AIRFLOW_VOLCANO_LOCAL_PLACEMENT (JSON).
"""

from __future__ import annotations

import json
import os

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}


def task_policy(task) -> None:  # noqa: ANN001 - Airflow's BaseOperator
    placement = os.environ.get("AIRFLOW_VOLCANO_LOCAL_PLACEMENT")
    if not placement or not isinstance(task, VolcanoPyTorchJobOperator):
        return
    local = json.loads(placement)
    task.image, task.image_pull_policy = local["image"], local["image_pull_policy"]
    task.node_selector, task.tolerations = local["node_selector"], local["tolerations"]
    task.container_resources = SMALL
