# shellcheck shell=sh
# PID 1 of a training container: runs the container's command as its child and passes signals on.
#
# The kernel delivers no signal to a container's PID 1 that it has no handler for, and Python as PID 1
# has none for SIGTERM: deleting the pod (on_kill, job_timeout, a gang restart, a preemption) would wait
# out the whole grace period and then SIGKILL the script, which never gets to save a checkpoint. Here
# the script is not PID 1: on SIGTERM, SIGINT or SIGQUIT this shell sends the same signal to every
# other process of the container (a launcher and its ranks alike: torchrun, DeepSpeed's runner,
# mpirun), so a script without a handler ends at once and one with a handler saves within
# terminationGracePeriodSeconds. It exits with the command's own exit status, which Volcano's
# exit-code policies read. A signal that comes before the command started: it is not started, and
# the exit status is 128 + the signal's number.
#
# An async command of sh starts with SIGINT and SIGQUIT ignored (dash cannot undo it): when the image
# has Python 3, the command is started through EXEC_HELPER below, which restores them and execs it
# (same pid and environment); without Python the command ignores SIGINT and SIGQUIT.
#
# It also creates $CHECKPOINT_DIR when the operator sets it (checkpoint_dir=), and sets WORLD_SIZE
# from $AIRFLOW_VOLCANO_WORLD_SIZE (older Volcano releases, below).
#
# $AIRFLOW_VOLCANO_HOLD_EXIT, "<seconds> <code>...": a non-zero exit status not among the codes
# (a failure Volcano's policies end the Job on) is held back that long, unless a signal came, so
# that a peer's retryable failure (OOM, preemption: exit codes the policies restart on) reaches
# Volcano first and restarts the gang instead of ending the Job.
#
# With stall_timeout, the operator also mounts the pod's annotations ($AIRFLOW_VOLCANO_PODINFO, the
# downward API) and passes stack_dumps.py in $AIRFLOW_VOLCANO_SITECUSTOMIZE. This shell installs it
# as every Python process's sitecustomize and watches the annotations: when the operator sets
# airflow-volcano.io/dump-stacks on the pod (a stall), it prints the Python stack of every thread of
# every registered process, each line prefixed `[airflow-volcano] stacks <request>:`. It also turns
# touches of $HEARTBEAT_FILE into a `[airflow-volcano] heartbeat` line (at most one per 10 s), which
# the operator counts as progress and does not show. With $AIRFLOW_VOLCANO_OUTPUT_RELAY
# (output_relay.py) and Python, the command's stdout and stderr go through that relay, which copies
# them unchanged and touches $HEARTBEAT_FILE while bytes flow: a progress bar that never ends a line
# (the runtime passes on a partial line only at 16 KiB) is not taken for a stall.
#
# Usage (inline: the pod may not mount the script's ConfigMap):
#   sh -c "<this file>" airflow-volcano-run COMMAND [ARG...]

# First of all (a stop that comes while this shell prepares must not be lost): the signals.
stopping=  # the signal received, if any
stop_number=
signals=0
started=
child=  # the command's pid until it is reaped
launched=  # set once $child was
forwarded=
stop_flag=
# shellcheck disable=SC2317  # run by the traps below
on_signal() {
    stopping=$1
    stop_number=$2
    signals=$((signals + 1))
    [ -n "$started" ] || return 0  # not started: it never will be
    forward
}
# shellcheck disable=SC2317
forward() {
    # The exec helper ignores SIGINT/SIGQUIT until it has restored them: it reads this once it has.
    if [ -n "$stop_flag" ]; then echo "$stopping" > "$stop_flag"; fi 2>/dev/null
    [ -n "$launched" ] || return 0  # being started: sent once it is (below)
    forwarded=1
    if [ "$$" -eq 1 ]; then
        kill -s "$stopping" -- -1 2>/dev/null  # every process of the container but PID 1 (this shell)
    elif [ -n "$child" ]; then
        kill -s "$stopping" "$child" 2>/dev/null  # not PID 1 (another init runs us): the command only
    fi
}
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT
trap 'on_signal QUIT 3' QUIT

# On a Volcano before 1.12, whose pytorch plugin counts every task's pods in WORLD_SIZE, the operator
# passes the number of ranks (master and workers) for a Job with other tasks (manifest/compatibility.py).
if [ -n "${AIRFLOW_VOLCANO_WORLD_SIZE:-}" ]; then
    export WORLD_SIZE="$AIRFLOW_VOLCANO_WORLD_SIZE"
