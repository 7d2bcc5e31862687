"""A DAG that gives an operator or `@task.volcano_pytorch` an argument of the wrong type fails mypy, naming the
argument; a correct one passes (the package ships py.typed, and every operator's and decorator's signature lists
its arguments, typed; `task` from airflow_volcano.decorators types the decorator on Airflow's `task`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WRONG = '''
from airflow_volcano.decorators import task
from airflow_volcano.decorators.volcano_pytorch import volcano_pytorch_task
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.job import VolcanoJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

VolcanoPyTorchJobOperator(task_id="a", image=123, worker_replicas=[2], wait_for_master=3)
VolcanoPyTorchJobOperator(task_id="b", env=42, startup_timeout="15m", get_logs="yes")
VolcanoDeepSpeedJobOperator(task_id="c", slots_per_worker=1.5, launcher_options="--bind")
VolcanoJobOperator(task_id="d", job_template=["job.yaml"], max_retry="3")
volcano_pytorch_task(image=123, worker_replicas=2.5, deferrable="yes")
task.volcano_pytorch(image=123, worker_replicas=[2], multiple_outputs="no")
'''

RIGHT = '''
import datetime

from airflow.sdk import DAG, Asset

from airflow_volcano.decorators import task
from airflow_volcano.decorators.volcano_pytorch import volcano_pytorch_task
from airflow_volcano.kubelet import ExpandVars
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator


@task.volcano_pytorch(image="pytorch:2", worker_replicas=2, container_resources={"cpu": "1"}, task_id="fit",
                      startup_timeout=datetime.timedelta(minutes=5), retries=1, multiple_outputs=False)
def fit(epochs: int) -> dict:
    return {"epochs": epochs}


@volcano_pytorch_task(image="pytorch:2", worker_replicas="{{ params.workers }}", launcher="torchrun")
def tune() -> None:
    pass


with DAG("typed", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)):
    VolcanoPyTorchJobOperator(
        task_id="train", image="pytorch:2", worker_replicas="{{ params.workers }}", env={"LR": "0.1"},
        args=["--out", ExpandVars("/ckpt/$(POD_NAME)"), 5], container_resources={"cpu": "2"},
        startup_timeout=datetime.timedelta(minutes=15), wait_for_master=True, launcher="torchrun",
        nproc_per_node="gpu", model_asset=Asset("s3://models/m"), retries=2, deferrable=True)
    VolcanoDeepSpeedJobOperator(task_id="ds", image="ds:1", training_script="train.py", worker_replicas=2,
                                slots_per_worker="{{ params.slots }}", ssh_wait_timeout=60)
    fit(3)
    tune()
'''

CONFIG = """[mypy]
python_version = 3.11
follow_imports = silent
"""

# The argument each line of WRONG gets wrong, which mypy's message must name. (`worker_replicas="two"` is no type
# error: a Jinja template is text too; the operator refuses it at parse, tests/unit/test_argument_declarations.py.)
EXPECTED = {8: ["image", "worker_replicas", "wait_for_master"], 9: ["env", "startup_timeout", "get_logs"],
            10: ["slots_per_worker", "launcher_options"], 11: ["job_template", "max_retry"],
            12: ["image", "worker_replicas", "deferrable"], 13: ["image", "worker_replicas", "multiple_outputs"]}


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("typed_dags")
    (folder / "wrong_dag.py").write_text(WRONG)
    (folder / "right_dag.py").write_text(RIGHT)
    (folder / "mypy.ini").write_text(CONFIG)
    # The package from this checkout (an editable install's import hook is invisible to mypy).
    env = {**os.environ, "MYPYPATH": str(ROOT), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
                           str(folder / "cache"), "--no-error-summary", "wrong_dag.py", "right_dag.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert not done.stderr.strip(), done.stderr
    found: dict[str, str] = {"wrong_dag.py": "", "right_dag.py": ""}
    for line in done.stdout.splitlines():
        found[line.split(":", 1)[0]] = found.get(line.split(":", 1)[0], "") + line + "\n"
    return found


def test_a_dag_with_wrong_argument_types_fails_mypy_naming_each_argument(mypy_output):
    output = mypy_output["wrong_dag.py"]
    for line, names in EXPECTED.items():
        for name in names:
            assert re.search(rf'^wrong_dag\.py:{line}: error: Argument "{name}" (to "\w+" )?has incompatible type',
                             output, re.MULTILINE), f"{name} (line {line}) not reported:\n{output}"
    assert len(output.splitlines()) == sum(map(len, EXPECTED.values())), output


def test_a_correct_dag_passes_mypy(mypy_output):
    assert mypy_output["right_dag.py"] == "", mypy_output["right_dag.py"]
