"""VolcanoPyTorchJobOperator end to end on the real local Volcano cluster, run by Airflow."""

from __future__ import annotations

import datetime
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SIM = "sim.airflow-volcano.io/"
REPO = Path(__file__).resolve().parents[2]
SEED_SCRIPT = REPO / "dags" / "scripts" / "pytorch_demo.py"


def seed_operator(namespace: str, name: str, **overrides) -> VolcanoPyTorchJobOperator:
    """Seed 000's job from operator arguments."""
    kwargs = dict(
        task_id="train", name=name, namespace=namespace,
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime", image_pull_policy="IfNotPresent",
        worker_replicas=2, container_resources={"cpu": "1", "memory": "2Gi"}, env={"PYTHONUNBUFFERED": "1"},
        training_script=str(SEED_SCRIPT), startup_timeout=60, poll_interval=1, deferrable=False,
    )
    kwargs.update(overrides)
    return VolcanoPyTorchJobOperator(**kwargs)


def test_seed_job_runs_to_completed_with_master_log_in_task_log(cluster, operator_kubeconfig, run_task):
    cluster.write_log("seed-master-0", ["[初始化] RANK=0, WORLD_SIZE=3", "Epoch [5/5], Average Loss: 0.0103"])

    run = run_task(lambda: seed_operator(cluster.namespace, "seed", on_finish_action="keep_job"))

    assert run.state == "success", run.log
    assert "[seed-master-0] Epoch [5/5], Average Loss: 0.0103" in run.log
    assert run.log.count("Epoch [5/5], Average Loss: 0.0103") == 1, "each log line once"
    assert run.xcom["job_name"] == "seed" and run.xcom["master_pod"] == "seed-master-0"
    assert run.xcom["return_value"]["phase"] == "Completed"
    job = cluster.job("seed")
    assert job["status"]["state"]["phase"] == "Completed"
    # The script went into a ConfigMap owned by the Job, mounted into every pod.
    configmap = cluster.core.read_namespaced_config_map("seed-script", cluster.namespace)
    assert configmap.data["pytorch_demo.py"] == SEED_SCRIPT.read_text()
    assert configmap.metadata.owner_references[0].uid == job["metadata"]["uid"]


def test_pods_carry_what_volcano_injected(cluster, operator_kubeconfig, run_task, volcano_release):
    # An extra task besides master and workers does not count in WORLD_SIZE from Volcano 1.12 on; it
    # did before (the seed 002 bug, which the operator corrects for the Jobs it submits).
    def task(name: str, replicas: int) -> dict:
        return {"name": name, "replicas": replicas, "template": {
            "metadata": {"annotations": {SIM + "outcome": "run-forever"}},
            "spec": {"containers": [{"name": name, "image": "img"}], "restartPolicy": "Never"}}}

    template = {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "envs"},
        "spec": {
            "minAvailable": 4, "schedulerName": "volcano",
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=29500"], "svc": []},
            "tasks": [task("master", 1), task("worker", 2), task("evaluator", 1)],
        },
    }
    cluster.create_job(template)
    pods = cluster.wait_for("4 pods", lambda: len(cluster.pods("envs")) == 4 and cluster.pods("envs"))
    env = {p.metadata.name: {e.name: e.value for e in p.spec.containers[0].env or []} for p in pods}
    assert {e["WORLD_SIZE"] for e in env.values()} == {"3" if volcano_release >= (1, 12) else "4"}
    assert env["envs-master-0"]["RANK"] == "0"
    assert (env["envs-worker-0"]["RANK"], env["envs-worker-1"]["RANK"]) == ("1", "2")
    assert "RANK" not in env["envs-evaluator-0"]
    assert {e["MASTER_ADDR"] for e in env.values()} == {"envs-master-0.envs"}
    assert {e["MASTER_PORT"] for e in env.values()} == {"29500"}


