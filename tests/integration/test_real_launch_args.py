"""DeepSpeed and mpirun launches on the real node, with hostile arguments: every rank's sys.argv holds
the task's arguments exactly (read from its worker pod, which saved its own container args: no
launcher's command line, pdsh or worker shell carries them, and DeepSpeed's logged command line shows
none of them), no shell runs them, and each worker's sshd lets root in with the Job's key only.
"""

from __future__ import annotations

import ast
import re
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

# Small requests so that a gang fits the 2-core node (as real_node.py).
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
ARGS = ["$(id)", "`id`", "it's \"quoted\"", "line one\nline two", "", "--opt=$(id)", "--opt2=$HOME", "$(HOSTNAME)",
        "$(HF_TOKEN)", "naïve ✓ 训练", "a;b|c&d>e", "*", "--local_rank=7", "x"]
ENV = {"HF_TOKEN": "hf-not-a-real-token", "MLFLOW_RUN_NOTE": "`echo INJECTED` $(id) \"q\"", "RUN_TAG": "it's 7"}
# Every rank prints what it received (the --local_rank=N DeepSpeed's launch adds first set apart), as
# one line ending in ":end" (the task log adds its own suffix); rank 0 hands its arguments to Airflow
# through its termination message.
PRINT_ARGV = """
    import json, os, sys
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    args = sys.argv[1:]
    inserted = args[:1] == [f"--local_rank={os.environ.get('LOCAL_RANK')}"]
    if inserted:
        args = args[1:]
    # One write per line: ranks on one worker share the output pipe (print writes the newline apart).
    os.write(1, f"argv-check rank={rank} inserted={inserted} args={args!r} :end\\n".encode())
    os.write(1, f"env-check rank={rank} note={os.environ.get('MLFLOW_RUN_NOTE')!r} "
                f"tag={os.environ.get('RUN_TAG')!r} :end\\n".encode())
    if rank == "0":
        with open("/dev/termination-log", "w") as message:
            json.dump({"args": args}, message)
"""


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "print_argv.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def kubectl(kubeconfig: Path, namespace: str, pod: str, *command: str, timeout: float = 60,
            ) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", namespace, pod, "--", *command],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("launcher", "slots"), [("deepspeed", 2), ("mpirun", 1)])
def test_every_rank_gets_the_task_arguments_exactly_and_no_shell_runs_them(cluster, operator_kubeconfig, run_task,
                                                                            real_node, tmp_path, launcher, slots):
    name = f"args-{launcher}"
    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name=name, namespace=cluster.namespace, launcher=launcher, worker_replicas=2,
        slots_per_worker=slots, training_script=script(tmp_path, PRINT_ARGV), args=ARGS, env=ENV,
        container_resources=SMALL, startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=False,
        **real_node))

    assert run.state == "success", run.log
    received = {int(rank): (inserted == "True", ast.literal_eval(args)) for rank, inserted, args in
                re.findall(r"argv-check rank=(\d+) inserted=(True|False) args=(\[.*?\]) :end", run.log)}
    assert sorted(received) == list(range(2 * slots)), run.log
    for rank, (inserted, args) in received.items():
        assert args == ARGS, (rank, args)
        assert inserted is (launcher == "deepspeed"), "deepspeed's --local_rank=N comes first, right after the script"
    assert run.xcom["return_value"]["result"] == {"args": ARGS}, "rank 0's arguments, through its termination message"
    notes = re.findall(r"env-check rank=\d+ note=(.*?) tag=(.*?) :end", run.log)
    assert len(notes) == 2 * slots and {(ast.literal_eval(note), ast.literal_eval(tag)) for note, tag in notes} == {
        (ENV["MLFLOW_RUN_NOTE"], ENV["RUN_TAG"])}, "each rank gets the pod's own values, literally"
    assert "uid=0(root)" not in run.log and "INJECTED" not in run.log.replace("`echo INJECTED`", ""), run.log
    assert ENV["HF_TOKEN"] not in run.log, "$(HF_TOKEN) stays literal: the kubelet expands no argument"
    assert "MLFLOW_RUN_NOTE=" not in run.log, "DeepSpeed's runner no longer copies it into the workers' command line"
    if launcher == "deepspeed":
        logged = [line for line in run.log.splitlines() if "cmd = " in line]
        assert logged, run.log
        for line in logged:  # the script, then nothing of ours: no argument, in any encoding
            assert re.search(r"airflow-volcano-argv\.py \S+/print_argv\.py(?!\s+x[A-Za-z0-9_-])", line), line
            assert "naïve" not in line and "HF_TOKEN" not in line and "line one" not in line, line


