"""The provider's Airflow plugin (registered in its provider info): a "Volcano Job" view on every task
instance's page, served by the panel's web app, which the API server mounts at PREFIX.

The app is built at its first request: Airflow loads plugins in every component (a worker, the
scheduler), and only the API server serves this one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from airflow.plugins_manager import AirflowPlugin

PREFIX = "/volcano-panel"  # app.PREFIX, without importing FastAPI here

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class PanelApp:
    """An ASGI app that builds the panel's FastAPI app at its first request."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            from airflow_volcano.panel.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class VolcanoPanelPlugin(AirflowPlugin):
    """A task instance's "Volcano Job" view: the Job, why it waits, its pods, progress, where its time
    went, the failure and stacks, a pod's last log lines (docs/panel.md "The Volcano Job panel")."""

    name = "airflow_volcano"
    fastapi_apps = [{"app": PanelApp(), "url_prefix": PREFIX, "name": "Volcano Job panel"}]
    external_views = [{
        "name": "Volcano Job", "href": PREFIX + "/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}",
        "destination": "task_instance", "url_route": "volcano-job",
    }]
