"""VolcanoPyTorchJobOperator: VolcanoJobOperator with arguments that build a PyTorch Job.

Only what is PyTorch's lives here: the master/worker tasks and the `pytorch` plugin (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK), the launcher (python or torchrun) and waiting for the master.
Submitting, waiting, logs, results, cleanup and kills are VolcanoJobOperator's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_volcano.manifest import DEFAULT_MASTER, DEFAULT_WORKER, PyTorchJobRequest, max_job_name_length
from airflow_volcano.operators.job import VolcanoJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class VolcanoPyTorchJobOperator(VolcanoJobOperator):
    """Build, submit and wait for a Volcano Job running PyTorch with the `pytorch` plugin.

    One master task (rank 0) and `worker_replicas` worker tasks; Volcano injects MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE and RANK. The master pod's log is streamed into the task log. An
    explicit argument overrides `job_template`, which overrides the built-in default Job (no
    template is needed). Every argument of VolcanoJobOperator applies, to master and workers;
    these are PyTorch's own:

    :param worker_replicas: number of workers (>= 0); there is always exactly one master.
    :param master_task_name: master task name (default `master`), passed to the plugin.
    :param worker_task_name: worker task name (default `worker`), passed to the plugin.
    :param port: the plugin's `--port` (MASTER_PORT), default 23456.
    :param master_resources: like `container_resources`, merged over it for the master.
    :param worker_resources: like `container_resources`, merged over it for the workers.
    :param master_policies: master task policies (default: TaskCompleted -> CompleteJob).
    :param launcher: `python` (default: one process per pod, Volcano's RANK/WORLD_SIZE count pods)
        or `torchrun` (one agent per pod starting `nproc_per_node` processes; torch's RANK and
        WORLD_SIZE then count processes). Elastic when `min_available` is below master + workers.
    :param nproc_per_node: torchrun's processes per pod: an int, or `auto`, `gpu`, `cpu` (default 1).
    :param max_restarts: torchrun's restarts of a pod's process group before it fails the pod.
    :param torchrun_options: more torchrun flags, e.g. `["--log_dir=/logs"]` (nodes, ranks and
        rendezvous are the operator's).
    :param wait_for_master: workers wait in an init container until the master accepts
        connections on MASTER_PORT (Volcano 1.14+'s pytorch plugin option): True (Volcano's default
        busybox image) or the image to use (it needs sh and nc).
    """

    template_fields: Sequence[str] = (
        *VolcanoJobOperator.template_fields[:VolcanoJobOperator.template_fields.index("main_task")],
        "worker_replicas", "master_resources", "worker_resources", "nproc_per_node", "torchrun_options",
    )

    def __init__(
        self,
        *,
        worker_replicas: int | str | None = None,
        master_task_name: str | None = None,
        worker_task_name: str | None = None,
        port: int | None = None,
        master_resources: dict | None = None,
        worker_resources: dict | None = None,
        master_policies: list[dict] | None = None,
        launcher: str | None = None,
        nproc_per_node: int | str | None = None,
        max_restarts: int | None = None,
        torchrun_options: list[str] | None = None,
        wait_for_master: bool | str = False,
        **kwargs: Any,
    ) -> None:
        if "main_task" in kwargs:
            raise TypeError("VolcanoPyTorchJobOperator: the main task is the master; set master_task_name")
        super().__init__(**kwargs)
        self.worker_replicas = worker_replicas
        self.master_task_name, self.worker_task_name = master_task_name, worker_task_name
        self.port = port
        self.master_resources, self.worker_resources = master_resources, worker_resources
        self.master_policies = master_policies
        self.launcher, self.nproc_per_node = launcher, nproc_per_node
        self.max_restarts, self.torchrun_options = max_restarts, torchrun_options
        self.wait_for_master = wait_for_master

    def _default_name_limit(self) -> int:
        try:
            max_index = max(0, int(self.worker_replicas if self.worker_replicas is not None else 1) - 1)
        except (TypeError, ValueError):
            max_index = 0  # validation reports the bad value with its parameter name
        names = [self.master_task_name or DEFAULT_MASTER, self.worker_task_name or DEFAULT_WORKER]
        return max_job_name_length(names, max_index=max_index)

    def _job_request(self, context: Context | None) -> PyTorchJobRequest:
        return dataclasses.replace(
            super()._job_request(context), all_tasks=None, main_task=None,
            worker_replicas=self.worker_replicas, master_task_name=self.master_task_name,
            worker_task_name=self.worker_task_name, port=self.port, master_resources=self.master_resources,
            worker_resources=self.worker_resources, master_policies=self.master_policies, launcher=self.launcher,
            nproc_per_node=self.nproc_per_node, max_restarts=self.max_restarts,
            torchrun_options=self.torchrun_options, wait_for_master=self.wait_for_master or None,
        )
