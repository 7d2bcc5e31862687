"""Operator arguments that are refused at DAG parse, before any template is rendered."""

from __future__ import annotations

import pytest

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator


@pytest.mark.parametrize("operator", [VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator])
def test_master_worker_operators_follow_the_master_and_say_so(operator):
    with pytest.raises(TypeError, match=f"{operator.__name__}: the main task is the master; set master_task_name"):
        operator(task_id="t", main_task="worker")


@pytest.mark.parametrize("argument", ["full_job_spec", "command"])
def test_deepspeed_operator_builds_the_commands_itself(argument):
    with pytest.raises(TypeError, match=f"builds the pods' commands: {argument} cannot be given"):
        VolcanoDeepSpeedJobOperator(task_id="t", **{argument: {"kind": "Job"} if argument == "full_job_spec"
                                                    else ["deepspeed", "train.py"]})


def test_deepspeed_arguments_are_template_fields():
    fields = VolcanoDeepSpeedJobOperator.template_fields
    assert {"slots_per_worker", "launcher_options", "worker_replicas", "args", "env"} <= set(fields)
    assert "nproc_per_node" not in fields, "torchrun's arguments are the PyTorch operator's"