def test_operator_job_pods_get_rank_and_world_size(cluster, operator_kubeconfig, run_task):
    cluster.write_log("ranks-master-0", ["ok"])
    run = run_task(lambda: seed_operator(cluster.namespace, "ranks", on_finish_action="keep_job",
                                         annotations={SIM + "run-for": "4s"}))
    assert run.state == "success", run.log
    master = cluster.core.read_namespaced_pod("ranks-master-0", cluster.namespace)
    env = {e.name: e.value for e in master.spec.containers[0].env}
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "3", "ranks-master-0.ranks")
    assert master.metadata.labels["app.kubernetes.io/managed-by"] == "airflow-volcano"


def test_worker_exiting_1_fails_the_task_naming_pod_and_exit_code(cluster, operator_kubeconfig, run_task):
    cluster.write_log("bad-master-0", ["starting"])
    cluster.write_log("bad-worker-1", ["Traceback (most recent call last):", "RuntimeError: NCCL timeout"],
                      container="worker")
    # Only the workers fail (per-task annotations need a template); policies as the built-in defaults.
    run = run_task(lambda: seed_operator(
        cluster.namespace, "bad", max_retry=1, restart_policy="Never", job_template=_failing_worker_template(),
        policies=[{"event": "PodFailed", "action": "RestartJob"}, {"event": "PodEvicted", "action": "RestartJob"}],
    ))

    assert run.state == "failed", run.log
    # Its policies restart the gang on the failure: the first restart spends max_retry=1, and the task, which
    # tells it from a preemption (none here), ends the Job.
    assert (f"Volcano Job {cluster.namespace}/bad was restarted 1 time(s) after a failure, an eviction, a lost node "
            "or a stall: the retry budget is exhausted (max_retry 1") in run.log, run.log
    assert "pod bad-worker-" in run.log and "exit code 1, reason Error" in run.log
    cluster.wait_for("the Job the task ended to be deleted (it was restarting)", lambda: cluster.job("bad") is None)


def test_a_failure_without_a_restart_keeps_the_failed_job_for_debugging(cluster, operator_kubeconfig, run_task):
    cluster.write_log("kept-worker-1", ["RuntimeError: bad batch"], container="worker")
    run = run_task(lambda: seed_operator(cluster.namespace, "kept", restart_policy="Never",
                                         job_template=_failing_worker_template(), retryable_exit_codes=[137]))
    assert run.state == "failed", run.log
    assert f"Volcano Job {cluster.namespace}/kept ended in phase Terminated" in run.log, run.log
    assert "exit code 1, reason Error" in run.log, run.log
    job = cluster.job("kept")
    assert job is not None and job["status"]["state"]["phase"] == "Terminated", "failed Jobs are kept for debugging"


def _failing_worker_template() -> dict:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {},
        "spec": {"tasks": [
            {"name": "master", "replicas": 1, "template": {
                "metadata": {"annotations": {SIM + "outcome": "run-forever"}},
                "spec": {"containers": [{"name": "master", "image": "img"}]}}},
            {"name": "worker", "replicas": 2, "template": {
                "metadata": {"annotations": {SIM + "outcome": "fail", SIM + "exit-code": "1", SIM + "run-for": "1.5s"}},
                "spec": {"containers": [{"name": "worker", "image": "img"}]}}},
        ]},
    }


