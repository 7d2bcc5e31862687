"""Launching over ssh from a hostfile: DeepSpeed's `deepspeed --hostfile` or OpenMPI's `mpirun`.

Pure: the options, and the files, commands and environment of the Job's pods. The pods run shell
scripts kept as files in airflow_volcano/shell/ (checked by shellcheck), shipped unchanged in the
script's ConfigMap; every value reaches them as an environment variable of the container or as an
argument, never written into a script.

- Workers run only sshd (airflow-volcano-sshd.sh), with key-only root login and every session
  through airflow-volcano-ssh-session.sh. The ssh plugin gives every pod the same key pair and an
  ssh config; the svc plugin gives `/etc/volcano/<task>.host` (one `<pod>.<job>` name per line) and
  the DNS names. An ssh session starts with sshd's environment, not the pod's (the image's ENV,
  `env=`, Volcano's variables): each worker saves its environment at start and every session
  restores it, so the ranks see what the pod sees without the launcher passing values on its
  command line (DeepSpeed's runner prints that command, with any value it exports). The script's
  arguments are the workers' own container args, saved at start too: no launcher carries them.
- The master (airflow-volcano-launch.sh) writes the hostfile (`<host> slots=<n>` per worker;
  DeepSpeed and OpenMPI read the same syntax; `slot=`, seen in examples, is ignored by DeepSpeed), waits
  until every worker accepts an ssh login, then runs the launcher with airflow-volcano-argv.py as
  each rank's program, which runs the script with the arguments its worker saved (DeepSpeed's
  runner would otherwise hand them to a shell on each worker, and log them). The master only launches: it is not in the
  hostfile, and rank 0 is the first worker's first slot, and the master copies its termination
  message (what a script returns to Airflow as XCom) when the launcher succeeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_volcano import shell
from airflow_volcano.kubelet import container_string
from airflow_volcano.shell.hostfile_argv import OPTIONS_FLAG

LAUNCHERS = ("deepspeed", "mpirun")
DEFAULT_PORT = 29500  # DeepSpeed's own default rendezvous port
DEFAULT_SSH_WAIT_TIMEOUT = 300
# The files in the ConfigMap (their names are what a user runs by hand in debug mode).
LAUNCH_SCRIPT = "airflow-volcano-launch.sh"
SSHD_SCRIPT = "airflow-volcano-sshd.sh"
SESSION_SCRIPT = "airflow-volcano-ssh-session.sh"
ARGV_SHIM = "airflow-volcano-argv.py"
# ConfigMap file name -> the file of the package airflow_volcano.shell it is, byte for byte.
PACKAGE_FILES = {LAUNCH_SCRIPT: "hostfile-launch.sh", SSHD_SCRIPT: "hostfile-sshd.sh",
                 SESSION_SCRIPT: "hostfile-ssh-session.sh", ARGV_SHIM: "hostfile_argv.py"}
POD_ENV_FILE = "/run/airflow-volcano-pod-env"
POD_ARGS_FILE = "/run/airflow-volcano-pod-args"  # the script's arguments, saved by each worker's sshd script
HOSTFILE = "/tmp/airflow-volcano-hostfile"
SSH_CLIENT_CONFIG = "/etc/ssh/ssh_config.d/airflow-volcano.conf"
TERMINATION_LOG = "/dev/termination-log"  # the container's terminationMessagePath (Kubernetes' default)
REQUIRED_PLUGINS = ("ssh", "svc", "env")
# Launcher flags the operator sets from the Job; a user's copy would contradict the hostfile.
MANAGED_OPTIONS = {
    "deepspeed": {"--hostfile", "-H", "--master_addr", "--master_port", "--num_nodes", "--num_gpus", "--launcher",
                  "--include", "-i", "--exclude", "-e", "--no_ssh", "--node_rank", "--force_multi"},
    "mpirun": {"--hostfile", "-hostfile", "--machinefile", "-machinefile", "-np", "-n", "--np", "-H", "--host",
               "-host"},
}
# DeepSpeed runner flags that bypass airflow-volcano-argv.py: the ranks would not run training_script
# as a Python file (--module, --no_python), or the autotuner would run the script without its arguments.
UNSUPPORTED_OPTIONS = {"deepspeed": {"--module", "--no_python", "--autotuning"}, "mpirun": set()}
# DeepSpeed runner flags whose value it writes, unquoted, into the command line each worker's shell runs.
REMOTE_VALUE_OPTIONS = {"deepspeed": {"--venv_script", "--enable_each_rank_log"}, "mpirun": set()}


@dataclass(frozen=True)
class HostfileLaunch:
    """How the master launches the ranks on the workers (checked by manifest._normalize)."""

    launcher: str = "deepspeed"
    # Templated numbers arrive as strings; manifest._normalize checks and converts them.
    slots_per_worker: int | str = 1
    port: int | str = DEFAULT_PORT
    ssh_wait_timeout: int | str = DEFAULT_SSH_WAIT_TIMEOUT
    options: Sequence[str] = ()


def scripts() -> dict[str, str]:
    """The ConfigMap entries of the launch, by file name: the package's files, unchanged."""
    return {name: shell.read(source) for name, source in PACKAGE_FILES.items()}


def master_command(options: HostfileLaunch, script_path: str, mount_path: str) -> list[str]:
    """The master's command, before the script's arguments (the container's args): the launch script,
    the launcher options counted, each one word (as written for the kubelet: it expands nothing)."""
    counted = [OPTIONS_FLAG, str(len(options.options)), *map(container_string, options.options)] \
        if options.options else []
    return ["/bin/sh", f"{mount_path}/{LAUNCH_SCRIPT}", *counted, script_path]


def worker_command(mount_path: str) -> list[str]:
    """A worker's command: sshd."""
    return ["/bin/sh", f"{mount_path}/{SSHD_SCRIPT}"]


def master_env(options: HostfileLaunch, worker_task: str, mount_path: str) -> dict[str, str]:
    """The environment variables the master's launch script reads (see its header)."""
    return {
        "AIRFLOW_VOLCANO_LAUNCHER": options.launcher,
        "AIRFLOW_VOLCANO_SLOTS_PER_WORKER": str(options.slots_per_worker),
        "AIRFLOW_VOLCANO_PORT": str(options.port),
        "AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT": str(options.ssh_wait_timeout),
        "AIRFLOW_VOLCANO_WORKER_HOSTS_FILE": f"/etc/volcano/{worker_task}.host",
        "AIRFLOW_VOLCANO_HOSTFILE": HOSTFILE,
        "AIRFLOW_VOLCANO_SSH_CLIENT_CONFIG": SSH_CLIENT_CONFIG,
        "AIRFLOW_VOLCANO_TERMINATION_LOG": TERMINATION_LOG,
        "AIRFLOW_VOLCANO_ARGV_SHIM": f"{mount_path}/{ARGV_SHIM}",
    }


def worker_env(mount_path: str) -> dict[str, str]:
    """The environment variables a worker's sshd script reads (see its header)."""
    return {"AIRFLOW_VOLCANO_POD_ENV_FILE": POD_ENV_FILE, "AIRFLOW_VOLCANO_POD_ARGS_FILE": POD_ARGS_FILE,
            "AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT": f"{mount_path}/{SESSION_SCRIPT}"}
