# shellcheck shell=sh
# airflow-volcano-launch.sh: the master of a hostfile launch (VolcanoDeepSpeedJobOperator) writes the
# hostfile of the workers, waits until each accepts an ssh login, then runs the launcher (DeepSpeed's
# runner or OpenMPI's mpirun), which starts the ranks on the workers over ssh. The master only
# launches: it is not in the hostfile, so rank 0 is the first worker's first slot, and rank 0's
# termination message (the task's XCom) is copied to the master's when the launcher succeeds.
#
# Usage: sh airflow-volcano-launch.sh [--launcher-options N OPTION...] SCRIPT
#   The N OPTIONs go to the launcher before the script, one word each, as given (N counts them, so
#   any word can be an option). This script reads none of them: it hands them unchanged to
#   `airflow-volcano-argv.py --launch`, which runs the launcher. SCRIPT runs on every rank with the
#   arguments its worker pod saved (the workers' container args; see that file), which no launcher
#   carries.
#
# Environment (the operator sets it on the container; nothing here is built into the script):
#   AIRFLOW_VOLCANO_LAUNCHER           deepspeed or mpirun
#   AIRFLOW_VOLCANO_SLOTS_PER_WORKER   ranks per worker, the hostfile's slots
#   AIRFLOW_VOLCANO_PORT               the rendezvous port on the first worker (MASTER_PORT)
#   AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT   seconds to wait for every worker's sshd
#   AIRFLOW_VOLCANO_WORKER_HOSTS_FILE  the svc plugin's /etc/volcano/<worker task>.host
#   AIRFLOW_VOLCANO_HOSTFILE           the hostfile written here, `<host> slots=<n>` per worker
#   AIRFLOW_VOLCANO_SSH_CLIENT_CONFIG  an ssh client config file written here (quiet logins)
#   AIRFLOW_VOLCANO_TERMINATION_LOG    the termination message file, the same path in every pod
#   AIRFLOW_VOLCANO_ARGV_SHIM          airflow-volcano-argv.py
set -eu

fail() {
    echo "airflow-volcano: $*" >&2
    exit 1
}

launcher=${AIRFLOW_VOLCANO_LAUNCHER:?}
slots=${AIRFLOW_VOLCANO_SLOTS_PER_WORKER:?}
timeout=${AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT:?}
hosts=${AIRFLOW_VOLCANO_WORKER_HOSTS_FILE:?}
hostfile=${AIRFLOW_VOLCANO_HOSTFILE:?}
ssh_config=${AIRFLOW_VOLCANO_SSH_CLIENT_CONFIG:?}
termination_log=${AIRFLOW_VOLCANO_TERMINATION_LOG:?}
shim=${AIRFLOW_VOLCANO_ARGV_SHIM:?}
: "${AIRFLOW_VOLCANO_PORT:?}"  # read by airflow-volcano-argv.py

[ "$#" -ge 1 ] || fail "usage: sh airflow-volcano-launch.sh [--launcher-options N OPTION...] SCRIPT"
case $launcher in
    deepspeed | mpirun) ;;
    *) fail "AIRFLOW_VOLCANO_LAUNCHER must be deepspeed or mpirun, got '$launcher'" ;;
esac
for number in "$slots" "$timeout"; do
    case $number in
        '' | *[!0-9]*) fail "AIRFLOW_VOLCANO_SLOTS_PER_WORKER and _SSH_WAIT_TIMEOUT must be whole numbers" ;;
    esac
done
# The termination log's path becomes part of a command a worker's shell runs (ssh joins its words).
case $termination_log in
    /*[!A-Za-z0-9_./-]* | [!/]*)
        fail "AIRFLOW_VOLCANO_TERMINATION_LOG must be an absolute path of letters, digits and _./-" ;;
esac
for program in ssh python3 "$launcher"; do
    if ! command -v "$program" >/dev/null; then
        fail "the image has no $program (launcher=$launcher needs it on the master)"
    fi
done
if [ ! -s "$hosts" ]; then
    task=${hosts##*/}
    fail "$hosts is missing or empty: the Job needs the svc plugin and a task named '${task%.host}' with at least" \
         "one replica"
fi

: > "$hostfile"
# (The svc plugin's host files end without a newline: `|| [ -n "$host" ]` keeps the last line.)
while read -r host || [ -n "$host" ]; do
    if [ -n "$host" ]; then printf '%s slots=%s\n' "$host" "$slots" >> "$hostfile"; fi
done < "$hosts"
workers=$(wc -l < "$hostfile")
ranks=$((workers * slots))
first_host=$(head -n 1 "$hostfile" | cut -d ' ' -f 1)

# The ssh plugin's config keeps no known_hosts: without this every login warns "Permanently added".
{ mkdir -p "$(dirname "$ssh_config")" && echo "LogLevel ERROR" > "$ssh_config"; } 2>/dev/null || true
deadline=$(($(date +%s) + timeout))
while read -r host _slots; do
    # -n: ssh must not read the hostfile, which is this loop's input.
    until ssh -n -o BatchMode=yes -o ConnectTimeout=5 "$host" true 2>/dev/null; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            fail "worker $host did not accept an ssh login within ${timeout}s (ssh_wait_timeout); its pod log" \
                 "shows sshd's side"
        fi
        sleep 2
    done
    echo "airflow-volcano: $host accepts ssh"
done < "$hostfile"
echo "airflow-volcano: $workers workers x $slots slots = $ranks ranks; hostfile $hostfile:"
cat "$hostfile"

python3 "$shim" --launch "$@" &
launcher_pid=$!
# The launcher passes a stop on to the ranks (sh as PID 1 would ignore SIGTERM).
trap 'kill -TERM "$launcher_pid" 2>/dev/null' TERM INT
status=0
wait "$launcher_pid" || status=$?
if kill -0 "$launcher_pid" 2>/dev/null; then wait "$launcher_pid" || status=$?; fi
if [ "$status" -eq 0 ]; then
    # Rank 0 ran on the first worker: its termination message (the task's XCom) becomes the master's.
    # A login can fail on a loaded node: a few tries, then say so (the task's result would be empty).
    copied=no
    for _try in 1 2 3; do
        # shellcheck disable=SC2094  # the file read is the first worker's (over ssh), the one written this pod's
        if ssh -n -o BatchMode=yes -o ConnectTimeout=10 "$first_host" cat "$termination_log" \
                > "$termination_log" 2>/dev/null; then
            copied=yes
            break
        fi
        sleep 2
    done
    if [ "$copied" = no ]; then
        : > "$termination_log"
        echo "airflow-volcano: could not read rank 0's termination message on $first_host over ssh: the task" \
             "returns no result" >&2
    fi
fi
exit "$status"
