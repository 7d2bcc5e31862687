"""The task keeps its Job through API trouble: throttling, server errors, an apiserver restart."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .faults import FaultyProxy
from .test_operator import SIM, seed_operator

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_task_retries_through_injected_429_and_5xx(cluster, operator_kubeconfig, kubeconfig, run_task, monkeypatch,
                                                   deferrable):
    config = json.loads(operator_kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    ca_file = kubeconfig.parent / "pki" / "ca.crt"
    cluster.write_log(f"flaky{int(deferrable)}-master-0", ["epoch 1", "epoch 2"])
    with FaultyProxy(server, ca_file, every=3) as proxy:
        config["clusters"][0]["cluster"] = {"server": proxy.url}
        proxied = operator_kubeconfig.with_name("proxied-kubeconfig.json")
        proxied.write_text(json.dumps(config))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(proxied), "namespace": cluster.namespace}}))
        run = run_task(lambda: seed_operator(cluster.namespace, f"flaky{int(deferrable)}", deferrable=deferrable,
                                             annotations={SIM + "run-for": "4s"}))
    assert run.state == "success", run.log
    assert proxy.injected >= 3, "the proxy must really have failed requests"
    assert "retrying in" in run.log
    assert len([j for j in cluster.jobs() if j["metadata"]["name"].startswith("flaky")]) <= 1, "no duplicate Job"


def test_reading_the_credentials_again_fails_no_call_of_the_triggers_sharing_the_client(cluster, operator_kubeconfig,
                                                                                      monkeypatch):
    """Found by the chaos soak: a trigger's wait failed with "AssertionError: " alone. One trigger (or the
    shared watch) met a 401 and read the credentials again, which closed the client the triggers share
    while others' calls were in flight on it: aiohttp fails those with a bare AssertionError (or
    "Connector is closed"), not retried. The client replaced is now closed with the shared one."""
    import asyncio

    from airflow_volcano.hooks import calls, volcano
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

    monkeypatch.setattr(volcano, "SHARED_RELOAD_SECONDS", 0.0)  # every reload replaces the client

    async def calls_across_reloads() -> tuple[list[str], int]:
        failures: list[str] = []
        answered = 0
        hook = AsyncVolcanoHook("kubernetes_default", retries=0)  # no retry hides a failure
        async with hook.shared_client():
            async def one() -> None:
                nonlocal answered
                try:
                    await hook.drive(calls.list_jobs(cluster.namespace, "app=none"))
                    answered += 1
                except Exception as error:  # noqa: BLE001 - what the test counts
                    failures.append(f"{type(error).__name__}: {error}")

            for round_ in range(10):
                in_flight = [asyncio.ensure_future(one()) for _ in range(20)]
                await asyncio.sleep(0.002 * round_)  # some calls sent, some answered, some not yet started
                await hook.reload_credentials()
                await asyncio.gather(*in_flight)
        return failures, answered

    failures, answered = asyncio.run(calls_across_reloads())
    assert not failures, failures[:5]
    assert answered == 200


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_token_refused_for_longer_than_one_reading_of_the_credentials_ends_no_wait(
        cluster, operator_kubeconfig, kubeconfig, run_task, monkeypatch, deferrable):
    """Found by the chaos soak: the apiserver refused the connection's token for 15 s (expired, or its
    authenticator down) while a task waited; the credentials were read again once, refused again, and
    the wait failed, leaving the Job to run unwatched. Now a token accepted before and refused while
    waiting is "cannot see": read again and retried with back-off. Here it is refused for 25 s across
    the Job's end, and the task still gets the Job's real end, with one Job and none left."""
    from .faults import fault_window, through, upstream_of

    name = f"expired{int(deferrable)}"
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        faults, window = fault_window(proxy.token_expired, 25, lambda: (
            cluster.wait_phase(name, {"Running"}, timeout=120), time.sleep(3)))
        run = run_task(lambda: seed_operator(cluster.namespace, name, deferrable=deferrable, worker_replicas=1,
                                             annotations={SIM + "run-for": "15s"}))
        faults.join()

    assert window.get("to"), "the token was refused while the task waited"
    assert run.state == "success", run.log
    assert "HTTP 401 Unauthorized" in run.log, "the refusal is said"
    assert not [job for job in cluster.jobs() if job["metadata"]["name"] == name], "deleted at the end, none left"


@pytest.mark.disruptive
@pytest.mark.control_plane
@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_apiserver_restart_while_waiting(cluster, operator_kubeconfig, run_task, deferrable):
    name = f"restart{int(deferrable)}"

    def restart_when_running() -> None:
        cluster.wait_phase(name, {"Running"}, timeout=60)
        subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "restart", "kube-apiserver"], check=True,
                       capture_output=True)

    restarter = threading.Thread(target=restart_when_running)
    restarter.start()
    run = run_task(lambda: seed_operator(cluster.namespace, name, deferrable=deferrable,
                                         annotations={SIM + "run-for": "15s"}, on_finish_action="keep_job"))
    restarter.join()
    assert run.state == "success", run.log
    assert cluster.job(name)["status"]["state"]["phase"] == "Completed"


def test_kill_loop_leaves_exactly_one_job_and_no_orphans(cluster, operator_kubeconfig, airflow_db, tmp_path):
    """kill -9 the worker again and again while one task instance's Job runs; each restart reattaches."""
    import datetime
    import signal

    from .test_kill_and_reattach import WORKER_WAIT, our_jobs, start_worker, write_dag

    dag_id = "kill_loop"
    script = tmp_path / "train.py"
    script.write_text("print('x')\n")
    # The Job runs until the kills are over, however long each worker takes to start on a loaded machine.
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, training_script=str(script),
                         annotations={SIM + "outcome": "run-forever"})
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"
    uids = set()
    for attempt in range(5):
        worker = start_worker(dag_file, dag_id, logical_date, log, retry=attempt > 0)
        # Kill it once it holds the Job: submitted (first) or reattached (the others).
        def reached(attempt: int = attempt) -> bool:
            text = log.read_text()
            return text.count("Submitted Volcano Job") + text.count("Reattaching to Volcano Job") > attempt

        cluster.wait_for(f"worker {attempt} to reach the Job", reached, timeout=WORKER_WAIT)
        # Each kill lands while the Job runs: on a loaded machine the first one's pods may still be starting.
        cluster.wait_for(f"the Job running before kill {attempt}", lambda: [
            job["status"]["state"]["phase"] for job in our_jobs(cluster)] == ["Running"], timeout=60)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        uids |= {job["metadata"]["uid"] for job in our_jobs(cluster)}
    final = start_worker(dag_file, dag_id, logical_date, log, retry=True)
    cluster.wait_for("the last worker to reach the Job", lambda: log.read_text().count("Reattaching to Volcano Job")
                     == 5, timeout=WORKER_WAIT)
    cluster.finish_simulated_pods(our_jobs(cluster)[0]["metadata"]["name"])
    assert final.wait(timeout=WORKER_WAIT) == 0, log.read_text()[-4000:]
    assert len(uids) == 1, f"one Job for one task instance, saw {len(uids)}"
    assert log.read_text().count("Submitted Volcano Job") == 1
    assert log.read_text().count("Reattaching to Volcano Job") == 5
    cluster.wait_for("no Job, pods or ConfigMap left", lambda: not our_jobs(cluster) and not [
        p for p in cluster.pods() if p.metadata.labels.get("app.kubernetes.io/managed-by") == "airflow-volcano"]
        and not [c for c in cluster.configmap_names() if c.endswith("-script")], timeout=60)


