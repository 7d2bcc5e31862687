"""DeepSpeed on Volcano (seed 003) without a hand-written Job: ssh, svc and env plugins, a hostfile.

Two worker pods run sshd; the master writes the hostfile from Volcano's /etc/volcano/worker.host
(`slots` = ranks per worker), waits until both accept ssh, and runs `deepspeed --hostfile`, which
starts 2 x 2 = 4 ranks over ssh (pdsh). Every rank's output comes back into the master's log and
so into this task's log; rank 0's final loss becomes the task's XCom. The second task runs the same
script under OpenMPI's `mpirun` over the same kind of hostfile. The image needs sshd, pdsh,
OpenMPI, mpi4py and DeepSpeed (the local cluster's training image has them, built for CPU).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

with DAG(
    dag_id="volcano_deepspeed_training",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "deepspeed", "mpi", "example"],
    params={"namespace": "default", "image": "localhost/airflow-volcano/pytorch-cpu:dev", "steps": 60},
) as dag:
    deepspeed_train = VolcanoDeepSpeedJobOperator(
        task_id="train_deepspeed",
        namespace="{{ params.namespace }}",
        image="{{ params.image }}",
        worker_replicas=2,
        slots_per_worker=2,
        training_script="scripts/train_deepspeed.py",
        args=["--steps", "{{ params.steps }}"],
        master_resources={"cpu": "100m", "memory": "512Mi"},  # the master only launches
        worker_resources={"cpu": "500m", "memory": "2Gi"},
        startup_timeout=600,
        job_timeout=1800,
    )
    mpi_train = VolcanoDeepSpeedJobOperator(
        task_id="train_mpirun",
        namespace="{{ params.namespace }}",
        image="{{ params.image }}",
        launcher="mpirun",
        worker_replicas=2,
        slots_per_worker=1,
        training_script="scripts/train_deepspeed.py",
        args=["--steps", "{{ params.steps }}"],
        master_resources={"cpu": "100m", "memory": "512Mi"},
        worker_resources={"cpu": "500m", "memory": "2Gi"},
        startup_timeout=600,
        job_timeout=1800,
    )
    deepspeed_train >> mpi_train