fi
hold=${AIRFLOW_VOLCANO_HOLD_EXIT:-}
case $hold in
    *[!0-9\ ]*) hold= ;;  # not "<seconds> <code>...": no hold (and no glob in the split below)
esac
relay_code=${AIRFLOW_VOLCANO_OUTPUT_RELAY:-}
sitecustomize=${AIRFLOW_VOLCANO_SITECUSTOMIZE:-}
unset AIRFLOW_VOLCANO_WORLD_SIZE AIRFLOW_VOLCANO_HOLD_EXIT AIRFLOW_VOLCANO_OUTPUT_RELAY AIRFLOW_VOLCANO_SITECUSTOMIZE
if [ -n "${CHECKPOINT_DIR:-}" ]; then
    mkdir -p "$CHECKPOINT_DIR" || echo "airflow-volcano: cannot create CHECKPOINT_DIR $CHECKPOINT_DIR" >&2
fi
# One that runs (a `python` may be Python 2, which has no -I; a python3 may be a broken link).
python=
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -I -S -c '' >/dev/null 2>&1; then
        python=$candidate
        break
    fi
done
# Resets SIGINT and SIGQUIT, then execs the command with the environment this process started with
# (Python's locale coercion may have set LC_CTYPE); sh runs what cannot be exec'd, with its message.
# shellcheck disable=SC2016  # "$@" is for that sh
EXEC_HELPER='import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)
name, flag, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    with open("/proc/self/environ", "rb") as environ:
        env = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)
except OSError:
    env = os.environ
try:
    with open(flag) as stop:
        stopped = getattr(signal, "SIG" + stop.read().strip(), None)
except OSError:
    stopped = None
if stopped:
    os.kill(os.getpid(), stopped)
try:
    os.execvpe(argv[0], argv, env)
except OSError:
    os.execve("/bin/sh", ["sh", "-c", "exec \"$@\"", name] + argv, env)'
STACKS_SIGNAL=42  # as in stack_dumps.py
run_dir=
stacks_dir=
for dir in "${TMPDIR:-/tmp}/airflow-volcano" /dev/shm/airflow-volcano; do
    { mkdir -p "$dir" && : > "$dir/stop-$$"; } 2>/dev/null || continue
    run_dir=$dir
    if [ -n "${AIRFLOW_VOLCANO_PODINFO:-}" ]; then
        printf '%s\n' "$sitecustomize" 2>/dev/null > "$dir/sitecustomize.py" || continue
        stacks_dir=$dir
    fi
    break
done
if [ -n "$run_dir" ] && [ -n "$python" ]; then
    stop_flag="$run_dir/stop-$$"
fi
if [ -n "$stacks_dir" ]; then
    export AIRFLOW_VOLCANO_STACKS_DIR="$stacks_dir" HEARTBEAT_FILE="$stacks_dir/heartbeat"
    export PYTHONPATH="$stacks_dir${PYTHONPATH:+:$PYTHONPATH}"
elif [ -n "${AIRFLOW_VOLCANO_PODINFO:-}" ]; then
    echo "airflow-volcano: no writable directory (\$TMPDIR, /dev/shm): a stall is reported without stacks" >&2
fi
unset sitecustomize

# Whether process $1 has a handler for signal 42 (bit 41 of /proc's hex SigCgt mask): unhandled, the
# signal would end it (a registered process that exec'd another program keeps its pid, not its handler).
catches_stacks_signal() {
    while read -r key mask _; do
        [ "$key" = SigCgt: ] || continue
        case $mask in
            '' | *[!0-9a-fA-F]*) return 1 ;;
            ???????????*) mask=${mask#"${mask%???????????}"} ;;  # the last 44 bits: no overflow in $((...))
        esac
        [ $((0x$mask >> (STACKS_SIGNAL - 1) & 1)) -eq 1 ]
        return
    done 2>/dev/null < "/proc/$1/status"
    return 1
}

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
    done 2>/dev/null < "$AIRFLOW_VOLCANO_PODINFO/annotations"
}