def test_unschedulable_gpu_request_fails_within_startup_timeout(cluster, operator_kubeconfig, run_task,
                                                                volcano_release):
    started = time.monotonic()
    run = run_task(lambda: seed_operator(cluster.namespace, "greedy", container_resources={"gpu": 64},
                                         startup_timeout=8))

    assert run.state == "failed", run.log
    assert "did not start within startup_timeout (8s)" in run.log
    # The scheduler's own words: from 1.14 (at least) it names the resource no node has; v1.10's
    # stops at its queue check and says only that the cluster's resources are overused.
    assert ("nvidia.com/gpu" if volcano_release >= (1, 14) else "resource in cluster is overused") in run.log
    # While it waited, the task log said why, each reason once.
    said = f"Volcano Job {cluster.namespace}/greedy is Pending, the scheduler says:"
    reasons = [line.split(said, 1)[1].split(" [airflow")[0] for line in run.log.splitlines() if said in line]
    assert reasons and len(set(reasons)) == len(reasons), reasons
    assert time.monotonic() - started < 60
    cluster.wait_for("the unstartable Job to be deleted", lambda: cluster.job("greedy") is None)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_image_pull_error_fails_fast_with_the_image(cluster, operator_kubeconfig, run_task, deferrable):
    """docs/deferrable.md "Cleanup guarantees": a Job whose pods cannot start is deleted, whatever on_kill_action
    says."""
    run = run_task(lambda: seed_operator(cluster.namespace, "pull", image="registry.invalid/nope:1",
                                         annotations={SIM + "outcome": "image-pull-error"}, deferrable=deferrable,
                                         on_kill_action="keep_job", on_finish_action="keep_job"))
    assert run.state == "failed", run.log
    assert "registry.invalid/nope:1" in run.log and "ImagePullBackOff" in run.log
    cluster.wait_for("the Job that cannot start to be deleted", lambda: cluster.job("pull") is None)


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_job_deleted_by_someone_else_fails_the_task_saying_so(cluster, operator_kubeconfig, run_task, deferrable):
    import threading

    def delete_when_running() -> None:
        cluster.wait_phase("gone", {"Running"}, timeout=60)
        cluster.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cluster.namespace, "jobs",
                                                       "gone")

    deleter = threading.Thread(target=delete_when_running)
    deleter.start()
    run = run_task(lambda: seed_operator(cluster.namespace, "gone", deferrable=deferrable,
                                         annotations={SIM + "outcome": "run-forever"}))
    deleter.join()
    assert run.state == "failed", run.log
    assert f"Volcano Job {cluster.namespace}/gone was deleted while the task waited" in run.log


def test_job_timeout_deletes_the_job(cluster, operator_kubeconfig, run_task):
    run = run_task(lambda: seed_operator(cluster.namespace, "slow", job_timeout=6,
                                         annotations={SIM + "outcome": "run-forever"}))
    assert run.state == "failed", run.log
    assert "job_timeout of 6s passed" in run.log
    cluster.wait_for("the timed-out Job to be deleted", lambda: cluster.job("slow") is None)


def test_succeeded_job_is_deleted_with_its_configmap_by_default(cluster, operator_kubeconfig, run_task):
    cluster.write_log("tidy-master-0", ["done"])
    run = run_task(lambda: seed_operator(cluster.namespace, "tidy"))
    assert run.state == "success", run.log
    cluster.wait_for("Job, pods and ConfigMap to be gone", lambda: cluster.job("tidy") is None
                     and not cluster.pods("tidy") and "tidy-script" not in cluster.configmap_names(), timeout=60)


def test_webhook_rejects_what_our_validation_catches_first(cluster, operator_kubeconfig, run_task):
    from kubernetes.client.rest import ApiException

    bad = _failing_worker_template()
    bad["metadata"]["name"] = "dup"
    bad["spec"]["tasks"][1]["name"] = "master"  # duplicate task names
    try:
        cluster.create_job(bad)
        raise AssertionError("Volcano's webhook accepted duplicate task names")
    except ApiException as error:
        assert error.status in (400, 422) and "duplicate" in error.body.lower()

    run = run_task(lambda: seed_operator(cluster.namespace, "dup", job_template=bad, worker_replicas=None))
    assert run.state == "failed"
    assert "duplicate" in run.log.lower() and "master" in run.log
    assert cluster.job("dup") is None and "dup-script" not in cluster.configmap_names()


def test_a_task_that_fails_before_submitting_says_why_and_nothing_else(cluster, operator_kubeconfig, run_task):
    """A bad argument: its error, and no "[error] XCom not found" for each of the UI links (they used to
    be read from XCom when the task ended, before any Job, hence any link, existed)."""
    run = run_task(lambda: seed_operator(cluster.namespace, "bad", worker_replicas=-1))

    assert run.state == "failed"
    assert "worker_replicas must be an integer >= 0, got -1" in run.log
    assert "XCom not found" not in run.log, run.log
    assert cluster.job("bad") is None


