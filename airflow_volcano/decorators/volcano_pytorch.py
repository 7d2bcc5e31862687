"""`@task.volcano_pytorch`: a Python function becomes the training script of a Volcano PyTorch Job.

The function's source is shipped like `training_script` (a ConfigMap mounted into master and
workers) and runs on every rank, with its arguments (rendered, XComArgs resolved) passed as JSON.
Rank 0's return value, if JSON-serialisable, is written to /dev/termination-log, so it comes
back as `result` in the task's return value, like any script's termination message.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_volcano.constants import IfJobExists, OnFinishAction, OnKillAction, StallAction
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest import TrainingScript
from airflow_volcano.operators.arguments import DEFAULT_DEFERRABLE
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Asset

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


def volcano_pytorch_task(
    python_callable: Callable | None = None,
    *,
    multiple_outputs: bool | None = None,
    # Generated from the declarations: python -m airflow_volcano.operators.arguments
    name: str | None = None,
    namespace: str | None = None,
    job_template: str | dict | None = None,
    full_job_spec: dict | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    priority_class_name: str | None = None,
    volcano_queue: str | None = None,
    scheduler_name: str | None = None,
    min_available: int | str | None = None,
    max_retry: int | None = None,
    max_preemptions: int | None = None,
    ttl_seconds_after_finished: int | None = None,
    policies: list[dict] | None = None,
    retryable_exit_codes: list[int] | None = None,
    restart_scope: str | None = None,
    extra_plugins: dict[str, list[str]] | None = None,
    tensorboard: dict[str, Any] | None = None,
    image: str | None = None,
    args: list[Any] | None = None,
    env: dict[str, Any] | list[dict] | None = None,
    container_resources: dict | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict] | None = None,
    volumes: list[dict] | None = None,
    volume_mounts: list[dict] | None = None,
    service_account_name: str | None = None,
    image_pull_policy: str | None = None,
    image_pull_secrets: list[str] | None = None,
    restart_policy: str | None = None,
    debug: bool = False,
    debug_timeout: float | datetime.timedelta = 3600.0,
    shm_size: str | None = "2Gi",
    termination_grace_period: int | None = None,
    checkpoint_dir: str | None = None,
    stall_timeout: float | datetime.timedelta | None = None,
    allowed_file_dirs: Sequence[str] | None = None,
    kubernetes_conn_id: str = "kubernetes_default",
    get_logs: bool = True,
    log_tasks: list[str] | None = None,
    startup_timeout: float | datetime.timedelta | None = 900.0,
    image_pull_timeout: float | datetime.timedelta | None = 300.0,
    job_timeout: float | datetime.timedelta | None = None,
    node_lost_timeout: float | datetime.timedelta | None = 180.0,
    stall_action: str = StallAction.FAIL,
    on_finish_action: str = OnFinishAction.DELETE_SUCCEEDED_JOB,
    on_kill_action: str = OnKillAction.DELETE_JOB,
    if_job_exists: str = IfJobExists.REATTACH,
    delete_orphaned_jobs: bool = True,
    deferrable: bool = DEFAULT_DEFERRABLE,
    poll_interval: float | datetime.timedelta = 5.0,
    model_asset: Asset | str | None = None,
    worker_replicas: int | str | None = None,
    master_task_name: str | None = None,
    worker_task_name: str | None = None,
    master_resources: dict | None = None,
    worker_resources: dict | None = None,
    master_policies: list[dict] | None = None,
    port: int | None = None,
    launcher: str | None = None,
    nproc_per_node: int | str | None = None,
    max_restarts: int | None = None,
    torchrun_options: list[str] | None = None,
    wait_for_master: bool | str = False,
    **kwargs: Any,
) -> TaskDecorator:
    """`@task.volcano_pytorch(image=..., worker_replicas=..., ...)`: any VolcanoPyTorchJobOperator
    argument except `training_script` and `command`, typed as the operator's (the signature is generated from the
    same declarations).

    :param python_callable: the function to run on every rank.
    :param multiple_outputs: unroll a dict return value into one XCom per key, as with any `@task`.
    """
    given = dict(locals())
    # Only what the caller gave goes on, as before the signature was typed: the operator's defaults are these
    # (generated from the same declarations), and a decorator's kwargs are also what `.override`, mapping and the
    # serialized DAG see. A value that is the default object itself was not given, or changes nothing.
    defaults = volcano_pytorch_task.__kwdefaults__ or {}
    passed = {name: value for name, value in given.items() if name in defaults and value is not defaults[name]}
    return task_decorator_factory(
        python_callable=python_callable,
        decorated_operator_class=_VolcanoPyTorchDecoratedOperator,
        **passed,
        **kwargs,
    )
