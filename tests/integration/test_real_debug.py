"""Debug mode on the real node (real containers): the Job's pods come up sleeping for a shell in
`kubectl exec` and the Job is deleted after debug_timeout; when the worker enforcing debug_timeout is
killed, the pods' own command still ends. (DeepSpeed's debug mode: test_real_deepspeed.py.)
"""

from __future__ import annotations

import datetime
import signal

from .real_node import SLEEPER, SMALL, real_operator, script
from .test_kill_and_reattach import start_worker, write_dag


def test_debug_mode_keeps_the_pods_up_for_a_shell_then_deletes_the_job(cluster, operator_kubeconfig, run_task,
                                                                         real_node, kubeconfig):
    """T9k's debug mode: the same pods (env, script, ranks) come up sleeping; `kubectl exec` runs a
    command in one; after debug_timeout the Job is deleted and the task succeeds."""
    import subprocess
    import threading

    shell: dict[str, subprocess.CompletedProcess] = {}

    def exec_in_the_master() -> None:
        cluster.wait_for("the master pod to run", lambda: any(
            pod.metadata.name == "dbg-master-0" and pod.status.phase == "Running" for pod in cluster.pods("dbg")),
            timeout=120)
        shell["master"] = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", cluster.namespace, "dbg-master-0", "-c", "master",
             "--", "python", "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
             "os.path.isfile('/opt/airflow-volcano/script/pytorch_demo.py'))"], capture_output=True, text=True,
            timeout=60)

    helper = threading.Thread(target=exec_in_the_master, daemon=True)
    helper.start()
    run = run_task(lambda: real_operator(real_node, cluster.namespace, "dbg", debug=True, debug_timeout=20))
    helper.join(timeout=60)

    assert run.state == "success", run.log
    assert shell["master"].stdout.strip() == "rank 0 of 3 True", shell["master"]
    assert "Debug mode: 3 pod(s) of Volcano Job" in run.log
    assert (f"kubectl exec -it -n {cluster.namespace} dbg-worker-1 -c worker -- bash   # then: python "
            "/opt/airflow-volcano/script/pytorch_demo.py") in run.log
    assert "Epoch [1/5]" not in run.log, "nothing trained"
    assert cluster.job("dbg") is None, "the Job is deleted when the debug session ends"


def test_debug_pods_end_by_themselves_when_the_worker_enforcing_debug_timeout_dies(
        cluster, operator_kubeconfig, airflow_db, real_node, containerd, tmp_path):
    """Debug mode's pods sleep; the task deletes the Job after debug_timeout. If the worker is
    killed (kill -9, no on_kill), each pod's own command still ends after debug_timeout and a
    minute, and the pods stop: nothing sleeps on, holding its GPUs, forever."""
    import time

    dag_id = "debug_orphan"
    train = script(tmp_path, SLEEPER)
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="dbgorphan", training_script=train,
                         container_resources=SMALL, debug=True, debug_timeout=5, **real_node)
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), tmp_path / "worker.log")
    cluster.wait_for("the debug pods to sleep in their containers", lambda: len(
        containerd.running_containers(cluster.namespace)) >= 4, timeout=120)
    started = time.monotonic()
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=60)

    cluster.wait_for("the debug pods' own command to end", lambda: not containerd.running_containers(
        cluster.namespace), timeout=150)
    assert time.monotonic() - started >= 30, "they slept, and were not stopped by anything else"
    assert "airflow-volcano debug mode: 65s are over" in cluster.pod_log("dbgorphan-master-0")
