"""Every operator argument is declared once (manifest/request.py's JobRequest, operators/arguments.py's
OperatorArguments), with its doc text; the operators' signatures, defaults, `:param` lines and template_fields
are what the declarations say (the signatures and `:param` lines are generated: regenerating changes nothing)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections import Counter

import pytest

from airflow_volcano.decorators.volcano_pytorch import _VolcanoPyTorchDecoratedOperator, volcano_pytorch_task
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest import JobRequest
from airflow_volcano.operators.arguments import (
    OperatorArguments,
    declarations,
    generated_classes,
    generated_decorators,
    operator_arguments,
    regenerated,
    regenerated_decorator,
    source_file,
)
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.job import VolcanoJobOperator
from airflow_volcano.operators.master_worker import MasterWorkerJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

OPERATORS = [*generated_classes(), _VolcanoPyTorchDecoratedOperator]


def test_every_argument_is_declared_once_with_its_doc_text():
    names = Counter(item.name for item in declarations())
    assert [name for name, count in names.items() if count > 1] == []
    request_fields = {item.name for item in dataclasses.fields(JobRequest)} - {"kind", "hostfile_launch"}
    assert request_fields | {item.name for item in dataclasses.fields(OperatorArguments)} == set(names)
    for item in declarations():
        assert item.metadata["doc"].strip().endswith("."), item.name
        assert item.metadata["doc"] == item.metadata["doc"].strip(), item.name


def test_the_generated_signatures_and_param_lines_are_current():
    """After a declaration changes: python -m airflow_volcano.operators.arguments."""
    for operator in generated_classes():
        text = source_file(operator).read_text()
        assert regenerated(text, operator) == text, f"{operator.__name__}: regenerate its signature and :param lines"
    for function, operator in generated_decorators():
        text = source_file(operator).read_text()
        assert regenerated_decorator(text, function.__name__, operator) == text, f"{function.__name__}: regenerate"


@pytest.mark.parametrize("operator", generated_classes(), ids=lambda cls: cls.__name__)
def test_each_signature_is_the_declared_arguments_with_their_types_and_defaults(operator):
    parameters = inspect.signature(operator.__init__).parameters
    declared = operator_arguments(operator)
    assert [name for name in parameters if name not in ("self", "kwargs")] == [item.name for item in declared]
    for item in declared:
        parameter = parameters[item.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, item.name
        assert parameter.annotation == item.annotation, item.name
        assert parameter.default == item.default and type(parameter.default) is type(item.default), item.name


def test_the_decorator_takes_the_operators_arguments_but_the_script_typed_and_defaulted_alike():
    """A new argument of VolcanoPyTorchJobOperator is one of `@task.volcano_pytorch`'s too (or this fails)."""
    operator = dict(inspect.signature(VolcanoPyTorchJobOperator.__init__).parameters)
    decorator = dict(inspect.signature(volcano_pytorch_task).parameters)
    for name in ("self", "training_script", "command"):  # the function is the script
        del operator[name]
    for name in ("python_callable", "multiple_outputs"):  # the decorator's own
        del decorator[name]
    assert list(decorator) == list(operator)
    for name, parameter in operator.items():
        assert decorator[name].kind is parameter.kind, name
        assert decorator[name].annotation == parameter.annotation, name
        assert decorator[name].default == parameter.default, name
        assert type(decorator[name].default) is type(parameter.default), name


def test_the_decorator_passes_on_only_the_arguments_given():
    """As before its signature was typed: a default left out is the operator's own, and not among the kwargs the
    decorated task keeps (which `.override`, mapping and the serialized DAG see)."""

    def train() -> None:
        pass

    decorated = volcano_pytorch_task(image="img:1", worker_replicas=2, get_logs=False, task_id="t")(train)
    assert decorated.kwargs == {"image": "img:1", "worker_replicas": 2, "get_logs": False, "task_id": "t"}
    assert volcano_pytorch_task(train).kwargs == {"task_id": "train"}  # the bare decorator: nothing but its name


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda cls: cls.__name__)
def test_the_runtime_docstrings_have_a_param_line_for_every_argument(operator):
    """What the docs' argument tables read: `:param name:` along the MRO, with the declaration's text."""
    documented: dict[str, str] = {}
    for cls in operator.__mro__:
        for name, text in re.findall(r"^\s*:param (\w+): (.*(?:\n {8}.*)*)", cls.__doc__ or "", re.MULTILINE):
            documented.setdefault(name, " ".join(part.strip() for part in text.splitlines()))
    for item in operator_arguments(operator):
        assert documented.get(item.name) == item.doc, item.name


@pytest.mark.parametrize("operator", OPERATORS, ids=lambda cls: cls.__name__)
def test_template_fields_are_the_declared_templated_arguments(operator):
    templated = [item.name for item in operator_arguments(operator) if item.templated]
    extra = list(getattr(operator, "extra_template_fields", ()))
    assert list(operator.template_fields) == ["job_manifest", "script_manifest", *templated, *extra]


def test_each_class_takes_its_bases_arguments_but_those_it_refuses():
    job = {item.name for item in operator_arguments(VolcanoJobOperator)}
    roles = {item.name for item in operator_arguments(MasterWorkerJobOperator)}
    assert roles == job - {"main_task"} | {"worker_replicas", "master_task_name", "worker_task_name",
                                           "master_resources", "worker_resources", "master_policies"}
    assert {item.name for item in operator_arguments(VolcanoDeepSpeedJobOperator)} == roles - {
        "command", "full_job_spec"} | {"port", "launcher", "slots_per_worker", "launcher_options", "ssh_wait_timeout"}
    defaults = {operator: {item.name: item.default for item in operator_arguments(operator)}
                for operator in (VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator)}
    assert (defaults[VolcanoPyTorchJobOperator]["launcher"], defaults[VolcanoDeepSpeedJobOperator]["launcher"]) == (
        None, "deepspeed")
    assert (defaults[VolcanoPyTorchJobOperator]["port"], defaults[VolcanoDeepSpeedJobOperator]["port"]) == (
        None, 29500)


# -- a templated integer given as text --------------------------------------------------------------------


@pytest.mark.parametrize(("operator", "argument"), [
    (VolcanoPyTorchJobOperator, "worker_replicas"), (VolcanoPyTorchJobOperator, "min_available"),
    (VolcanoDeepSpeedJobOperator, "slots_per_worker")])
def test_a_templated_integer_given_as_other_text_fails_at_parse_naming_it(operator, argument):
    with pytest.raises(JobSpecError) as error:
        operator(task_id="t", image="img:1", **{argument: "two"})
    assert str(error.value) == f"{argument}='two' is neither an integer nor a Jinja template"


@pytest.mark.parametrize("value", ["{{ params.workers }}", "{% if params.big %}8{% else %}2{% endif %}", "2", 2])
def test_a_templated_integer_may_be_a_template_digits_or_an_integer(value):
    assert VolcanoPyTorchJobOperator(task_id="t", image="img:1", worker_replicas=value).worker_replicas == value
