"""MasterWorkerJobOperator: VolcanoJobOperator for Jobs of one master pod and N worker pods.

The shared part of the PyTorch and DeepSpeed operators: the two tasks' names, the worker count,
per-role resources and the master's policies. What the pods run is the subclass's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_volcano.constants import IfJobExists, OnFinishAction, OnKillAction, StallAction
from airflow_volcano.manifest import DEFAULT_MASTER, DEFAULT_WORKER, max_job_name_length
from airflow_volcano.operators.arguments import DEFAULT_DEFERRABLE, passed_on, take_arguments
from airflow_volcano.operators.job import VolcanoJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Asset


class MasterWorkerJobOperator(VolcanoJobOperator):
    """A Volcano Job of one master task (one pod, followed for the log and the result) and one
    worker task. Every argument of VolcanoJobOperator applies, to master and workers; these are
    the roles':

    :param worker_replicas: number of workers (>= 0; default 1, or the template's); there is always exactly one
        master.
    :param master_task_name: master task name (default `master`), passed to the pytorch plugin as `--master`.
    :param worker_task_name: worker task name (default `worker`, not the master's), passed to the pytorch plugin as
        `--worker`.
    :param master_resources: like `container_resources`, merged over it for the master.
    :param worker_resources: like `container_resources`, merged over it for the workers.
    :param master_policies: master task policies (default: TaskCompleted -> CompleteJob: the Job succeeds when the
        master does, whatever workers still run).
    """

    argument_groups: ClassVar[tuple[str, ...]] = ("job", "roles")
    refused_arguments: ClassVar[tuple[str, ...]] = ("main_task",)  # the master, by definition
    # The arguments this class reads itself (take_arguments sets every one).
    worker_replicas: int | str | None
    master_task_name: str | None
    worker_task_name: str | None

    def __init__(
        self,
        *,
        # Generated from the declarations: python -m airflow_volcano.operators.arguments
        name: str | None = None,
        namespace: str | None = None,
        job_template: str | dict | None = None,
        full_job_spec: dict | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class_name: str | None = None,
        volcano_queue: str | None = None,
        scheduler_name: str | None = None,
        min_available: int | str | None = None,
        max_retry: int | None = None,
        max_preemptions: int | None = None,
        ttl_seconds_after_finished: int | None = None,
        policies: list[dict] | None = None,
        retryable_exit_codes: list[int] | None = None,
        restart_scope: str | None = None,
        extra_plugins: dict[str, list[str]] | None = None,
        tensorboard: dict[str, Any] | None = None,
        image: str | None = None,
        command: list[Any] | None = None,
        args: list[Any] | None = None,
        env: dict[str, Any] | list[dict] | None = None,
        container_resources: dict | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict] | None = None,
        volumes: list[dict] | None = None,
        volume_mounts: list[dict] | None = None,
        service_account_name: str | None = None,
        image_pull_policy: str | None = None,
        image_pull_secrets: list[str] | None = None,
        restart_policy: str | None = None,
        training_script: str | None = None,
        debug: bool = False,
        debug_timeout: float | datetime.timedelta = 3600.0,
        shm_size: str | None = "2Gi",
        termination_grace_period: int | None = None,
        checkpoint_dir: str | None = None,
        stall_timeout: float | datetime.timedelta | None = None,
        allowed_file_dirs: Sequence[str] | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        get_logs: bool = True,
        log_tasks: list[str] | None = None,
        startup_timeout: float | datetime.timedelta | None = 900.0,
        image_pull_timeout: float | datetime.timedelta | None = 300.0,
        job_timeout: float | datetime.timedelta | None = None,
        node_lost_timeout: float | datetime.timedelta | None = 180.0,
        stall_action: str = StallAction.FAIL,
        on_finish_action: str = OnFinishAction.DELETE_SUCCEEDED_JOB,
        on_kill_action: str = OnKillAction.DELETE_JOB,
        if_job_exists: str = IfJobExists.REATTACH,
        delete_orphaned_jobs: bool = True,
        deferrable: bool = DEFAULT_DEFERRABLE,
        poll_interval: float | datetime.timedelta = 5.0,
        model_asset: Asset | str | None = None,
        worker_replicas: int | str | None = None,
        master_task_name: str | None = None,
        worker_task_name: str | None = None,
        master_resources: dict | None = None,
        worker_resources: dict | None = None,
        master_policies: list[dict] | None = None,
        **kwargs: Any,
    ) -> None:
        given = dict(locals())
        if "main_task" in kwargs:
            raise TypeError(f"{type(self).__name__}: the main task is the master; set master_task_name")
        super().__init__(**passed_on(MasterWorkerJobOperator, given), **kwargs)
        take_arguments(self, MasterWorkerJobOperator, given)

    def _default_name_limit(self) -> int:
        try:
            max_index = max(0, int(self.worker_replicas if self.worker_replicas is not None else 1) - 1)
        except (TypeError, ValueError):
            max_index = 0  # validation reports the bad value with its parameter name
        names = [self.master_task_name or DEFAULT_MASTER, self.worker_task_name or DEFAULT_WORKER]
        return max_job_name_length(names, max_index=max_index)
