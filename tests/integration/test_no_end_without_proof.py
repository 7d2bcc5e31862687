"""No Job ended on a guess (issue 41): a gang restarted long after its first start, a pod outside a
running gang, Volcano's Job resource unserved for a while. Each of these ended a healthy Job before."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_volcano.preflight import main as preflight

from .real_node import real_operator, script
from .test_kill_and_reattach import SIM
from .test_operator import seed_operator

LATE_CRASH = """
    import os, pathlib, signal, sys, time
    # PID 1 ignores SIGTERM unless it has a handler: without one a restart waits out the grace period.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.environ["RANK"] == "1":
        marker = pathlib.Path("/state/attempts")
        attempts = int(marker.read_text()) if marker.exists() else 0
        marker.write_text(str(attempts + 1))
        if attempts == 0:
            # Well past startup_timeout after the Job's creation: a retryable exit (as an OOM kill gives).
            print("rank 1 crashes later", flush=True)
            time.sleep(float(os.environ["CRASH_AFTER"]))
            os._exit(137)
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} all_reduce {total.item():.0f}", flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_gang_restarted_after_startup_timeout_runs_on_and_succeeds(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, deferrable):
    """startup_timeout bounds the first start; a restart's new pods, Pending for a few seconds, used to meet a
    Job older than startup_timeout and be deleted as "did not start". Real containers: rank 1 exits 137 after
    60 s (startup_timeout 45 s), Volcano restarts the gang (the master, blocked in gloo's rendezvous, is killed
    after its 5 s grace period), which trains. The pods request no CPU: the first start must come within
    startup_timeout, and the concurrent tests' pods on the real node, whose CPU requests can book it up for
    minutes, once kept this gang Pending past it ("Insufficient cpu")."""
    state = tmp_path / "state"
    state.mkdir()
    name = f"late{'d' if deferrable else 's'}"
    run = run_task(lambda: real_operator(
        real_node, cluster.namespace, name, training_script=script(tmp_path, LATE_CRASH), worker_replicas=1,
        container_resources={"requests": {"memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        startup_timeout=45, termination_grace_period=5, env={"CRASH_AFTER": "60"}, deferrable=deferrable,
        volumes=[{"name": "state", "hostPath": {"path": str(state), "type": "Directory"}}],
        volume_mounts=[{"name": "state", "mountPath": "/state"}]))

    assert run.state == "success", run.log
    assert "is Restarting (" in run.log, run.log
    assert "did not start" not in run.log, run.log
    assert run.xcom["return_value"]["retry_count"] == 1
    assert f"[{name}-master-0] rank 0 all_reduce 2" in run.log
    assert (state / "attempts").read_text() == "2"


@pytest.mark.namespace_allows("hostPath")  # TensorBoard's logdir on a volume the pods share (never mounted: kwok)
@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_tensorboard_that_cannot_be_scheduled_beside_a_running_gang_does_not_end_it(
        cluster, operator_kubeconfig, run_task, tmp_path, deferrable):
    """TensorBoard is outside the gang (minAvailable 0): the gang runs without it. A TensorBoard no node can
    take used to end the Job at startup_timeout; now the task log says it waits, and why."""
    name = f"board{'d' if deferrable else 's'}"
    run = run_task(lambda: seed_operator(
        cluster.namespace, name, startup_timeout=8, worker_replicas=1, deferrable=deferrable,
        annotations={SIM + "run-for": "20s"},
        volumes=[{"name": "logs", "hostPath": {"path": str(tmp_path), "type": "Directory"}}],
        volume_mounts=[{"name": "logs", "mountPath": "/logs"}],
        tensorboard={"logdir": "/logs/tb", "resources": {"requests": {"cpu": "5000"}}}))

    assert run.state == "success", run.log
    assert "did not start" not in run.log, run.log
    said = [line for line in run.log.splitlines() if "outside its gang" in line]
    assert said and f"{name}-tensorboard-0 (" in said[0] and "Unschedulable" in said[0], run.log


@pytest.mark.disruptive
@pytest.mark.control_plane
@pytest.mark.parametrize("deferrable", [True], ids=["deferred"])
def test_a_job_resource_unserved_for_20_seconds_is_waited_through(
        cluster, operator_kubeconfig, run_task, deferrable):
    """Volcano being upgraded: its Job CRD is not served for a while, and the apiserver answers 404 for every
    Job ("404 page not found", naming none). That used to read as "the Job was deleted" (and a last try then
    deleted what it found later). Now it is "cannot see": the task says so, waits, and goes on. Disruptive:
    every Job of the cluster is unreadable meanwhile, so the trigger's path only (its shared watch, its reads);
    the worker's loop meets the same 404 in tests/unit/test_drivers.py (and did here, both modes passing)."""
    name = f"unserved{'d' if deferrable else 's'}"
    crd = "jobs.batch.volcano.sh"
    events: list[str] = []

    preflight_said: list[str] = []

    def unserve() -> None:
        cluster.wait_phase(name, {"Running"}, timeout=120)
        time.sleep(2)
        cluster.serve_crd_version(crd, False)
        events.append("unserved")
        started = time.monotonic()
        try:
            # Meanwhile the preflight (issue 44), as on a cluster without Volcano: its row says so.
            deadline = started + 15
            while time.monotonic() < deadline and not any(line.startswith("FAIL  Volcano") for line in preflight_said):
                preflight_said.clear()
                preflight(["--namespace", cluster.namespace], out=preflight_said.append)
                time.sleep(1)
            time.sleep(max(0.0, 20 - (time.monotonic() - started)))
        finally:
            cluster.serve_crd_version(crd, True)
            events.append("served")

    upgrader = threading.Thread(target=unserve, daemon=True)
    upgrader.start()
    try:
        run = run_task(lambda: seed_operator(cluster.namespace, name, deferrable=deferrable, worker_replicas=1,
                                             annotations={SIM + "run-for": "45s"}))
    finally:
        upgrader.join(timeout=180)
        cluster.serve_crd_version(crd, True)

    assert events == ["unserved", "served"], run.log
    assert run.state == "success", run.log
    assert f"Cannot see Volcano Job {cluster.namespace}/{name}: " in run.log, run.log
    assert "does not serve this resource now" in run.log, run.log
    assert "was deleted" not in run.log, run.log
    assert "TypeError" not in run.log, "the watch's plain-text 404 line is read as the 404 it is"
    assert preflight_said[1] == ("FAIL  Volcano: the apiserver does not serve jobs.batch.volcano.sh/v1alpha1: "
                                 "Volcano is not installed in this cluster (or is being upgraded)"), preflight_said
    assert preflight_said[0].startswith("OK    apiserver:") and len(preflight_said) == 2, preflight_said
