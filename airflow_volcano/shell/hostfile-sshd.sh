# shellcheck shell=sh
# airflow-volcano-sshd.sh: a worker of a hostfile launch runs only sshd; the master's launcher starts
# its ranks over ssh with the key pair Volcano's ssh plugin gave every pod of the Job.
#
# Usage: sh airflow-volcano-sshd.sh [ARG...]
#   The training script's arguments (the container's args): saved for the ranks, which read them
#   there (airflow-volcano-argv.py), so that no launcher's command line (or log) carries them.
#
# Environment (the operator sets it on the container):
#   AIRFLOW_VOLCANO_POD_ENV_FILE        where this pod's environment is saved for the ssh sessions
#   AIRFLOW_VOLCANO_POD_ARGS_FILE       where the script's arguments are saved, each ended by a NUL
#   AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT  airflow-volcano-ssh-session.sh, sshd's ForceCommand
#
# An ssh session starts with sshd's environment, not the pod's (the image's ENV, env=, Volcano's
# variables): the pod's is saved here and every session restores it (ForceCommand), so the ranks see
# what the pod sees. sshd's settings are given on its command line, which wins over any sshd_config
# of the image: root logs in with a key only (no password, no keyboard-interactive, no empty
# password), forwarding of ports, sockets, agents, X11 and tunnels is off, and every session runs
# through ForceCommand.
set -eu

fail() {
    echo "airflow-volcano: $*" >&2
    exit 1
}

env_file=${AIRFLOW_VOLCANO_POD_ENV_FILE:?}
args_file=${AIRFLOW_VOLCANO_POD_ARGS_FILE:?}
session=${AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT:?}
# sshd runs ForceCommand as a command line (with the login shell's -c): its words must be inert.
for path in "$env_file" "$session"; do
    case $path in
        /*[!A-Za-z0-9_./-]* | [!/]*) fail "'$path' must be an absolute path of letters, digits and _./-" ;;
    esac
done
# sshd re-executes itself, so it needs its absolute path (which `command -v` gives).
sshd=$(command -v sshd) || sshd=/usr/sbin/sshd
if [ ! -x "$sshd" ]; then
    fail "the image has no sshd (on PATH or /usr/sbin/sshd); a worker of a hostfile launch runs OpenSSH's server"
fi
(umask 077 && export -p > "$env_file")
# Readable by this pod's root only, as the environment (an argument may be a secret).
(umask 077 && if [ "$#" -gt 0 ]; then printf '%s\0' "$@"; fi > "$args_file")
mkdir -p /run/sshd
ssh-keygen -A >/dev/null
echo "airflow-volcano: sshd listening on $(hostname) (port 22)"
# OpenSSH 9.8 and later refuse for a while an address whose connections ended before authenticating
# (PerSourcePenalties): the master's launcher, waiting for sshd on a loaded node, makes such
# connections, and was then refused ("Connection closed", exit 255) by DeepSpeed's reachability check.
# Logins are key-only: the penalties guard nothing here. (The script's arguments are saved above.)
set --
if "$sshd" -T -o PerSourcePenalties=no >/dev/null 2>&1; then
    set -- -o PerSourcePenalties=no
fi
# Option names every OpenSSH since 7.x reads (ChallengeResponseAuthentication is the older name of
# KbdInteractiveAuthentication, still read).
exec "$sshd" -D -e "$@" \
    -o PermitRootLogin=prohibit-password \
    -o PubkeyAuthentication=yes \
    -o AuthenticationMethods=publickey \
    -o PasswordAuthentication=no \
    -o PermitEmptyPasswords=no \
    -o ChallengeResponseAuthentication=no \
    -o AllowTcpForwarding=no \
    -o AllowStreamLocalForwarding=no \
    -o AllowAgentForwarding=no \
    -o X11Forwarding=no \
    -o PermitTunnel=no \
    -o PermitUserEnvironment=no \
    -o "ForceCommand=/bin/sh $session $env_file"
