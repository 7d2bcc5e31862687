"""A DAG written with KubernetesPodOperator's habits (issue 44): the Kubernetes client's models
(`k8s.V1EnvVar`, `V1ResourceRequirements`, `V1Toleration`, `V1Volume`, `V1VolumeMount`,
`V1LocalObjectReference`) are taken where the dicts are and reach the pods as the API has them,
templates inside them rendered; KubernetesPodOperator's own argument names, and pod resources given
as Airflow's `resources`, fail at once naming the argument to use."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from kubernetes.client import models as k8s

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest.api_form import api_form
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.job import VolcanoJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SECRET_ENV = k8s.V1EnvVar(name="HF_TOKEN", value_from=k8s.V1EnvVarSource(
    secret_key_ref=k8s.V1SecretKeySelector(name="hf", key="token")))


def pods(job: dict) -> dict[str, dict]:
    return {task["name"]: task["template"]["spec"] for task in job["spec"]["tasks"]}


def built(tmp_path: Path, **kwargs) -> dict:
    from airflow.sdk import DAG

    with DAG("kpo_habits", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(tmp_path / "dag.py")
        task = VolcanoPyTorchJobOperator(task_id="train", image="img:1", worker_replicas=1, **kwargs)
    task.render_template_fields({"params": {"day": "mon"}, "run_id": "manual", "ds": "2026-11-27"})
    assert task._manifests is not None
    return task._manifests.job


def test_the_kubernetes_clients_models_reach_every_pod_as_the_api_has_them(tmp_path):
    job = built(
        tmp_path,
        env=[k8s.V1EnvVar(name="DAY", value="{{ ds }}"), SECRET_ENV],
        container_resources=k8s.V1ResourceRequirements(requests={"cpu": "1", "memory": "1Gi"},
                                                       limits={"cpu": "2", "memory": "1Gi"}),
        tolerations=[k8s.V1Toleration(key="gpu", operator="Exists", effect="NoSchedule")],
        volumes=[k8s.V1Volume(name="data", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name="runs-{{ params.day }}"))],
        volume_mounts=[k8s.V1VolumeMount(name="data", mount_path="/data", read_only=True)],
        image_pull_secrets=[k8s.V1LocalObjectReference(name="regcred")],
    )
    for role, pod in pods(job).items():
        container = pod["containers"][0]
        env = {item["name"]: item for item in container["env"]}
        assert env["DAY"]["value"] == "2026-11-27", (role, "the template inside the V1EnvVar rendered")
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
        assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"},
                                          "limits": {"cpu": "2", "memory": "1Gi"}}, role
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"], role
        assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"], role
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "runs-mon"}} in pod["volumes"], role
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], role


def test_a_model_gives_the_same_job_as_the_dicts_it_stands_for(tmp_path):
    as_models = built(tmp_path, env=[SECRET_ENV], tolerations=[k8s.V1Toleration(key="gpu", operator="Exists")],
                      container_resources=k8s.V1ResourceRequirements(limits={"cpu": "2"}, requests={"cpu": "2"}))
    secret = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    as_dicts = built(tmp_path, env=[secret],
                     tolerations=[{"key": "gpu", "operator": "Exists"}], container_resources={"cpu": "2"})
    assert pods(as_models) == pods(as_dicts)


def test_a_bad_value_inside_a_model_is_named_like_a_bad_dict():
    with pytest.raises(JobSpecError, match=r"env: invalid environment variable .*'bad name'"):
        VolcanoPyTorchJobOperator(task_id="t", image="img:1", env=[k8s.V1EnvVar(name="bad name", value="1")]).\
            build_manifests()


@pytest.mark.parametrize(("given", "ours"), [
    ({"env_vars": {"A": "1"}}, "use env"),
    ({"env_vars": [k8s.V1EnvVar(name="A", value="1")]}, "use env"),
    ({"cmds": ["python"]}, "use command"),
    ({"arguments": ["--lr", "0.1"]}, "use args"),
    ({"startup_timeout_seconds": 120}, "use startup_timeout"),
    ({"in_cluster": True}, "use kubernetes_conn_id"),
])
@pytest.mark.parametrize("operator", [VolcanoJobOperator, VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator],
                         ids=lambda cls: cls.__name__)
def test_kubernetes_pod_operators_names_are_refused_naming_the_argument_to_use(operator, given, ours):
    (name, value), = given.items()
    with pytest.raises(JobSpecError) as error:
        operator(task_id="t", image="img:1", **given)
    assert f"{operator.__name__} takes no {name}=" in str(error.value) and ours in str(error.value)
    assert repr(api_form(value)) in str(error.value) or repr(value) in str(error.value)


@pytest.mark.parametrize("resources", [{"cpu": "1"}, {"limits": {"nvidia.com/gpu": "1"}},
                                       k8s.V1ResourceRequirements(limits={"cpu": "1"})], ids=str)
def test_pod_resources_given_as_airflows_resources_point_to_container_resources(resources):
    with pytest.raises(JobSpecError, match=r"resources is Airflow's executor resources .*container_resources"):
        VolcanoPyTorchJobOperator(task_id="t", image="img:1", resources=resources)


def test_airflows_own_executor_resources_are_still_airflows():
    task = VolcanoPyTorchJobOperator(task_id="t", image="img:1", resources={"cpus": 2, "ram": 1024})
    assert task.resources is not None and task.resources.cpus.qty == 2


def test_values_without_a_model_are_left_as_they_are():
    env = [{"name": "A", "value": "1"}]
    assert api_form(env) is env
    assert api_form(k8s.V1ObjectMeta) is k8s.V1ObjectMeta, "a model's class is not a model"
    assert api_form({"nested": [{"deeper": k8s.V1EnvVar(name="A", value="1")}]}) == {
        "nested": [{"deeper": {"name": "A", "value": "1"}}]}
