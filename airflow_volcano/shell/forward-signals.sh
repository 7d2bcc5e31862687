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
# It also creates $CHECKPOINT_DIR when the operator sets it (checkpoint_dir=), and sets WORLD_SIZE
# from $AIRFLOW_VOLCANO_WORLD_SIZE (older Volcano releases, below).
#
# With stall_timeout, the operator also mounts the pod's annotations ($AIRFLOW_VOLCANO_PODINFO, the
# downward API) and passes stack_dumps.py in $AIRFLOW_VOLCANO_SITECUSTOMIZE. This shell installs it
# as every Python process's sitecustomize and watches the annotations: when the operator sets
# airflow-volcano.io/dump-stacks on the pod (a stall), it prints the Python stack of every thread of
# every registered process, each line prefixed `[airflow-volcano] stacks <request>:`. It also turns
# touches of $HEARTBEAT_FILE into a `[airflow-volcano] heartbeat` line (at most one per 10 s), which
# the operator counts as progress and does not show.
#
# Usage (inline: the pod may not mount the script's ConfigMap):
#   sh -c "<this file>" airflow-volcano-run COMMAND [ARG...]
# On a Volcano before 1.12, whose pytorch plugin counts every task's pods in WORLD_SIZE, the operator
# passes the number of ranks (master and workers) for a Job with other tasks (manifest/compatibility.py).
if [ -n "${AIRFLOW_VOLCANO_WORLD_SIZE:-}" ]; then
    export WORLD_SIZE="$AIRFLOW_VOLCANO_WORLD_SIZE"
fi
unset AIRFLOW_VOLCANO_WORLD_SIZE
if [ -n "${CHECKPOINT_DIR:-}" ]; then
    mkdir -p "$CHECKPOINT_DIR" || echo "airflow-volcano: cannot create CHECKPOINT_DIR $CHECKPOINT_DIR" >&2
fi
STACKS_SIGNAL=42  # as in stack_dumps.py
stacks_dir=
if [ -n "${AIRFLOW_VOLCANO_PODINFO:-}" ]; then
    for dir in "${TMPDIR:-/tmp}/airflow-volcano" /dev/shm/airflow-volcano; do
        if mkdir -p "$dir" 2>/dev/null &&
            printf '%s\n' "${AIRFLOW_VOLCANO_SITECUSTOMIZE:-}" > "$dir/sitecustomize.py" 2>/dev/null; then
            stacks_dir=$dir
            break
        fi
    done
    if [ -n "$stacks_dir" ]; then
        export AIRFLOW_VOLCANO_STACKS_DIR="$stacks_dir" HEARTBEAT_FILE="$stacks_dir/heartbeat"
        export PYTHONPATH="$stacks_dir${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "airflow-volcano: no writable directory (\$TMPDIR, /dev/shm): a stall is reported without stacks" >&2
    fi
fi
unset AIRFLOW_VOLCANO_SITECUSTOMIZE

# The value of the pod's dump-stacks annotation, if any.
stacks_request() {
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            'airflow-volcano.io/dump-stacks="'*)
                line=${line#*=\"}
                printf '%s\n' "${line%\"}"
                return
                ;;
        esac
    done < "$AIRFLOW_VOLCANO_PODINFO/annotations" 2>/dev/null
}

# Every registered Python process writes its threads' stacks (faulthandler), printed here.
print_stacks() {
    prefix="[airflow-volcano] stacks $1:"
    echo "$prefix begin"
    signalled=
    for file in "$stacks_dir"/stacks-*; do
        [ -f "$file" ] || continue
        pid=${file##*/stacks-}
        if kill -"$STACKS_SIGNAL" "$pid" 2>/dev/null; then
            signalled="$signalled $pid"
        else  # ended
            rm -f "$file" "$stacks_dir/about-$pid"
        fi
    done
    if [ -z "$signalled" ]; then
        echo "$prefix no Python process is running in this container"
    else
        sleep 1  # the handlers write at once; this leaves them the time to be scheduled
        for pid in $signalled; do
            about=
            IFS= read -r about < "$stacks_dir/about-$pid" 2>/dev/null
            echo "$prefix process $pid, $about"
            while IFS= read -r line || [ -n "$line" ]; do
                printf '%s %s\n' "$prefix" "$line"
            done < "$stacks_dir/stacks-$pid"
            : > "$stacks_dir/stacks-$pid"
        done
    fi
    echo "$prefix end"
}

# Runs in the background: answers the operator's requests for stacks, passes heartbeats on.
watch_requests() {
    last=$(stacks_request)  # one already set when this container started asked a container before it
    seen="$stacks_dir/heartbeat-seen"
    touch "$seen"
    ticks=0
    while sleep 2; do
        request=$(stacks_request)
        if [ -n "$request" ] && [ "$request" != "$last" ]; then
            last=$request
            print_stacks "$request"
        fi
        ticks=$((ticks + 1))
        # shellcheck disable=SC3013  # -nt: not POSIX, but dash, bash and busybox sh all have it
        if [ $((ticks % 5)) -eq 0 ] && [ "$HEARTBEAT_FILE" -nt "$seen" ]; then
            touch "$seen"
            echo "[airflow-volcano] heartbeat"
        fi
    done
}

"$@" &
child=$!
watcher=
if [ -n "$stacks_dir" ]; then
    watch_requests &
    watcher=$!
fi
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
if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null
fi
# Stopped by a signal: the other processes that got SIGTERM too (ranks saving a checkpoint, say)
# may finish before PID 1 exits and the kernel kills whatever is left. The grace period bounds this.
if [ "$signalled" -eq 1 ] && [ "$$" -eq 1 ]; then
    while others_left; do
        sleep 0.2
    done
fi
exit "$status"
