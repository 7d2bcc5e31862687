"""The "Volcano Job" panel's web app, served by Airflow's own API server (the provider's plugin mounts
it at plugin.PREFIX): a static page, shown on every task instance's page, and the JSON it refreshes itself
from every few seconds while the task runs or is deferred.

Safe: the JSON answers only a user whom Airflow's auth manager allows to read that DAG's task
instances (its own dependency, run before anything else: no cluster call for anyone else), and has log
lines only for one it allows to read the DAG's task logs (no log read for anyone else); it holds no
credential and no environment value (see `view.py`); it reads only the task's own Job, with the
connection and in the namespace the task rendered (see `data.py`). Cheap: a Job and its pods are read
at most once per CACHE_SECONDS whatever the number of open pages (one read at a time per Job: the others
wait for it), a pod's log tail at most once per CACHE_SECONDS and LOG_TAIL_BYTES at most.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response

CACHE_SECONDS = 5.0
STATIC = {"panel.js": "text/javascript", "panel.css": "text/css"}


@dataclass
class Cached:
    value: Any = None
    at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Cache:
    """Values by key, each computed at most once per CACHE_SECONDS however many ask at once."""

    def __init__(self, seconds: float = CACHE_SECONDS) -> None:
        self.seconds = seconds
        self.entries: dict[tuple, Cached] = {}

    async def get(self, key: tuple, compute: Callable[[], Awaitable[Any]]) -> Any:
        entry = self.entries.setdefault(key, Cached())
        async with entry.lock:
            if time.monotonic() - entry.at >= self.seconds:
                entry.value, entry.at = await compute(), time.monotonic()
        if len(self.entries) > 10_000:  # a long-lived API server: forget what nobody looked at lately
            stale = [key for key, item in self.entries.items() if time.monotonic() - item.at > 600]
            for old in stale:
                self.entries.pop(old, None)
        return entry.value


def _authorized() -> Any:
    """Airflow's own check: the viewer may read this DAG's task instances (401/403 otherwise)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))


def _may_read_logs() -> Any:
    """Whether the viewer may read this DAG's task logs, as Airflow's own log endpoint asks (a viewer who
    may not still gets the panel, without its log lines)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api.security import get_user
    from airflow.models.dag import DagModel

    signed_in = Depends(get_user)  # the same user the access check read (FastAPI resolves it once)

    def check(dag_id: str, user: Any = signed_in) -> bool:
        team = getattr(DagModel, "get_team_name", None)
        details = DagDetails(id=dag_id, team_name=team(dag_id) if team is not None else None)
        return bool(get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.TASK_LOGS,
                                                         details=details, user=user))

    return Depends(check)


def create_app() -> FastAPI:
    from airflow_volcano.panel import data

    app = FastAPI(title="airflow-volcano: the Volcano Job panel", docs_url=None, redoc_url=None, openapi_url=None)
    jobs, logs = Cache(), Cache()

    @app.get("/ti/{dag_id}/{run_id}/{task_id}/{map_index}", response_class=HTMLResponse)
    def page(dag_id: str, run_id: str, task_id: str, map_index: str) -> str:
        """The page (no data: it asks the JSON endpoint, with the viewer's own session)."""
        return _static("panel.html")

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404)
        return Response(_static(name), media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})

    @app.get("/api/ti/{dag_id}/{run_id}/{task_id}/{map_index}", dependencies=[_authorized()])
    async def panel(dag_id: str, run_id: str, task_id: str, map_index: str, pod: str | None = None,
                    may_read_logs: bool = _may_read_logs()) -> dict:
        try:
            return await data.panel_data(dag_id, run_id, task_id, _map_index(map_index), pod, jobs=jobs, logs=logs,
                                         may_read_logs=may_read_logs)
        except data.NotTheJobsPod as error:
            raise HTTPException(404, str(error)) from None

    return app


def _map_index(text: str) -> int:
    """The UI fills `{MAP_INDEX}` of a mapped task instance's view only: an unmapped one's is -1."""
    try:
        return int(text)
    except ValueError:
        return -1


def _static(name: str) -> str:
    return importlib.resources.files("airflow_volcano.panel").joinpath("static", name).read_text()
