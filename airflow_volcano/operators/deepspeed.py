"""VolcanoDeepSpeedJobOperator: DeepSpeed (or OpenMPI's mpirun) over ssh from a hostfile, the way
Volcano runs MPI-style training (its ssh and svc plugins give the pods keys and host names).

Only what is the launch's lives here: the ssh, svc and env plugins, sshd in the workers and the
master's launch script (airflow_volcano.hostfile_launch). The roles are MasterWorkerJobOperator's;
submitting, waiting, logs, results, cleanup and kills are VolcanoJobOperator's.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_volcano.constants import IfJobExists, OnFinishAction, OnKillAction, StallAction
from airflow_volcano.manifest import DEFAULT_WORKER, JobKind, task_pods
from airflow_volcano.operators.arguments import DEFAULT_DEFERRABLE, passed_on, take_arguments
from airflow_volcano.operators.master_worker import MasterWorkerJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Asset


class VolcanoDeepSpeedJobOperator(MasterWorkerJobOperator):
    """Run a DeepSpeed (or MPI) training script on `worker_replicas` pods, launched over ssh.

    Volcano's ssh plugin gives the pods one key pair, its svc plugin their host names, its env
    plugin VC_TASK_INDEX. Each worker runs sshd (the image needs sshd, and for `deepspeed` pdsh and
    DeepSpeed; for `mpirun` OpenMPI). The master writes a hostfile of the workers
    (`<pod>.<job> slots=<slots_per_worker>`), waits until every worker accepts an ssh login, then
    runs `deepspeed --hostfile ...` or `mpirun --hostfile ...`, which start the script on every rank
    with exactly the `args` given (each worker pod keeps them and its ranks read them there: no
    launcher's command line, shell or log carries them); all
    ranks' output comes back through it into the master's log, and so into the task log. The master
    only launches: rank 0 is on the first worker. Ranks see their pod's environment (image, `env`,
    Volcano's) in the ssh sessions. The Job succeeds when the launcher does. Give the
    script (`training_script`) and its `args`; every argument of VolcanoJobOperator and
    MasterWorkerJobOperator applies, except `command`, `main_task` and `full_job_spec`.

    :param port: the rendezvous port on the first worker (MASTER_PORT, default 29500).
    :param launcher: `deepspeed` (default: DeepSpeed's runner, pdsh over ssh; DeepSpeed's launch sets RANK,
        LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT in each rank) or `mpirun` (OpenMPI; ranks read
        OMPI_COMM_WORLD_RANK/SIZE, or let `deepspeed.init_distributed()` discover them through mpi4py;
        MASTER_ADDR/MASTER_PORT are passed).
    :param slots_per_worker: ranks per worker pod, the hostfile's `slots` (default 1; one per GPU).
    :param launcher_options: more launcher flags, before the script, each one word, e.g. `["--bind_cores_to_rank"]`
        or `["--mca", "btl", "tcp,self"]`. Hostfile, hosts, rank counts and rendezvous are the operator's and
        refused here (for `deepspeed` under any abbreviation its argparse accepts: `--hostf=...`); for `deepspeed`,
        `--module`, `--no_python` and `--autotuning` are refused too, and the values of `--venv_script` and
        `--enable_each_rank_log` must be plain words (letters, digits, `_@%+=:,./-`).
    :param ssh_wait_timeout: seconds the master waits for every worker's sshd before failing with the host that did
        not answer (default 300).
    """

    refused_arguments: ClassVar[tuple[str, ...]] = ("main_task", "command", "full_job_spec")  # the launch's own
    job_kind = JobKind.HOSTFILE
    argument_groups: ClassVar[tuple[str, ...]] = ("job", "roles", "hostfile")

    def __init__(
        self,
        *,
        # Generated from the declarations: python -m airflow_volcano.operators.arguments
        name: str | None = None,
        namespace: str | None = None,
        job_template: str | dict | None = None,
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
        port: int | None = 29500,
        launcher: str | None = "deepspeed",
        slots_per_worker: int | str | None = 1,
        launcher_options: list[str] | None = None,
        ssh_wait_timeout: int | None = 300,
        **kwargs: Any,
    ) -> None:
        given = dict(locals())
        for unsupported in ("full_job_spec", "command"):
            if kwargs.get(unsupported) is not None:
                raise TypeError(f"VolcanoDeepSpeedJobOperator builds the pods' commands: {unsupported} cannot be "
                                "given (use job_template for the rest of the Job, args for the script)")
        super().__init__(**passed_on(VolcanoDeepSpeedJobOperator, given), **kwargs)
        take_arguments(self, VolcanoDeepSpeedJobOperator, given)

    def _probed_pods(self, job: dict, main: str) -> list[tuple[str, str | None]]:
        """The workers' pods, whose ranks' output counts for stall_timeout: it reaches the task log
        through the launcher on the master, but a rank's heartbeat (or a progress bar, which the
        launcher holds back until its line ends) shows only in its own pod's log. Those of log_tasks
        are copied, so already followed."""
        if self.stall_timeout is None:
            return []
        copied = {pod for pod, _ in self._log_pods(job, main)}
        worker = self.worker_task_name or DEFAULT_WORKER
        tasks = {task.get("name") for task in job["spec"]["tasks"]}
        return [pod for pod in task_pods(job, [worker], "worker_task_name") if pod[0] not in copied] \
            if worker in tasks else []