WAIT_FOR_THE_TEST = """
    import os, time
    deadline = time.monotonic() + 120
    while os.environ.get("RANK") == "0" and not os.path.exists("/tmp/release") and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"rank {os.environ.get('RANK')} released", flush=True)
"""


def test_a_workers_sshd_lets_root_in_with_the_jobs_key_only(cluster, operator_kubeconfig, run_task, real_node,
                                                             kubeconfig, tmp_path):
    """While rank 0 waits, the test reads the settings the running sshd applies (`sshd -T` with its
    own command line) and tries a password / keyboard-interactive login from the master."""
    name, checks = "sshdcfg", {}
    worker, host = f"{name}-worker-0", f"{name}-worker-0.{name}"

    def check_the_running_workers() -> None:
        try:
            cluster.wait_for("the Job's pods to run", lambda: sum(
                pod.status.phase == "Running" for pod in cluster.pods(name)) == 3, timeout=120)
            cluster.wait_for("rank 0 to run on the first worker", lambda: kubectl(
                kubeconfig, cluster.namespace, worker, "pgrep", "-f", "airflow-volcano-argv.py").returncode == 0,
                timeout=120)
            # sshd retitles itself "sshd: <its command line> [listener] ...": the options it was started with.
            # (PID 1 is the signal-forwarding shell that runs it.)
            title = kubectl(kubeconfig, cluster.namespace, worker, "sh", "-c",
                            'cat "/proc/$(pgrep -o -f "\\[listener\\]")/cmdline"').stdout
            checks["sshd"] = started = re.match(r"sshd: (/\S+/sshd) -D -e -o (.*?)(?: \[listener\].*)?$",
                                                title.replace("\0", " ").strip())
            options = [word for option in started.group(2).split(" -o ") for word in ("-o", option)]
            checks["sshd -T"] = kubectl(kubeconfig, cluster.namespace, worker, started.group(1), "-T", *options).stdout
            checks["password"] = kubectl(
                kubeconfig, cluster.namespace, f"{name}-master-0", "ssh", "-o", "BatchMode=yes",
                "-o", "PreferredAuthentications=password,keyboard-interactive", "-o", "PubkeyAuthentication=no", host,
                "true")
            # Connections that end before authenticating, as a launcher's that gave up waiting on a loaded
            # node: OpenSSH 9.8 and later would then refuse the master's address for a while.
            checks["hang-ups"] = kubectl(kubeconfig, cluster.namespace, f"{name}-master-0", "python3", "-c", (
                "import socket\nfor _ in range(30):\n"
                f"    s = socket.create_connection(({host!r}, 22)); s.recv(64); s.close()"))
            checks["key"] = kubectl(kubeconfig, cluster.namespace, f"{name}-master-0", "ssh", "-o", "BatchMode=yes",
                                    host, "echo", "session", "on", "$HOSTNAME", "with", "$RUN_TAG")
        finally:
            kubectl(kubeconfig, cluster.namespace, worker, "touch", "/tmp/release")

    helper = threading.Thread(target=check_the_running_workers, daemon=True)
    helper.start()
    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name=name, namespace=cluster.namespace, worker_replicas=2,
        training_script=script(tmp_path, WAIT_FOR_THE_TEST), env={"RUN_TAG": "nightly"}, container_resources=SMALL,
        startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=False, **real_node))
    helper.join(timeout=60)

    assert run.state == "success", run.log
    assert checks["sshd"], checks
    effective = set(checks["sshd -T"].splitlines())
    assert effective >= {
        "permitrootlogin without-password", "pubkeyauthentication yes", "authenticationmethods publickey",
        "passwordauthentication no", "kbdinteractiveauthentication no", "permitemptypasswords no",
        "allowtcpforwarding no", "allowagentforwarding no", "x11forwarding no", "permittunnel no",
        "persourcepenalties no",
        "forcecommand /bin/sh /opt/airflow-volcano/script/airflow-volcano-ssh-session.sh "
        "/run/airflow-volcano-pod-env"}, checks["sshd -T"]
    assert checks["password"].returncode == 255, checks["password"]
    assert "Permission denied (publickey)" in checks["password"].stderr, checks["password"]
    # The Job's key gets in, after the hang-ups too, and the session has the pod's environment (the
    # ForceCommand's doing).
    assert checks["hang-ups"].returncode == 0, checks["hang-ups"]
    assert checks["key"].returncode == 0, checks["key"]
    assert checks["key"].stdout.strip() == f"session on {worker} with nightly", checks["key"]