@pytest.mark.disruptive
@pytest.mark.control_plane
def test_two_hundred_deferred_triggers_share_one_watch_through_an_apiserver_restart(cluster, operator_kubeconfig):
    """A triggerer's VolcanoJobTriggers of one connection and namespace share one watch of the Jobs:
    200 of them wait on 200 Jobs, one is cancelled (it leaves the watch to the others), the
    apiserver restarts under them, and every other trigger fires exactly once with its own Job."""
    import asyncio

    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.triggers.job import VolcanoJobTrigger
    from airflow_volcano.triggers.job_watch import shared_job_watch
    from airflow_volcano.waiting.wait_engine import WaitLimits

    from .jobs import pytorch_job

    count = 200
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"share-{cluster.namespace}",
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "250"},
                       "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "250"}}}
    cluster.core.create_node(node)
    try:
        for i in range(count):
            body = pytorch_job(f"share-{i}", master_sim={"run-for": "90s"})
            body["spec"]["tasks"] = body["spec"]["tasks"][:1]  # the master alone
            body["spec"]["minAvailable"] = 1
            cluster.create_job(body)
        jobs = {job["metadata"]["name"]: job for job in cluster.jobs()}

        async def wait_all() -> tuple[list, dict]:
            tasks = {name: asyncio.create_task(anext(VolcanoJobTrigger(
                JobRef.from_job(job, "master").to_dict(), "kubernetes_default", get_logs=False,
                limits=WaitLimits(poll_interval=10).to_dict()).run()))
                for name, job in jobs.items()}
            await asyncio.sleep(5)
            watch = shared_job_watch("kubernetes_default", cluster.namespace)
            seen = {"subscribed": len(watch.subscribers)}
            victim = tasks.pop("share-0")
            victim.cancel()
            await asyncio.wait({victim}, timeout=30)
            seen["victim"] = "cancelled" if victim.cancelled() else repr(victim)
            seen["after_cancel"] = len(watch.subscribers)
            await asyncio.to_thread(cluster.wait_for, "the Jobs to run", lambda: sum(
                (j.get("status") or {}).get("state", {}).get("phase") == "Running" for j in cluster.jobs()) >= 150,
                120)
            await asyncio.to_thread(subprocess.run, [str(REPO / "scripts" / "volcano-cluster"), "restart",
                                                     "kube-apiserver"], check=True, capture_output=True)
            events = await asyncio.wait_for(asyncio.gather(*tasks.values()), timeout=300)
            seen["watch_requests"], seen["relists"] = watch.watch_requests, watch.relists
            seen["left"] = len(watch.subscribers)
            return [(name, event.payload) for name, event in zip(tasks, events, strict=True)], seen

        fired, seen = asyncio.run(wait_all())
        print(seen)  # shown with `pytest -s`
    finally:
        cluster.core.delete_node(node["metadata"]["name"])
    assert seen["subscribed"] == count, seen
    assert seen["victim"] == "cancelled" and seen["after_cancel"] == count - 1, "the cancelled one left the watch"
    assert len(fired) == count - 1 and len({name for name, _ in fired}) == count - 1, "each fired exactly once"
    for name, payload in fired:
        assert payload["verdict"] == "finished" and payload["phase"] == "Completed", (name, payload)
        assert payload["job"]["name"] == name
    # One stream for all, not one per trigger (that would be 199 or more). It is reopened after the
    # restart and at its 5-minute timeout, and each try the restarting apiserver refuses or drops counts
    # too: how many depends on how long it takes to serve again (5 and 6 seen).
    assert seen["watch_requests"] < 20 and seen["left"] == 0, seen


