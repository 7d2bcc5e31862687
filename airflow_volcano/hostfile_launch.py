"""Launching over ssh from a hostfile (seed 003): DeepSpeed's `deepspeed --hostfile` or OpenMPI's `mpirun`.

Pure: the options and the shell scripts the Job's pods run, shipped in the script's ConfigMap.

- Workers run only sshd. The ssh plugin gives every pod the same key pair and an ssh config; the svc
  plugin gives `/etc/volcano/<task>.host` (one `<pod>.<job>` name per line) and the DNS names.
  An ssh session starts with sshd's environment, not the pod's (the image's ENV, `env=`, Volcano's
  variables): each worker saves its environment at start and every session restores it, so the
  ranks see what the pod sees without the launcher passing values on its command line (DeepSpeed's
  runner prints that command, with any value it exports).
- The master writes the hostfile (`<host> slots=<n>` per worker; DeepSpeed and OpenMPI read the same
  syntax; seed 003's `slot=` is a typo DeepSpeed ignores), waits until every worker accepts an ssh
  login, then runs the launcher. The master only launches: it is not in the hostfile, and rank 0 is
  the first worker's first slot, and the master copies its termination message (what a script
  returns to Airflow as XCom) when the launcher succeeds.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

LAUNCHERS = ("deepspeed", "mpirun")
DEFAULT_PORT = 29500  # DeepSpeed's own default rendezvous port
DEFAULT_SSH_WAIT_TIMEOUT = 300
LAUNCH_SCRIPT = "airflow-volcano-launch.sh"
SSHD_SCRIPT = "airflow-volcano-sshd.sh"
SESSION_SCRIPT = "airflow-volcano-ssh-session.sh"
POD_ENV_FILE = "/run/airflow-volcano-pod-env"
HOSTFILE = "/tmp/airflow-volcano-hostfile"
TERMINATION_LOG = "/dev/termination-log"  # the container's terminationMessagePath (Kubernetes' default)
REQUIRED_PLUGINS = ("ssh", "svc", "env")
# Launcher flags the operator sets from the Job; a user's copy would contradict the hostfile.
MANAGED_OPTIONS = {
    "deepspeed": {"--hostfile", "-H", "--master_addr", "--master_port", "--num_nodes", "--num_gpus", "--launcher",
                  "--include", "-i", "--exclude", "-e", "--no_ssh", "--node_rank", "--force_multi"},
    "mpirun": {"--hostfile", "-hostfile", "--machinefile", "-machinefile", "-np", "-n", "--np", "-H", "--host",
               "-host"},
}


@dataclass(frozen=True)
class HostfileLaunch:
    """How the master launches the ranks on the workers (checked by manifest._normalize)."""

    launcher: str = "deepspeed"
    # Templated numbers arrive as strings; manifest._normalize checks and converts them.
    slots_per_worker: int | str = 1
    port: int | str = DEFAULT_PORT
    ssh_wait_timeout: int | str = DEFAULT_SSH_WAIT_TIMEOUT
    options: Sequence[str] = ()


def managed_option(launcher: str, option: str) -> bool:
    return option.split("=", 1)[0] in MANAGED_OPTIONS[launcher]


def scripts(options: HostfileLaunch, worker_task: str, mount_path: str) -> dict[str, str]:
    """The ConfigMap entries, by file name, for scripts mounted at `mount_path`."""
    return {LAUNCH_SCRIPT: launch_script(options, worker_task),
            SSHD_SCRIPT: sshd_script(f"{mount_path}/{SESSION_SCRIPT}"),
            SESSION_SCRIPT: session_script()}


def sshd_script(session_script_path: str) -> str:
    """A worker's command: save the pod's environment, make every ssh session restore it, run sshd."""
    return f"""\
# airflow-volcano: a worker runs only sshd; the master's launcher starts its ranks over ssh.
set -eu
if [ ! -x /usr/sbin/sshd ]; then
    echo "airflow-volcano: the image has no /usr/sbin/sshd; a worker of a hostfile launch runs OpenSSH's server" >&2
    exit 1
fi
# ssh sessions start with sshd's environment: save the pod's for them (airflow-volcano-ssh-session.sh).
export -p > {POD_ENV_FILE}
chmod 600 {POD_ENV_FILE}
mkdir -p /run/sshd /etc/ssh/sshd_config.d
ssh-keygen -A >/dev/null
printf 'ForceCommand /bin/sh {session_script_path}\\n' > /etc/ssh/sshd_config.d/airflow-volcano.conf
echo "airflow-volcano: sshd listening on $(hostname) (port 22)"
exec /usr/sbin/sshd -D -e
"""


def session_script() -> str:
    """sshd's ForceCommand on a worker: the pod's environment, then the command ssh was asked to run."""
    return f"""\
