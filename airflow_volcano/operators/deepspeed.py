"""VolcanoDeepSpeedJobOperator: DeepSpeed (or OpenMPI's mpirun) over ssh from a hostfile, the way
Volcano runs MPI-style training (its ssh and svc plugins give the pods keys and host names).

Only what is the launch's lives here: the ssh, svc and env plugins, sshd in the workers and the
master's launch script (airflow_volcano.hostfile_launch). The roles are MasterWorkerJobOperator's;
submitting, waiting, logs, results, cleanup and kills are VolcanoJobOperator's.
"""

from __future__ import annotations

from typing import Any

from airflow_volcano.hostfile_launch import DEFAULT_PORT, DEFAULT_SSH_WAIT_TIMEOUT
from airflow_volcano.manifest import DEFAULT_WORKER, JobKind, task_pods
from airflow_volcano.operators.master_worker import MasterWorkerJobOperator


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

    :param launcher: `deepspeed` (default: DeepSpeed's runner, pdsh over ssh; DeepSpeed's
        launch sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT in each rank) or `mpirun`
        (OpenMPI; ranks read OMPI_COMM_WORLD_RANK/SIZE, or let `deepspeed.init_distributed()`
        discover them through mpi4py; MASTER_ADDR/MASTER_PORT are passed).
    :param slots_per_worker: ranks per worker pod, the hostfile's `slots` (default 1; one per GPU).
    :param port: the rendezvous port on the first worker (MASTER_PORT, default 29500).
    :param launcher_options: more flags for the launcher, before the script (hostfile, hosts, ranks
        and rendezvous are the operator's).
    :param ssh_wait_timeout: seconds the master waits for every worker's sshd before failing with
        the host that did not answer (default 300).
    """

    untemplated_fields = ("main_task", "command", "full_job_spec")  # the launch's own, or refused
    job_kind = JobKind.HOSTFILE

    def __init__(
        self,
        *,
        launcher: str = "deepspeed",
        slots_per_worker: int | str = 1,
        port: int | str = DEFAULT_PORT,
        launcher_options: list[str] | None = None,
        ssh_wait_timeout: int = DEFAULT_SSH_WAIT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        for unsupported in ("full_job_spec", "command"):
            if kwargs.get(unsupported) is not None:
                raise TypeError(f"VolcanoDeepSpeedJobOperator builds the pods' commands: {unsupported} cannot be "
                                "given (use job_template for the rest of the Job, args for the script)")
        super().__init__(**kwargs)
        self.launcher, self.slots_per_worker, self.port = launcher, slots_per_worker, port
        self.launcher_options, self.ssh_wait_timeout = launcher_options, ssh_wait_timeout

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
