"""Long training that survives what clusters do to it: checkpoints across restarts and retries.

Rank 0 of `scripts/train_resumable.py` saves a checkpoint every epoch under CHECKPOINT_DIR, the
task instance's own directory under `checkpoint_dir` on a volume every pod mounts (here a
PersistentVolumeClaim `checkpoints` that must exist in the namespace; a hostPath works on a single
node). Whatever stops the training, it resumes from the latest checkpoint:
- a rank killed (exit code 137) or a pod evicted: Volcano restarts the gang (max_retry);
- a node that stops answering: after node_lost_timeout its pods are deleted, which Volcano handles
  like an eviction;
- a failed try of the task: Airflow's retry submits a new Job, which finds the same CHECKPOINT_DIR.
Deleting the Job (a kill of the task, job_timeout) sends SIGTERM to the script, which saves before
it exits, within termination_grace_period. /dev/shm is a 2 GiB memory-backed volume (shm_size).
The task's return value says where the run resumed from (`resumed_from`).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(
    dag_id="volcano_resumable_training",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "pytorch", "checkpoints", "example"],
    params={"namespace": "default", "checkpoints_claim": "checkpoints"},
) as dag:
    VolcanoPyTorchJobOperator(
        task_id="train",
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas=2,
        container_resources={"cpu": "2", "memory": "8Gi"},
        training_script="scripts/train_resumable.py",
        env={"EPOCHS": "6"},
        volumes=[{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "{{ params.checkpoints_claim }}"}}],
        volume_mounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        checkpoint_dir="/checkpoints",
        termination_grace_period=60,
        node_lost_timeout=datetime.timedelta(minutes=3),
        max_retry=3,
        retries=1,
        retry_delay=datetime.timedelta(minutes=1),
        job_timeout=datetime.timedelta(hours=6),
    )