# airflow-volcano: an ssh session on a worker runs with the pod's environment (saved at start).
. {POD_ENV_FILE}
if [ -n "${{SSH_ORIGINAL_COMMAND:-}}" ]; then
    exec "${{SHELL:-/bin/sh}}" -c "$SSH_ORIGINAL_COMMAND"
fi
exec "${{SHELL:-/bin/sh}}" -l
"""


def launch_script(options: HostfileLaunch, worker_task: str) -> str:
    """The master's command (`sh <this> <script> <args>...`): hostfile, wait for sshd, launch."""
    hosts = f"/etc/volcano/{worker_task}.host"
    program = "deepspeed" if options.launcher == "deepspeed" else "mpirun"
    if options.launcher == "deepspeed":
        # --force_multi: with one worker DeepSpeed would otherwise run the ranks here, on the master.
        launch = (f'deepspeed --force_multi --hostfile={HOSTFILE} --master_addr="$first_host" '
                  f'--master_port={options.port} {_quoted(options.options)}"$@"')
    else:
        launch = (f"mpirun --allow-run-as-root --hostfile {HOSTFILE} -np \"$ranks\" "
                  f'-x MASTER_ADDR="$first_host" -x MASTER_PORT={options.port} {_quoted(options.options)}python "$@"')
    return f"""\
# airflow-volcano: the master writes the hostfile, waits for every worker's sshd, then launches.
set -eu
for program in ssh {program}; do
    if ! command -v "$program" >/dev/null; then
        echo "airflow-volcano: the image has no $program (launcher={options.launcher!r} needs it on the master)" >&2
        exit 1
    fi
done
if [ ! -s {hosts} ]; then
    echo "airflow-volcano: {hosts} is missing or empty: the Job needs the svc plugin and a task named" \\
         "{shlex.quote(worker_task)} with at least one replica" >&2
    exit 1
fi
: > {HOSTFILE}
# (The svc plugin's host files end without a newline: `|| [ -n "$host" ]` keeps the last line.)
while read -r host || [ -n "$host" ]; do
    if [ -n "$host" ]; then echo "$host slots={options.slots_per_worker}" >> {HOSTFILE}; fi
done < {hosts}
workers=$(wc -l < {HOSTFILE})
ranks=$((workers * {options.slots_per_worker}))
first_host=$(head -n 1 {HOSTFILE} | cut -d ' ' -f 1)
# The ssh plugin's config keeps no known_hosts: without this every login warns "Permanently added".
mkdir -p /etc/ssh/ssh_config.d && echo "LogLevel ERROR" > /etc/ssh/ssh_config.d/airflow-volcano.conf || true
deadline=$(($(date +%s) + {options.ssh_wait_timeout}))
for host in $(cut -d ' ' -f 1 {HOSTFILE}); do
    until ssh -o BatchMode=yes -o ConnectTimeout=5 "$host" true 2>/dev/null; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "airflow-volcano: worker $host did not accept an ssh login within {options.ssh_wait_timeout}s" \\
                 "(ssh_wait_timeout); its pod log shows sshd's side" >&2
            exit 1
        fi
        sleep 2
    done
    echo "airflow-volcano: $host accepts ssh"
done
echo "airflow-volcano: $workers workers x {options.slots_per_worker} slots = $ranks ranks; hostfile {HOSTFILE}:"
cat {HOSTFILE}
{launch} &
launcher=$!
# The launcher passes a stop on to the ranks (sh as PID 1 would ignore SIGTERM).
trap 'kill -TERM "$launcher" 2>/dev/null' TERM INT
status=0
wait "$launcher" || status=$?
if kill -0 "$launcher" 2>/dev/null; then wait "$launcher" || status=$?; fi
if [ "$status" -eq 0 ]; then
    # Rank 0 ran on the first worker: its termination message (the task's XCom) becomes the master's.
    ssh -o BatchMode=yes "$first_host" cat {TERMINATION_LOG} > {TERMINATION_LOG} 2>/dev/null || true
fi
exit "$status"
"""


def _quoted(options: Sequence[str]) -> str:
    return "".join(f"{shlex.quote(option)} " for option in options)
