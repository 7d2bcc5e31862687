"""What the pods of a Job run: PyTorch's launchers (python, torchrun), a hostfile launch over ssh
(DeepSpeed, OpenMPI's mpirun), Volcano's wait-for-master init container, and debug mode (pods that
sleep instead of training, for a user to open a shell in, as in the debug mode of T9k's training
jobs; T9k is a Kubernetes platform for ML training)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_volcano import hostfile_launch, shell
from airflow_volcano.constants import DEBUG_ANNOTATION
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import HostfileLaunch
from airflow_volcano.kubelet import container_string, process_string
from airflow_volcano.manifest.checks import check_type, choice, integer
from airflow_volcano.manifest.names import TENSORBOARD_TASK, find_task, role_names
from airflow_volcano.shell.hostfile_argv import INERT as INERT_WORD

if TYPE_CHECKING:
    from airflow_volcano.manifest.request import JobRequest


LAUNCHERS = ("python", "torchrun")
NPROC_NAMES = ("auto", "gpu", "cpu")  # torchrun's own values: one process per GPU / per CPU / per GPU else CPU


# torchrun flags the operator derives from the Job; a user's copy would contradict Volcano's view.
TORCHRUN_MANAGED = {"--nnodes", "--node_rank", "--master_addr", "--master_port", "--rdzv_backend", "--rdzv_endpoint",
                    "--rdzv_id", "--nproc_per_node", "--max_restarts", "--standalone"}


def managed_flag(option: str, managed: Iterable[str], *, abbreviations: bool) -> str | None:
    """The managed flag that `option` (`--flag` or `--flag=value`) would set, if any. With
    `abbreviations` (a launcher parsing with argparse, as torchrun and DeepSpeed's runner do) that
    includes any prefix of a long flag (`--nnode=4` is `--nnodes`), `-` and `_` alike, and a short
    flag with its value attached (`-Hhosts`)."""
    name = option.split("=", 1)[0]
    if not name.startswith("-"):
        return None
    for flag in managed:
        if name == flag:
            return flag
        if not abbreviations:
            continue
        spelled, wanted = name.replace("_", "-"), flag.replace("_", "-")
        if wanted.startswith("--") and spelled.startswith("--") and len(spelled) > 2 and wanted.startswith(spelled):
            return flag
        if len(wanted) == 2 and not spelled.startswith("--") and spelled.startswith(wanted):
            return flag
    return None


def torchrun_options(req: JobRequest) -> dict[str, Any]:
    """The launcher of a PyTorch Job (python or torchrun) and torchrun's own arguments, checked."""
    choice("launcher", req.launcher, set(LAUNCHERS))
    check_type("torchrun_options", req.torchrun_options, list, str)
    torchrun_only = [field for field in ("nproc_per_node", "max_restarts", "torchrun_options")
                     if getattr(req, field) is not None]
    if req.launcher != "torchrun":
        if torchrun_only:
            raise JobSpecError(f"{', '.join(torchrun_only)}: only used with launcher='torchrun' "
                               f"(launcher is {req.launcher or 'python'!r})")
        return {}
    if req.training_script is None:
        raise JobSpecError("launcher='torchrun' runs training_script under torchrun: give training_script (or write "
                           "the torchrun command yourself in command=)")
    if req.command is not None:
        raise JobSpecError("launcher='torchrun' builds the command: give args= for the script, not command=")
    nproc = req.nproc_per_node
    if nproc is None:
        nproc = 1
    elif not (isinstance(nproc, str) and nproc in NPROC_NAMES):
        nproc = integer("nproc_per_node", nproc, 1, None, f" (or one of {', '.join(NPROC_NAMES)})")
    for option in req.torchrun_options or []:
        if managed_flag(option, TORCHRUN_MANAGED, abbreviations=True):
            raise JobSpecError(f"torchrun_options: {option!r} is set by the operator from the Job (nodes, ranks, "
                               "rendezvous); use nproc_per_node/max_restarts/min_available instead")
    return {"nproc_per_node": nproc}


def torchrun_command(job: dict, req: JobRequest, script_path: str, *, is_master: bool = True) -> list[str]:
    """torchrun in every master/worker pod: one agent per pod, `nproc_per_node` ranks each.

    Volcano's pytorch plugin gives each pod MASTER_ADDR/MASTER_PORT and RANK (0 for the master,
    index + 1 for workers): fixed-size Jobs use torchrun's static rendezvous at the master with
    --node_rank=RANK; a Job whose minAvailable is below its pods is elastic (--nnodes=min:max,
    c10d rendezvous at the master, node ranks assigned by torchrun). The kubelet expands $(VAR)."""
    master, worker = role_names(job, req)
    pods = sum(int((find_task(job, name) or {}).get("replicas") or 0) for name in (master, worker))
    min_pods = job["spec"].get("minAvailable")
    flags = [f"--nproc_per_node={req.nproc_per_node}"]
    options = list(req.torchrun_options or [])
    if isinstance(min_pods, int) and 0 < min_pods < pods:
        flags += [f"--nnodes={min_pods}:{pods}", "--rdzv_backend=c10d", "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
                  f"--rdzv_id={job['metadata']['name']}"]
        options = _with_rendezvous_host(options, is_master)
    else:
        flags += [f"--nnodes={pods}", "--node_rank=$(RANK)", "--master_addr=$(MASTER_ADDR)",
                  "--master_port=$(MASTER_PORT)"]
    if req.max_restarts is not None:
        flags.append(f"--max_restarts={req.max_restarts}")
    return ["torchrun", *flags, *map(container_string, options), script_path]


RDZV_CONF_FLAGS = ("--rdzv_conf", "--rdzv-conf")


def _with_rendezvous_host(options: list[str], is_master: bool) -> list[str]:
    """torchrun's options with `is_host` in its rendezvous configuration: the master hosts the c10d
    store. Left to itself, an agent decides by resolving the endpoint's name, and a pod's DNS name
    appears only once the pod is ready: a master that starts first concludes it is not the host,
    and every agent then waits for a store nobody serves (seen here). A user's own `is_host` wins;
    a `--rdzv_conf` given as two words is left as it is."""
    if any(option in RDZV_CONF_FLAGS for option in options):
        return options
    given = [option for option in options if option.split("=", 1)[0] in RDZV_CONF_FLAGS]
    conf = given[-1].split("=", 1)[1] if given else ""
    if "is_host=" in conf:
        return options
    conf = ",".join(part for part in (conf, f"is_host={int(is_master)}") if part)
    return [option for option in options if option not in given] + [f"--rdzv_conf={conf}"]


def hostfile_options(req: JobRequest) -> HostfileLaunch:
    """The launch a DeepSpeed/mpirun Job's master runs, from the request's arguments, checked."""
    launcher = req.launcher or hostfile_launch.LAUNCHERS[0]
    choice("launcher", launcher, set(hostfile_launch.LAUNCHERS))
    if req.training_script is None:
        raise JobSpecError(f"launcher={launcher!r} runs training_script on every worker: give training_script")
    if req.command is not None:
        raise JobSpecError(f"launcher={launcher!r} builds the master's and the workers' commands: give args= "
                           "for the script, not command=")
    options = [] if req.launcher_options is None else req.launcher_options
    if not isinstance(options, list | tuple) or not all(isinstance(item, str) for item in options):
        raise JobSpecError(f"launcher_options must be a list of strings, got {options!r}")
    for option in options:
        # DeepSpeed's runner parses its flags with argparse (abbreviations allowed); OpenMPI's mpirun does not.
        if managed_flag(option, hostfile_launch.MANAGED_OPTIONS[launcher], abbreviations=launcher == "deepspeed"):
            raise JobSpecError(f"launcher_options: {option!r} is set by the operator (hostfile, hosts, ranks, "
                               "rendezvous); use worker_replicas/slots_per_worker/port instead")
        if managed_flag(option, hostfile_launch.UNSUPPORTED_OPTIONS[launcher], abbreviations=True):
            raise JobSpecError(f"launcher_options: {option!r} cannot be used: the ranks run training_script as a "
                               f"Python file through {hostfile_launch.ARGV_SHIM}, which gives it its arguments")
    _check_remote_values(launcher, list(options))
    return HostfileLaunch(
        launcher=launcher, options=tuple(options),
        slots_per_worker=integer("slots_per_worker", 1 if req.slots_per_worker is None else req.slots_per_worker, 1),
        port=integer("port", hostfile_launch.DEFAULT_PORT if req.port is None else req.port, 1, 65535),
        ssh_wait_timeout=integer("ssh_wait_timeout", hostfile_launch.DEFAULT_SSH_WAIT_TIMEOUT
                                 if req.ssh_wait_timeout is None else req.ssh_wait_timeout, 1))


def _check_remote_values(launcher: str, options: list[str]) -> None:
    """DeepSpeed's runner writes some flags' values unquoted into the command line each worker's shell
    runs (`--venv_script=X` as `source X;`): those must be shell-inert words."""
    for index, option in enumerate(options):
        if not managed_flag(option, hostfile_launch.REMOTE_VALUE_OPTIONS[launcher], abbreviations=True):
            continue
        value = option.split("=", 1)[1] if "=" in option else (options[index + 1] if index + 1 < len(options) else "")
        if not INERT_WORD.match(value):
            raise JobSpecError(f"launcher_options: {option!r}: DeepSpeed's runner writes this value unquoted into the "
                               f"command line each worker's shell runs; use letters, digits and _@%+=:,./- (got "
                               f"{value!r})")


def hostfile_launch_data(job: dict, options: HostfileLaunch, worker: str) -> dict[str, str]:
    """The master's launch script, the workers' sshd scripts and the argv shim, beside the training script."""
    worker_task = find_task(job, worker)
    if worker_task is None or not worker_task.get("replicas"):
        raise JobSpecError(f"launcher={options.launcher!r} runs the ranks on the workers: the job needs a task "
                           f"{worker!r} with worker_replicas >= 1")
    plugins = job["spec"].get("plugins") or {}
    missing = [plugin for plugin in ("ssh", "svc") if plugin not in plugins]
    if missing:
        raise JobSpecError(f"launcher={options.launcher!r} needs the Volcano plugins ssh and svc; the job lacks "
                           f"{', '.join(missing)} (job_template spec.plugins)")
    return hostfile_launch.scripts()


WAIT_MASTER_FLAGS = ("--wait-master-enabled", "--wait-master-timeout=", "--wait-master-image=")


def apply_wait_for_master(job: dict, req: JobRequest) -> None:
    """Volcano's own option (pytorch plugin, v1.14+): an init container in each worker waits until
    the master accepts connections on MASTER_PORT (`nc -z`, for up to 300 s, then the pod fails).
    Its image needs sh and nc: Volcano's default busybox, or the image named by wait_for_master."""
    plugin = job["spec"]["plugins"]["pytorch"]
    plugin[:] = [arg for arg in plugin if not arg.startswith(WAIT_MASTER_FLAGS)]
    plugin += ["--wait-master-enabled", "--wait-master-timeout=300"]
    if isinstance(req.wait_for_master, str):
        plugin.append(f"--wait-master-image={req.wait_for_master}")


# Debug mode (the pods come up as configured, but sleep instead of training): a pod sleeps the
# task's debug_timeout and this margin at most, counted from its own start, so it ends by itself even if
# the task's worker (which deletes the Job after debug_timeout, counted once every pod runs) is gone.
DEBUG_POD_MARGIN_SECONDS = 60


def debug_command(seconds: int) -> list[str]:
    """A debug pod's command: shell/debug-sleep.sh, inline (the pod may not mount the script's ConfigMap)."""
    return ["/bin/sh", "-c", shell.read("debug-sleep.sh"), "airflow-volcano-debug", str(seconds)]


def apply_debug(job: dict, keep: set[str], seconds: int) -> None:
    """Every pod (but those of the tasks in `keep`) sleeps for at most `seconds` instead of running its
    command, which it keeps in an annotation (the task log prints it, to be run by hand in
    `kubectl exec`); the rest of the pod is unchanged."""
    for task in job["spec"]["tasks"]:
        containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers or task.get("name") in {TENSORBOARD_TASK, *keep}:
            continue
        container = containers[0]
        # As the process would get it (printed for the user to run by hand).
        original = [process_string(str(part)) for part in (*(container.get("command") or []),
                                                            *(container.get("args") or []))]
        metadata = task.setdefault("template", {}).setdefault("metadata", {})
        metadata.setdefault("annotations", {})[DEBUG_ANNOTATION] = json.dumps(original)
        container["command"] = debug_command(seconds)
        container.pop("args", None)
