"""Every argument the docs' argument tables mark templated (T) is a template field of every operator class
that takes it, as the argument declarations say (their `templated`), and renders: from a
Jinja expression in a DAG to the rendered value the Job is built from."""

from __future__ import annotations

import datetime
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_volcano.decorators.volcano_pytorch import _VolcanoPyTorchDecoratedOperator
from airflow_volcano.operators.arguments import declarations
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.job import VolcanoJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
from airflow_volcano.sensors.job import VolcanoJobSensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))
import argument_rows  # noqa: E402  (docs/_ext: the rows the Sphinx extension makes its tables of)

OPERATORS = [VolcanoJobOperator, VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator]


def documented(cls: type) -> dict[str, bool]:
    """The arguments of a class's generated docs table: name -> marked T."""
    return {argument.name: argument.templated for argument in argument_rows.arguments(cls)}


def marks() -> dict[str, bool]:
    """Every operator table's arguments: name -> marked T in any of them."""
    found: dict[str, bool] = {}
    for operator in [*OPERATORS, _VolcanoPyTorchDecoratedOperator]:
        for name, templated in documented(operator).items():
            found[name] = found.get(name, False) or templated
    return found


def arguments(operator: type) -> set[str]:
    return {name for cls in operator.__mro__ if "__init__" in vars(cls)
            for name in inspect.signature(vars(cls)["__init__"]).parameters} - {"self", "kwargs"}


def test_the_docs_mark_templated_what_the_declarations_template():
    marked = {name for name, mark in marks().items() if mark}
    declared = {item.name for item in declarations() if item.metadata["templated"]} & set(marks())
    extra = {"op_args", "op_kwargs"}  # the decorator's own (its extra_template_fields)
    assert marked - extra == declared, (sorted(marked - extra - declared), sorted(declared - marked))


@pytest.mark.parametrize("operator", [*OPERATORS, _VolcanoPyTorchDecoratedOperator], ids=lambda cls: cls.__name__)
def test_every_templated_argument_of_the_docs_is_a_template_field_of_every_operator_that_takes_it(operator):
    found = marks()
    templated = {name for name, mark in found.items() if mark}
    refused = set(getattr(operator, "refused_arguments", ()))
    wanted = (templated & arguments(operator)) - refused
    assert wanted <= set(operator.template_fields), sorted(wanted - set(operator.template_fields))
    untemplated = {name for name, mark in found.items() if not mark} & set(operator.template_fields)
    assert not untemplated, f"templated, but the docs do not say so: {sorted(untemplated)}"


def test_the_sensors_templated_arguments_are_its_template_fields():
    marked = documented(VolcanoJobSensor)
    assert {name for name, mark in marked.items() if mark} == set(VolcanoJobSensor.template_fields)
    assert set(VolcanoJobSensor.template_fields) <= set(marked), "every template field is in the table"


# A Jinja expression for each templated argument, and what it must render to.
EXAMPLES: dict[str, tuple[Any, Any]] = {
    "image": ("{{ params.image }}", "img:1"),
    "command": (["python", "{{ params.script_path }}"], ["python", "/opt/train.py"]),
    "args": (["--lr", "{{ params.lr }}"], ["--lr", "0.1"]),
    "env": ({"LR": "{{ params.lr }}"}, {"LR": "0.1"}),
    "name": ("train-{{ params.day }}", "train-mon"),
    "namespace": ("{{ params.ns }}", "ml"),
    "worker_replicas": ("{{ params.workers }}", "2"),
    "container_resources": ({"cpu": "{{ params.cpu }}"}, {"cpu": "2"}),
    "master_resources": ({"memory": "{{ params.mem }}"}, {"memory": "1Gi"}),
    "worker_resources": ({"memory": "{{ params.mem }}"}, {"memory": "1Gi"}),
    "node_selector": ({"pool": "{{ params.pool }}"}, {"pool": "gpu-a"}),
    "tolerations": ([{"key": "{{ params.pool }}", "operator": "Exists"}], [{"key": "gpu-a", "operator": "Exists"}]),
    "volumes": ([{"name": "data", "persistentVolumeClaim": {"claimName": "{{ params.claim }}"}}],
                [{"name": "data", "persistentVolumeClaim": {"claimName": "runs"}}]),
    "volume_mounts": ([{"name": "data", "mountPath": "{{ params.mount }}"}], [{"name": "data", "mountPath": "/data"}]),
    "service_account_name": ("{{ params.sa }}", "trainer"),
    "labels": ({"team": "{{ params.team }}"}, {"team": "search"}),
    "annotations": ({"note": "{{ params.team }}"}, {"note": "search"}),
    "priority_class_name": ("{{ params.priority }}", "high"),
    "volcano_queue": ("{{ params.queue }}", "research"),
    "min_available": ("{{ params.min }}", "1"),
    "tensorboard": ({"logdir": "{{ params.mount }}/tb"}, {"logdir": "/data/tb"}),
    "checkpoint_dir": ("{{ params.mount }}/ckpt", "/data/ckpt"),
    "kubernetes_conn_id": ("{{ params.conn }}", "kubernetes_default"),
    "log_tasks": (["{{ params.role }}"], ["worker"]),
    "nproc_per_node": ("{{ params.nproc }}", "2"),
    "torchrun_options": (["--rdzv_conf=timeout={{ params.timeout }}"], ["--rdzv_conf=timeout=900"]),
    "slots_per_worker": ("{{ params.slots }}", "2"),
    "launcher_options": (["--bind_cores_to_rank={{ params.bind }}"], ["--bind_cores_to_rank=true"]),
    "training_script": ("scripts/{{ params.script }}", "scripts/train.py"),
    "main_task": ("{{ params.main }}", "master"),
    "job_template": ("templates/{{ params.template }}", "templates/job.yaml"),
    "full_job_spec": ({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                       "spec": {"tasks": [{"name": "main", "replicas": 1, "template": {"spec": {"containers": [
                           {"name": "main", "image": "{{ params.image }}"}]}}}]}},
                      "img:1"),
}
PARAMS = {"image": "img:1", "script_path": "/opt/train.py", "lr": "0.1", "day": "mon", "ns": "ml", "workers": 2,
          "cpu": "2", "mem": "1Gi", "pool": "gpu-a", "claim": "runs", "mount": "/data", "sa": "trainer",
          "team": "search", "priority": "high", "queue": "research", "min": 1, "conn": "kubernetes_default",
          "role": "worker", "nproc": 2, "timeout": 900, "slots": 2, "port": 29400, "script": "train.py",
          "main": "master", "template": "job.yaml", "bind": "true"}


