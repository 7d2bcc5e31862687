"""torchrun on Volcano: several processes per pod, TensorBoard beside the training, restarts by exit code.

Each of the 3 pods (master + 2 workers) runs one torchrun agent starting `nproc_per_node`
processes (one per GPU on a GPU node: nproc_per_node="gpu"), so torch sees 3 x 2 = 6 ranks.
Workers wait for the master to accept connections before they start (Volcano's own init
container). Killed processes (SIGKILL/OOM 137, SIGTERM 143, ...) restart the gang, at most
max_retry - 1 times; an ordinary exception fails the task at once, naming the pod. TensorBoard
serves the event files rank 0 writes to a shared volume (here a PersistentVolumeClaim
`training-logs` that must exist in the namespace); every worker's log is in the task log.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(
    dag_id="volcano_torchrun_training",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "pytorch", "torchrun", "example"],
    params={"namespace": "default", "logs_claim": "training-logs"},
) as dag:
    VolcanoPyTorchJobOperator(
        task_id="train",
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas=2,
        launcher="torchrun",
        nproc_per_node=2,
        container_resources={"cpu": "2", "memory": "4Gi"},
        training_script="scripts/train_ddp_tensorboard.py",
        env={"TB_LOGDIR": "/logs/tb/{{ run_id | replace(':', '-') | replace('+', '-') }}", "STEPS": "50"},
        volumes=[{"name": "logs", "persistentVolumeClaim": {"claimName": "{{ params.logs_claim }}"}}],
        volume_mounts=[{"name": "logs", "mountPath": "/logs"}],
        tensorboard={"logdir": "/logs/tb"},
        log_tasks=["worker"],
        wait_for_master=True,
        retryable_exit_codes=[130, 137, 138, 143],
        max_retry=3,
        startup_timeout=600,
        job_timeout=3600,
    )
