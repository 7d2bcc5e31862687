"""VolcanoPyTorchJobOperator: a master/worker Job with the `pytorch` plugin.

Only what is PyTorch's lives here: the `pytorch` plugin (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
RANK), the launcher (python or torchrun) and waiting for the master. The roles are
MasterWorkerJobOperator's; submitting, waiting, logs, results, cleanup and kills are
VolcanoJobOperator's.
"""

from __future__ import annotations

from typing import Any

from airflow_volcano.manifest import JobKind
from airflow_volcano.operators.master_worker import MasterWorkerJobOperator


class VolcanoPyTorchJobOperator(MasterWorkerJobOperator):
    """Build, submit and wait for a Volcano Job running PyTorch with the `pytorch` plugin.

    One master task (rank 0) and `worker_replicas` worker tasks; Volcano injects MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE and RANK. The master pod's log is streamed into the task log. An
    explicit argument overrides `job_template`, which overrides the built-in default Job (no
    template is needed). Every argument of VolcanoJobOperator and MasterWorkerJobOperator
    (`worker_replicas`, `master_task_name`, `worker_task_name`, `master_resources`,
    `worker_resources`, `master_policies`) applies; these are PyTorch's own:

    :param port: the plugin's `--port` (MASTER_PORT), default 23456.
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

    job_kind = JobKind.PYTORCH

    def __init__(
        self,
        *,
        port: int | None = None,
        launcher: str | None = None,
        nproc_per_node: int | str | None = None,
        max_restarts: int | None = None,
        torchrun_options: list[str] | None = None,
        wait_for_master: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.port = port
        self.launcher, self.nproc_per_node = launcher, nproc_per_node
        self.max_restarts, self.torchrun_options = max_restarts, torchrun_options
        self.wait_for_master = wait_for_master or None
