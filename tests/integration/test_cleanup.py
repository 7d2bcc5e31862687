"""Nothing left running, nothing trained twice: what becomes of a Job when its task fails, times out
or cannot clean up, on the real local cluster (kwok pods)."""

from __future__ import annotations

import datetime
import json

import pytest

from .faults import FaultyProxy
from .test_operator import SIM, seed_operator


def submitted(log: str, namespace: str, name: str) -> int:
    return log.count(f"Submitted Volcano Job {namespace}/{name} ")


def test_execution_timeout_with_no_try_left_deletes_the_job(cluster, operator_kubeconfig, run_task):
    """execution_timeout, retries=0: the task fails and no try will ever reattach, so the Job (which
    would otherwise run on, holding its GPUs) is deleted."""
    run = run_task(lambda: seed_operator(cluster.namespace, "timeout0", retries=0,
                                         execution_timeout=datetime.timedelta(seconds=10),
                                         annotations={SIM + "outcome": "run-forever"}))

    assert run.state == "failed", run.log
    assert "No later try of this task will reattach: deleting Volcano Job" in run.log
    assert "for the next try to reattach" not in run.log
    cluster.wait_for("the Job to be deleted", lambda: cluster.job("timeout0") is None, timeout=30)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_execution_timeout_with_a_try_left_keeps_the_job_for_the_retry_to_reattach(cluster, operator_kubeconfig,
                                                                                    run_task, deferrable):
    """The same whether the task waited in a worker or deferred (a deferred execution_timeout used to
    delete the Job, and the retry trained again from the start).

    The Job trains 60 s: longer than one try's execution_timeout (45 s), shorter than two. A deferred
    try's deadline counts from its start_date, which precedes the Job by the seconds a loaded machine
    takes to start the task (up to about 20 here), so the margins are wide."""
    run = run_task(lambda: seed_operator(cluster.namespace, "timeout1", retries=1,
                                         retry_delay=datetime.timedelta(seconds=1),
                                         execution_timeout=datetime.timedelta(seconds=45),
                                         annotations={SIM + "run-for": "60s"}, on_finish_action="keep_job",
                                         deferrable=deferrable))

    assert run.state == "success", run.log
    assert f"Keeping Volcano Job {cluster.namespace}/timeout1 for the next try of this task to reattach" in run.log
    assert f"Reattaching to Volcano Job {cluster.namespace}/timeout1 submitted by an earlier try" in run.log
    assert submitted(run.log, cluster.namespace, "timeout1") == 1, "one Job, trained once"
    assert cluster.job("timeout1")["status"]["state"]["phase"] == "Completed"


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_deletes_failing_for_a_minute_neither_orphan_the_job_nor_train_it_twice(
        cluster, operator_kubeconfig, kubeconfig, run_task, monkeypatch, deferrable):
    """The apiserver refuses every delete of the Job for 60 s. The cleanup retries (here for 10 s),
    then the task fails without marking the Job reported; its retry reattaches to the finished Job,
    reports it and deletes it. One Job, trained once, none left."""
    from airflow_volcano import ownership

    monkeypatch.setattr(ownership, "CLEANUP_RETRY_SECONDS", 10.0)
    config = json.loads(operator_kubeconfig.read_text())
    ca_file = kubeconfig.parent / "pki" / "ca.crt"
    with FaultyProxy(config["clusters"][0]["cluster"]["server"], ca_file, every=0, job_deletes_fail_for=60) as proxy:
        config["clusters"][0]["cluster"] = {"server": proxy.url}
        proxied = operator_kubeconfig.with_name("proxied-kubeconfig.json")
        proxied.write_text(json.dumps(config))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(proxied), "namespace": cluster.namespace}}))
        run = run_task(lambda: seed_operator(cluster.namespace, "undeletable", annotations={SIM + "run-for": "2s"},
                                             retries=1, retry_delay=datetime.timedelta(seconds=55),
                                             deferrable=deferrable))

    assert proxy.job_deletes_refused >= 3, "the deletes really failed, and were retried"
    assert f"delete Job {cluster.namespace}/undeletable failed (HTTP 503" in run.log
    assert run.state == "success", run.log
    assert f"Reattaching to Volcano Job {cluster.namespace}/undeletable submitted by an earlier try" in run.log
    assert submitted(run.log, cluster.namespace, "undeletable") == 1, "trained once"
    cluster.wait_for("the Job to be gone", lambda: cluster.job("undeletable") is None, timeout=30)


def test_someone_elses_configmap_is_never_replaced(cluster, operator_kubeconfig, run_task):
    from kubernetes import client

    cluster.core.create_namespaced_config_map(cluster.namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="theirs-script"), data={"keep.txt": "not yours"}))

    run = run_task(lambda: seed_operator(cluster.namespace, "theirs"))

    assert run.state == "failed", run.log
    assert (f"name: a ConfigMap {cluster.namespace}/theirs-script already exists and was not created by this "
            "task") in run.log
    found = cluster.core.read_namespaced_config_map("theirs-script", cluster.namespace)
    assert found.data == {"keep.txt": "not yours"}
    assert cluster.job("theirs") is None, "nothing submitted"


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_failed_wait_with_no_try_left_deletes_the_running_job(cluster, operator_kubeconfig, run_task, monkeypatch,
                                                                deferrable):
    """The wait itself fails for good (here: the identity loses its permission to read Jobs while the
    Job runs). With no try left, the Job is deleted rather than left training unwatched."""
    import threading

    from kubernetes import client

    from airflow_volcano.triggers import job_watch

    # An open watch outlives the permission: it is refused when reopened (every 5 min; here every 3 s).
    monkeypatch.setattr(job_watch, "WATCH_SECONDS", 3)

    def revoke_when_running() -> None:
        cluster.wait_phase(f"lost{int(deferrable)}", {"Running"}, timeout=60)
        rbac = client.RbacAuthorizationV1Api(cluster.api)
        role = rbac.read_namespaced_role("airflow-volcano", cluster.namespace)
        for rule in role.rules:
            if "jobs" in (rule.resources or []):
                rule.verbs = ["delete"]  # it may still clean up, no longer watch or read
        rbac.replace_namespaced_role("airflow-volcano", cluster.namespace, role)

    revoker = threading.Thread(target=revoke_when_running)
    revoker.start()
    run = run_task(lambda: seed_operator(cluster.namespace, f"lost{int(deferrable)}", retries=0,
                                         deferrable=deferrable, annotations={SIM + "outcome": "run-forever"}))
    revoker.join()

    assert run.state == "failed", run.log
    assert "403" in run.log
    cluster.wait_for("the Job to be deleted", lambda: cluster.job(f"lost{int(deferrable)}") is None, timeout=60)
