"""The chaos soak's DAG: benchmarks/chaos_soak.py copies it, with `soak-settings.json` beside it, into the
dags folder of the Airflow services it starts. Each DAG run's `conf["cases"]` lists, per kind of task, the
task instances to map: what each one's pods do (kwok's simulated outcome, or the real node's exit code)
and whether it waits in the worker or in the triggerer. The soak knows from that list how each should end.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, task

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.job import VolcanoJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SETTINGS = json.loads(Path(__file__).with_name("soak-settings.json").read_text())
MODEL = Asset("s3://chaos-soak/models")
SCRIPT = str(Path(__file__).with_name("soak_train.py"))
SIMULATED = {"image": "img:1", "container_resources": {"cpu": "100m", "memory": "64Mi"}}
GENERIC_JOB = {
    "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {},
    "spec": {"minAvailable": 1, "schedulerName": "volcano",
             "policies": [{"event": "PodFailed", "action": "AbortJob"}],
             "tasks": [{"name": "main", "replicas": 1,
                        "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                        "template": {"spec": {"restartPolicy": "Never",
                                              "containers": [{"name": "main", "command": ["true"]}]}}}]},
}

with DAG("chaos_soak", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
         max_active_runs=SETTINGS["max_active_runs"], catchup=False, tags=["chaos-soak"]) as dag:

    @task
    def cases(kind: str, dag_run: Any = None) -> list[dict[str, Any]]:
        return dag_run.conf["cases"].get(kind, [])

    common: dict[str, Any] = {
        "namespace": SETTINGS["namespace"], "retries": SETTINGS["retries"],
        "retry_delay": datetime.timedelta(seconds=SETTINGS["retry_delay"]),
        "execution_timeout": datetime.timedelta(seconds=SETTINGS["execution_timeout"]),
        "startup_timeout": SETTINGS["startup_timeout"], "poll_interval": 2, "outlets": [MODEL],
    }
    VolcanoPyTorchJobOperator.partial(
        task_id="pytorch", worker_replicas=1, training_script=SCRIPT, **SIMULATED, **common,
    ).expand_kwargs(cases.override(task_id="pytorch_cases")("pytorch"))
    VolcanoJobOperator.partial(
        task_id="generic", job_template=GENERIC_JOB, **SIMULATED, **common,
    ).expand_kwargs(cases.override(task_id="generic_cases")("generic"))
    VolcanoDeepSpeedJobOperator.partial(
        task_id="deepspeed", worker_replicas=1, training_script=SCRIPT, **SIMULATED, **common,
    ).expand_kwargs(cases.override(task_id="deepspeed_cases")("deepspeed"))
    real = SETTINGS["real_node"]
    VolcanoPyTorchJobOperator.partial(
        task_id="real", worker_replicas=1, training_script=SCRIPT, image=real["image"],
        image_pull_policy=real["image_pull_policy"], node_selector=real["node_selector"],
        tolerations=real["tolerations"],
        container_resources={"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}, **common,
    ).expand_kwargs(cases.override(task_id="real_cases")("real"))