def dag_folder(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("print('train')\n")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "job.yaml").write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nspec:\n  tasks:\n  - name: master\n    replicas: 1\n"
        "    template: {spec: {containers: [{name: master, image: img:1}]}}\n  - name: worker\n    replicas: 1\n"
        "    template: {spec: {containers: [{name: worker, image: img:1}]}}\n")
    return tmp_path


def rendered(operator: type, names: list[str], tmp_path: Path) -> tuple[BaseException | None, Any]:
    from airflow.sdk import DAG

    kwargs: dict[str, Any] = {name: EXAMPLES[name][0] for name in names}
    if operator is VolcanoPyTorchJobOperator:
        kwargs["launcher"] = "torchrun"  # nproc_per_node and torchrun_options are torchrun's
        kwargs.pop("command")  # which builds the command
    with DAG(f"templated_{operator.__name__}", schedule=None,
             start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(dag_folder(tmp_path) / "dag.py")
        task = operator(task_id="train", **kwargs)
    task.render_template_fields({"params": PARAMS, "run_id": "manual"})
    return task, kwargs


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda cls: cls.__name__)
def test_every_templated_argument_renders_into_the_job(operator, tmp_path):
    """A templated value in a DAG reaches the Job rendered, for every argument the class templates
    (checkpoint_dir once fell out of the PyTorch and DeepSpeed operators' template_fields)."""
    # full_job_spec cannot be combined with the others: the test below renders it.
    names = [name for name in operator.template_fields if name in EXAMPLES and name != "full_job_spec"]
    task, kwargs = rendered(operator, names, tmp_path)
    for name in kwargs:
        if name in EXAMPLES:
            assert getattr(task, name) == EXAMPLES[name][1], name
    job = task._manifests.job
    text = str(job)
    assert "{{ " not in text and "params." not in text, "nothing left unrendered in the Job"
    assert "/data/ckpt" in text, "checkpoint_dir reached the pods rendered"


def test_a_full_job_spec_renders_and_its_secrets_are_masked_at_any_depth_in_the_rendered_field(tmp_path):
    """Airflow's own redaction of a rendered dict stops a few levels down; a Job's env values sit deeper."""
    spec = EXAMPLES["full_job_spec"][0]
    container = spec["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "HF_TOKEN", "value": "hf_secret_value_12345"}]
    from airflow.sdk import DAG

    with DAG("masked", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(tmp_path / "dag.py")
        task = VolcanoJobOperator(task_id="train", full_job_spec=spec, main_task="main")
    task.render_template_fields({"params": PARAMS, "run_id": "manual"})
    assert "hf_secret_value_12345" not in str(task.full_job_spec), "the rendered field shows it masked"
    built = task._manifests.job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert built["image"] == "img:1" and built["env"] == [{"name": "HF_TOKEN", "value": "hf_secret_value_12345"}], (
        "the pods get the real value")
