"""The provider's TaskFlow decorators, and `task`: Airflow's `task` with them typed.

Airflow finds `@task.volcano_pytorch` through the provider's `task-decorators` entry, but its type stub
declares the decorators of Airflow's own providers only and answers any other name with an untyped
`TaskDecorator`. A DAG that imports `task` from here gets the same object, and a type checker sees
`task.volcano_pytorch` with every argument typed (`image=123` fails mypy naming `image`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk.definitions.decorators import TaskDecoratorCollection

    from airflow_volcano.decorators.volcano_pytorch import volcano_pytorch_task

    class VolcanoTaskDecoratorCollection(TaskDecoratorCollection):
        """Airflow's decorators and this provider's, for type checkers only."""

        volcano_pytorch = staticmethod(volcano_pytorch_task)

    task: VolcanoTaskDecoratorCollection


def __getattr__(name: str) -> Any:
    # Imported when asked for, not with the package: Airflow imports this package to register the decorator.
    if name == "task":
        from airflow.sdk import task

        return task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
