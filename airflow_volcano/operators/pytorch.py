"""VolcanoPyTorchJobOperator: a master/worker Job with the `pytorch` plugin.

Only what is PyTorch's lives here: the `pytorch` plugin (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
RANK), the launcher (python or torchrun) and waiting for the master. The roles are
MasterWorkerJobOperator's; submitting, waiting, logs, results, cleanup and kills are
VolcanoJobOperator's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_volcano.constants import IfJobExists, OnFinishAction, OnKillAction, StallAction
from airflow_volcano.manifest import JobKind
from airflow_volcano.operators.arguments import DEFAULT_DEFERRABLE, passed_on, take_arguments
from airflow_volcano.operators.master_worker import MasterWorkerJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Asset


class VolcanoPyTorchJobOperator(MasterWorkerJobOperator):
    """Build, submit and wait for a Volcano Job running PyTorch with the `pytorch` plugin.

    One master task (rank 0) and `worker_replicas` worker tasks; Volcano injects MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE and RANK. The master pod's log is streamed into the task log. An
    explicit argument overrides `job_template`, which overrides the built-in default Job (no
    template is needed). Every argument of VolcanoJobOperator and MasterWorkerJobOperator
    (`worker_replicas`, `master_task_name`, `worker_task_name`, `master_resources`,
    `worker_resources`, `master_policies`) applies; these are PyTorch's own:

    :param port: the pytorch plugin's `--port` (MASTER_PORT), default 23456.
    :param launcher: `python` (default: one process per pod, Volcano's RANK/WORLD_SIZE count pods) or `torchrun`
        (one agent per pod starting `nproc_per_node` processes; torch's RANK and WORLD_SIZE then count processes; it
        needs `training_script`). Elastic when `min_available` is below master + workers.
    :param nproc_per_node: torchrun's processes per pod: an int, or `auto`, `gpu`, `cpu` (default 1). Only with
        `launcher="torchrun"`.
    :param max_restarts: torchrun's own in-pod restart budget: restarts of a pod's processes before the pod fails.
        Only with `launcher="torchrun"`.
    :param torchrun_options: more torchrun flags, e.g. `["--rdzv_conf=last_call_timeout=5"]`. Node count, ranks,
        rendezvous, processes per pod and restarts are the operator's (`nproc_per_node`, `max_restarts`,
        `min_available`) and refused here, under any abbreviation torchrun accepts (`--nnode=4`). Only with
        `launcher="torchrun"`.
    :param wait_for_master: workers wait in an init container until the master accepts connections on MASTER_PORT
        (Volcano 1.14+'s pytorch plugin option; up to 300 s, then the pod fails): True (Volcano's default busybox
        image) or the image to use (it needs sh and nc).
    """

    job_kind = JobKind.PYTORCH
    argument_groups: ClassVar[tuple[str, ...]] = ("job", "roles", "pytorch")
    wait_for_master: bool | str | None  # False given is None kept: the plugin's option is not set

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
        port: int | None = None,
        launcher: str | None = None,
        nproc_per_node: int | str | None = None,
        max_restarts: int | None = None,
        torchrun_options: list[str] | None = None,
        wait_for_master: bool | str = False,
        **kwargs: Any,
    ) -> None:
        given = dict(locals())
        super().__init__(**passed_on(VolcanoPyTorchJobOperator, given), **kwargs)
        take_arguments(self, VolcanoPyTorchJobOperator, given)
        self.wait_for_master = self.wait_for_master or None
