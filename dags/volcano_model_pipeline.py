"""A retraining pipeline that chains itself through Airflow Assets: retrain -> evaluate -> promote.

- `volcano_retrain` trains on Volcano whenever new training data arrives (an event of `DATA`, emitted by
  whatever lands it; `schedule="@daily"` instead retrains on a clock). `model_asset=MODEL` makes each
  successful run emit an event of the asset `s3://models/linear`, whose `extra` carries the model URI
  and metrics the master wrote to /dev/termination-log (`scripts/train_with_metrics.py`), the Volcano
  Job, the image and its digest, the Airflow run and where the time went. A failed run emits nothing,
  so nothing downstream runs.
- `volcano_evaluate` runs on each new model: it reads the event's `extra` and emits an evaluation event.
- `volcano_promote` runs on each evaluation and promotes only a model whose `eval_loss` is at most
  `params.max_eval_loss`.

docs/pipelines.md "Retraining pipelines" shows what a consumer reads.
"""

from __future__ import annotations

import datetime
from typing import Any

from airflow.sdk import DAG, Asset, task

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

DATA = Asset("s3://datasets/clicks")
MODEL = Asset("s3://models/linear")
EVALUATION = Asset("s3://models/linear/evaluations")

with DAG(
    dag_id="volcano_retrain",
    schedule=[DATA],
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["volcano", "pytorch", "example"],
    params={"namespace": "default", "epochs": 30},
) as dag:
    VolcanoPyTorchJobOperator(
        task_id="train",
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas=2,
        container_resources={"cpu": "1", "memory": "2Gi"},
        training_script="scripts/train_with_metrics.py",
        args=["--epochs", "{{ params.epochs }}",
              "--model-uri", "s3://models/linear/{{ dag_run.run_after.strftime('%Y%m%dT%H%M%S') }}"],
        inlets=[DATA],
        model_asset=MODEL,
        job_timeout=3600,
    )

with DAG(
    dag_id="volcano_evaluate",
    schedule=[MODEL],
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "example"],
) as evaluate_dag:

    @task(outlets=[EVALUATION])
    def evaluate(triggering_asset_events: Any = None, outlet_events: Any = None) -> dict:
        """Read the newest model event's `extra`; a real pipeline would score the model on fresh data here."""
        event = triggering_asset_events[MODEL][-1]
        model_uri, metrics = event.extra["model_uri"], event.extra["metrics"]
        if model_uri is None or "eval_loss" not in metrics:
            raise ValueError(f"the training reported no model_uri or eval_loss: {event.extra!r}")
        evaluation = {"model_uri": model_uri, "eval_loss": metrics["eval_loss"],
                      "volcano_job_uid": event.extra["volcano_job"]["uid"]}
        outlet_events[EVALUATION].extra = evaluation
        print(f"evaluated {model_uri}: eval_loss {metrics['eval_loss']}")
        return evaluation

    evaluate()

with DAG(
    dag_id="volcano_promote",
    schedule=[EVALUATION],
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "example"],
    params={"max_eval_loss": 0.05},
) as promote_dag:

    @task.short_circuit
    def good_enough(triggering_asset_events: Any = None, params: Any = None) -> bool:
        evaluation = triggering_asset_events[EVALUATION][-1].extra
        passed = evaluation["eval_loss"] <= float(params["max_eval_loss"])
        print(f"{evaluation['model_uri']}: eval_loss {evaluation['eval_loss']} "
              f"{'<=' if passed else '>'} {params['max_eval_loss']}")
        return passed

    @task
    def promote(triggering_asset_events: Any = None) -> str:
        """A real pipeline would tag the model in its registry here."""
        evaluation = triggering_asset_events[EVALUATION][-1].extra
        return f"promoted {evaluation['model_uri']}"

    good_enough() >> promote()
