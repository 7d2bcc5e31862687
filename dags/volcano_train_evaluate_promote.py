"""Retrain, gate on quality, promote: the training Job's metrics decide the next step.

`train` runs `scripts/train_with_metrics.py` on Volcano; its master writes the evaluation metrics
as JSON to /dev/termination-log, and the operator returns them as `result` in its XCom. The branch
`quality_gate` reads them: a model whose eval_loss is above `params.max_eval_loss` is not promoted
(`promote` is skipped, `report_rejected` runs instead).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(
    dag_id="volcano_train_evaluate_promote",
    schedule="@weekly",
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["volcano", "pytorch", "example"],
    params={"namespace": "default", "max_eval_loss": 0.05},
) as dag:
    train = VolcanoPyTorchJobOperator(
        task_id="train",
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas=2,
        container_resources={"cpu": "1", "memory": "2Gi"},
        training_script="scripts/train_with_metrics.py",
        args=["--epochs", "30", "--model-uri", "s3://models/linear/{{ ds }}"],
        job_timeout=3600,
    )

    @task.branch
    def quality_gate(summary: dict, params: dict | None = None) -> str:
        metrics = summary.get("result") or {}
        if "eval_loss" not in metrics:
            raise ValueError(f"the training Job reported no eval_loss (result: {metrics!r})")
        return "promote" if metrics["eval_loss"] <= float(params["max_eval_loss"]) else "report_rejected"

    @task
    def promote(summary: dict) -> str:
        """A real pipeline would tag the model in its registry here."""
        return f"promoted {summary['result']['model_uri']} (eval_loss {summary['result']['eval_loss']})"

    @task
    def report_rejected(summary: dict) -> str:
        return f"kept the current model: eval_loss {summary['result']['eval_loss']} is too high"

    quality_gate(train.output) >> [promote(train.output), report_rejected(train.output)]