# Every registered Python process writes its threads' stacks (faulthandler), printed here.
print_stacks() {
    prefix="[airflow-volcano] stacks $1:"
    echo "$prefix begin"
    signalled=
    for file in "$stacks_dir"/stacks-*; do
        [ -f "$file" ] || continue
        pid=${file##*/stacks-}
        case $pid in '' | *[!0-9]*) continue ;; esac
        if catches_stacks_signal "$pid" && kill -"$STACKS_SIGNAL" "$pid" 2>/dev/null; then
            signalled="$signalled $pid"
        else  # ended, or no longer the registered program (an exec, a reused pid)
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
    nap=
    # Ended with its nap (a sleep left behind would hold this shell's stdout open for 2 s).
    # shellcheck disable=SC2317
    trap 'if [ -n "$nap" ]; then kill "$nap" 2>/dev/null; fi; exit 0' TERM
    last=$(stacks_request)  # one already set when this container started asked a container before it
    seen="$stacks_dir/heartbeat-seen"
    touch "$seen"
    ticks=0
    while :; do
        sleep 2 &
        nap=$!
        wait "$nap"
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

# Whether process $1 has not ended (a zombie has).
running() {
    while read -r key value _; do
        if [ "$key" = State: ]; then
            [ "$value" != Z ]
            return
        fi
    done 2>/dev/null < "/proc/$1/status"
    return 1
}

# Waits for child $1 to end, its exit status in $waited. A trapped signal interrupts `wait` (status
# > 128), even one that came as the child ended: then wait again, which gives the status the shell
# kept (it keeps it until it starts another job; the traps start none) or waits on.
wait_for() {
    while :; do
        before=$signals
        wait "$1"
        waited=$?
        if [ "$waited" -le 128 ] || [ "$signals" -eq "$before" ]; then
            return 0
        fi
    done
}

if [ -n "$stopping" ]; then
    exit $((128 + stop_number))
fi
relay=
if [ -n "$relay_code" ] && [ -n "$stacks_dir" ] && [ -n "$python" ]; then
    relay_out="$stacks_dir/output-$$" relay_err="$stacks_dir/errors-$$"
    if printf '%s\n' "$relay_code" 2>/dev/null > "$stacks_dir/output_relay.py" &&
        rm -f "$relay_out" "$relay_err" && mkfifo "$relay_out" "$relay_err"; then
        "$python" -I -S "$stacks_dir/output_relay.py" "$relay_out" "$relay_err" &
        relay=$!
    fi
fi
unset relay_code
if [ -n "$python" ]; then
    set -- "$python" -I -S -c "$EXEC_HELPER" "$0" "$stop_flag" "$@"
fi
started=1
if [ -n "$relay" ]; then
    "$@" > "$relay_out" 2> "$relay_err" &
else
    "$@" &
fi
child=$!
launched=1
if [ -n "$stopping" ] && [ -z "$forwarded" ]; then
    forward  # the signal came as the command started
fi
watcher=
if [ -n "$stacks_dir" ]; then
    watch_requests &
    watcher=$!
fi
# Whether a process other than this shell, the relay and the watcher is left in the container
# (zombies aside).
others_left() {
    for proc in /proc/[0-9]*; do
        case ${proc#/proc/} in "$$" | "$relay" | "$watcher") continue ;; esac
        running "${proc#/proc/}" && return 0
    done
    return 1
}
wait_for "$child"
status=$waited
child=
if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null
fi
# Stopped by a signal: the other processes that got it too (ranks saving a checkpoint, say) may
# finish before PID 1 exits and the kernel kills whatever is left. The grace period bounds this.
if [ -n "$stopping" ] && [ "$$" -eq 1 ]; then
    while others_left; do
        sleep 0.2
    done
fi
if [ -n "$relay" ]; then
    # The relay ends at the end of the command's output; a process the command left running may
    # keep it open: after 2 s the relay copies what is there and ends (killed 2 s later if stuck).
    for how in USR1 KILL; do
        ticks=0
        while running "$relay" && [ "$ticks" -lt 20 ]; do
            sleep 0.1
            ticks=$((ticks + 1))
        done
        kill -s "$how" "$relay" 2>/dev/null  # (harmless once it ended)
    done
    wait_for "$relay"
fi
# A failure the Job's policies would end it on waits, so that a peer's retryable failure is seen first.
holds() {
    seconds=$1
    shift
    for code; do
        [ "$code" -ne "$status" ] || return 1
    done
    [ "$seconds" -gt 0 ]
}
# shellcheck disable=SC2086  # digits and spaces only (checked above)
if [ "$status" -ne 0 ] && [ -z "$stopping" ] && [ -n "$hold" ] && holds $hold; then
    sleep "$seconds" &
    holder=$!
    [ -n "$stopping" ] || wait "$holder"  # a signal ends the hold at once
    if [ -n "$stopping" ]; then kill "$holder" 2>/dev/null; fi
fi
# A signal that reaches a subshell before it has set its own traps is lost (dash, busybox): a watcher
# started as a SIGTERM came may have outlived both of ours.
if [ -n "$watcher" ] && running "$watcher"; then
    kill -s KILL "$watcher" 2>/dev/null
fi
exit "$status"
