"""Seed 000 as one Airflow task: the `pytorch-job-with-configmap` Volcano job.

What the seed did by hand (kubectl create configmap, kubectl apply the Job YAML, kubectl get
vcjob, kubectl logs on the master) is this single operator: the script is shipped in a ConfigMap
owned by the Job, the master's log streams into the task log, and the Job is deleted once it
succeeds (kept for debugging if it fails).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(
    dag_id="volcano_pytorch_seed_demo",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "pytorch", "example"],
    params={"namespace": "default"},
) as dag:
    VolcanoPyTorchJobOperator(
        task_id="train",
        name="pytorch-job-with-configmap",  # the seed's name; leave it out to get a unique one per run
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        image_pull_policy="IfNotPresent",
        worker_replicas=2,
        container_resources={"cpu": "1", "memory": "2Gi"},
        env={"PYTHONUNBUFFERED": "1"},
        training_script="scripts/pytorch_demo.py",  # relative to this file
        startup_timeout=300,
        job_timeout=3600,
    )