def test_strings_ending_in_yaml_or_json_are_values_and_only_job_template_is_a_file(
        cluster, operator_kubeconfig, run_task, tmp_path):
    """apache/airflow#16922: every templated string ending in .yaml/.json used to be read as a
    template file, so `args=["--config", "conf/train.yaml"]` failed with TemplateNotFound."""
    template = tmp_path / "templates" / "job.yaml"  # given by absolute path, rendered with Jinja
    template.parent.mkdir()
    template.write_text(textwrap.dedent("""
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        metadata: {}
        spec:
          tasks:
          - name: master
            replicas: 1
            template:
              metadata: {annotations: {team: "{{ dag.dag_id }}"}}
              spec: {containers: [{name: master, image: img}]}
          - name: worker
            replicas: 1
            template:
              spec: {containers: [{name: worker, image: img}]}
    """))
    cluster.write_log("cfg-master-0", ["ok"])

    run = run_task(lambda: seed_operator(
        cluster.namespace, "cfg", job_template=str(template), worker_replicas=None, training_script=None,
        command=["python", "train.py"], args=["--config", "conf/train.yaml", "--ds", "ds_config.json"],
        env={"CFG": "x.json", "HYDRA": "conf/{{ task.task_id }}.yml"}, on_finish_action="keep_job",
    ), dag_id="templating_dag")

    assert run.state == "success", run.log
    master = cluster.job("cfg")["spec"]["tasks"][0]["template"]
    container = master["spec"]["containers"][0]
    assert container["args"] == ["--config", "conf/train.yaml", "--ds", "ds_config.json"]
    assert {e["name"]: e["value"] for e in container["env"] if "value" in e} == {"CFG": "x.json",
                                                                                "HYDRA": "conf/train.yml"}
    assert master["metadata"]["annotations"]["team"] == "templating_dag"


