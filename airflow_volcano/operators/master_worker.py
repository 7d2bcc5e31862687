"""MasterWorkerJobOperator: VolcanoJobOperator for Jobs of one master pod and N worker pods.

The shared part of the PyTorch and DeepSpeed operators: the two tasks' names, the worker count,
per-role resources and the master's policies. What the pods run is the subclass's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_volcano.manifest import DEFAULT_MASTER, DEFAULT_WORKER, max_job_name_length
from airflow_volcano.operators.job import VolcanoJobOperator


class MasterWorkerJobOperator(VolcanoJobOperator):
    """A Volcano Job of one master task (one pod, followed for the log and the result) and one
    worker task. Every argument of VolcanoJobOperator applies, to master and workers; these are
    the roles':

    :param worker_replicas: number of workers (>= 0); there is always exactly one master.
    :param master_task_name: master task name (default `master`).
    :param worker_task_name: worker task name (default `worker`).
    :param master_resources: like `container_resources`, merged over it for the master.
    :param worker_resources: like `container_resources`, merged over it for the workers.
    :param master_policies: master task policies (default: TaskCompleted -> CompleteJob: the Job
        succeeds when the master does, whatever workers still run).
    """

    untemplated_fields: ClassVar[tuple[str, ...]] = ("main_task",)  # the master, by definition

    def __init__(
        self,
        *,
        worker_replicas: int | str | None = None,
        master_task_name: str | None = None,
        worker_task_name: str | None = None,
        master_resources: dict | None = None,
        worker_resources: dict | None = None,
        master_policies: list[dict] | None = None,
        **kwargs: Any,
    ) -> None:
        if "main_task" in kwargs:
            raise TypeError(f"{type(self).__name__}: the main task is the master; set master_task_name")
        super().__init__(**kwargs)
        self.worker_replicas = worker_replicas
        self.master_task_name, self.worker_task_name = master_task_name, worker_task_name
        self.master_resources, self.worker_resources = master_resources, worker_resources
        self.master_policies = master_policies

    def _default_name_limit(self) -> int:
        try:
            max_index = max(0, int(self.worker_replicas if self.worker_replicas is not None else 1) - 1)
        except (TypeError, ValueError):
            max_index = 0  # validation reports the bad value with its parameter name
        names = [self.master_task_name or DEFAULT_MASTER, self.worker_task_name or DEFAULT_WORKER]
        return max_job_name_length(names, max_index=max_index)
