"""`@task.volcano_pytorch`: a Python function becomes the training script of a Volcano PyTorch Job.

The function's source is shipped like `training_script` (a ConfigMap mounted into master and
workers) and runs on every rank, with its arguments (rendered, XComArgs resolved) passed as JSON.
Rank 0's return value, if JSON-serialisable, is written to /dev/termination-log, so it comes
back as `result` in the task's return value, like any script's termination message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest import TrainingScript
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

RUNNER = '''

if __name__ == "__main__":
    import json as _json
    import os as _os

    _arguments = _json.loads({arguments!r})
    _result = {function}(*_arguments["args"], **_arguments["kwargs"])
    # Rank 0 hands its return value to Airflow through the termination message (4 KiB at most).
    if _os.environ.get("RANK", "0") == "0" and _result is not None and _os.path.exists("/dev/termination-log"):
        with open("/dev/termination-log", "w") as _out:
            _json.dump(_result, _out, default=str)
'''


class _VolcanoPyTorchDecoratedOperator(DecoratedOperator, VolcanoPyTorchJobOperator):
    """Runs the decorated function as the training script of a VolcanoPyTorchJobOperator.

    :param python_callable: the function; it runs in the container, so it imports what it needs
        itself (its module's imports are not shipped).
    :param op_args: positional arguments (JSON-serialisable after rendering).
    :param op_kwargs: keyword arguments (JSON-serialisable after rendering).
    """

    custom_operator_name = "@task.volcano_pytorch"
    # The function is the script: `training_script` and `command` are not arguments here.
    refused_arguments = (*VolcanoPyTorchJobOperator.refused_arguments, "training_script", "command")
    extra_template_fields = ("op_args", "op_kwargs")
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    def __init__(self, **kwargs: Any) -> None:
        for reserved in ("training_script", "command"):
            if reserved in kwargs:
                raise JobSpecError(f"{reserved}: @task.volcano_pytorch runs the decorated function; "
                                   f"use VolcanoPyTorchJobOperator to give a {reserved}")
        super().__init__(**kwargs)

    def _read_training_script(self) -> TrainingScript | None:
        name = self.python_callable.__name__
        try:
            arguments = json.dumps({"args": list(self.op_args), "kwargs": dict(self.op_kwargs)})
        except TypeError as error:
            raise JobSpecError(f"op_args/op_kwargs of {name}: must be JSON-serialisable to reach the pods "
                               f"({error})") from error
        source = self.get_python_source()
        return TrainingScript(filename=f"{name}.py", content=source + RUNNER.format(arguments=arguments,
                                                                                   function=name))


def volcano_pytorch_task(python_callable: Callable | None = None, **kwargs: Any) -> TaskDecorator:
    """`@task.volcano_pytorch(image=..., worker_replicas=..., ...)`: any VolcanoPyTorchJobOperator
    argument except `training_script` and `command`.

    :param python_callable: the function to run on every rank.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        decorated_operator_class=_VolcanoPyTorchDecoratedOperator,
        **kwargs,
    )
