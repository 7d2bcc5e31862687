"""A scheduled retraining pipeline: prepare -> train on Volcano -> evaluate from XCom.

`train` is deferrable when the deployment's `[operators] default_deferrable` is on, so hours of
training hold no worker slot; a retry reattaches to the Job already running instead of
submitting a second one.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(
    dag_id="volcano_retraining_pipeline",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["volcano", "pytorch", "example"],
    params={"namespace": "default", "workers": 2},
) as dag:

    @task
    def prepare(ds: str | None = None) -> str:
        """Pick the day's training data (a real pipeline would snapshot a table or a bucket)."""
        return f"s3://datasets/clicks/date={ds}"

    dataset = prepare()

    train = VolcanoPyTorchJobOperator(
        task_id="train",
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas="{{ params.workers }}",
        training_script="scripts/pytorch_demo.py",
        args=["--data", "{{ ti.xcom_pull(task_ids='prepare') }}"],
        container_resources={"cpu": "1", "memory": "2Gi"},
        labels={"team": "ranking"},
        retries=2,
        job_timeout=6 * 3600,
        execution_timeout=datetime.timedelta(hours=7),
    )

    @task
    def evaluate(summary: dict) -> str:
        """Use the training Job's summary (name, phase, master pod) pushed by `train`."""
        if summary["phase"] != "Completed":
            raise ValueError(f"training ended in {summary['phase']}")
        return f"evaluated model of {summary['namespace']}/{summary['job_name']}"

    dataset >> train
    evaluate(train.output)