def test_an_expired_token_on_the_shared_watch_fails_no_deferred_task(cluster, kubeconfig, tmp_path, monkeypatch,
                                                                     caplog):
    """The connection's token stops being valid while triggers wait (here: a token bound to a Secret,
    which is deleted, so the apiserver answers 401 at once), and a new one is in the token file, as a
    kubelet-projected or rotated token would be. The shared watch's next request is refused; it
    reads the credentials again and goes on, and every deferred task gets its Job's real end."""
    import asyncio

    import yaml
    from kubernetes import client

    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.triggers import job_watch
    from airflow_volcano.triggers.job import VolcanoJobTrigger
    from airflow_volcano.waiting.wait_engine import WaitLimits

    from .jobs import pytorch_job

    def bound_token(anchor: str) -> str:
        secret = cluster.core.create_namespaced_secret(cluster.namespace, client.V1Secret(
            metadata=client.V1ObjectMeta(name=anchor)))
        return cluster.core.create_namespaced_service_account_token(
            "airflow-volcano", cluster.namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=[], expiration_seconds=3600, bound_object_ref=client.V1BoundObjectReference(
                    kind="Secret", api_version="v1", name=anchor, uid=secret.metadata.uid)))).status.token

    token_file = tmp_path / "token"
    token_file.write_text(bound_token("anchor-1"))
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    config = tmp_path / "kubeconfig.json"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "sa", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa", "namespace": cluster.namespace}}]}))
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(config), "namespace": cluster.namespace}}))
    monkeypatch.setattr(job_watch, "WATCH_SECONDS", 3)  # the watch request reopens every 3 s instead of 5 min
    names = [f"tok-{index}" for index in range(5)]
    for name in names:
        cluster.create_job(pytorch_job(name, master_sim={"run-for": "40s"}, worker_sim={"run-for": "40s"}))
    jobs = {name: cluster.wait_phase(name, {"Running"}, timeout=90) for name in names}

    async def wait_all() -> list[dict]:
        tasks = [asyncio.create_task(anext(VolcanoJobTrigger(
            JobRef.from_job(job, "master").to_dict(), "kubernetes_default", get_logs=False,
            limits=WaitLimits(poll_interval=2).to_dict()).run())) for job in jobs.values()]
        await asyncio.sleep(4)
        # Rotate: the new token is in the file, the old one is refused from now on.
        token_file.write_text(await asyncio.to_thread(bound_token, "anchor-2"))
        await asyncio.to_thread(cluster.core.delete_namespaced_secret, "anchor-1", cluster.namespace)
        return [event.payload for event in await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)]

    fired = asyncio.run(wait_all())
    assert "HTTP 401 Unauthorized" in caplog.text, "the old token was refused: the fault happened"
    for name, payload in zip(names, fired, strict=True):
        assert payload["verdict"] == "finished" and payload["phase"] == "Completed", (name, payload)