def test_master_log_is_read_from_the_container_the_job_names(cluster, operator_kubeconfig, run_task):
    """A template whose container is not named after its task (here `pytorch`) still gets its log."""
    template = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {}, "spec": {"tasks": [
        {"name": "master", "replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "img"}]}}},
        {"name": "worker", "replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "img"}]}}},
    ]}}
    cluster.write_log("named-master-0", ["loss 0.42 from the pytorch container"], container="pytorch")

    run = run_task(lambda: seed_operator(cluster.namespace, "named", job_template=template, worker_replicas=None,
                                         annotations={SIM + "run-for": "3s"}))

    assert run.state == "success", run.log
    assert "[named-master-0] loss 0.42 from the pytorch container" in run.log
    assert run.xcom["return_value"]["log_lines"] == 1


def test_a_namespace_the_connection_may_not_use_fails_in_clear_sentences(cluster, operator_kubeconfig, run_task):
    # The ServiceAccount's Role (deploy/rbac.yaml) is in the test namespace only.
    run = run_task(lambda: seed_operator("default", "elsewhere"))

    assert run.state == "failed", run.log
    assert "failed: HTTP 403 Forbidden" in run.log
    assert f'User "system:serviceaccount:{cluster.namespace}:airflow-volcano" cannot' in run.log
    assert 'in the namespace "default"' in run.log and "deploy/rbac.yaml" in run.log
    assert "HTTP response headers" not in run.log and "Audit-Id" not in run.log, "no header dump"


def test_the_ui_shows_each_mapped_tasks_job_then_its_script(cluster, operator_kubeconfig, airflow_db):
    """Rendered fields as the UI reads them (RenderedTaskInstanceFields): the Job and the script's
    ConfigMap as separate fields, Job first, for every mapped task instance too."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.sdk import DAG
    from airflow.utils.session import create_session

    from .dag_runner import run_dag

    with DAG("mapped_manifests", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
             template_searchpath=[str(SEED_SCRIPT.parent)]) as dag:
        VolcanoPyTorchJobOperator.partial(
            task_id="train", namespace=cluster.namespace, image="img:1", training_script=str(SEED_SCRIPT),
            annotations={SIM + "run-for": "1s"}, startup_timeout=60, poll_interval=1, deferrable=False,
        ).expand(worker_replicas=[1, 2])
    run = run_dag(dag)

    with create_session() as session:
        rows = session.query(RenderedTaskInstanceFields).filter_by(dag_id=dag.dag_id, run_id=run.run_id).all()
        fields = {row.map_index: row.rendered_fields for row in rows}
    assert set(fields) == {0, 1}
    for map_index, workers in ((0, 1), (1, 2)):
        rendered = fields[map_index]
        assert list(rendered)[:2] == ["job_manifest", "script_manifest"]
        job = yaml.safe_load(rendered["job_manifest"])
        assert job["kind"] == "Job" and job["spec"]["tasks"][1]["replicas"] == workers
        # The seed's script is longer than Airflow's rendered-field limit (4,096 characters): Airflow
        # truncates that field alone, and the Job above stays whole.
        assert "kind: ConfigMap" in rendered["script_manifest"]
        assert "pytorch_demo.py: " in rendered["script_manifest"]


def test_ui_links_to_the_job_and_the_master_log(cluster, operator_kubeconfig, run_task, monkeypatch):
    """The links the UI shows, read the way Airflow's API server reads them: from the serialized
    DAG (name and XCom key per link) and the XCom the task stored."""
    import json
    import os

    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    monkeypatch.setenv("AIRFLOW__VOLCANO__JOB_URL_TEMPLATE", "https://volcano.example/job/{namespace}/{name}")
    monkeypatch.setenv("AIRFLOW__VOLCANO__POD_LOG_URL_TEMPLATE", "https://config-loses.example/{pod}")
    conn = json.loads(os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    conn["extra"]["pod_log_url_template"] = "https://k8s.example/#/log/{namespace}/{pod}/pod?container={container}"
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(conn))
    cluster.write_log("linked-master-0", ["ok"])

    run = run_task(lambda: seed_operator(cluster.namespace, "linked"), dag_id="links_dag")

    assert run.state == "success", run.log
    task = SerializedDagModel.get_dag("links_dag").get_task("train")  # the DAG as the API server has it
    with create_session() as session:
        ti = session.query(DagRun).filter_by(dag_id="links_dag").one().get_task_instance("train", session=session)
        links = {name: link.get_link(task, ti_key=ti.key) for name, link in task.operator_extra_link_dict.items()}
    assert links == {
        "Volcano dashboard": f"https://volcano.example/job/{cluster.namespace}/linked",
        "Master pod log": f"https://k8s.example/#/log/{cluster.namespace}/linked-master-0/pod?container=master",
        "TensorBoard": "",  # the Job runs no TensorBoard
    }


def test_secret_env_values_are_masked_in_the_stored_rendered_fields(cluster, operator_kubeconfig, run_task):
    """A literal env value named like a secret reaches the pod as it is, but the rendered
    `job_manifest` Airflow stores (and the UI and REST API show) does not carry it. (The task log's
    masking happens in Airflow's supervisor, which dag.test() does not run: see test_triggerer.py
    for a real triggerer's, and tests/unit/test_arguments.py for the masker the worker is given.)"""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session

    run = run_task(lambda: seed_operator(cluster.namespace, "masked", on_finish_action="keep_job",
                                         env={"HF_TOKEN": "hf_live_0123456789abcdef", "STEPS": "3"},
                                         annotations={SIM + "run-for": "2s"}), dag_id="masked_dag")

    assert run.state == "success", run.log
    with create_session() as session:
        stored = session.query(RenderedTaskInstanceFields).filter_by(dag_id="masked_dag").one().rendered_fields
    assert "hf_live_0123456789abcdef" not in str(stored)
    assert "HF_TOKEN" in stored["job_manifest"] and "STEPS" in stored["job_manifest"]
    submitted = cluster.job("masked")["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "value": "hf_live_0123456789abcdef"} in submitted, "the pod gets the real value"
