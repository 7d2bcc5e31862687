# shellcheck shell=sh
# The command of a pod in debug mode (debug=True): the pod comes up as configured but sleeps instead
# of running its command, so a user can open a shell in it. It sleeps SECONDS (the task's
# debug_timeout and a margin; a little more on a busy node), so it ends even if the task's worker,
# which deletes the Job after debug_timeout, is gone; and it exits at once on SIGTERM, so deleting the
# Job does not wait out the pod's grace period. It counts its one-second sleeps rather than reading the
# clock: whole seconds of `date +%s` ended it up to a second early, and a clock set back would not.
#
# Usage (inline, the pod may not mount the script's ConfigMap): sh -c "<this file>" airflow-volcano-debug SECONDS
seconds=${1:?usage: airflow-volcano-debug SECONDS}
echo "airflow-volcano debug mode: sleeping instead of running the command, for at most ${seconds}s"
trap 'exit 0' TERM INT
left=$seconds
while [ "$left" -gt 0 ]; do
    sleep 1
    left=$((left - 1))
done
echo "airflow-volcano debug mode: ${seconds}s are over; the pod ends"
