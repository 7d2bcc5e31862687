# shellcheck shell=sh
# PID 1 of a training container: runs the container's command as its child and passes SIGTERM on.
#
# The kernel delivers no signal to a container's PID 1 that it has no handler for, and Python as PID 1
# has none for SIGTERM: deleting the pod (on_kill, job_timeout, a gang restart, a preemption) would wait
# out the whole grace period and then SIGKILL the script, which never gets to save a checkpoint. Here
# the script is not PID 1: on SIGTERM (or SIGINT) this shell sends SIGTERM to every other process of the
# container (a launcher and its ranks alike: torchrun, DeepSpeed's runner, mpirun), so a script without
# a handler ends at once and one with a handler saves within terminationGracePeriodSeconds. It exits
# with the command's own exit status, which Volcano's exit-code policies read.
#
# It also creates $CHECKPOINT_DIR when the operator sets it (checkpoint_dir=).
#
# Usage (inline: the pod may not mount the script's ConfigMap):
#   sh -c "<this file>" airflow-volcano-run COMMAND [ARG...]
if [ -n "${CHECKPOINT_DIR:-}" ]; then
    mkdir -p "$CHECKPOINT_DIR" || echo "airflow-volcano: cannot create CHECKPOINT_DIR $CHECKPOINT_DIR" >&2
fi
"$@" &
child=$!
stopping=0
# shellcheck disable=SC2317  # run by the trap below
forward() {
    stopping=1
    if [ "$$" -eq 1 ]; then
        kill -s TERM -- -1 2>/dev/null  # every process of the container but PID 1 (this shell)
    else
        kill -s TERM "$child" 2>/dev/null  # not PID 1 (another init runs us): the command only
    fi
}
trap forward TERM INT
# Whether a process other than this shell is left in the container (zombies aside).
others_left() {
    for proc in /proc/[0-9]*; do
        [ "${proc#/proc/}" != "$$" ] || continue
        while read -r key value _; do
            if [ "$key" = "State:" ]; then
                [ "$value" = Z ] || return 0
                break
            fi
        done < "$proc/status" 2>/dev/null
    done
    return 1
}
signalled=0
while :; do
    stopping=0
    wait "$child"
    status=$?
    # A trapped signal interrupts `wait` (status > 128): wait again for the command's real exit.
    [ "$stopping" -eq 1 ] || break
    signalled=1
done
# Stopped by a signal: the other processes that got SIGTERM too (ranks saving a checkpoint, say)
# may finish before PID 1 exits and the kernel kills whatever is left. The grace period bounds this.
if [ "$signalled" -eq 1 ] && [ "$$" -eq 1 ]; then
    while others_left; do
        sleep 0.2
    done
fi
exit "$status"
