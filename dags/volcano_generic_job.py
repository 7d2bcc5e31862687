"""Any Volcano Job, not only PyTorch: a sharded evaluation from a Job template.

`VolcanoJobOperator` submits the Job in `templates/sharded_evaluation.yaml` (rendered with Jinja:
`params.shards` sets the replicas and the gang size), ships the script to every pod, follows the
`report` pod (its log in the task log, its termination message as the `result` XCom) and copies
every shard's log too; reattach, failure reasons, cleanup and deferral work as for PyTorch.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_volcano.operators.job import VolcanoJobOperator

with DAG(
    dag_id="volcano_generic_job",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "example"],
    params={"namespace": "default", "shards": 3},
) as dag:
    evaluate = VolcanoJobOperator(
        task_id="train",  # the evaluation step of a retraining pipeline
        namespace="{{ params.namespace }}",
        job_template="templates/sharded_evaluation.yaml",
        main_task="report",
        training_script="scripts/sharded_evaluation.py",
        log_tasks=["shard"],
        container_resources={"cpu": "500m", "memory": "512Mi"},
        job_timeout=1800,
    )

    @task
    def report_accuracy(summary: dict) -> float:
        accuracy = summary["result"]["accuracy"]
        print(f"accuracy {accuracy:.4f} over {summary['result']['rows']} rows")
        return accuracy

    report_accuracy(evaluate.output)
