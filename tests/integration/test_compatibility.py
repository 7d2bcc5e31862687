"""The provider on the cluster's own Volcano release: what it learns of it, and what it refuses or
adapts before submitting. Every test here runs on each combination of `make test-compat` (and on the
default cluster in `make test`); the assertions follow the release the cluster runs."""

from __future__ import annotations

from airflow_volcano.hooks.volcano import VolcanoHook
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SIM = "sim.airflow-volcano.io/"


def test_the_provider_learns_the_clusters_volcano_from_its_job_schema(cluster, operator_kubeconfig, volcano_release):
    """With the operator's least-privileged ServiceAccount (no read of CRDs): the apiserver's OpenAPI
    document, which every user may read, carries the Job CRD's schema."""
    features = VolcanoHook().volcano_features()

    assert features.source == "the Job CRD's schema"
    assert features.at_least((1, 12)) is (volcano_release >= (1, 12))
    assert features.at_least((1, 14)) is (volcano_release >= (1, 14))


def test_the_connection_can_name_the_release_instead(cluster, operator_kubeconfig, monkeypatch):
    import json
    import os

    connection = json.loads(os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    connection["extra"]["volcano_version"] = "v1.10.0"
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))

    assert VolcanoHook().volcano_features().describe() == "Volcano 1.10 (connection extra volcano_version)"


def test_the_volcano_setting_names_it_for_every_connection_and_the_extra_wins(cluster, operator_kubeconfig,
                                                                             monkeypatch):
    import json
    import os

    monkeypatch.setenv("AIRFLOW__VOLCANO__VOLCANO_VERSION", "1.12")
    assert VolcanoHook().volcano_features().describe() == "Volcano 1.12 (setting [volcano] volcano_version)"

    connection = json.loads(os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    connection["extra"]["volcano_version"] = "v1.14.1"
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(connection))
    assert VolcanoHook().volcano_features().describe() == "Volcano 1.14 (connection extra volcano_version)"


def test_wait_for_master_runs_where_volcano_has_it_and_is_refused_before_submitting_where_not(
    cluster, operator_kubeconfig, run_task, volcano_release
):
    cluster.write_log("waits-master-0", ["trained"])
    run = run_task(lambda: VolcanoPyTorchJobOperator(
        task_id="train", name="waits", namespace=cluster.namespace, image="img", command=["python", "train.py"],
        worker_replicas=1, wait_for_master=True, startup_timeout=60, poll_interval=1, deferrable=False,
        on_finish_action="keep_job"))

    if volcano_release >= (1, 14):
        # (Its workers' real waiting: test_real_training's torchrun example DAG.)
        assert run.state == "success", run.log
        assert "--wait-master-enabled" in cluster.job("waits")["spec"]["plugins"]["pytorch"]
    else:
        assert run.state == "failed", run.log
        assert ("wait_for_master (the pytorch plugin's '--wait-master-enabled') needs Volcano >= 1.14; this cluster "
                "runs Volcano before 1.12 (the Job CRD's schema)") in run.log
        assert cluster.jobs() == [], "nothing was submitted"
