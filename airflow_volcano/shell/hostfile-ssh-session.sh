# shellcheck shell=sh
# airflow-volcano-ssh-session.sh: sshd's ForceCommand on a worker of a hostfile launch. Every ssh
# session gets the pod's environment (saved by airflow-volcano-sshd.sh), then runs the command ssh
# was asked to run (the launcher's, e.g. pdsh's `... python3 -u -m deepspeed.launcher.launch ...`),
# or a login shell.
#
# Usage (sshd runs it): /bin/sh airflow-volcano-ssh-session.sh POD_ENV_FILE
#   An argument, not the environment: a session starts with sshd's environment, not the pod's.

# shellcheck source=/dev/null  # written at the pod's start by airflow-volcano-sshd.sh (`export -p`)
. "$1"
if [ -n "${SSH_ORIGINAL_COMMAND:-}" ]; then
    exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
fi
exec "${SHELL:-/bin/sh}" -l
