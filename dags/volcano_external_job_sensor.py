"""Wait for a Volcano Job submitted outside Airflow (by kubectl, another team's CI, ...).

Runs in reschedule mode: between pokes the task gives its worker slot back.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_volcano.sensors.job import VolcanoJobSensor

with DAG(
    dag_id="volcano_external_job_sensor",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "example"],
    params={"job_name": "pytorch-job-with-configmap", "namespace": "default"},
) as dag:
    wait = VolcanoJobSensor(
        task_id="wait_for_training",
        job_name="{{ params.job_name }}",
        namespace="{{ params.namespace }}",
        mode="reschedule",
        poke_interval=60,
        timeout=12 * 3600,
        get_logs=True,
    )

    @task
    def publish(summary: dict) -> None:
        print(f"training {summary['job_name']} finished: {summary['phase']}")

    publish(wait.output)
