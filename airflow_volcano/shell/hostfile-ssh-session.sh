# shellcheck shell=sh
# airflow-volcano-ssh-session.sh: sshd's ForceCommand on a worker of a hostfile launch. Every ssh
# session gets the pod's environment (saved by airflow-volcano-sshd.sh), then runs the command ssh
# was asked to run (the launcher's, e.g. pdsh's `... python3 -u -m deepspeed.launcher.launch ...`),
# or a login shell.
#
# When the worker's forward-signals.sh prepared an output relay (stall_timeout: output_relay.py in
# its $AIRFLOW_VOLCANO_STACKS_DIR), the command's output goes through one of its own, so the ranks'
# bytes touch this worker's $HEARTBEAT_FILE (a progress bar is output, not a stall).
#
# Usage (sshd runs it): /bin/sh airflow-volcano-ssh-session.sh POD_ENV_FILE
#   An argument, not the environment: a session starts with sshd's environment, not the pod's.

# shellcheck source=/dev/null  # written at the pod's start by airflow-volcano-sshd.sh (`export -p`)
. "$1"
if [ -z "${SSH_ORIGINAL_COMMAND:-}" ]; then
    exec "${SHELL:-/bin/sh}" -l
fi
dir=${AIRFLOW_VOLCANO_STACKS_DIR:-}
python=
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -I -S -c '' >/dev/null 2>&1; then
        python=$candidate
        break
    fi
done
if [ -z "$dir" ] || [ ! -f "$dir/output_relay.py" ] || [ -z "$python" ] ||
    ! { rm -f "$dir/session-$$.out" "$dir/session-$$.err" && mkfifo "$dir/session-$$.out" "$dir/session-$$.err"; }
then
    exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"
fi
"$python" -I -S "$dir/output_relay.py" "$dir/session-$$.out" "$dir/session-$$.err" &
relay=$!
# Caught (not ignored, which the command would inherit): this shell stays until the command ends.
trap : TERM HUP
"${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND" > "$dir/session-$$.out" 2> "$dir/session-$$.err"
status=$?
# As in forward-signals.sh: a process the command left running may keep the relay's input open.
for how in USR1 KILL; do
    ticks=0
    while [ "$ticks" -lt 20 ] && [ -d "/proc/$relay" ] && ! grep -q '^State:.*Z' "/proc/$relay/status" 2>/dev/null; do
        sleep 0.1
        ticks=$((ticks + 1))
    done
    kill -s "$how" "$relay" 2>/dev/null
done
wait "$relay"
rm -f "$dir/session-$$.out" "$dir/session-$$.err"
exit "$status"
